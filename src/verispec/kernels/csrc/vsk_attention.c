/* Attention of the stack's passes: each query row over exactly its own sequence's prefix.
 *
 * The rows of a pass are cut into blocks of consecutive positions of one sequence (a decode step is a block of
 * one row; a verify pass, or a prefill chunk, blocks of up to VSK_ATTENTION_ROWS), and an item is a block and a
 * key/value head: the group's query heads of the block's rows attend together, so each key and value they share
 * is read once for all of them (at a long context the cache, not the weights, is most of what a step reads).
 * Each query's scores, softmax and weighted sum still run in one fixed order of their own (keys by position,
 * dimensions by index), so a row's result is the same bits whatever block it shares.
 *
 * The cache holds float32, or IEEE half (the stack's cache: half the bytes to read); a half is widened exactly. It is
 * paged (vsk_pages): each position's address comes from its sequence's block table, and the keys are still taken
 * in position order, so where the blocks lie changes no bit. */
#include <math.h>
#include <stdlib.h>

#include "vsk.h"
#include "vsk_math.h"

#define VSK_API __attribute__((visibility("default")))

static inline float cached(const void *base, size_t at, int half) {
    return half ? vsk_fp16_to_fp32(((const uint16_t *)base)[at]) : ((const float *)base)[at];
}

/* where row m's key at logical position t is stored: in place, or (a tree row's ancestors) at its tail */
static inline int stored_at(const vsk_attention_t *a, int m, int t) {
    const int direct = vsk_direct_keys(a, m);
    return t < direct ? t : a->tail[(size_t)m * VSK_ATTENTION_ROWS + t - direct];
}

/* one query (row m, head h) over its keys at logical positions first .. pos[m] (first: 0, or where its window
 * begins), portable C */
static void attend_one(const vsk_attention_t *a, int m, int h, float *scores) {
    const int group = a->H / a->kvH, span = a->pos[m] + 1, D = a->D, first = vsk_first_key(a, m);
    const float *q = a->q + ((size_t)m * a->H + h) * D;
    float top = -INFINITY;
    for (int t = first; t < span; t++) {
        float lanes[8] = {0}; /* 8 partial sums, added in one fixed order (D is a multiple of 8) */
        const size_t key = vsk_kv_at(&a->pages, a->slot[m], h / group, stored_at(a, m, t), D);
        for (int i = 0; i < D; i += 8)
            for (int l = 0; l < 8; l++) lanes[l] += q[i + l] * cached(a->keys, key + i + l, a->half);
        const float s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        scores[t] = s * a->scale;
    }
    if (a->softcap) vsk_softcap(scores + first, span - first, a->softcap);
    for (int t = first; t < span; t++) top = scores[t] > top ? scores[t] : top;
    float total = 0.0f;
    for (int t = first; t < span; t++) {
        scores[t] = vsk_exp(scores[t] - top);
        total += scores[t];
    }
    float *o = a->out + ((size_t)m * a->H + h) * D;
    for (int i = 0; i < D; i++) o[i] = 0.0f;
    for (int t = first; t < span; t++) {
        const float p = scores[t] / total;
        const size_t value = vsk_kv_at(&a->pages, a->slot[m], h / group, stored_at(a, m, t), D);
        for (int i = 0; i < D; i++) o[i] += p * cached(a->values, value + i, a->half);
    }
}

/* items of a vsk_attention_job: (block, key/value head) */
static void attention_items(const void *ctx, int begin, int end) {
    const vsk_attention_job *job = ctx;
    const vsk_attention_t *a = job->a;
    const int group = a->H / a->kvH;
    int longest = 0;
    for (int item = begin; item < end; item++) {
        const int block = item / a->kvH, keys = vsk_block_keys(a, job->first[block], job->first[block + 1], 0);
        longest = keys > longest ? keys : longest;
    }
    float *scores = malloc(sizeof(float) * (size_t)longest);
    for (int item = begin; item < end; item++) {
        const int block = item / a->kvH, g = item % a->kvH;
        for (int m = job->first[block]; m < job->first[block + 1]; m++)
            for (int h = g * group; h < (g + 1) * group; h++) attend_one(a, m, h, scores);
    }
    free(scores);
}

void vsk_attend(const vsk_attention_t *a, int M) {
    int *first = malloc(sizeof(int) * (size_t)(M + 1)), blocks = 0;
    for (int m = 0; m < M; m++) { /* a block: consecutive positions of one slot (or one token tree's rows), at most
                                    VSK_ATTENTION_ROWS rows */
        const int tree = a->direct && a->direct[m] < a->pos[m] + 1;
        const int continues = m > 0 && a->slot[m] == a->slot[m - 1] && (a->pos[m] == a->pos[m - 1] + 1 || tree) &&
                              m - first[blocks - 1] < VSK_ATTENTION_ROWS;
        if (!continues) first[blocks++] = m;
    }
    first[blocks] = M;
    const vsk_attention_job job = {a, first, blocks};
    const int isa = vsk_get_isa();
    vsk_task vector = NULL;
    if (!vsk_isa_neon(isa)) { /* the NEON family runs the portable items */
        if (isa >= VSK_ISA_AVX512 && a->D % 16 == 0) vector = vsk_attention_task_avx512();
        if (!vector && isa >= VSK_ISA_AVX2) vector = vsk_attention_task_avx2();
    }
    vsk_parallel_for(vector ? vector : attention_items, &job, blocks * a->kvH);
    free(first);
}

/* out [M][H][D] for queries q [M][H][D] at positions start .. start + M - 1 of one sequence, whose keys and
 * values (all positions up to start + M - 1 already written) are `keys`/`values` [kvH][length][D], float32;
 * window and softcap as in vsk_attention_t */
VSK_API void vsk_attention(const float *q, int M, int H, int kvH, int D, const float *keys, const float *values,
                           size_t head_stride, int start, float scale, int window, float softcap, float *out) {
    int *rows = malloc(sizeof(int) * 2 * (size_t)M);
    for (int m = 0; m < M; m++) {
        rows[m] = 0;
        rows[M + m] = start + m;
    }
    static const int32_t one_block = 0; /* the sequence is one block holding all its positions */
    const vsk_attention_t a = {.q = q, .keys = keys, .values = values,
                               .pages = {&one_block, 0, start + M, 0, head_stride},
                               .slot = rows, .pos = rows + M, .H = H, .kvH = kvH, .D = D, .scale = scale, .out = out,
                               .window = window, .softcap = softcap};
    vsk_attend(&a, M);
    free(rows);
}
