/* vsk_exp (vsk_math.h) on 8 floats: the same bits per element. Include after a target pragma that enables AVX2. */
#ifndef VSK_EXP8_H
#define VSK_EXP8_H

#include <immintrin.h>

#include "vsk_math.h"

typedef int32_t vsk_i32x8 __attribute__((vector_size(32)));

static inline __m256 exp8_clamp(__m256 x) {
    return _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
}

static inline __m256 exp8_pow2(__m256 n) { return (__m256)((__builtin_convertvector(n, vsk_i32x8) + 127) << 23); }

VSK_EXP(exp8, __m256, exp8_clamp, exp8_pow2)

#endif
