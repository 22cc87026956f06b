/* Rows of a GGUF matrix to float32 (the token embedding lookup), computed as the `gguf` package's
 * dequantization computes them, operation for operation, so the same bits. */
#include <string.h>

#include "vsk.h"
#include "vsk_dense.h"

#define VSK_API __attribute__((visibility("default")))

static float half(const uint8_t *p) { return vsk_fp16_to_fp32(rd16(p)); }

/* one block of a 32-weight type */
static void block32_floats(int type, const uint8_t *blk, float *out) {
    const float d = half(blk);
    if (type == VSK_Q8_0) {
        for (int i = 0; i < 32; i++) out[i] = (float)(int8_t)blk[2 + i] * d;
    } else if (type == VSK_IQ4_NL) {
        for (int i = 0; i < 16; i++) {
            out[i] = d * (float)vsk_iq4_levels[blk[2 + i] & 0x0F];
            out[i + 16] = d * (float)vsk_iq4_levels[blk[2 + i] >> 4];
        }
    } else if (type == VSK_Q4_1) {
        const float m = half(blk + 2);
        for (int i = 0; i < 16; i++) {
            out[i] = d * (float)(blk[4 + i] & 0x0F) + m;
            out[i + 16] = d * (float)(blk[4 + i] >> 4) + m;
        }
    } else { /* Q4_0, Q5_0 */
        const uint8_t *qs = blk + (type == VSK_Q5_0 ? 6 : 2);
        const uint32_t qh = type == VSK_Q5_0 ? rd32(blk + 2) : 0;
        const int offset = type == VSK_Q5_0 ? 16 : 8;
        for (int i = 0; i < 16; i++) {
            out[i] = d * (float)((int)((qs[i] & 0x0F) | (((qh >> i) & 1u) << 4)) - offset);
            out[i + 16] = d * (float)((int)((qs[i] >> 4) | (((qh >> (i + 16)) & 1u) << 4)) - offset);
        }
    }
}

/* one block of a 256-weight type: Q4_K, Q6_K, or the package's (d * scale) * level - dmin * min of the others (Q3_K
 * and IQ4_XS have no minimum: less 0, the same bits) */
static void block256_floats(int type, const uint8_t *blk, float *out) {
    uint8_t sc[8], mn[8], q[256];
    if (type == VSK_Q4_K) {
        q4_k_scales(blk + 4, sc, mn);
        q4_k_values(blk + 16, q);
        const float d = half(blk), dmin = half(blk + 2);
        for (int i = 0; i < 256; i++) out[i] = (d * (float)sc[i / 32]) * (float)q[i] - dmin * (float)mn[i / 32];
    } else if (type == VSK_Q6_K) {
        q6_k_values(blk, q);
        const float d = half(blk + 208);
        for (int i = 0; i < 256; i++) out[i] = (d * (float)(int8_t)blk[192 + i / 16]) * (float)((int)q[i] - 32);
    } else {
        vsk_kblock k;
        vsk_kblock_of(type, blk, &k);
        const float d = vsk_fp16_to_fp32(k.d), dmin = vsk_fp16_to_fp32(k.dmin);
        for (int i = 0; i < 256; i++)
            out[i] = (d * (float)k.scale[i / 16]) * (float)vsk_level(type, k.value[i]) - dmin * (float)k.min[i / 16];
    }
}

/* the types with a definition (MXFP4 has none) */
static int has_floats(int type) { return vsk_block_weights(type) > 0 && !vsk_is_tile(type) && type != VSK_MXFP4; }

int vsk_row_to_floats(int type, const uint8_t *row, int K, float *out) {
    const int weights = vsk_block_weights(type);
    if (!has_floats(type)) return -1;
    for (int b = 0; b < K / weights; b++, out += weights) {
        const uint8_t *blk = row + (size_t)b * (size_t)vsk_block_bytes(type);
        if (weights == 1) *out = vsk_dense_value(type, row, b);
        if (weights == 32) block32_floats(type, blk, out);
        if (weights == 256) block256_floats(type, blk, out);
    }
    return 0;
}

VSK_API int vsk_has_rows_to_floats(int type) {
    return vsk_row_to_floats(type, NULL, 0, NULL) == 0; /* a row of no values: only the type is looked at */
}

/* out[i] = row ids[i] of W (rows of `row_bytes` bytes, K values each) as float32; 0, or -1 for another type */
VSK_API int vsk_rows_to_floats(int type, const uint8_t *W, size_t row_bytes, const int64_t *ids, int count, int K,
                               float *out) {
    for (int i = 0; i < count; i++)
        if (vsk_row_to_floats(type, W + (size_t)ids[i] * row_bytes, K, out + (size_t)i * K)) return -1;
    return 0;
}
