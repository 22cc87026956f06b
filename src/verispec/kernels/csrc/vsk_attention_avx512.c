/* The stack's attention (see vsk_attention.c) on 512-bit vectors, for head sizes that are a multiple of 16.
 *
 * The layout is the AVX2 variant's (vsk_attention_avx2.c): an item's queries share a tile of TILE positions,
 * widened to float32 once when the cache holds halves, and every query of the item runs over the tile while it is
 * in L1. The wider registers let one key load serve two queries against eight keys, and one value load up to six
 * queries over 64 dimensions: at a long context the AVX2 variant was bound by its multiply-adds, not by memory.
 *
 * Each query keeps one fixed order of its own, whatever shares its item: a score is the dot product in 16 lanes
 * along the dimensions, each lane one chain of fused multiply-adds from 0, the lanes summed in one fixed tree, times
 * the scale; the softmax's exponentials run 16 at a time from position 0 (the tail one at a time), their sum in 16
 * lanes and a fixed tree; a weighted sum adds the positions in order for each dimension, its accumulators passing
 * through memory between tiles unchanged. So a row's result is the same bits alone or in a block, and does not
 * depend on its tile neighbours; positions past a row's own are never read into its results. */
#include "vsk.h"

#if !defined(__x86_64__)
vsk_task vsk_attention_task_avx512(void) { return NULL; }
#else

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vsk_math.h"
#include "vsk_rows.h"

#define TILE 32    /* positions per tile: 32 x 128 float32 = 16 KiB */
#define QUERIES 6  /* queries of one row sharing each value load */
#define KEYS 8     /* keys per step of the scores: 2 queries x 8 keys = 16 accumulators */

/* vsk_exp (vsk_math.h) on 16 floats: the same bits per element */
typedef int32_t vsk_i32x16 __attribute__((vector_size(64)));

static inline __m512 exp16_clamp(__m512 x) {
    return _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
}

static inline __m512 exp16_pow2(__m512 n) { return (__m512)((__builtin_convertvector(n, vsk_i32x16) + 127) << 23); }

VSK_EXP(exp16, __m512, exp16_clamp, exp16_pow2)

/* asks for a tile's lines while the one before it is computed on (the hardware's prefetcher alone left the cache's
 * stream well below the machine's read rate) */
static inline void prefetch_tile(const void *cache, size_t at, int elements, int half) {
    const char *p = (const char *)cache + at * (half ? 2 : 4);
    for (int b = 0; b < elements * (half ? 2 : 4); b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

/* 16 halves at h as float32 at f (vsk_attention_items.h: tile_of) */
static inline void widen_lanes(const uint16_t *h, float *f) {
    _mm512_storeu_ps(f, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
}

/* The folds of lane_sums: each takes two vectors of partial sums and adds each one's partials in pairs, giving
 * half as many partials of each, side by side (fold256: 128-bit chunk c + chunk c + 2; fold128: chunk 2c + 2c + 1;
 * fold64 and fold32 the same within each 128-bit chunk, on pairs of lanes then single lanes). */
static inline __m512 fold256(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

static inline __m512 fold128(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

static inline __m512 fold64(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
}

static inline __m512 fold32(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

/* the 16 lanes of each of v[0..15] summed, as one vector: every v[j] passes through the same four folds (a fixed
 * tree of its own lanes, never mixed with another vector's), and its sum lands in lane LANE_OF(j) = 4 (j % 4) +
 * j / 4 (traced through the shuffles; the kernel tests against a float64 reference would see a wrong one) */
#define LANE_OF(j) (4 * ((j) % 4) + (j) / 4)
static inline __m512 lane_sums(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int j = 0; j < 8; j++) a[j] = fold256(v[2 * j], v[2 * j + 1]);
    for (int j = 0; j < 4; j++) b[j] = fold128(a[2 * j], a[2 * j + 1]);
    for (int j = 0; j < 2; j++) c[j] = fold64(b[2 * j], b[2 * j + 1]);
    return fold32(c[0], c[1]);
}

/* scores of `count` queries q[c] (rows of D) against keys k [n][D] (n <= TILE): s[c][t] for t in [0, n), each the
 * dot product in 16 lanes along the dimensions (one chain of fused multiply-adds per lane) summed by lane_sums,
 * times the scale. Two queries and KEYS keys at a time; a missing query or key is a copy of one present, its sums
 * computed and dropped. */
static void tile_scores(const float *const *q, int count, const float *k, int n, int D, float scale, float *const *s) {
    const __m512 scale16 = _mm512_set1_ps(scale);
    for (int c = 0; c < count; c += 2) {
        const float *qa = q[c], *qb = q[c + 1 < count ? c + 1 : c];
        for (int t = 0; t < n; t += KEYS) {
            const float *key[KEYS];
            for (int j = 0; j < KEYS; j++) key[j] = k + (size_t)(t + j < n ? t + j : n - 1) * D;
            __m512 acc[2 * KEYS];
            for (int j = 0; j < 2 * KEYS; j++) acc[j] = _mm512_setzero_ps();
            for (int i = 0; i < D; i += 16) {
                const __m512 a = _mm512_loadu_ps(qa + i), b = _mm512_loadu_ps(qb + i);
                for (int j = 0; j < KEYS; j++) {
                    const __m512 x = _mm512_loadu_ps(key[j] + i);
                    acc[j] = _mm512_fmadd_ps(a, x, acc[j]);
                    acc[KEYS + j] = _mm512_fmadd_ps(b, x, acc[KEYS + j]);
                }
            }
            float out[16];
            _mm512_storeu_ps(out, _mm512_mul_ps(lane_sums(acc), scale16));
            const int keys = n - t < KEYS ? n - t : KEYS;
            for (int j = 0; j < keys; j++) s[c][t + j] = out[LANE_OF(j)];
            if (c + 1 < count)
                for (int j = 0; j < keys; j++) s[c + 1][t + j] = out[LANE_OF(KEYS + j)];
        }
    }
}

/* the softmax's vectors (vsk_attention_items.h): 16 lanes, their maximum (exact in any order), and their sum by
 * the pairwise tree */
#define LANES 16
typedef __m512 lanes;
#define lanes_exp exp16

static inline __m512 lanes_max(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }

static inline float lanes_top(__m512 v) { return _mm512_reduce_max_ps(v); }

static inline float lanes_total(__m512 v) {
    float l[16];
    _mm512_storeu_ps(l, v);
    return vsk_lane_tree(l);
}

/* o[c] (D values each) += sum over positions [0, n) of w[c][t] * v[t], positions in order, for COUNT queries and
 * WIDTH vectors of dimensions at a time (constants where it is inlined, so that the accumulators stay in
 * registers: 6 x 4 of them at most) */
static inline __attribute__((always_inline)) void sums_of(const float *const *w, const int COUNT, const int WIDTH,
                                                          const float *v, int n, int D, float *const *o) {
    for (int i = 0; i < D; i += 16 * WIDTH) {
        __m512 acc[QUERIES][4];
        for (int c = 0; c < COUNT; c++)
            for (int u = 0; u < WIDTH; u++) acc[c][u] = _mm512_loadu_ps(o[c] + i + 16 * u);
        for (int t = 0; t < n; t++) {
            __m512 x[4];
            for (int u = 0; u < WIDTH; u++) x[u] = _mm512_loadu_ps(v + (size_t)t * D + i + 16 * u);
            for (int c = 0; c < COUNT; c++) {
                const __m512 p = _mm512_set1_ps(w[c][t]);
                for (int u = 0; u < WIDTH; u++) acc[c][u] = _mm512_fmadd_ps(p, x[u], acc[c][u]);
            }
        }
        for (int c = 0; c < COUNT; c++)
            for (int u = 0; u < WIDTH; u++) _mm512_storeu_ps(o[c] + i + 16 * u, acc[c][u]);
    }
}

#define SUMS_FOR_COUNT(WIDTH)                                      \
    switch (count) {                                               \
    case 6: sums_of(w, 6, WIDTH, v, n, D, o); break;               \
    case 5: sums_of(w, 5, WIDTH, v, n, D, o); break;               \
    case 4: sums_of(w, 4, WIDTH, v, n, D, o); break;               \
    case 3: sums_of(w, 3, WIDTH, v, n, D, o); break;               \
    case 2: sums_of(w, 2, WIDTH, v, n, D, o); break;               \
    default: sums_of(w, 1, WIDTH, v, n, D, o); break;              \
    }

static void tile_sums(const float *const *w, int count, const float *v, int n, int D, float *const *o) {
    if (D % 64 == 0) {
        SUMS_FOR_COUNT(4)
    } else if (D % 32 == 0) {
        SUMS_FOR_COUNT(2)
    } else {
        SUMS_FOR_COUNT(1)
    }
}

#include "vsk_attention_items.h"

vsk_task vsk_attention_task_avx512(void) { return attention_items; }

#endif
