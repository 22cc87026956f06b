/* Tile formats: GGUF weights repacked losslessly so that one vector instruction serves 16 weight
 * rows. A strip holds 16 rows; per 256-weight superblock it stores the rows' float16 factors, their
 * sub-block scales as bytes, and the values interleaved: for every 32 weights of a sub-block, 16 lanes
 * (one per row) of 4 bytes, byte c of lane n of chunk i holding row n's weight 4i + c in its low nibble
 * and weight 16 + 4i + c in its high nibble. A 4-byte group of activations, broadcast to all lanes, then
 * meets 16 rows' weights in one u8 x s8 dot product; each output's sum keeps one order whatever M is.
 *
 * T4_K superblock (2368 bytes): f16 d[16], f16 dmin[16], u8 scale[8][16], u8 min[8][16], nibbles[8][256].
 * T6_K superblock (3360 bytes): f16 d[16], i8 scale[16][16], nibbles[8][256], high bits[8][128]; the high
 *   bits of group g (0..7) of a sub-block sit in chunk g / 4, bits 2 (g % 4) .. 2 (g % 4) + 1 of each byte.
 * T4_0 block of 32 weights (288 bytes): f16 d[16], nibbles[256]; values 0..15, the weight d * (value - 8).
 * T4_1 block of 32 weights (320 bytes): T4_0's, then f16 m[16]; the weight d * value + m.
 * T5_0 block of 32 weights (352 bytes): f16 d[16], nibbles[256], fifth bits[64] (group g in bit g of each
 *   byte); values 0..31, the weight d * (value - 16).
 * T8_0 block of 32 weights (544 bytes): f16 d[16], then per group g of 4 weights 64 bytes, lane n (row n)
 *   holding its 4 weights as unsigned bytes (weight + 128), in the same group order as the nibble forms.
 * T5_K superblock (2880 bytes): T4_K's, then fifth bits[8][64] (as T5_0's, per sub-block).
 * T3_K superblock (1824 bytes): f16 d[16], i8 scale[16][16] (less 32 already), crumbs[8][128], third
 *   bits[8][64] (as T5_0's fifth bits); values 0..7, the weight d * scale * (value - 4). Crumbs: per 32 weights
 *   two 64-byte chunks, chunk k holding the groups 4k .. 4k + 3 (sub-block 2j + k): byte c of lane n holds row
 *   n's weight 16k + 4i + c in bits 2i, 2i + 1.
 * T2_K superblock (1344 bytes, the GGUF's size): f16 d[16], f16 dmin[16], u8 scale | min << 4 [16][16] (the
 *   GGUF's bytes), crumbs[8][128] (as T3_K's); values 0..3, the weight d * scale * value - dmin * min.
 * TIQ4_XS superblock (2208 bytes): f16 d[16], i8 scale[8][16] (less 32 already), nibbles[8][256] of indices
 *   into vsk_iq4_levels; the weight d * scale * level.
 * TIQ4_NL block of 32 weights (288 bytes): T4_0's layout, the nibbles indices into vsk_iq4_levels; the weight
 *   d * level.
 * Rows past N are zero (they add nothing and are never stored).
 */
#include <string.h>

#include "vsk.h"
#include "vsk_blocks.h"


/* the weight index (0..31 within a sub-block) of byte c of group g */
static inline int group_index(int g, int c) { return g < 4 ? 4 * g + c : 16 + 4 * (g - 4) + c; }

static void pack_nibbles(const uint8_t values[16][256], int j, uint8_t *out) {
    for (int i = 0; i < 4; i++)
        for (int n = 0; n < 16; n++)
            for (int c = 0; c < 4; c++)
                out[64 * i + 4 * n + c] = (uint8_t)((values[n][32 * j + 4 * i + c] & 0x0F) |
                                                    ((values[n][32 * j + 16 + 4 * i + c] & 0x0F) << 4));
}

/* The packers of one tile block: from the 16 rows' GGUF blocks blk[n] (NULL for rows past N, which stay zero)
 * into `out` (zeroed before). */

/* Q4_0 and IQ4_NL (18-byte blocks: f16 d, 16 bytes of nibbles), Q4_1 (20: f16 d, f16 m, 16 of nibbles) and Q5_0 (22:
 * f16 d, 4 bytes of fifth bits, 16 of nibbles) into T4_0 / T4_1 / T5_0: the same nibble chunks, T5_0 adding
 * its fifth bits after them, T4_1 its minimums */
static void pack_nibble32(int type, const uint8_t *const *blk, uint8_t *out) {
    const int five = type == VSK_Q5_0, one = type == VSK_Q4_1, nibbles = five ? 6 : one ? 4 : 2;
    uint8_t values[16][256];
    memset(values, 0, sizeof values);
    for (int n = 0; n < 16 && blk[n]; n++) {
        memcpy(out + 2 * n, blk[n], 2);
        if (one) memcpy(out + 288 + 2 * n, blk[n] + 2, 2);
        const uint32_t qh = five ? rd32(blk[n] + 2) : 0;
        for (int j = 0; j < 16; j++) {
            values[n][j] = (uint8_t)((blk[n][nibbles + j] & 0x0F) | (((qh >> j) & 1u) << 4));
            values[n][j + 16] = (uint8_t)((blk[n][nibbles + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
        }
    }
    pack_nibbles((const uint8_t (*)[256])values, 0, out + 32);
    for (int g = 0; g < 8 && five; g++)
        for (int n = 0; n < 16; n++)
            for (int c = 0; c < 4; c++)
                out[288 + 4 * n + c] |= (uint8_t)(((values[n][group_index(g, c)] >> 4) & 1) << g);
}

static void pack_q8_0(const uint8_t *const *blk, uint8_t *out) {
    for (int n = 0; n < 16; n++) {
        if (blk[n]) memcpy(out + 2 * n, blk[n], 2);
        for (int g = 0; g < 8; g++)
            for (int c = 0; c < 4; c++) /* rows past N: weight 0, d 0 */
                out[32 + 64 * g + 4 * n + c] = (uint8_t)((blk[n] ? blk[n][2 + group_index(g, c)] : 0) ^ 0x80);
    }
}

/* ---- T2_K, T3_K, T5_K and TIQ4_XS: packed from and unpacked to the portable superblock (vsk_kblock) --------- */

/* bit `bit` of the values of sub-block pair j (32 weights) into a 64-byte chunk: group g in bit g of each byte */
static void pack_bits(const vsk_kblock *k, int j, int bit, uint8_t *out) {
    for (int g = 0; g < 8; g++)
        for (int n = 0; n < 16; n++)
            for (int c = 0; c < 4; c++)
                out[4 * n + c] |= (uint8_t)(((k[n].value[32 * j + group_index(g, c)] >> bit) & 1) << g);
}

/* the low two bits of the values of sub-block pair j into two 64-byte chunks of crumbs */
static void pack_crumbs(const vsk_kblock *k, int j, uint8_t *out) {
    for (int h = 0; h < 2; h++)
        for (int n = 0; n < 16; n++)
            for (int c = 0; c < 4; c++)
                for (int i = 0; i < 4; i++)
                    out[64 * h + 4 * n + c] |= (uint8_t)((k[n].value[32 * j + 16 * h + 4 * i + c] & 3) << (2 * i));
}

static int gguf_of_tile(int tile) { return tile - 100; }

/* the 16 rows' superblocks k[16] into one superblock of a tile form (zeroed before) */
static void pack_kblocks(int tile, const vsk_kblock *k, uint8_t *out) {
    uint8_t values[16][256];
    for (int n = 0; n < 16; n++) {
        memcpy(out + 2 * n, &k[n].d, 2);
        if (tile == VSK_T5_K || tile == VSK_T2_K) memcpy(out + 32 + 2 * n, &k[n].dmin, 2);
        for (int i = 0; i < 256; i++) values[n][i] = k[n].value[i] & 0x0F;
    }
    for (int j = 0; j < 16; j++)
        for (int n = 0; n < 16; n++) {
            if (tile == VSK_T3_K) out[32 + 16 * j + n] = (uint8_t)k[n].scale[j];
            if (tile == VSK_T2_K) out[64 + 16 * j + n] = (uint8_t)(k[n].scale[j] | k[n].min[j] << 4);
            if (j % 2) continue; /* the 32-weight forms: a scale per sub-block pair */
            if (tile == VSK_TIQ4_XS) out[32 + 8 * j + n] = (uint8_t)k[n].scale[j];
            if (tile == VSK_T5_K) {
                out[64 + 8 * j + n] = (uint8_t)k[n].scale[j];
                out[192 + 8 * j + n] = k[n].min[j];
            }
        }
    for (int j = 0; j < 8; j++) {
        if (tile == VSK_T5_K) {
            pack_nibbles((const uint8_t (*)[256])values, j, out + 320 + 256 * j);
            pack_bits(k, j, 4, out + 2368 + 64 * j);
        } else if (tile == VSK_TIQ4_XS) {
            pack_nibbles((const uint8_t (*)[256])values, j, out + 160 + 256 * j);
        } else {
            pack_crumbs(k, j, out + (tile == VSK_T3_K ? 288 : 320) + 128 * j);
            if (tile == VSK_T3_K) pack_bits(k, j, 2, out + 1312 + 64 * j);
        }
    }
}

/* row n's superblock of a tile form: what pack_kblocks packed */
static void unpack_kblock(int tile, const uint8_t *blk, int n, vsk_kblock *k) {
    memset(k, 0, sizeof *k);
    memcpy(&k->d, blk + 2 * n, 2);
    if (tile == VSK_T5_K || tile == VSK_T2_K) memcpy(&k->dmin, blk + 32 + 2 * n, 2);
    for (int j = 0; j < 16; j++) {
        const int pair = j / 2;
        if (tile == VSK_T3_K) k->scale[j] = (int8_t)blk[32 + 16 * j + n];
        if (tile == VSK_T2_K) {
            k->scale[j] = (int8_t)(blk[64 + 16 * j + n] & 0x0F);
            k->min[j] = blk[64 + 16 * j + n] >> 4;
        }
        if (tile == VSK_TIQ4_XS) k->scale[j] = (int8_t)blk[32 + 16 * pair + n];
        if (tile == VSK_T5_K) {
            k->scale[j] = (int8_t)blk[64 + 16 * pair + n];
            k->min[j] = blk[192 + 16 * pair + n];
        }
    }
    for (int j = 0; j < 8; j++)
        for (int g = 0; g < 8; g++)
            for (int c = 0; c < 4; c++) {
                uint8_t *v = &k->value[32 * j + group_index(g, c)];
                if (tile == VSK_T5_K || tile == VSK_TIQ4_XS) {
                    const uint8_t byte = blk[(tile == VSK_T5_K ? 320 : 160) + 256 * j + 64 * (g % 4) + 4 * n + c];
                    *v = g < 4 ? byte & 0x0F : byte >> 4;
                } else {
                    const uint8_t byte = blk[(tile == VSK_T3_K ? 288 : 320) + 128 * j + 64 * (g / 4) + 4 * n + c];
                    *v = (byte >> (2 * (g % 4))) & 3;
                }
                if (tile == VSK_T5_K) *v |= (uint8_t)(((blk[2368 + 64 * j + 4 * n + c] >> g) & 1) << 4);
                if (tile == VSK_T3_K) *v |= (uint8_t)(((blk[1312 + 64 * j + 4 * n + c] >> g) & 1) << 2);
            }
}

static void pack_kblock(int type, const uint8_t *const *blk, uint8_t *out) {
    vsk_kblock k[16];
    memset(k, 0, sizeof k); /* rows past N: all zero */
    for (int n = 0; n < 16 && blk[n]; n++) vsk_kblock_of(type, blk[n], &k[n]);
    pack_kblocks(type + 100, k, out);
}

/* row n's superblock of Q4_K or Q6_K: its factors and scales into the tile's superblock `out`, its values */
static void pack_k_row(int type, const uint8_t *blk, int n, uint8_t *out, uint8_t *values) {
    if (type == VSK_Q4_K) {
        uint8_t sc[8], mn[8];
        memcpy(out + 2 * n, blk, 2);
        memcpy(out + 32 + 2 * n, blk + 2, 2);
        q4_k_scales(blk + 4, sc, mn);
        for (int j = 0; j < 8; j++) {
            out[64 + 16 * j + n] = sc[j];
            out[192 + 16 * j + n] = mn[j];
        }
        q4_k_values(blk + 16, values);
    } else {
        memcpy(out + 2 * n, blk + 208, 2);
        for (int j = 0; j < 16; j++) out[32 + 16 * j + n] = blk[192 + j];
        q6_k_values(blk, values);
    }
}

/* Q6_K's high two bits of the 16 rows' values, per sub-block pair j two 64-byte chunks (group g in chunk g / 4) */
static void pack_high(const uint8_t values[16][256], uint8_t *high) {
    for (int j = 0; j < 8; j++)
        for (int g = 0; g < 8; g++)
            for (int n = 0; n < 16; n++)
                for (int c = 0; c < 4; c++)
                    high[128 * j + 64 * (g / 4) + 4 * n + c] |=
                        (uint8_t)(((values[n][32 * j + group_index(g, c)] >> 4) & 3) << (2 * (g % 4)));
}

/* Q4_K and Q6_K into T4_K and T6_K */
static void pack_k(int type, const uint8_t *const *blk, uint8_t *out) {
    uint8_t values[16][256];
    memset(values, 0, sizeof values);
    for (int n = 0; n < 16 && blk[n]; n++) pack_k_row(type, blk[n], n, out, values[n]);
    for (int j = 0; j < 8; j++)
        pack_nibbles((const uint8_t (*)[256])values, j, out + (type == VSK_Q4_K ? 320 : 288) + 256 * j);
    if (type == VSK_Q6_K) pack_high((const uint8_t (*)[256])values, out + 288 + 2048);
}

/* a GGUF matrix of `type` [N rows of `row_bytes`, K values each] into its tile form (vsk_repacked_bytes, vsk_core.c,
 * whose visibility it has): each block of each strip of 16 rows packed from the rows' blocks */
void vsk_repack_rows(int type, const uint8_t *src, size_t row_bytes, int N, int K, uint8_t *dst) {
    const int strips = (N + 15) / 16, blocks = K / vsk_block_weights(type);
    const size_t out_bytes = (size_t)vsk_block_bytes(type + 100), in_bytes = (size_t)vsk_block_bytes(type);
    memset(dst, 0, out_bytes * (size_t)blocks * (size_t)strips);
    for (int t = 0; t < strips; t++)
        for (int b = 0; b < blocks; b++) {
            const uint8_t *blk[16];
            uint8_t *out = dst + ((size_t)t * blocks + b) * out_bytes;
            for (int n = 0; n < 16; n++)
                blk[n] = 16 * t + n < N ? src + (size_t)(16 * t + n) * row_bytes + (size_t)b * in_bytes : NULL;
            switch (type) {
            case VSK_Q2_K: case VSK_Q3_K: case VSK_Q5_K: case VSK_IQ4_XS: pack_kblock(type, blk, out); break;
            case VSK_Q4_0: case VSK_Q4_1: case VSK_Q5_0: case VSK_IQ4_NL: pack_nibble32(type, blk, out); break;
            case VSK_Q8_0: pack_q8_0(blk, out); break;
            default: pack_k(type, blk, out); /* VSK_Q4_K, VSK_Q6_K */
            }
        }
}

/* ---- the portable kernels over tiles ----------------------------------------------------------------- */

/* row n's 32 values of sub-block j, in weight order */
static inline void unpack_sub(const uint8_t *nibbles, const uint8_t *high, int n, uint8_t *w) {
    for (int g = 0; g < 8; g++)
        for (int c = 0; c < 4; c++) {
            const uint8_t byte = nibbles[64 * (g % 4) + 4 * n + c];
            uint8_t v = g < 4 ? (byte & 0x0F) : (byte >> 4);
            if (high) v |= (uint8_t)(((high[64 * (g / 4) + 4 * n + c] >> (2 * (g % 4))) & 3) << 4);
            w[group_index(g, c)] = v;
        }
}

/* T4_K and T6_K, row n of a superblock against each activation row: each sub-block's integer sum meets its scale
 * (times the superblock's d), the minimums (T4_K) or the values' offset of 32 (T6_K) are one integer sum over the
 * activations' sub-block sums, and the superblock's total meets the activations' scale once */
static void k_rows(int form, const uint8_t *blk, int n, const uint8_t *xq, size_t x_stride, int b, int rows,
                   float (*acc)[16]) {
    const int six = form == VSK_T6_K;
    const float d = vsk_fp16_to_fp32(rd16(blk + 2 * n));
    const float dmin = six ? 32.0f * d : vsk_fp16_to_fp32(rd16(blk + 32 + 2 * n));
    uint8_t w[256];
    for (int j = 0; j < 8; j++)
        unpack_sub(blk + (six ? 288 : 320) + 256 * j, six ? blk + 2336 + 128 * j : NULL, n, w + 32 * j);
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        float sb = 0.0f;
        for (int j = 0; j < 8; j++) {
            int32_t s[2] = {0, 0};
            for (int i = 0; i < 32; i++) s[i / 16] += (int32_t)w[32 * j + i] * x->q[32 * j + i];
            for (int h = 0; h < 2 && six; h++) sb += (d * (float)(int8_t)blk[32 + 16 * (2 * j + h) + n]) * (float)s[h];
            if (!six) sb += (d * (float)blk[64 + 16 * j + n]) * (float)(s[0] + s[1]);
        }
        int32_t terms = 0; /* T4_K: sum_j min_j sum32_j; T6_K: sum_j scale_j bsum_j */
        for (int j = 0; j < 16 && six; j++) terms += (int32_t)(int8_t)blk[32 + 16 * j + n] * x->bsum[j];
        for (int j = 0; j < 8 && !six; j++) terms += (int32_t)blk[192 + 16 * j + n] * x->sum32[j];
        acc[m][n] += (sb - dmin * (float)terms) * x->d;
    }
}

/* T2_K, T3_K, T5_K and TIQ4_XS: row n's superblock unpacked to the portable form and dotted as the row layout's
 * portable kernel does (vsk_scalar.c), so the same bits */
static void kblock_rows(int form, const uint8_t *blk, int n, const uint8_t *xq, size_t x_stride, int b, int rows,
                        float (*acc)[16]) {
    vsk_kblock k;
    unpack_kblock(form, blk, n, &k);
    for (int m = 0; m < rows; m++)
        acc[m][n] += vsk_kblock_dot(gguf_of_tile(form), &k, vsk_act256_at(xq, x_stride, m, b));
}

/* the 32-weight tile forms: T4_0 (values 0..15, the weight d (value - 8)), T4_1 (values 0..15, the weight
 * d value + m), T5_0 (values 0..31, the weight d (value - 16)), T8_0 (bytes weight + 128) and TIQ4_NL (indices,
 * taken as their level + 128 like T8_0's bytes): row n's 32 values */
static void unpack32(int form, const uint8_t *blk, int n, uint8_t *w) {
    if (form == VSK_T8_0) {
        for (int g = 0; g < 8; g++)
            for (int c = 0; c < 4; c++) w[group_index(g, c)] = blk[32 + 64 * g + 4 * n + c];
        return;
    }
    unpack_sub(blk + 32, NULL, n, w);
    for (int g = 0; g < 8 && form == VSK_T5_0; g++)
        for (int c = 0; c < 4; c++) w[group_index(g, c)] |= (uint8_t)(((blk[288 + 4 * n + c] >> g) & 1) << 4);
    for (int i = 0; i < 32 && form == VSK_TIQ4_NL; i++) w[i] = (uint8_t)(vsk_iq4_levels[w[i]] + 128);
}

static void rows32(int form, const uint8_t *blk, int n, const uint8_t *xq, size_t x_stride, int b, int rows,
                   float (*acc)[16]) {
    const int offset = form == VSK_T8_0 || form == VSK_TIQ4_NL ? 128 : form == VSK_T5_0 ? 16 : form == VSK_T4_0 ? 8 : 0;
    const float d = vsk_fp16_to_fp32(rd16(blk + 2 * n));
    const float mn = form == VSK_T4_1 ? vsk_fp16_to_fp32(rd16(blk + 288 + 2 * n)) : 0.0f;
    uint8_t w[32];
    unpack32(form, blk, n, w);
    for (int m = 0; m < rows; m++) {
        const vsk_act32 *x = vsk_act32_at(xq, x_stride, m, b);
        int32_t s = -offset * (x->half[0] + x->half[1]);
        for (int i = 0; i < 32; i++) s += (int32_t)w[i] * x->q[i];
        acc[m][n] += (d * x->d) * (float)s + mn * (x->d * (float)(x->half[0] + x->half[1]));
    }
}

/* the tile body (vsk_forms.h): per block, each row of the strip against every activation row */
static void tile_rows(int form, const uint8_t *strip, int blocks, const uint8_t *xq, size_t x_stride, int rows,
                      float *y, int ldy, int lanes) {
    const size_t block_bytes = (size_t)vsk_block_bytes(form);
    float acc[MAX_ROWS][16] = {{0}};
    for (int b = 0; b < blocks; b++)
        for (int n = 0; n < 16; n++) {
            const uint8_t *blk = strip + (size_t)b * block_bytes;
            if (vsk_block_weights(form) == 32)
                rows32(form, blk, n, xq, x_stride, b, rows, acc);
            else if (form == VSK_T4_K || form == VSK_T6_K)
                k_rows(form, blk, n, xq, x_stride, b, rows, acc);
            else
                kblock_rows(form, blk, n, xq, x_stride, b, rows, acc);
        }
    for (int m = 0; m < rows; m++)
        for (int n = 0; n < lanes; n++) y[(size_t)m * ldy + n] = acc[m][n];
}

/* the body serving each family of tile forms (vsk_forms.h) */
#define TILES_tile32(entry, ...) entry(tile_rows, MAX_ROWS, __VA_ARGS__)
#define TILES_tile256(entry, ...) entry(tile_rows, MAX_ROWS, __VA_ARGS__)
#define TILES_tile_kblock(entry, ...) entry(tile_rows, MAX_ROWS, __VA_ARGS__)

VSK_TILE_KERNELS(vsk_tile_kernel_scalar)
