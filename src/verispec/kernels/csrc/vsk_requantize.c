/* Rows of a GGUF matrix requantized to Q4_0, for a cheaper draft head (models/draft_head.py): the draft only proposes
 * tokens, so a coarser head changes which tokens it proposes, never the output. ggml's reference rounding, as
 * the `gguf` package writes it: per 32 values d = (the first value of largest magnitude) / -8, q = min(15,
 * trunc(x / d + 8.5)) in float32, d stored as float16. */
#include <stdlib.h>
#include <string.h>

#include "vsk.h"

#define VSK_API __attribute__((visibility("default")))
#define Q4_0_BYTES 18

static void to_q4_0(const float *x, int K, uint8_t *out) {
    for (int b = 0; b < K / 32; b++, x += 32, out += Q4_0_BYTES) {
        float amax = x[0] < 0 ? -x[0] : x[0], max = x[0]; /* the first of largest magnitude, as argmax */
        for (int i = 1; i < 32; i++) {
            const float a = x[i] < 0 ? -x[i] : x[i];
            if (a > amax) {
                amax = a;
                max = x[i];
            }
        }
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t half = vsk_fp32_to_fp16(d);
        memcpy(out, &half, 2);
        for (int j = 0; j < 16; j++) {
            const int lo = (int)(int8_t)(x[j] * id + 8.5f), hi = (int)(int8_t)(x[16 + j] * id + 8.5f);
            out[2 + j] = (uint8_t)((lo < 15 ? lo : 15) | ((hi < 15 ? hi : 15) << 4));
        }
    }
}

typedef struct {
    int type, K;
    const uint8_t *W;
    size_t row_bytes;
    const int64_t *ids;
    uint8_t *out;
    int failed;
} requantize_t;

static void requantize_rows(const void *ctx, int begin, int end) {
    requantize_t *r = (requantize_t *)ctx;
    float *row = malloc(sizeof(float) * (size_t)r->K);
    for (int i = begin; i < end && row; i++) {
        if (vsk_row_to_floats(r->type, r->W + (size_t)r->ids[i] * r->row_bytes, r->K, row)) {
            r->failed = 1;
            break;
        }
        to_q4_0(row, r->K, r->out + (size_t)i * (size_t)(r->K / 32) * Q4_0_BYTES);
    }
    if (!row) r->failed = 1;
    free(row);
}

/* out (count rows of K / 32 Q4_0 blocks) = rows ids[i] of W (rows of `row_bytes` bytes, K values each, K a
 * multiple of 32) requantized; 0, or -1 for a type without a dequantization (vsk_row_to_floats) */
VSK_API int vsk_requantize_q4_0(int type, const uint8_t *W, size_t row_bytes, const int64_t *ids, int count, int K,
                                uint8_t *out) {
    if (K % 32) return -1;
    requantize_t r = {type, K, W, row_bytes, ids, out, 0};
    vsk_parallel_for(requantize_rows, &r, count);
    return r.failed ? -1 : 0;
}
