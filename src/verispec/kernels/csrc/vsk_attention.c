/* Attention of decode and verify passes: each query row over exactly its own sequence's prefix. */
#include <math.h>
#include <stdlib.h>

#include "vsk.h"
#include "vsk_math.h"

#define VSK_API __attribute__((visibility("default")))

/* item = (row m, head h): the row's query over keys 0 .. pos[m] of its slot. Scores, softmax and the
 * weighted sum each run in one fixed order (keys by position, dimensions by index) whatever else shares the
 * call. The keys and values of every row of the call are written before any row attends. */
static void attention_items(const void *ctx, int begin, int end) {
    const vsk_attention_t *a = ctx;
    const int group = a->H / a->kvH;
    int longest = 0;
    for (int item = begin; item < end; item++) longest = a->pos[item / a->H] + 1 > longest ? a->pos[item / a->H] + 1 : longest;
    float *scores = malloc(sizeof(float) * (size_t)longest);
    for (int item = begin; item < end; item++) {
        const int m = item / a->H, h = item % a->H, span = a->pos[m] + 1;
        const float *q = a->q + ((size_t)m * a->H + h) * a->D;
        const size_t base = (size_t)a->slot[m] * a->slot_stride + (size_t)(h / group) * a->head_stride;
        const float *k = a->keys + base, *v = a->values + base;
        float top = -INFINITY;
        for (int t = 0; t < span; t++) {
            float lanes[8] = {0}; /* 8 partial sums, added in one fixed order (D is a multiple of 8) */
            for (int i = 0; i < a->D; i += 8)
                for (int l = 0; l < 8; l++) lanes[l] += q[i + l] * k[(size_t)t * a->D + i + l];
            const float s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
            scores[t] = s * a->scale;
            top = scores[t] > top ? scores[t] : top;
        }
        float total = 0.0f;
        for (int t = 0; t < span; t++) {
            scores[t] = vsk_exp(scores[t] - top);
            total += scores[t];
        }
        float *o = a->out + ((size_t)m * a->H + h) * a->D;
        for (int i = 0; i < a->D; i++) o[i] = 0.0f;
        for (int t = 0; t < span; t++) {
            const float p = scores[t] / total;
            for (int i = 0; i < a->D; i++) o[i] += p * v[(size_t)t * a->D + i];
        }
    }
    free(scores);
}

void vsk_attend(const vsk_attention_t *a, int M) {
    const vsk_task vector = vsk_get_isa() >= VSK_ISA_AVX2 ? vsk_attention_task_avx2() : NULL;
    vsk_parallel_for(vector ? vector : attention_items, a, M * a->H);
}

/* out [M][H][D] for queries q [M][H][D] at positions start .. start + M - 1 of one sequence, whose keys and
 * values (all positions up to start + M - 1 already written) are `keys`/`values` [kvH][length][D] */
VSK_API void vsk_attention(const float *q, int M, int H, int kvH, int D, const float *keys, const float *values,
                           size_t head_stride, int start, float scale, float *out) {
    int *rows = malloc(sizeof(int) * 2 * (size_t)M);
    for (int m = 0; m < M; m++) {
        rows[m] = 0;
        rows[M + m] = start + m;
    }
    const vsk_attention_t a = {q, keys, values, 0, head_stride, rows, rows + M, H, kvH, D, scale, out};
    vsk_attend(&a, M);
    free(rows);
}
