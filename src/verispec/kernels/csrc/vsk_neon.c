/* The GGUF row layouts on NEON, compiled twice: plain Advanced SIMD (widening multiplies), and with VSK_DOTPROD
 * defined (vsk_neon_dot.c, built with +dotprod) for cores with sdot. Both compute the portable kernels' bits
 * (vsk_scalar.c): each block's integer sums are exact, then each row takes the portable float steps in the
 * portable order, four activation rows to a vector where a block's float step is the larger part of its work
 * (the 32-weight types), one row at a time in scalar registers where it is not (256-weight superblocks). */
#include "vsk.h"

#if defined(VSK_DOTPROD)
#define NAME(x) x##_neon_dot
#else
#define NAME(x) x##_neon
#endif

#if !defined(__aarch64__) || (defined(VSK_DOTPROD) && !defined(__ARM_FEATURE_DOTPROD))
vsk_kernel NAME(vsk_kernel)(int type) {
    (void)type;
    return NULL;
}
#else

#include "vsk_blocks.h"
#include "vsk_neon.h"


static inline float half(const uint8_t *p) { return vsk_fp16_to_fp32(rd16(p)); }

/* ---- 32-weight block types: each block unpacked to 32 signed bytes -------------------------------------- */

/* byte j = 0xFF where bit j of the 16 bits is set */
static inline uint8x16_t bits_to_bytes(uint32_t bits16) {
    const uint8x16_t bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x8_t lo = vdup_n_u8((uint8_t)bits16), hi = vdup_n_u8((uint8_t)(bits16 >> 8));
    return vtstq_u8(vcombine_u8(lo, hi), bit);
}

/* the block's weights 0..15 and 16..31: signed values (Q4_0, Q5_0, Q8_0, IQ4_NL's levels), or 0..15 with a
 * minimum (Q4_1) */
VSK_NEON_INLINE void unpack32(int type, const uint8_t *b, int8x16_t *w, float *d, float *mn) {
    *d = half(b);
    if (type == VSK_Q8_0) {
        w[0] = vld1q_s8((const int8_t *)b + 2);
        w[1] = vld1q_s8((const int8_t *)b + 18);
        return;
    }
    const int at = type == VSK_Q4_1 ? 4 : type == VSK_Q5_0 ? 6 : 2;
    const uint8x16_t raw = vld1q_u8(b + at), low = vandq_u8(raw, vdupq_n_u8(0x0F)), high = vshrq_n_u8(raw, 4);
    if (type == VSK_Q4_0) {
        w[0] = vsubq_s8(vreinterpretq_s8_u8(low), vdupq_n_s8(8));
        w[1] = vsubq_s8(vreinterpretq_s8_u8(high), vdupq_n_s8(8));
    } else if (type == VSK_IQ4_NL) {
        const int8x16_t levels = vld1q_s8(vsk_iq4_levels);
        w[0] = vqtbl1q_s8(levels, low);
        w[1] = vqtbl1q_s8(levels, high);
    } else if (type == VSK_Q4_1) {
        *mn = half(b + 2);
        w[0] = vreinterpretq_s8_u8(low);
        w[1] = vreinterpretq_s8_u8(high);
    } else { /* VSK_Q5_0: value - 16 is the nibble where the fifth bit is set, the nibble | 0xF0 where it is not */
        const uint32_t qh = rd32(b + 2);
        const uint8x16_t f0 = vdupq_n_u8(0xF0);
        w[0] = vreinterpretq_s8_u8(vorrq_u8(low, vbicq_u8(f0, bits_to_bytes(qh & 0xFFFF))));
        w[1] = vreinterpretq_s8_u8(vorrq_u8(high, vbicq_u8(f0, bits_to_bytes(qh >> 16))));
    }
}

/* the portable step of one block for the four activation rows at[0..3], acc += (d x->d) (float)s + mn (x->d
 * (float)(its sum)), their integer sums gathered into one vector. (The minimum's term is added only for Q4_1: for
 * the other types it is 0 x a finite value, and adding a zero changes no accumulator that started at +0.) */
VSK_NEON_INLINE float32x4_t quad32(int type, const int8x16_t *w, float d, float mn, const uint8_t *xq,
                                   size_t x_stride, const int *at, int b, float32x4_t acc) {
    int32x4_t s[4];
    float xd[4], xs[4];
    for (int i = 0; i < 4; i++) {
        const vsk_act32 *x = vsk_act32_at(xq, x_stride, at[i], b);
        s[i] = dot16(dot16(vdupq_n_s32(0), w[0], vld1q_s8(x->q)), w[1], vld1q_s8(x->q + 16));
        xd[i] = x->d;
        xs[i] = (float)(x->half[0] + x->half[1]);
    }
    const int32x4_t sums = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
    const float32x4_t dx = vld1q_f32(xd);
    float32x4_t t = vmulq_f32(vmulq_n_f32(dx, d), vcvtq_f32_s32(sums));
    if (type == VSK_Q4_1) t = vaddq_f32(t, vmulq_n_f32(vmulq_f32(dx, vld1q_f32(xs)), mn));
    return vaddq_f32(acc, t);
}

/* the row bodies (vsk_forms.h): one weight row against `rows` activation rows; the 32-weight types four rows to a
 * vector (a quad missing rows repeats its last, computed and not stored) */
VSK_NEON_INLINE void q32_rows(int type, const uint8_t *row, int K, const uint8_t *xq, size_t x_stride, int rows,
                              float *y, int ldy) {
    const int quads = (rows + 3) / 4;
    int at[MAX_ROWS];
    float32x4_t acc[MAX_ROWS / 4];
    for (int i = 0; i < 4 * quads; i++) at[i] = i < rows ? i : rows - 1;
    for (int v = 0; v < quads; v++) acc[v] = vdupq_n_f32(0.0f);
    for (int b = 0; b < K / 32; b++) {
        int8x16_t w[2];
        float d, mn = 0.0f;
        unpack32(type, row + (size_t)b * vsk_block_bytes(type), w, &d, &mn);
        for (int v = 0; v < quads; v++) acc[v] = quad32(type, w, d, mn, xq, x_stride, at + 4 * v, b, acc[v]);
    }
    float out[MAX_ROWS];
    for (int v = 0; v < quads; v++) vst1q_f32(out + 4 * v, acc[v]);
    for (int m = 0; m < rows; m++) y[(size_t)m * ldy] = out[m];
}

/* ---- 256-weight superblocks: the values unpacked once per block, each row's integer sums, then that row's
 * portable float step in scalar registers (one per 256 weights) --------------------------------------------- */

/* sum_i a[i] b[i] over 16 int16 pairs (exact: the products of scales or minimums and activation sums) */
static inline int32_t dot_s16x16(int16x8_t a0, int16x8_t a1, const int16_t *b) {
    const int16x8_t b0 = vld1q_s16(b), b1 = vld1q_s16(b + 8);
    int32x4_t s = vmull_s16(vget_low_s16(a0), vget_low_s16(b0));
    s = vmlal_high_s16(s, a0, b0);
    s = vmlal_s16(s, vget_low_s16(a1), vget_low_s16(b1));
    return vaddvq_s32(vmlal_high_s16(s, a1, b1));
}

/* Q4_K's 256 values 0..15: sub-block j in q[2j], q[2j + 1] (32 bytes c of the nibbles: sub-block 2c low, 2c + 1
 * high) */
static inline void q4_k_unpack(const uint8_t *qs, int8x16_t *q) {
    const uint8x16_t low = vdupq_n_u8(0x0F);
    for (int c = 0; c < 4; c++) {
        const uint8x16_t a = vld1q_u8(qs + 32 * c), b = vld1q_u8(qs + 16 + 32 * c);
        q[4 * c] = vreinterpretq_s8_u8(vandq_u8(a, low));
        q[4 * c + 1] = vreinterpretq_s8_u8(vandq_u8(b, low));
        q[4 * c + 2] = vreinterpretq_s8_u8(vshrq_n_u8(a, 4));
        q[4 * c + 3] = vreinterpretq_s8_u8(vshrq_n_u8(b, 4));
    }
}

/* the steps of the row bodies (VSK_FLOAT_ROWS): one superblock of a weight row against each activation row */
VSK_NEON_INLINE void q4_k_step(int type, const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows,
                               float *acc) {
    const float d = half(blk), dmin = half(blk + 2);
    uint8_t sc[8], mn[8];
    int8x16_t q[16];
    (void)type;
    q4_k_scales(blk + 4, sc, mn);
    q4_k_unpack(blk + 16, q);
    const int16x8_t mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        int32x4_t isum = vdupq_n_s32(0);
        for (int j = 0; j < 8; j++) {
            const int32x4_t s = dot16(dot16(vdupq_n_s32(0), q[2 * j], vld1q_s8(x->q + 32 * j)), q[2 * j + 1],
                                      vld1q_s8(x->q + 32 * j + 16));
            isum = vmlaq_n_s32(isum, s, sc[j]);
        }
        const int16x8_t sum32 = vld1q_s16(x->sum32);
        const int32_t msum =
            vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(mins), vget_low_s16(sum32)), mins, sum32));
        acc[m] += x->d * (d * (float)vaddvq_s32(isum)) - x->d * (dmin * (float)msum);
    }
}

/* Q6_K's 256 values 0..63 in weight order (q6_k_values), 16 per vector: vector j has scale j */
static inline void q6_k_unpack(const uint8_t *blk, int8x16_t *q) {
    const uint8x16_t low = vdupq_n_u8(0x0F), two = vdupq_n_u8(0x30);
    for (int h = 0; h < 2; h++)
        for (int p = 0; p < 2; p++) {
            const uint8x16_t a = vld1q_u8(blk + 64 * h + 16 * p), c = vld1q_u8(blk + 64 * h + 32 + 16 * p);
            const uint8x16_t hb = vld1q_u8(blk + 128 + 32 * h + 16 * p);
            q[8 * h + p] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(a, low), vandq_u8(vshlq_n_u8(hb, 4), two)));
            q[8 * h + 2 + p] = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(c, low), vandq_u8(vshlq_n_u8(hb, 2), two)));
            q[8 * h + 4 + p] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(a, 4), vandq_u8(hb, two)));
            q[8 * h + 6 + p] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(c, 4), vandq_u8(vshrq_n_u8(hb, 2), two)));
        }
}

VSK_NEON_INLINE void q6_k_step(int type, const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows,
                               float *acc) {
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = half(blk + 208);
    int8x16_t q[16];
    (void)type;
    q6_k_unpack(blk, q);
    const int8x16_t sc8 = vld1q_s8(sc);
    const int16x8_t sc0 = vmovl_s8(vget_low_s8(sc8)), sc1 = vmovl_high_s8(sc8);
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        int32x4_t isum = vdupq_n_s32(0);
        for (int j = 0; j < 16; j++)
            isum = vmlaq_n_s32(isum, dot16(vdupq_n_s32(0), q[j], vld1q_s8(x->q + 16 * j)), sc[j]);
        /* the values are offset by 32: 32 x sum_j scale_j bsum_j taken off */
        const int32_t total = vaddvq_s32(isum) - 32 * dot_s16x16(sc0, sc1, x->bsum);
        acc[m] += (d * x->d) * (float)total;
    }
}

/* Q2_K, Q3_K, Q5_K and IQ4_XS: a superblock as 16 vectors of levels (16 weights each, as vsk_kblock's
 * vsk_level), with a scale and a minimum per vector (vsk_kblock_scales), dotted as vsk_kblock_dot (vsk_blocks.h) */
typedef struct {
    int8x16_t level[16];
    int8_t scale[16];
    uint8_t min[16];
    uint16_t d, dmin; /* float16 bits */
} kblock_t;

/* weights 16j .. 16j + 15 of Q2_K's and Q3_K's 2-bit values: bits 2 (j / 2 % 4) of bytes 32 (j / 8) + 16 (j % 2)
 * .. of qs */
static inline uint8x16_t crumbs(const uint8_t *qs, int j) {
    return vandq_u8(vshlq_u8(vld1q_u8(qs + 32 * (j / 8) + 16 * (j % 2)), vdupq_n_s8((int8_t)(-2 * (j / 2 % 4)))),
                    vdupq_n_u8(3));
}

/* bit j / 2 of bytes 16 (j % 2) .. of `bits`, at bit `to` */
static inline uint8x16_t bit_of(const uint8_t *bits, int j, int to) {
    const uint8x16_t v = vld1q_u8(bits + 16 * (j % 2));
    return vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)(to - j / 2))), vdupq_n_u8((uint8_t)(1 << to)));
}

/* the levels of weights 16j .. 16j + 15 */
VSK_NEON_INLINE int8x16_t kblock_levels(int type, const uint8_t *blk, int j) {
    const uint8x16_t low = vdupq_n_u8(0x0F);
    if (type == VSK_Q2_K) return vreinterpretq_s8_u8(crumbs(blk + 16, j));
    if (type == VSK_Q3_K)
        return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(crumbs(blk + 32, j), bit_of(blk, j, 2))), vdupq_n_s8(4));
    if (type == VSK_Q5_K) {
        const uint8x16_t raw = vld1q_u8(blk + 48 + 32 * (j / 4) + 16 * (j % 2));
        const uint8x16_t nibble = j / 2 % 2 ? vshrq_n_u8(raw, 4) : vandq_u8(raw, low);
        return vreinterpretq_s8_u8(vorrq_u8(nibble, bit_of(blk + 16, j, 4)));
    }
    const uint8x16_t raw = vld1q_u8(blk + 8 + 16 * (j / 2)); /* VSK_IQ4_XS */
    return vqtbl1q_s8(vld1q_s8(vsk_iq4_levels), j % 2 ? vshrq_n_u8(raw, 4) : vandq_u8(raw, low));
}

VSK_NEON_INLINE void kblock_step(int type, const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows,
                                 float *acc) {
    const int mins = type == VSK_Q2_K || type == VSK_Q5_K;
    kblock_t k;
    vsk_kblock_scales(type, blk, &k.d, &k.dmin, k.scale, k.min);
    for (int j = 0; j < 16; j++) k.level[j] = kblock_levels(type, blk, j);
    const float d = vsk_fp16_to_fp32(k.d), dmin = vsk_fp16_to_fp32(k.dmin);
    const uint8x16_t mn = vld1q_u8(k.min);
    const int16x8_t min0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
    const int16x8_t min1 = vreinterpretq_s16_u16(vmovl_high_u8(mn));
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        int32x4_t isum = vdupq_n_s32(0);
        for (int j = 0; j < 16; j++)
            isum = vmlaq_n_s32(isum, dot16(vdupq_n_s32(0), k.level[j], vld1q_s8(x->q + 16 * j)), k.scale[j]);
        const int32_t msum = mins ? dot_s16x16(min0, min1, x->bsum) : 0;
        acc[m] += x->d * (d * (float)vaddvq_s32(isum)) - x->d * (dmin * (float)msum);
    }
}

VSK_FLOAT_ROWS(q4_k_rows, q4_k_step)
VSK_FLOAT_ROWS(q6_k_rows, q6_k_step)
VSK_FLOAT_ROWS(kblock_rows, kblock_step)

/* ---- dense types (F32, F16, BF16): the rule's 16 lanes in four vectors (vsk_dense.h) ---------------------- */

typedef float32x4_t dense_vec;

/* weights k .. k + 15 of a dense row as float32 (float16 and bfloat16 widen exactly) */
VSK_NEON_INLINE void dense_weights(int type, const uint8_t *row, int k, float32x4_t *w) {
    for (int v = 0; v < 4; v++) {
        if (type == VSK_F32) {
            w[v] = vld1q_f32((const float *)row + k + 4 * v);
        } else {
            const uint16x4_t h = vld1_u16((const uint16_t *)row + k + 4 * v);
            w[v] = type == VSK_F16 ? vcvt_f32_f16(vreinterpret_f16_u16(h)) : vreinterpretq_f32_u32(vshll_n_u16(h, 16));
        }
    }
}

#define VSK_DENSE_VECTORS 1
#include "vsk_dense.h"

/* the body serving each family of types (vsk_forms.h); MXFP4 runs the portable kernel */
#define ROWS_q32(entry, ...) entry(q32_rows, __VA_ARGS__)
#define ROWS_mxfp4(entry, ...)
#define ROWS_q4_k(entry, ...) entry(q4_k_rows, __VA_ARGS__)
#define ROWS_q6_k(entry, ...) entry(q6_k_rows, __VA_ARGS__)
#define ROWS_kblock(entry, ...) entry(kblock_rows, __VA_ARGS__)
#define ROWS_dense(entry, ...) entry(dense_rows, __VA_ARGS__)

VSK_ROW_KERNELS(NAME(vsk_kernel))

#endif /* __aarch64__ */
