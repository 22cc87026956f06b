/* The attention of decode and verify passes (see vsk_attention.c) on 256-bit vectors with FMA: the same
 * items, each in one fixed order of its own (8 lanes along the head dimension, added in a fixed tree). */
#include "vsk.h"

#if !defined(__x86_64__)
vsk_task vsk_attention_task_avx2(void) { return NULL; }
#else

#pragma GCC target("avx2,fma")
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "vsk_exp8.h"
#include "vsk_math.h"

static inline float fixed_sum(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static void attention_items(const void *ctx, int begin, int end) {
    const vsk_attention_t *a = ctx;
    const int group = a->H / a->kvH, D = a->D;
    int longest = 0;
    for (int item = begin; item < end; item++) longest = a->pos[item / a->H] + 1 > longest ? a->pos[item / a->H] + 1 : longest;
    float *scores = malloc(sizeof(float) * (size_t)longest);
    for (int item = begin; item < end; item++) {
        const int m = item / a->H, h = item % a->H, span = a->pos[m] + 1;
        const float *q = a->q + ((size_t)m * a->H + h) * D;
        const size_t base = (size_t)a->slot[m] * a->slot_stride + (size_t)(h / group) * a->head_stride;
        const float *k = a->keys + base, *v = a->values + base;
        int t = 0;
        for (; t + 4 <= span; t += 4) { /* four keys at once: independent chains, each summed as one key alone */
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int i = 0; i < D; i += 8) {
                const __m256 qi = _mm256_loadu_ps(q + i);
                for (int j = 0; j < 4; j++)
                    acc[j] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k + (size_t)(t + j) * D + i), acc[j]);
            }
            for (int j = 0; j < 4; j++) scores[t + j] = fixed_sum(acc[j]) * a->scale;
        }
        for (; t < span; t++) {
            __m256 acc = _mm256_setzero_ps();
            for (int i = 0; i < D; i += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + (size_t)t * D + i), acc);
            scores[t] = fixed_sum(acc) * a->scale;
        }
        float top = -INFINITY;
        for (t = 0; t < span; t++) top = scores[t] > top ? scores[t] : top;
        const __m256 top8 = _mm256_set1_ps(top);
        for (t = 0; t + 8 <= span; t += 8)
            _mm256_storeu_ps(scores + t, exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + t), top8)));
        for (; t < span; t++) scores[t] = vsk_exp(scores[t] - top);
        float total = 0.0f;
        for (t = 0; t < span; t++) total += scores[t];
        const float inverse = 1.0f / total;
        float *o = a->out + ((size_t)m * a->H + h) * D;
        for (int i0 = 0; i0 < D; i0 += 64) { /* 64 dimensions at a time in registers, keys in order */
            const int lanes = (D - i0 < 64 ? D - i0 : 64) / 8;
            __m256 acc[8];
            for (int j = 0; j < lanes; j++) acc[j] = _mm256_setzero_ps();
            for (int t = 0; t < span; t++) {
                const __m256 p = _mm256_set1_ps(scores[t] * inverse);
                const float *row = v + (size_t)t * D + i0;
                for (int j = 0; j < lanes; j++) acc[j] = _mm256_fmadd_ps(p, _mm256_loadu_ps(row + 8 * j), acc[j]);
            }
            for (int j = 0; j < lanes; j++) _mm256_storeu_ps(o + i0 + 8 * j, acc[j]);
        }
    }
    free(scores);
}

vsk_task vsk_attention_task_avx2(void) { return attention_items; }

#endif
