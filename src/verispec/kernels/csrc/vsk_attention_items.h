/* The attention's items over tiles, shared by its vector paths (vsk_attention_avx2.c, vsk_attention_avx512.c):
 * included by each after it defines TILE and QUERIES and its own tile_of, prefetch_tile, tile_scores, softmax and
 * tile_sums, so that these compile for its vectors (the file's target pragma covers them too). */
#ifndef VSK_ATTENTION_ITEMS_H
#define VSK_ATTENTION_ITEMS_H

/* positions t0 .. t0 + n - 1 of slot s's head g in a cache's pool (vsk_pages) as float32 rows [n][D]: a run inside
 * one block read in place (a float32 cache) or widened into `buffer`; a run over two blocks or more assembled in
 * `buffer`, block by block. The same values whichever way, so where blocks lie changes no result. */
static const float *run_of(const vsk_attention_t *a, const void *cache, int s, int g, int t0, int n, float *buffer) {
    const int B = a->pages.block_size, D = a->D;
    if (t0 / B == (t0 + n - 1) / B) return tile_of(cache, vsk_kv_at(&a->pages, s, g, t0, D), n, D, a->half, buffer);
    for (int t = t0; t < t0 + n;) {
        const int count = B - t % B < t0 + n - t ? B - t % B : t0 + n - t;
        float *to = buffer + (size_t)(t - t0) * D;
        const float *got = tile_of(cache, vsk_kv_at(&a->pages, s, g, t, D), count, D, a->half, to);
        if (got != to) memcpy(to, got, sizeof(float) * (size_t)count * D); /* a float32 cache's rows, read in place */
        t += count;
    }
    return buffer;
}

/* asks for the lines of positions t0 .. t0 + n - 1 of slot s's head g (the next tile) before they are read */
static void prefetch_run(const vsk_attention_t *a, const void *cache, int s, int g, int t0, int n) {
    const int B = a->pages.block_size;
    for (int t = t0; t < t0 + n;) {
        const int count = B - t % B < t0 + n - t ? B - t % B : t0 + n - t;
        prefetch_tile(cache, vsk_kv_at(&a->pages, s, g, t, a->D), count * a->D, a->half);
        t += count;
    }
}

/* keys or values [n][D] of slot s's head g at the positions at[0 .. n) as float32 rows in `buffer`: a tree row's
 * ancestors, which need not lie side by side */
static const float *gathered(const vsk_attention_t *a, const void *cache, int s, int g, const int *at, int n,
                             float *buffer) {
    for (int j = 0; j < n; j++) {
        float *to = buffer + (size_t)j * a->D;
        const float *row = tile_of(cache, vsk_kv_at(&a->pages, s, g, at[j], a->D), 1, a->D, a->half, to);
        if (row != to) memcpy(to, row, sizeof(float) * a->D); /* a float32 cache's row, read in place */
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
    const int group = a->H / a->kvH, D = a->D, shared = vsk_block_keys(a, m0, m1, 1), s = a->slot[m0];
    const int begin = vsk_block_first_key(a, m0, m1) / TILE * TILE;
    for (int t0 = begin; t0 < shared; t0 += TILE) { /* scores, a tile of keys at a time */
        const int n = shared - t0 < TILE ? shared - t0 : TILE;
        if (t0 + n < shared) prefetch_run(a, a->keys, s, g, t0 + n, shared - t0 - n < TILE ? shared - t0 - n : TILE);
        const float *k = run_of(a, a->keys, s, g, t0, n, tile);
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
        const float *k = gathered(a, a->keys, s, g, at, tail, tile);
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
        if (t0 + n < shared) prefetch_run(a, a->values, s, g, t0 + n, shared - t0 - n < TILE ? shared - t0 - n : TILE);
        const float *v = run_of(a, a->values, s, g, t0, n, tile);
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
        const float *v = gathered(a, a->values, s, g, at, tail, tile);
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
