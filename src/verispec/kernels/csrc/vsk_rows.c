/* The portable definitions of the per-row steps (vsk_rows.h). */
#include <math.h>

#include "vsk_math.h"
#include "vsk_rows.h"

/* symmetric 8-bit over one block of n values: d = max|x| / 127, q = round(x / d) (as x * (127 / max|x|));
 * writes q and its sums over each 16 values (sums16[n / 16]); returns d */
static float quantize_block(const float *x, int n, int8_t *q, int16_t *sums16) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (int8_t)vsk_round(x[i] * id);
    for (int j = 0; j < n / 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += q[16 * j + i];
        sums16[j] = (int16_t)s;
    }
    return amax / 127.0f;
}

/* per 32 values; half[h] = the sum of q over values 16h .. 16h + 15 */
static void quantize32(const float *x, int K, vsk_act32 *out) {
    for (int b = 0; b < K / 32; b++) out[b].d = quantize_block(x + 32 * b, 32, out[b].q, out[b].half);
}

/* per 256 values, with the sums of q over each 16 (bsum) and each 32 (sum32) */
static void quantize256(const float *x, int K, vsk_act256 *out) {
    for (int b = 0; b < K / 256; b++) {
        out[b].d = quantize_block(x + 256 * b, 256, out[b].q, out[b].bsum);
        for (int j = 0; j < 8; j++) out[b].sum32[j] = (int16_t)(out[b].bsum[2 * j] + out[b].bsum[2 * j + 1]);
    }
}

static float sum_squares(const float *x, int n) {
    float lanes[VSK_SQUARE_LANES] = {0};
    const int body = n / VSK_SQUARE_LANES * VSK_SQUARE_LANES;
    for (int i = 0; i < body; i += VSK_SQUARE_LANES)
        for (int l = 0; l < VSK_SQUARE_LANES; l++) lanes[l] += x[i + l] * x[i + l];
    float sum = vsk_lane_tree(lanes);
    for (int i = body; i < n; i++) sum += x[i] * x[i];
    return sum;
}

static void swiglu(const float *gate, const float *up, float *out, int n) {
    for (int i = 0; i < n; i++) out[i] = gate[i] / (1.0f + vsk_exp(-gate[i])) * up[i];
}

/* as torch.argmax: the first maximum, or the first NaN */
static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) return i;
        if (x[i] > x[best]) best = i;
    }
    return best;
}

static const vsk_row_ops portable = {quantize32, quantize256, sum_squares, swiglu, argmax};

const vsk_row_ops *vsk_rows_portable(void) { return &portable; }
