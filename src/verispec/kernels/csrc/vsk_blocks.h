/* GGUF block layouts (as ggml stores them), shared by every path. */
#ifndef VSK_BLOCKS_H
#define VSK_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "vsk.h"

#define Q4_K_BYTES 144 /* f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles */
#define Q6_K_BYTES 210 /* 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, f16 d */

/* the tile forms' blocks of 16 rows (layouts: vsk_tiles.c) */
#define T4K_BYTES 2368 /* 256 weights */
#define T6K_BYTES 3360 /* 256 weights */
#define T40_BYTES 288  /* 32 weights */
#define T41_BYTES 320  /* 32 weights */
#define T50_BYTES 352  /* 32 weights */
#define T80_BYTES 544  /* 32 weights */

#define MAX_ROWS 16 /* activation rows handled per sweep over the weights; more rows take more sweeps */

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

/* weight k of a dense row (F32, F16, BF16) as float32: float16 and bfloat16 convert exactly */
static inline float vsk_dense_value(int type, const uint8_t *row, int k) {
    float v;
    if (type == VSK_F32) {
        memcpy(&v, row + 4 * (size_t)k, 4);
        return v;
    }
    const uint16_t h = rd16(row + 2 * (size_t)k);
    if (type == VSK_F16) return vsk_fp16_to_fp32(h);
    const uint32_t bits = (uint32_t)h << 16;
    memcpy(&v, &bits, 4);
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

/* a vsk_kernel (vsk.h) running `body(variant, ...)`: the tile forms of one family share one body per path */
#define VSK_TILE_ENTRY(name, body, variant)                                                                     \
    static void name(const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,              \
                     size_t x_stride, int M, float *y, int ldy) {                                              \
        (void)row_bytes;                                                                                       \
        body(variant, W, n0, n1, K, xq, x_stride, M, y, ldy);                                                  \
    }

/* a vsk_kernel running `body(variant, ...)` with the rows' byte stride (the row layouts' kernels) */
#define VSK_ROW_ENTRY(name, body, variant)                                                                      \
    static void name(const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,              \
                     size_t x_stride, int M, float *y, int ldy) {                                              \
        body(variant, W, row_bytes, n0, n1, K, xq, x_stride, M, y, ldy);                                       \
    }

#endif
