/* The stack's attention (see vsk_attention.c) on 256-bit vectors with FMA.
 *
 * An item's queries (its rows' heads of one key/value group) share their keys and values: they are taken a tile
 * of TILE positions at a time, widened to float32 once when the cache holds halves, and every query of the item
 * runs over the tile while it is in L1: one load of a key serves two queries, one load of values up to QUERIES.
 *
 * Each query keeps one fixed order of its own, whatever shares its item: a score is the dot product in 8 lanes
 * along the dimensions, each lane one chain of fused multiply-adds from 0, the lanes summed in one fixed tree,
 * times the scale; the softmax's
 * exponentials run 8 at a time from position 0 (the tail one at a time), their sum in 8 lanes and a fixed tree; a
 * weighted sum adds the positions in order for each dimension, its accumulators passing through memory between
 * tiles unchanged. So a row's result is the same bits alone or in a block, and does not depend on its tile
 * neighbours; positions past a row's own are never read into its results. */
#include "vsk.h"

#if !defined(__x86_64__)
vsk_task vsk_attention_task_avx2(void) { return NULL; }
#else

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vsk_exp8.h"
#include "vsk_math.h"

#define TILE 32    /* positions per tile: 32 x 128 float32 = 16 KiB */
#define QUERIES 6  /* queries of one row sharing each load: 2 x 6 accumulators */

/* 8 halves at h as float32 at f (vsk_attention_items.h: tile_of) */
static inline void widen_lanes(const uint16_t *h, float *f) {
    _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
}

/* nothing: this path leaves the tiles to the hardware's prefetcher */
static inline void prefetch_tile(const void *cache, size_t at, int elements, int half) {
    (void)cache, (void)at, (void)elements, (void)half;
}

/* the 8 lanes of each of v[0..7] summed, as one vector: lane j = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
 * of v[j], the same tree for every j */
static inline __m256 lane_sums(const __m256 *v) {
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* scores of `count` (<= QUERIES) queries q[c] (rows of D) against keys k [n][D]: s[c][t] for t in [0, n), each the
 * dot product in 8 lanes along the dimensions (one chain of fused multiply-adds per lane) summed by lane_sums,
 * times the scale. Two queries and four keys at a time; a missing query or key is a copy of one present, its sums
 * computed and dropped. */
static void tile_scores(const float *const *q, int count, const float *k, int n, int D, float scale, float *const *s) {
    const __m256 scale8 = _mm256_set1_ps(scale);
    for (int c = 0; c < count; c += 2) {
        const float *qa = q[c], *qb = q[c + 1 < count ? c + 1 : c];
        for (int t = 0; t < n; t += 4) {
            const float *k0 = k + (size_t)t * D, *k1 = k + (size_t)(t + 1 < n ? t + 1 : n - 1) * D;
            const float *k2 = k + (size_t)(t + 2 < n ? t + 2 : n - 1) * D, *k3 = k + (size_t)(t + 3 < n ? t + 3 : n - 1) * D;
            __m256 acc[8];
            for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
            for (int i = 0; i < D; i += 8) {
                const __m256 a = _mm256_loadu_ps(qa + i), b = _mm256_loadu_ps(qb + i);
                const __m256 x0 = _mm256_loadu_ps(k0 + i), x1 = _mm256_loadu_ps(k1 + i);
                const __m256 x2 = _mm256_loadu_ps(k2 + i), x3 = _mm256_loadu_ps(k3 + i);
                acc[0] = _mm256_fmadd_ps(a, x0, acc[0]);
                acc[1] = _mm256_fmadd_ps(a, x1, acc[1]);
                acc[2] = _mm256_fmadd_ps(a, x2, acc[2]);
                acc[3] = _mm256_fmadd_ps(a, x3, acc[3]);
                acc[4] = _mm256_fmadd_ps(b, x0, acc[4]);
                acc[5] = _mm256_fmadd_ps(b, x1, acc[5]);
                acc[6] = _mm256_fmadd_ps(b, x2, acc[6]);
                acc[7] = _mm256_fmadd_ps(b, x3, acc[7]);
            }
            float out[8];
            _mm256_storeu_ps(out, _mm256_mul_ps(lane_sums(acc), scale8));
            const int keys = n - t < 4 ? n - t : 4;
            memcpy(s[c] + t, out, sizeof(float) * keys);
            if (c + 1 < count) memcpy(s[c + 1] + t, out + 4, sizeof(float) * keys);
        }
    }
}

/* the softmax's vectors (vsk_attention_items.h): 8 lanes, their maximum, and their sum by a fixed tree */
#define LANES 8
typedef __m256 lanes;
#define lanes_exp exp8

static inline __m256 lanes_max(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }

static inline float lanes_top(__m256 v) {
    float l[8], top = -INFINITY;
    _mm256_storeu_ps(l, v);
    for (int i = 0; i < 8; i++) top = l[i] > top ? l[i] : top;
    return top;
}

static inline float lanes_total(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* o[c] (D values each) += sum over positions [0, n) of w[c][t] * v[t], positions in order, for COUNT queries
 * (a constant where it is inlined, so that the accumulators stay in registers) */
static inline __attribute__((always_inline)) void sums_of(const float *const *w, const int COUNT, const float *v, int n,
                                                          int D, float *const *o) {
    for (int i = 0; i < D; i += 16) {
        __m256 acc[QUERIES][2];
        for (int c = 0; c < COUNT; c++) {
            acc[c][0] = _mm256_loadu_ps(o[c] + i);
            acc[c][1] = _mm256_loadu_ps(o[c] + i + 8);
        }
        for (int t = 0; t < n; t++) {
            const __m256 v0 = _mm256_loadu_ps(v + (size_t)t * D + i), v1 = _mm256_loadu_ps(v + (size_t)t * D + i + 8);
            for (int c = 0; c < COUNT; c++) {
                const __m256 p = _mm256_broadcast_ss(w[c] + t);
                acc[c][0] = _mm256_fmadd_ps(p, v0, acc[c][0]);
                acc[c][1] = _mm256_fmadd_ps(p, v1, acc[c][1]);
            }
        }
        for (int c = 0; c < COUNT; c++) {
            _mm256_storeu_ps(o[c] + i, acc[c][0]);
            _mm256_storeu_ps(o[c] + i + 8, acc[c][1]);
        }
    }
}

static void tile_sums(const float *const *w, int count, const float *v, int n, int D, float *const *o) {
    switch (count) {
    case 6: sums_of(w, 6, v, n, D, o); break;
    case 5: sums_of(w, 5, v, n, D, o); break;
    case 4: sums_of(w, 4, v, n, D, o); break;
    case 3: sums_of(w, 3, v, n, D, o); break;
    case 2: sums_of(w, 2, v, n, D, o); break;
    default: sums_of(w, 1, v, n, D, o); break;
    }
}

#include "vsk_attention_items.h"

vsk_task vsk_attention_task_avx2(void) { return attention_items; }

#endif
