/* Helpers of the NEON paths (AArch64 Advanced SIMD: vsk_neon.c, vsk_tiles_neon.c, vsk_rows_neon.c). Include on
 * AArch64 only. A file built with +dotprod (setup.py: vsk_neon_dot.c, vsk_tiles_neon_dot.c, vsk_tiles_neon_i8mm.c)
 * defines VSK_DOTPROD before including this; its integer dot products are then sdot.
 *
 * The NEON paths compute the portable path's bits: integer sums are exact whatever their grouping, and every
 * float operation is the portable one on the same operands in the same order, a multiply and an add apart (the
 * library is compiled with -ffp-contract=off: no fused multiply-add may change a rounding), lanes holding
 * independent outputs (activation rows, weight rows, dimensions) rather than parts of one sum. */
#ifndef VSK_NEON_H
#define VSK_NEON_H

#include <arm_neon.h>
#include <string.h>

#include "vsk_math.h"

/* the kernels' bodies take their type as a constant of each entry point (vsk_forms.h: VSK_ROW_KERNELS,
 * VSK_TILE_KERNELS): inlined there, their switches on it fold away */
#define VSK_NEON_INLINE static inline __attribute__((always_inline))

/* int32 lanes += the products of the signed bytes a x b, some lanes taking each (only the lanes' total is
 * used): sdot, or widening multiplies, an int16 lane holding two products (|a b| <= 128 x 127: at most 32512,
 * the activations' bytes being -127..127) */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(VSK_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b));
#endif
}

/* 4 bytes at p as int32 lanes, sign-extended or not */
static inline int32x4_t bytes4(const uint8_t *p, int is_signed) {
    uint32_t word;
    memcpy(&word, p, 4);
    const uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(word));
    return is_signed ? vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(b))))
                     : vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))));
}

/* 4 IEEE halves at p as float32 (exact) */
static inline float32x4_t halves4(const uint8_t *p) {
    uint16x4_t h;
    memcpy(&h, p, 8);
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* vsk_exp (vsk_math.h) on 4 floats: the same bits per element */
static inline float32x4_t exp4_clamp(float32x4_t x) {
    return vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
}

static inline float32x4_t exp4_pow2(float32x4_t n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
}

VSK_EXP(exp4, float32x4_t, exp4_clamp, exp4_pow2)

#endif
