/* GGUF block layouts (as ggml stores them), shared by every path. */
#ifndef VSK_BLOCKS_H
#define VSK_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "vsk.h"

#define MAX_ROWS 16 /* activation rows handled per sweep over the weights; more rows take more sweeps */

/* whether a 256-weight tile form scales its weights per 16 (T6_K, T3_K, T2_K: the groups 0..3 and 4..7 of 32
 * weights have their own scales) rather than per 32 */
static inline int vsk_sub16(int form) { return form == VSK_T6_K || form == VSK_T3_K || form == VSK_T2_K; }

/* activation block b of row m, rows x_stride bytes apart */
static inline const vsk_act32 *vsk_act32_at(const uint8_t *xq, size_t x_stride, int m, int b) {
    return (const vsk_act32 *)(xq + (size_t)m * x_stride) + b;
}

static inline const vsk_act256 *vsk_act256_at(const uint8_t *xq, size_t x_stride, int m, int b) {
    return (const vsk_act256 *)(xq + (size_t)m * x_stride) + b;
}

/* A row body (vsk_forms.h) `name` that accumulates each output in one float (the portable and NEON paths'), block
 * by block along the row: step(type, blk, xq, x_stride, b, rows, acc) adds the block's products with activation
 * block b of each row m < rows to acc[m]. */
#define VSK_FLOAT_ROWS(name, step)                                                                              \
    static inline __attribute__((always_inline)) void name(int type, const uint8_t *row, int K, const uint8_t *xq, \
                                                           size_t x_stride, int rows, float *y, int ldy) {     \
        float acc[MAX_ROWS] = {0};                                                                              \
        for (int b = 0; b < K / vsk_block_weights(type); b++)                                                   \
            step(type, row + (size_t)b * (size_t)vsk_block_bytes(type), xq, x_stride, b, rows, acc);            \
        for (int m = 0; m < rows; m++) y[(size_t)m * ldy] = acc[m];                                             \
    }

/* bytes of a strip of 16 rows of a tile form, K values each */
static inline size_t vsk_strip_bytes(int form, int K) {
    return (size_t)(K / vsk_block_weights(form)) * (size_t)vsk_block_bytes(form);
}

static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Q4_K: the 8 sub-block scales and mins (6 bits each, packed in 12 bytes) */
static inline void q4_k_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
    }
    for (int j = 4; j < 8; j++) {
        sc[j] = (uint8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        mn[j] = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q4_K: the 256 values 0..15 in weight order (each 32 bytes hold weights 64c..64c+31 in their low nibbles
 * and 64c+32..64c+63 in their high nibbles); value v belongs to sub-block v / 32 */
static inline void q4_k_values(const uint8_t *qs, uint8_t *q) {
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = qs[32 * c + l] & 0x0F;
            q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
    }
}

/* Q6_K: the 256 values 0..63 (the weight is d * scale[v / 16] * (value - 32)) */
static inline void q6_k_values(const uint8_t *blk, uint8_t *q) {
    const uint8_t *ql = blk, *qh = blk + 128;
    for (int h = 0; h < 2; h++, ql += 64, qh += 32, q += 128) {
        for (int l = 0; l < 32; l++) {
            q[l] = (uint8_t)((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4));
            q[l + 32] = (uint8_t)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
            q[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            q[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}

/* IQ4_NL and IQ4_XS: the weight of a 4-bit index i is (its block's scale) x vsk_iq4_levels[i] */
static const int8_t vsk_iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* MXFP4 (gpt-oss's experts): 17-byte blocks of 32, an E8M0 exponent e then 16 bytes of nibbles (weights 0..15 low,
 * 16..31 high); the weight of nibble i is 2^(e - 128) x vsk_mxfp4_levels[i], E2M1's values doubled (ggml's
 * kvalues_mxfp4 and GGML_E8M0_TO_FP32_HALF: the same products as ggml's) */
static const int8_t vsk_mxfp4_levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float vsk_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23; /* 2^(e - 128), e < 2 subnormal */
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Q5_K: the 256 values 0..31 in weight order: Q4_K's nibbles (after the 32 bytes of fifth bits), and the fifth
 * bit of weight 32b + l in bit b of byte l */
static inline void q5_k_values(const uint8_t *blk, uint8_t *q) {
    q4_k_values(blk + 48, q);
    for (int i = 0; i < 256; i++) q[i] |= (uint8_t)(((blk[16 + i % 32] >> (i / 32)) & 1) << 4);
}

/* Q3_K: the 256 values 0..7 (the weight is d * scale[v / 16] * (value - 4)): weight 128h + 32s + l has its low
 * two bits at bit 2s of qs[32h + l] and its third bit at bit (weight / 32) of hmask[l] */
static inline void q3_k_values(const uint8_t *blk, uint8_t *q) {
    const uint8_t *hmask = blk, *qs = blk + 32;
    for (int i = 0; i < 256; i++) {
        const int low = (qs[32 * (i / 128) + i % 32] >> (2 * (i / 32 % 4))) & 3;
        q[i] = (uint8_t)(low | (((hmask[i % 32] >> (i / 32)) & 1) << 2));
    }
}

/* Q3_K: the 16 scales (6 bits less 32: -32..31), packed in 12 bytes: the low 4 bits of scale j in byte j % 8
 * (nibble j / 8), the high 2 in byte 8 + j % 4 (bits 2 (j / 4)) */
static inline void q3_k_scales(const uint8_t *s, int8_t *sc) {
    for (int j = 0; j < 16; j++) {
        const int low = (s[j % 8] >> (4 * (j / 8))) & 0x0F, high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int8_t)((low | (high << 4)) - 32);
    }
}

/* Q2_K: the 256 values 0..3, laid out as Q3_K's low two bits */
static inline void q2_k_values(const uint8_t *qs, uint8_t *q) {
    for (int i = 0; i < 256; i++) q[i] = (qs[32 * (i / 128) + i % 32] >> (2 * (i / 32 % 4))) & 3;
}

/* IQ4_XS: the scale of sub-block j (6 bits less 32: the low 4 in a nibble of scales_l, the high 2 in scales_h) */
static inline int8_t iq4_xs_scale(const uint8_t *blk, int j) {
    const uint16_t high = rd16(blk + 2);
    return (int8_t)((((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F) | (((high >> (2 * j)) & 3) << 4)) - 32);
}

/* IQ4_XS: the 256 indices (sub-block j: weights 32j + l and 32j + 16 + l in the low and high nibble of byte
 * 16j + l) */
static inline void iq4_xs_values(const uint8_t *blk, uint8_t *q) {
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 16; l++) {
            q[32 * j + l] = blk[8 + 16 * j + l] & 0x0F;
            q[32 * j + 16 + l] = blk[8 + 16 * j + l] >> 4;
        }
}

/* A superblock of Q2_K, Q3_K, Q5_K or IQ4_XS in one portable form: the weight i is
 *   d * scale[i / 16] * level(value[i]) - dmin * min[i / 16]
 * (level: the value itself, value - 4 for Q3_K, vsk_iq4_levels[value] for IQ4_XS; Q5_K's and IQ4_XS's scales
 * of 32 weights repeated for both halves; dmin and min zero where the type has none). The portable products and
 * the portable tile kernels of these types both go through it, so they compute the same bits. */
typedef struct {
    uint16_t d, dmin; /* float16 bits */
    int8_t scale[16];
    uint8_t min[16];
    uint8_t value[256];
} vsk_kblock;

static inline int vsk_level(int type, int value) {
    return type == VSK_Q3_K ? value - 4 : type == VSK_IQ4_XS ? vsk_iq4_levels[value] : value;
}

/* the factors, scales and minimums of the GGUF superblock `blk` of `type` (zero where it has none) */
static inline void vsk_kblock_scales(int type, const uint8_t *blk, uint16_t *d, uint16_t *dmin, int8_t *scale,
                                     uint8_t *min) {
    uint8_t sc[8], mn[8];
    *dmin = 0;
    memset(min, 0, 16);
    if (type == VSK_Q2_K) {
        *d = rd16(blk + 80);
        *dmin = rd16(blk + 82);
        for (int j = 0; j < 16; j++) {
            scale[j] = (int8_t)(blk[j] & 0x0F);
            min[j] = blk[j] >> 4;
        }
    } else if (type == VSK_Q3_K) {
        *d = rd16(blk + 108);
        q3_k_scales(blk + 96, scale);
    } else if (type == VSK_Q5_K) {
        *d = rd16(blk);
        *dmin = rd16(blk + 2);
        q4_k_scales(blk + 4, sc, mn);
        for (int j = 0; j < 16; j++) {
            scale[j] = (int8_t)sc[j / 2];
            min[j] = mn[j / 2];
        }
    } else { /* VSK_IQ4_XS */
        *d = rd16(blk);
        for (int j = 0; j < 16; j++) scale[j] = iq4_xs_scale(blk, j / 2);
    }
}

/* the GGUF superblock `blk` of `type` */
static inline void vsk_kblock_of(int type, const uint8_t *blk, vsk_kblock *k) {
    vsk_kblock_scales(type, blk, &k->d, &k->dmin, k->scale, k->min);
    if (type == VSK_Q2_K) q2_k_values(blk + 16, k->value);
    if (type == VSK_Q3_K) q3_k_values(blk, k->value);
    if (type == VSK_Q5_K) q5_k_values(blk, k->value);
    if (type == VSK_IQ4_XS) iq4_xs_values(blk, k->value);
}

/* the superblock's product with one activation block: integer sums per 16 weights meet their integer scales, the
 * minimums meet the activations' sums of 16, then one float step each (|sums| < 2^31: at most 256 x 127 x 127 x 32) */
static inline float vsk_kblock_dot(int type, const vsk_kblock *k, const vsk_act256 *x) {
    int32_t isum = 0, msum = 0;
    for (int j = 0; j < 16; j++) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++) s += vsk_level(type, k->value[16 * j + i]) * x->q[16 * j + i];
        isum += k->scale[j] * s;
        msum += k->min[j] * x->bsum[j];
    }
    const float d = vsk_fp16_to_fp32(k->d), dmin = vsk_fp16_to_fp32(k->dmin);
    return x->d * (d * (float)isum) - x->d * (dmin * (float)msum);
}

#endif
