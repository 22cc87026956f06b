/* The attention's items over tiles, shared by its vector paths (vsk_attention_avx2.c, vsk_attention_avx512.c):
 * included by each after it defines TILE and QUERIES and its own tile_of, tile_scores, softmax and tile_sums, so
 * that these compile for its vectors (the file's target pragma covers them too). */
#ifndef VSK_ATTENTION_ITEMS_H
#define VSK_ATTENTION_ITEMS_H

/* keys or values [n][D] of a cache at the positions at[0 .. n) (element `base` is position 0) as float32 rows in
 * `buffer`: a tree row's ancestors, which need not lie side by side */
static const float *gathered(const void *cache, size_t base, const int *at, int n, int D, int half, float *buffer) {
    for (int j = 0; j < n; j++) {
        float *to = buffer + (size_t)j * D;
        const float *row = tile_of(cache, base + (size_t)at[j] * D, 1, D, half, to);
        if (row != to) memcpy(to, row, sizeof(float) * D); /* a float32 cache's row, read in place */
    }
    return buffer;
}

/* row m's queries of head group g against keys k [n][D], its logical positions t0 .. t0 + n - 1 */
static void row_scores(const vsk_attention_t *a, int m, int m0, int g, const float *k, int t0, int n, float *scores,
                       int stride) {
    const int group = a->H / a->kvH, D = a->D;
    const float *q[QUERIES];
    float *rows[QUERIES];
    for (int j0 = 0; j0 < group; j0 += QUERIES) {
        const int count = group - j0 < QUERIES ? group - j0 : QUERIES;
        for (int c = 0; c < count; c++) {
            q[c] = a->q + ((size_t)m * a->H + g * group + j0 + c) * D;
            rows[c] = scores + (size_t)((m - m0) * group + j0 + c) * stride + t0;
        }
        tile_scores(q, count, k, n, D, a->scale, rows);
    }
}

/* row m's outputs of head group g += its weights at logical positions t0 .. t0 + n - 1 times values v [n][D] */
static void row_sums(const vsk_attention_t *a, int m, int m0, int g, const float *v, int t0, int n, const float *scores,
                     int stride) {
    const int group = a->H / a->kvH, D = a->D;
    const float *w[QUERIES];
    float *rows[QUERIES];
    for (int j0 = 0; j0 < group; j0 += QUERIES) {
        const int count = group - j0 < QUERIES ? group - j0 : QUERIES;
        for (int c = 0; c < count; c++) {
            w[c] = scores + (size_t)((m - m0) * group + j0 + c) * stride + t0;
            rows[c] = a->out + ((size_t)m * a->H + g * group + j0 + c) * D;
        }
        tile_sums(w, count, v, n, D, rows);
    }
}

/* one item: the rows m0 .. m1 - 1 (one sequence) and key/value head g; `scores` holds (m1 - m0) x group rows of
 * `stride` floats, indexed by logical position. The keys the rows read in place come a tile at a time, shared (from
 * the tile holding the first key any of them sees: a window's start); a tree row's own ancestors after them,
 * gathered for that row alone (logical positions in order either way, so the same bits). A row's keys are those
 * from its first (vsk_first_key) to its own position. */
static void attend_block(const vsk_attention_t *a, int m0, int m1, int g, float *scores, int stride, float *tile) {
    const int group = a->H / a->kvH, D = a->D, shared = vsk_block_keys(a, m0, m1, 1);
    const int begin = vsk_block_first_key(a, m0, m1) / TILE * TILE;
    const size_t base = (size_t)a->slot[m0] * a->slot_stride + (size_t)g * a->head_stride;
    for (int t0 = begin; t0 < shared; t0 += TILE) { /* scores, a tile of keys at a time */
        const int n = shared - t0 < TILE ? shared - t0 : TILE;
        const float *k = tile_of(a->keys, base + (size_t)t0 * D, n, D, a->half, tile);
        for (int m = m0; m < m1; m++) {
            const int first = vsk_first_key(a, m) > t0 ? vsk_first_key(a, m) : t0;
            const int end = vsk_direct_keys(a, m) < t0 + n ? vsk_direct_keys(a, m) : t0 + n;
            if (first < end) row_scores(a, m, m0, g, k + (size_t)(first - t0) * D, first, end - first, scores, stride);
        }
    }
    for (int m = m0; m < m1; m++) {
        const int direct = vsk_direct_keys(a, m), first = vsk_first_key(a, m) > direct ? vsk_first_key(a, m) : direct;
        const int tail = a->pos[m] + 1 - first;
        if (tail <= 0) continue;
        const int *at = a->tail + (size_t)m * VSK_ATTENTION_ROWS + (first - direct);
        const float *k = gathered(a->keys, base, at, tail, D, a->half, tile);
        row_scores(a, m, m0, g, k, first, tail, scores, stride);
    }
    for (int m = m0; m < m1; m++)
        for (int j = 0; j < group; j++) {
            float *row = scores + (size_t)((m - m0) * group + j) * stride + vsk_first_key(a, m);
            const int span = a->pos[m] + 1 - vsk_first_key(a, m);
            if (a->softcap) vsk_softcap(row, span, a->softcap);
            softmax(row, span);
            memset(a->out + ((size_t)m * a->H + g * group + j) * D, 0, sizeof(float) * D);
        }
    for (int t0 = begin; t0 < shared; t0 += TILE) { /* weighted sums, a tile of values at a time */
        const int n = shared - t0 < TILE ? shared - t0 : TILE;
        const float *v = tile_of(a->values, base + (size_t)t0 * D, n, D, a->half, tile);
        for (int m = m0; m < m1; m++) {
            const int first = vsk_first_key(a, m) > t0 ? vsk_first_key(a, m) : t0;
            const int end = vsk_direct_keys(a, m) < t0 + n ? vsk_direct_keys(a, m) : t0 + n;
            if (first < end) row_sums(a, m, m0, g, v + (size_t)(first - t0) * D, first, end - first, scores, stride);
        }
    }
    for (int m = m0; m < m1; m++) {
        const int direct = vsk_direct_keys(a, m), first = vsk_first_key(a, m) > direct ? vsk_first_key(a, m) : direct;
        const int tail = a->pos[m] + 1 - first;
        if (tail <= 0) continue;
        const int *at = a->tail + (size_t)m * VSK_ATTENTION_ROWS + (first - direct);
        const float *v = gathered(a->values, base, at, tail, D, a->half, tile);
        row_sums(a, m, m0, g, v, first, tail, scores, stride);
    }
}

static void attention_items(const void *ctx, int begin, int end) {
    const vsk_attention_job *job = ctx;
    const vsk_attention_t *a = job->a;
    const int group = a->H / a->kvH;
    size_t most = 0; /* the scores of the largest item */
    for (int item = begin; item < end; item++) {
        const int block = item / a->kvH, rows = job->first[block + 1] - job->first[block];
        const int span = vsk_block_keys(a, job->first[block], job->first[block + 1], 0);
        const size_t size = (size_t)rows * group * (size_t)span;
        most = size > most ? size : most;
    }
    float *scores = malloc(sizeof(float) * most);
    float *tile = aligned_alloc(64, (sizeof(float) * TILE * (size_t)a->D + 63) / 64 * 64);
    for (int item = begin; item < end; item++) {
        const int block = item / a->kvH, m0 = job->first[block], m1 = job->first[block + 1];
        attend_block(a, m0, m1, item % a->kvH, scores, vsk_block_keys(a, m0, m1, 0), tile);
    }
    free(scores);
    free(tile);
}

#endif
