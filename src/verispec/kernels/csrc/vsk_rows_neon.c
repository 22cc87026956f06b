/* The per-row steps (vsk_rows.h) on NEON: the portable definitions' operations, element by element, so the same
 * bits (explicit multiplies and adds: no fused multiply-add may change a rounding). */
#include <math.h>

#include "vsk_math.h"
#include "vsk_rows.h"

#if !defined(__aarch64__)
const vsk_row_ops *vsk_rows_neon(void) { return NULL; }
#else

#include "vsk_neon.h"

/* the largest |x| of n values (a multiple of 16): maxima are exact in any order, and maxNum skips a NaN as fmaxf
 * does */
static inline float abs_max(const float *x, int n) {
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int i = 0; i < n; i += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + i)));
    return vmaxnmvq_f32(m);
}

/* 16 values times id, rounded to nearest even (as vsk_round: |x id| <= 127 + rounding), stored as bytes; returns
 * their sum */
static inline int16_t round_16(const float *x, float id, int8_t *out) {
    int32x4_t q[4];
    for (int j = 0; j < 4; j++) q[j] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 4 * j), id));
    const int16x8_t lo = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
    const int16x8_t hi = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
    const int8x16_t bytes = vcombine_s8(vmovn_s16(lo), vmovn_s16(hi));
    vst1q_s8(out, bytes);
    return (int16_t)vaddlvq_s8(bytes);
}

static void quantize32(const float *x, int K, vsk_act32 *out) {
    for (int b = 0; b < K / 32; b++, x += 32) {
        const float amax = abs_max(x, 32), id = amax > 0.0f ? 127.0f / amax : 0.0f;
        out[b].d = amax / 127.0f;
        out[b].half[0] = round_16(x, id, out[b].q);
        out[b].half[1] = round_16(x + 16, id, out[b].q + 16);
    }
}

static void quantize256(const float *x, int K, vsk_act256 *out) {
    for (int b = 0; b < K / 256; b++, x += 256) {
        const float amax = abs_max(x, 256), id = amax > 0.0f ? 127.0f / amax : 0.0f;
        out[b].d = amax / 127.0f;
        for (int j = 0; j < 16; j++) out[b].bsum[j] = round_16(x + 16 * j, id, out[b].q + 16 * j);
        for (int j = 0; j < 8; j++) out[b].sum32[j] = (int16_t)(out[b].bsum[2 * j] + out[b].bsum[2 * j + 1]);
    }
}

/* lanes 0..3, 4..7, 8..11, 12..15 of the portable definition in four vectors */
static float sum_squares(const float *x, int n) {
    float32x4_t l[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    const int body = n / VSK_SQUARE_LANES * VSK_SQUARE_LANES;
    for (int i = 0; i < body; i += VSK_SQUARE_LANES)
        for (int v = 0; v < 4; v++) {
            const float32x4_t a = vld1q_f32(x + i + 4 * v);
            l[v] = vaddq_f32(l[v], vmulq_f32(a, a));
        }
    float lanes[VSK_SQUARE_LANES];
    for (int v = 0; v < 4; v++) vst1q_f32(lanes + 4 * v, l[v]);
    float sum = vsk_lane_tree(lanes);
    for (int i = body; i < n; i++) sum += x[i] * x[i];
    return sum;
}

static void swiglu(const float *gate, const float *up, float *out, int n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate + i);
        const float32x4_t silu = vdivq_f32(g, vaddq_f32(one, exp4(vnegq_f32(g))));
        vst1q_f32(out + i, vmulq_f32(silu, vld1q_f32(up + i)));
    }
    for (; i < n; i++) out[i] = gate[i] / (1.0f + vsk_exp(-gate[i])) * up[i];
}

/* the largest of x by vector maxima (exact in any order), noting a NaN */
static inline float top_of(const float *x, int n, int *nan) {
    float32x4_t top = vdupq_n_f32(-INFINITY);
    uint32x4_t ordered = vdupq_n_u32(0xFFFFFFFFu);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        ordered = vandq_u32(ordered, vceqq_f32(v, v));
        top = vmaxq_f32(top, v);
    }
    *nan = vminvq_u32(ordered) == 0;
    return vsk_top_from(x, i, n, vmaxvq_f32(top), nan);
}

/* the largest value, then its first index (a vector of four holding it, then its lane); a NaN anywhere: the portable
 * scan, which finds the first one */
static int argmax(const float *x, int n) {
    int nan, i = 0;
    const float best = top_of(x, n, &nan);
    if (nan) return vsk_rows_portable()->argmax(x, n);
    for (; i + 4 <= n; i += 4)
        if (vmaxvq_u32(vceqq_f32(vld1q_f32(x + i), vdupq_n_f32(best)))) return vsk_first_from(x, i, i + 4, best);
    return vsk_first_from(x, i, n, best);
}

static const vsk_row_ops ops = {quantize32, quantize256, sum_squares, swiglu, argmax};

const vsk_row_ops *vsk_rows_neon(void) { return &ops; }

#endif
