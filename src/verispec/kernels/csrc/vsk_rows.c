/* The portable definitions of the per-row steps (vsk_rows.h). */
#include <math.h>

#include "vsk_math.h"
#include "vsk_rows.h"

/* symmetric 8-bit per 32 values: d = max|x| / 127, q = round(x / d) (as x * (127 / max|x|)); half[h] = the sum
 * of q over values 16h .. 16h + 15 */
static void quantize32(const float *x, int K, vsk_act32 *out) {
    for (int b = 0; b < K / 32; b++, x += 32) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        out[b].d = amax / 127.0f;
        for (int i = 0; i < 32; i++) out[b].q[i] = (int8_t)vsk_round(x[i] * id);
        for (int h = 0; h < 2; h++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += out[b].q[16 * h + i];
            out[b].half[h] = (int16_t)s;
        }
    }
}

/* the same per 256 values, with the sums of q over each 16 (bsum) and each 32 (sum32) */
static void quantize256(const float *x, int K, vsk_act256 *out) {
    for (int b = 0; b < K / 256; b++, x += 256) {
        float amax = 0.0f;
        for (int i = 0; i < 256; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        out[b].d = amax / 127.0f;
        for (int i = 0; i < 256; i++) out[b].q[i] = (int8_t)vsk_round(x[i] * id);
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += out[b].q[16 * j + i];
            out[b].bsum[j] = (int16_t)s;
        }
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

static const vsk_row_ops portable = {quantize32, quantize256, sum_squares, swiglu};

const vsk_row_ops *vsk_rows_portable(void) { return &portable; }
