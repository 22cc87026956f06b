/* The attention's items over tiles, shared by its vector paths (vsk_attention_avx2.c, vsk_attention_avx512.c):
 * included by each after it defines TILE and QUERIES, its own prefetch_tile, tile_scores and tile_sums, and its
 * vectors: `lanes` (LANES floats), widen_lanes (LANES halves to floats) and the softmax's lanes_max, lanes_top,
 * lanes_total and lanes_exp, so that these compile for its vectors (the file's target pragma covers them too). */
#ifndef VSK_ATTENTION_ITEMS_H
#define VSK_ATTENTION_ITEMS_H

/* keys or values [n][D] of a cache from element `at` as float32 rows: in place when the cache holds float32, else
 * widened into `buffer`, LANES at a time (D is a multiple of LANES) */
static const float *tile_of(const void *cache, size_t at, int n, int D, int half, float *buffer) {
    if (!half) return (const float *)cache + at;
    const uint16_t *src = (const uint16_t *)cache + at;
    for (int i = 0; i < n * D; i += LANES) widen_lanes(src + i, buffer + i);
    return buffer;
}

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

static inline lanes load_lanes(const float *p) {
    lanes v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* a query's scores over its span -> its weights exp(score - max) / their sum, in place: the maximum and the sum in
 * LANES lanes over the first span / LANES * LANES positions (lanes_top, lanes_total: each a fixed tree), then the
 * rest in order (GCC's vector extensions: each operation lane by lane, a scalar operand in every lane) */
static void softmax(float *scores, int span) {
    lanes top_lanes, sum;
    for (int l = 0; l < LANES; l++) top_lanes[l] = -INFINITY, sum[l] = 0.0f;
    int t = 0;
    for (; t + LANES <= span; t += LANES) top_lanes = lanes_max(top_lanes, load_lanes(scores + t));
    float top = lanes_top(top_lanes);
    for (; t < span; t++) top = scores[t] > top ? scores[t] : top;
    for (t = 0; t + LANES <= span; t += LANES) {
        const lanes e = lanes_exp(load_lanes(scores + t) - top);
        memcpy(scores + t, &e, sizeof e);
        sum += e;
    }
    float total = lanes_total(sum);
    for (; t < span; t++) {
        scores[t] = vsk_exp(scores[t] - top);
        total += scores[t];
    }
    for (t = 0; t + LANES <= span; t += LANES) {
        const lanes w = load_lanes(scores + t) * (1.0f / total);
        memcpy(scores + t, &w, sizeof w);
    }
    for (; t < span; t++) scores[t] *= 1.0f / total;
}

/* row m's queries of head group g against keys kv [n][D] (its logical positions t0 .. t0 + n - 1) into their scores,
 * or (`values`) its outputs += its weights at those positions times values kv [n][D] */
static void row_pass(const vsk_attention_t *a, int values, int m, int m0, int g, const float *kv, int t0, int n,
                     float *scores, int stride) {
    const int group = a->H / a->kvH, D = a->D;
    const float *in[QUERIES];
    float *rows[QUERIES];
    for (int j0 = 0; j0 < group; j0 += QUERIES) {
        const int count = group - j0 < QUERIES ? group - j0 : QUERIES;
        for (int c = 0; c < count; c++) {
            const size_t head = (size_t)m * a->H + g * group + j0 + c;
            float *weights = scores + (size_t)((m - m0) * group + j0 + c) * stride + t0;
            in[c] = values ? weights : a->q + head * D;
            rows[c] = values ? a->out + head * D : weights;
        }
        if (values)
            tile_sums(in, count, kv, n, D, rows);
        else
            tile_scores(in, count, kv, n, D, a->scale, rows);
    }
}

/* the scores (or `values`: the weighted sums) of the rows m0 .. m1 - 1 over the keys (values) they read: those read in
 * place a tile at a time, shared (from the tile holding the first key any of them sees: a window's start), then a tree
 * row's own ancestors, gathered for that row alone (logical positions in order either way, so the same bits) */
static void block_pass(const vsk_attention_t *a, int values, int m0, int m1, int g, float *scores, int stride,
                       float *tile) {
    const int D = a->D, shared = vsk_block_keys(a, m0, m1, 1), s = a->slot[m0];
    const void *cache = values ? a->values : a->keys;
    for (int t0 = vsk_block_first_key(a, m0, m1) / TILE * TILE; t0 < shared; t0 += TILE) {
        const int n = shared - t0 < TILE ? shared - t0 : TILE;
        if (t0 + n < shared) prefetch_run(a, cache, s, g, t0 + n, shared - t0 - n < TILE ? shared - t0 - n : TILE);
        const float *kv = run_of(a, cache, s, g, t0, n, tile);
        for (int m = m0; m < m1; m++) {
            const int first = vsk_first_key(a, m) > t0 ? vsk_first_key(a, m) : t0;
            const int end = vsk_direct_keys(a, m) < t0 + n ? vsk_direct_keys(a, m) : t0 + n;
            if (first < end)
                row_pass(a, values, m, m0, g, kv + (size_t)(first - t0) * D, first, end - first, scores, stride);
        }
    }
    for (int m = m0; m < m1; m++) {
        const int direct = vsk_direct_keys(a, m), first = vsk_first_key(a, m) > direct ? vsk_first_key(a, m) : direct;
        const int tail = a->pos[m] + 1 - first;
        if (tail <= 0) continue;
        const int *at = a->tail + (size_t)m * VSK_ATTENTION_ROWS + (first - direct);
        row_pass(a, values, m, m0, g, gathered(a, cache, s, g, at, tail, tile), first, tail, scores, stride);
    }
}

/* one item: the rows m0 .. m1 - 1 (one sequence) and key/value head g; `scores` holds (m1 - m0) x group rows of
 * `stride` floats, indexed by logical position. A row's keys are those from its first (vsk_first_key) to its own
 * position: their scores, the softmax, then the weighted sums of the values. */
static void attend_block(const vsk_attention_t *a, int m0, int m1, int g, float *scores, int stride, float *tile) {
    const int group = a->H / a->kvH;
    block_pass(a, 0, m0, m1, g, scores, stride, tile);
    for (int m = m0; m < m1; m++)
        for (int j = 0; j < group; j++) {
            float *row = scores + (size_t)((m - m0) * group + j) * stride + vsk_first_key(a, m);
            const int span = a->pos[m] + 1 - vsk_first_key(a, m);
            if (a->softcap) vsk_softcap(row, span, a->softcap);
            softmax(row, span);
            memset(a->out + ((size_t)m * a->H + g * group + j) * a->D, 0, sizeof(float) * a->D);
        }
    block_pass(a, 1, m0, m1, g, scores, stride, tile);
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
