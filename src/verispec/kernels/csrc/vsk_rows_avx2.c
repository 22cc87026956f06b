/* The per-row steps (vsk_rows.h) on 256-bit vectors: the portable definitions' operations, element by element,
 * so the same bits (explicit multiplies and adds: no fused multiply-add may change a rounding). */
#include <math.h>

#include "vsk_math.h"
#include "vsk_rows.h"

#if !defined(__x86_64__)
const vsk_row_ops *vsk_rows_avx2(void) { return NULL; }
#else

#pragma GCC target("avx2")
#include <immintrin.h>

#include "vsk_exp8.h"

static inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* the largest |x| of n values (a multiple of 8): maxima are exact in any order */
static inline float abs_max(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* 32 values times id, rounded to nearest even (as vsk_round), stored as bytes; returns the two sums of 16 */
static inline __m128i round_32(const float *x, __m256 id, int8_t *out) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i q[4];
    for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), id));
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(bytes, order));
    return _mm_setr_epi32(hsum_epi32(_mm256_add_epi32(q[0], q[1])), hsum_epi32(_mm256_add_epi32(q[2], q[3])), 0, 0);
}

static void quantize32(const float *x, int K, vsk_act32 *out) {
    for (int b = 0; b < K / 32; b++, x += 32) {
        const float amax = abs_max(x, 32), id = amax > 0.0f ? 127.0f / amax : 0.0f;
        out[b].d = amax / 127.0f;
        const __m128i sums = round_32(x, _mm256_set1_ps(id), out[b].q);
        out[b].half[0] = (int16_t)_mm_cvtsi128_si32(sums);
        out[b].half[1] = (int16_t)_mm_extract_epi32(sums, 1);
    }
}

static void quantize256(const float *x, int K, vsk_act256 *out) {
    for (int b = 0; b < K / 256; b++, x += 256) {
        const float amax = abs_max(x, 256), id = amax > 0.0f ? 127.0f / amax : 0.0f;
        out[b].d = amax / 127.0f;
        for (int c = 0; c < 8; c++) {
            const __m128i sums = round_32(x + 32 * c, _mm256_set1_ps(id), out[b].q + 32 * c);
            out[b].bsum[2 * c] = (int16_t)_mm_cvtsi128_si32(sums);
            out[b].bsum[2 * c + 1] = (int16_t)_mm_extract_epi32(sums, 1);
            out[b].sum32[c] = (int16_t)(out[b].bsum[2 * c] + out[b].bsum[2 * c + 1]);
        }
    }
}

static float sum_squares(const float *x, int n) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    const int body = n / VSK_SQUARE_LANES * VSK_SQUARE_LANES;
    for (int i = 0; i < body; i += VSK_SQUARE_LANES) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        lo = _mm256_add_ps(lo, _mm256_mul_ps(a, a));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(b, b));
    }
    float lanes[VSK_SQUARE_LANES];
    _mm256_storeu_ps(lanes, lo);
    _mm256_storeu_ps(lanes + 8, hi);
    float sum = vsk_lane_tree(lanes);
    for (int i = body; i < n; i++) sum += x[i] * x[i];
    return sum;
}

static void swiglu(const float *gate, const float *up, float *out, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_xor_ps(g, sign))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + vsk_exp(-gate[i])) * up[i];
}

/* the largest of x by vector maxima (exact in any order), noting a NaN */
static inline float top_of(const float *x, int n, int *nan) {
    __m256 top = _mm256_set1_ps(-INFINITY), unordered = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        top = _mm256_max_ps(top, v);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    *nan = _mm256_movemask_ps(unordered);
    return vsk_top_from(x, i, n, _mm_cvtss_f32(h), nan);
}

/* the largest value, then its first index; a NaN anywhere: the portable scan, which finds the first one */
static int argmax(const float *x, int n) {
    int nan, i = 0;
    const float best = top_of(x, n, &nan);
    if (nan) return vsk_rows_portable()->argmax(x, n);
    const __m256 wanted = _mm256_set1_ps(best);
    for (; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), wanted, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    return vsk_first_from(x, i, n, best);
}

static const vsk_row_ops ops = {quantize32, quantize256, sum_squares, swiglu, argmax};

const vsk_row_ops *vsk_rows_avx2(void) { return &ops; }

#endif
