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

/* the kernels' bodies take their type as a constant of each entry point (vsk_blocks.h: VSK_ROW_ENTRY, VSK_TILE_ENTRY):
 * inlined there, their switches on it fold away */
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

/* vsk_exp (vsk_math.h) on 4 floats, operation for operation: the same bits per element */
static inline float32x4_t exp4(float32x4_t x) {
    const float32x4_t magic = vdupq_n_f32(12582912.0f);
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0f)), vdupq_n_f32(88.0f));
    const float32x4_t n = vsubq_f32(vaddq_f32(vmulq_n_f32(x, 1.44269504089f), magic), magic);
    const float32x4_t r = vaddq_f32(vsubq_f32(x, vmulq_n_f32(n, 0.693359375f)), vmulq_n_f32(n, 2.12194440e-4f));
    float32x4_t p = vaddq_f32(vmulq_n_f32(r, 1.9875691500e-4f), vdupq_n_f32(1.3981999507e-3f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(8.3334519073e-3f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(4.1665795894e-2f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(1.6666665459e-1f));
    p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(5.0000001201e-1f));
    const float32x4_t e = vaddq_f32(vaddq_f32(vmulq_f32(p, vmulq_f32(r, r)), r), vdupq_n_f32(1.0f));
    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(e, vreinterpretq_f32_s32(bits));
}

#endif
