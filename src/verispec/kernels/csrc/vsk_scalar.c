/* The portable path: plain C for every block type, the reference the vector paths are tested beside. */
#include <string.h>

#include "vsk.h"
#include "vsk_blocks.h"
#include "vsk_dense.h"


/* ---- 32-weight block types: unpack a block to signed values, then one integer dot per row ----------- */

static inline void unpack_q4_0(const uint8_t *b, int8_t *w, float *d, float *m) {
    *d = vsk_fp16_to_fp32(rd16(b));
    *m = 0.0f;
    for (int j = 0; j < 16; j++) {
        w[j] = (int8_t)((b[2 + j] & 0x0F) - 8);
        w[j + 16] = (int8_t)((b[2 + j] >> 4) - 8);
    }
}

static inline void unpack_q4_1(const uint8_t *b, int8_t *w, float *d, float *m) {
    *d = vsk_fp16_to_fp32(rd16(b));
    *m = vsk_fp16_to_fp32(rd16(b + 2));
    for (int j = 0; j < 16; j++) {
        w[j] = (int8_t)(b[4 + j] & 0x0F);
        w[j + 16] = (int8_t)(b[4 + j] >> 4);
    }
}

static inline void unpack_q5_0(const uint8_t *b, int8_t *w, float *d, float *m) {
    *d = vsk_fp16_to_fp32(rd16(b));
    *m = 0.0f;
    uint32_t qh = rd32(b + 2);
    for (int j = 0; j < 16; j++) {
        int lo = (b[6 + j] & 0x0F) | (int)(((qh >> j) & 1u) << 4);
        int hi = (b[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
        w[j] = (int8_t)(lo - 16);
        w[j + 16] = (int8_t)(hi - 16);
    }
}

static inline void unpack_q8_0(const uint8_t *b, int8_t *w, float *d, float *m) {
    *d = vsk_fp16_to_fp32(rd16(b));
    *m = 0.0f;
    memcpy(w, b + 2, 32);
}

static inline void unpack_iq4_nl(const uint8_t *b, int8_t *w, float *d, float *m) {
    *d = vsk_fp16_to_fp32(rd16(b));
    *m = 0.0f;
    for (int j = 0; j < 16; j++) {
        w[j] = vsk_iq4_levels[b[2 + j] & 0x0F];
        w[j + 16] = vsk_iq4_levels[b[2 + j] >> 4];
    }
}

static inline void unpack_mxfp4(const uint8_t *b, int8_t *w, float *d, float *m) {
    *d = vsk_e8m0_half(b[0]);
    *m = 0.0f;
    for (int j = 0; j < 16; j++) {
        w[j] = vsk_mxfp4_levels[b[1 + j] & 0x0F];
        w[j + 16] = vsk_mxfp4_levels[b[1 + j] >> 4];
    }
}

/* a block of a 32-weight type: its values w, its factor d and minimum mn (0 but for Q4_1) */
static inline void unpack32(int type, const uint8_t *b, int8_t *w, float *d, float *mn) {
    switch (type) {
    case VSK_Q4_0: unpack_q4_0(b, w, d, mn); break;
    case VSK_Q4_1: unpack_q4_1(b, w, d, mn); break;
    case VSK_Q5_0: unpack_q5_0(b, w, d, mn); break;
    case VSK_IQ4_NL: unpack_iq4_nl(b, w, d, mn); break;
    case VSK_MXFP4: unpack_mxfp4(b, w, d, mn); break;
    default: unpack_q8_0(b, w, d, mn); break;
    }
}

/* the steps of the row bodies (VSK_FLOAT_ROWS): one block of a weight row against each activation row */
static inline void q32_step(int type, const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows,
                            float *acc) {
    int8_t w[32];
    float d, mn;
    unpack32(type, blk, w, &d, &mn);
    for (int m = 0; m < rows; m++) {
        const vsk_act32 *x = vsk_act32_at(xq, x_stride, m, b);
        int32_t s = 0;
        for (int i = 0; i < 32; i++) s += (int32_t)w[i] * x->q[i];
        acc[m] += (d * x->d) * (float)s + mn * (x->d * (float)(x->half[0] + x->half[1]));
    }
}

/* ---- K-quants: 256 weights per block ---------------------------------------------------------------- */

/* Q4_K: per sub-block of 32 an integer sum times its scale, the minimums against the activations' sums of 16 */
static inline void q4_k_step(int type, const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows,
                             float *acc) {
    const float d = vsk_fp16_to_fp32(rd16(blk)), dmin = vsk_fp16_to_fp32(rd16(blk + 2));
    uint8_t sc[8], mn[8], q[256];
    (void)type;
    q4_k_scales(blk + 4, sc, mn);
    q4_k_values(blk + 16, q);
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += (int32_t)q[32 * j + i] * x->q[32 * j + i];
            isum += (int32_t)sc[j] * s;
            msum += (int32_t)mn[j] * (x->bsum[2 * j] + x->bsum[2 * j + 1]);
        }
        acc[m] += x->d * (d * (float)isum) - x->d * (dmin * (float)msum);
    }
}

/* Q6_K: per sub-block of 16 an integer sum less the values' offset of 32, times its scale */
static inline void q6_k_step(int type, const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows,
                             float *acc) {
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = vsk_fp16_to_fp32(rd16(blk + 208));
    uint8_t q[256];
    (void)type;
    q6_k_values(blk, q);
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int i = 0; i < 16; i++) s += (int32_t)q[16 * j + i] * x->q[16 * j + i];
            isum += (int32_t)sc[j] * (s - 32 * x->bsum[j]);
        }
        acc[m] += (d * x->d) * (float)isum;
    }
}

/* Q2_K, Q3_K, Q5_K and IQ4_XS: each superblock in the portable form (vsk_blocks.h), dotted with every row */
static inline void kblock_step(int type, const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows,
                               float *acc) {
    vsk_kblock k;
    vsk_kblock_of(type, blk, &k);
    for (int m = 0; m < rows; m++) acc[m] += vsk_kblock_dot(type, &k, vsk_act256_at(xq, x_stride, m, b));
}

VSK_FLOAT_ROWS(q32_rows, q32_step)
VSK_FLOAT_ROWS(q4_k_rows, q4_k_step)
VSK_FLOAT_ROWS(q6_k_rows, q6_k_step)
VSK_FLOAT_ROWS(kblock_rows, kblock_step)

/* ---- dense types (F32, F16, BF16) against float32 activations ------------------------------------------- */

/* The dense rule (every path computes these bits): y[m][n] sums x[m][k] w[n][k] in VSK_DENSE_LANES lanes, lane
 * l over k = l mod 16 ascending (k below K rounded down to 16), each product rounded and then added (no fused
 * multiply-add); the lanes are added by vsk_lane_tree, then the tail in index order (vsk_dense_tail). */
static inline void dense_rows(int type, const uint8_t *row, int K, const uint8_t *xq, size_t x_stride, int rows,
                              float *y, int ldy) {
    const int body = K / VSK_DENSE_LANES * VSK_DENSE_LANES;
    for (int m = 0; m < rows; m++) {
        const float *x = (const float *)(xq + (size_t)m * x_stride);
        float lanes[VSK_DENSE_LANES] = {0};
        for (int k = 0; k < body; k += VSK_DENSE_LANES)
            for (int l = 0; l < VSK_DENSE_LANES; l++) lanes[l] += x[k + l] * vsk_dense_value(type, row, k + l);
        y[(size_t)m * ldy] = vsk_dense_tail(type, vsk_lane_tree(lanes), row, x, K);
    }
}

/* the body serving each family of types (vsk_forms.h) */
#define ROWS_q32(entry, ...) entry(q32_rows, __VA_ARGS__)
#define ROWS_mxfp4(entry, ...) entry(q32_rows, __VA_ARGS__)
#define ROWS_q4_k(entry, ...) entry(q4_k_rows, __VA_ARGS__)
#define ROWS_q6_k(entry, ...) entry(q6_k_rows, __VA_ARGS__)
#define ROWS_kblock(entry, ...) entry(kblock_rows, __VA_ARGS__)
#define ROWS_dense(entry, ...) entry(dense_rows, __VA_ARGS__)

VSK_ROW_KERNELS(vsk_kernel_scalar)
