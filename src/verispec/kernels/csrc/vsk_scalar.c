/* The portable path: plain C for every block type, the reference the vector paths are tested beside. */
#include <string.h>

#include "vsk.h"
#include "vsk_blocks.h"
#include "vsk_rows.h"


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

typedef void (*unpack32)(const uint8_t *, int8_t *, float *, float *);

static void sweep32(unpack32 unpack, size_t block_bytes, const uint8_t *W, size_t row_bytes, int n0, int n1,
                    int K, const uint8_t *xq, size_t x_stride, int M, float *y, int ldy) {
    const int blocks = K / 32;
    for (int r0 = 0; r0 < M; r0 += MAX_ROWS) {
        const int rows = M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS;
        for (int n = n0; n < n1; n++) {
            float acc[MAX_ROWS] = {0};
            const uint8_t *row = W + (size_t)n * row_bytes;
            for (int b = 0; b < blocks; b++) {
                int8_t w[32];
                float d, mn;
                unpack(row + (size_t)b * block_bytes, w, &d, &mn);
                for (int m = 0; m < rows; m++) {
                    const vsk_act32 *x = (const vsk_act32 *)(xq + (size_t)(r0 + m) * x_stride) + b;
                    int32_t s = 0;
                    for (int i = 0; i < 32; i++) s += (int32_t)w[i] * x->q[i];
                    acc[m] += (d * x->d) * (float)s + mn * (x->d * (float)(x->half[0] + x->half[1]));
                }
            }
            for (int m = 0; m < rows; m++) y[(size_t)(r0 + m) * ldy + n] = acc[m];
        }
    }
}

#define SWEEP32(name, block_bytes)                                                                           \
    static void kernel_##name(const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,  \
                              size_t x_stride, int M, float *y, int ldy) {                                   \
        sweep32(unpack_##name, block_bytes, W, row_bytes, n0, n1, K, xq, x_stride, M, y, ldy);               \
    }
SWEEP32(q4_0, 18)
SWEEP32(q4_1, 20)
SWEEP32(q5_0, 22)
SWEEP32(q8_0, 34)
SWEEP32(iq4_nl, 18)
SWEEP32(mxfp4, 17)

/* ---- K-quants: 256 weights per block ---------------------------------------------------------------- */

static void kernel_q4_k(const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,
                        size_t x_stride, int M, float *y, int ldy) {
    const int blocks = K / 256;
    for (int r0 = 0; r0 < M; r0 += MAX_ROWS) {
        const int rows = M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS;
        for (int n = n0; n < n1; n++) {
            float acc[MAX_ROWS] = {0};
            const uint8_t *row = W + (size_t)n * row_bytes;
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk = row + (size_t)b * Q4_K_BYTES;
                const float d = vsk_fp16_to_fp32(rd16(blk)), dmin = vsk_fp16_to_fp32(rd16(blk + 2));
                uint8_t sc[8], mn[8], q[256];
                q4_k_scales(blk + 4, sc, mn);
                q4_k_values(blk + 16, q);
                for (int m = 0; m < rows; m++) {
                    const vsk_act256 *x = (const vsk_act256 *)(xq + (size_t)(r0 + m) * x_stride) + b;
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
            for (int m = 0; m < rows; m++) y[(size_t)(r0 + m) * ldy + n] = acc[m];
        }
    }
}

static void kernel_q6_k(const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,
                        size_t x_stride, int M, float *y, int ldy) {
    const int blocks = K / 256;
    for (int r0 = 0; r0 < M; r0 += MAX_ROWS) {
        const int rows = M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS;
        for (int n = n0; n < n1; n++) {
            float acc[MAX_ROWS] = {0};
            const uint8_t *row = W + (size_t)n * row_bytes;
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk = row + (size_t)b * Q6_K_BYTES;
                const int8_t *sc = (const int8_t *)(blk + 192);
                const float d = vsk_fp16_to_fp32(rd16(blk + 208));
                uint8_t q[256];
                q6_k_values(blk, q);
                for (int m = 0; m < rows; m++) {
                    const vsk_act256 *x = (const vsk_act256 *)(xq + (size_t)(r0 + m) * x_stride) + b;
                    int32_t isum = 0;
                    for (int j = 0; j < 16; j++) {
                        int32_t s = 0;
                        for (int i = 0; i < 16; i++) s += (int32_t)q[16 * j + i] * x->q[16 * j + i];
                        isum += (int32_t)sc[j] * (s - 32 * x->bsum[j]);
                    }
                    acc[m] += (d * x->d) * (float)isum;
                }
            }
            for (int m = 0; m < rows; m++) y[(size_t)(r0 + m) * ldy + n] = acc[m];
        }
    }
}

/* Q2_K, Q3_K, Q5_K and IQ4_XS: each superblock in the portable form (vsk_blocks.h), dotted with every row */
static void kblock_kernel(int type, const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,
                          size_t x_stride, int M, float *y, int ldy) {
    const int blocks = K / 256;
    const size_t block_bytes = (size_t)vsk_kblock_bytes(type);
    for (int r0 = 0; r0 < M; r0 += MAX_ROWS) {
        const int rows = M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS;
        for (int n = n0; n < n1; n++) {
            float acc[MAX_ROWS] = {0};
            for (int b = 0; b < blocks; b++) {
                vsk_kblock k;
                vsk_kblock_of(type, W + (size_t)n * row_bytes + (size_t)b * block_bytes, &k);
                for (int m = 0; m < rows; m++)
                    acc[m] += vsk_kblock_dot(type, &k, (const vsk_act256 *)(xq + (size_t)(r0 + m) * x_stride) + b);
            }
            for (int m = 0; m < rows; m++) y[(size_t)(r0 + m) * ldy + n] = acc[m];
        }
    }
}

VSK_ROW_ENTRY(kernel_q2_k, kblock_kernel, VSK_Q2_K)
VSK_ROW_ENTRY(kernel_q3_k, kblock_kernel, VSK_Q3_K)
VSK_ROW_ENTRY(kernel_q5_k, kblock_kernel, VSK_Q5_K)
VSK_ROW_ENTRY(kernel_iq4_xs, kblock_kernel, VSK_IQ4_XS)

/* ---- dense types (F32, F16, BF16) against float32 activations ------------------------------------------- */

/* The dense rule (every path computes these bits): y[m][n] sums x[m][k] w[n][k] in VSK_DENSE_LANES lanes, lane
 * l over k = l mod 16 ascending (k below K rounded down to 16), each product rounded and then added (no fused
 * multiply-add); the lanes are added by vsk_lane_tree, then the tail in index order. */
static void dense_kernel(int type, const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,
                         size_t x_stride, int M, float *y, int ldy) {
    const int body = K / VSK_DENSE_LANES * VSK_DENSE_LANES;
    for (int n = n0; n < n1; n++) {
        const uint8_t *row = W + (size_t)n * row_bytes;
        for (int m = 0; m < M; m++) {
            const float *x = (const float *)(xq + (size_t)m * x_stride);
            float lanes[VSK_DENSE_LANES] = {0};
            for (int k = 0; k < body; k += VSK_DENSE_LANES)
                for (int l = 0; l < VSK_DENSE_LANES; l++) lanes[l] += x[k + l] * vsk_dense_value(type, row, k + l);
            float sum = vsk_lane_tree(lanes);
            for (int k = body; k < K; k++) sum += x[k] * vsk_dense_value(type, row, k);
            y[(size_t)m * ldy + n] = sum;
        }
    }
}

VSK_ROW_ENTRY(kernel_f32, dense_kernel, VSK_F32)
VSK_ROW_ENTRY(kernel_f16, dense_kernel, VSK_F16)
VSK_ROW_ENTRY(kernel_bf16, dense_kernel, VSK_BF16)

vsk_kernel vsk_kernel_scalar(int type) {
    switch (type) {
    case VSK_Q4_0: return kernel_q4_0;
    case VSK_Q4_1: return kernel_q4_1;
    case VSK_Q5_0: return kernel_q5_0;
    case VSK_Q8_0: return kernel_q8_0;
    case VSK_Q4_K: return kernel_q4_k;
    case VSK_Q6_K: return kernel_q6_k;
    case VSK_Q2_K: return kernel_q2_k;
    case VSK_Q3_K: return kernel_q3_k;
    case VSK_Q5_K: return kernel_q5_k;
    case VSK_IQ4_NL: return kernel_iq4_nl;
    case VSK_MXFP4: return kernel_mxfp4;
    case VSK_IQ4_XS: return kernel_iq4_xs;
    case VSK_F32: return kernel_f32;
    case VSK_F16: return kernel_f16;
    case VSK_BF16: return kernel_bf16;
    default: return NULL;
    }
}
