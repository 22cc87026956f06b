/* Per-row elementwise steps of a pass (activation quantization, RMSNorm's sum of squares, SwiGLU, argmax), with one
 * portable definition each and vector paths that compute the very same bits: the same operations in the same
 * order per element (no fused multiply-adds, integer sums exact, maxima order-free). So a row's result does
 * not depend on the path, and never on the other rows. */
#ifndef VSK_ROWS_H
#define VSK_ROWS_H

#include <math.h>

#include "vsk.h"

/* RMSNorm's sum of squares in a fixed order: 16 lanes (lane j sums x[i]^2 for i = j mod 16, i ascending,
 * for i below n rounded down to 16), added as a pairwise tree, then the tail in index order */
#define VSK_SQUARE_LANES 16

typedef struct {
    void (*quantize32)(const float *x, int K, vsk_act32 *out);   /* K a multiple of 32 */
    void (*quantize256)(const float *x, int K, vsk_act256 *out); /* K a multiple of 256 */
    float (*sum_squares)(const float *x, int n);
    void (*swiglu)(const float *gate, const float *up, float *out, int n); /* silu(gate) * up */
    int (*argmax)(const float *x, int n); /* the first index of the largest (a NaN counts as largest), n >= 1 */
} vsk_row_ops;

/* the ops of the current path (vsk_get_isa; chosen in vsk_core.c), and of each path */
const vsk_row_ops *vsk_rows(void);
const vsk_row_ops *vsk_rows_portable(void);
const vsk_row_ops *vsk_rows_avx2(void); /* NULL off x86-64 */
const vsk_row_ops *vsk_rows_neon(void); /* NULL off AArch64 */

/* the pairwise tree over 16 lanes (the sum of squares', the dense products'), shared by every path */
static inline float vsk_lane_tree(const float *l) {
    return (((l[0] + l[8]) + (l[4] + l[12])) + ((l[2] + l[10]) + (l[6] + l[14]))) +
           (((l[1] + l[9]) + (l[5] + l[13])) + ((l[3] + l[11]) + (l[7] + l[15])));
}

/* The vector paths' argmax ends: the largest of best and x[i .. n - 1], noting a NaN in *nan (the path then takes the
 * portable scan, which finds the first one); the first index from i on that holds best (0: none) */
static inline float vsk_top_from(const float *x, int i, int n, float best, int *nan) {
    for (; i < n; i++) {
        *nan |= isnan(x[i]);
        best = x[i] > best ? x[i] : best;
    }
    return best;
}

static inline int vsk_first_from(const float *x, int i, int n, float best) {
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0;
}

#endif
