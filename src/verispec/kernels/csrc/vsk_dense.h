/* The dense types (F32, F16, BF16) against float32 activations: the rule every path computes (the portable body,
 * vsk_scalar.c), its end, and the body of the vector paths. */
#ifndef VSK_DENSE_H
#define VSK_DENSE_H

#include <string.h>

#include "vsk_blocks.h"
#include "vsk_rows.h"

#define VSK_DENSE_LANES 16 /* the rule's lanes, added by vsk_lane_tree */

/* weight k of a dense row as float32: float16 and bfloat16 convert exactly */
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

/* one output's end: the sum of its lanes (by vsk_lane_tree), then the tail (k from K rounded down to 16) in index
 * order */
static inline float vsk_dense_tail(int type, float sum, const uint8_t *row, const float *x, int K) {
    for (int k = K / VSK_DENSE_LANES * VSK_DENSE_LANES; k < K; k++) sum += x[k] * vsk_dense_value(type, row, k);
    return sum;
}

#if defined(VSK_DENSE_VECTORS)
/* The vector paths' body (vsk_avx2.c, vsk_neon.c), which define before including this their vector of floats
 * `dense_vec` (arithmetic through GCC's vector extensions: lane by lane, a product rounded and then added, as the
 * rule) and dense_weights(type, row, k, w): the weights k .. k + 15 of a dense row as float32 in w[]. */
#define DENSE_ROWS 4                                          /* activation rows sharing a load of the weights */
#define DENSE_VECS (VSK_DENSE_LANES * 4 / (int)sizeof(dense_vec)) /* vectors of the 16 lanes */

/* vsk_lane_tree over the 16 lanes in registers: lane i + lane i + 8 first, for every i < 8 at once */
static inline float lane_tree(const dense_vec *acc) {
    enum { PER = (int)(sizeof(dense_vec) / sizeof(float)) }; /* lanes per vector */
    dense_vec e[DENSE_VECS / 2];
    for (int v = 0; v < DENSE_VECS / 2; v++) e[v] = acc[v] + acc[v + DENSE_VECS / 2];
#define E(i) e[(i) / PER][(i) % PER]
    return ((E(0) + E(4)) + (E(2) + E(6))) + ((E(1) + E(5)) + (E(3) + E(7)));
#undef E
}

static inline __attribute__((always_inline)) void dense_rows(int type, const uint8_t *row, int K, const uint8_t *xq,
                                                             size_t x_stride, int rows, float *y, int ldy) {
    const int body = K / VSK_DENSE_LANES * VSK_DENSE_LANES;
    for (int r0 = 0; r0 < rows; r0 += DENSE_ROWS) {
        const int count = rows - r0 < DENSE_ROWS ? rows - r0 : DENSE_ROWS;
        dense_vec acc[DENSE_ROWS][DENSE_VECS], w[DENSE_VECS], x, zero;
        memset(&zero, 0, sizeof zero);
        for (int m = 0; m < count; m++)
            for (int v = 0; v < DENSE_VECS; v++) acc[m][v] = zero;
        for (int k = 0; k < body; k += VSK_DENSE_LANES) {
            dense_weights(type, row, k, w);
            for (int m = 0; m < count; m++)
                for (int v = 0; v < DENSE_VECS; v++) {
                    const float *at = (const float *)(xq + (size_t)(r0 + m) * x_stride) + k;
                    memcpy(&x, at + v * (int)(sizeof x / sizeof(float)), sizeof x);
                    acc[m][v] += x * w[v];
                }
        }
        for (int m = 0; m < count; m++)
            y[(size_t)(r0 + m) * ldy] =
                vsk_dense_tail(type, lane_tree(acc[m]), row, (const float *)(xq + (size_t)(r0 + m) * x_stride), K);
    }
}
#endif

#endif
