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

size_t vsk_tile_strip_bytes(int type, int K) {
    if (type == VSK_T4_0 || type == VSK_TIQ4_NL) return (size_t)(K / 32) * T40_BYTES;
    if (type == VSK_T4_1) return (size_t)(K / 32) * T41_BYTES;
    if (type == VSK_T5_0) return (size_t)(K / 32) * T50_BYTES;
    if (type == VSK_T8_0) return (size_t)(K / 32) * T80_BYTES;
    const size_t bytes = type == VSK_T4_K ? T4K_BYTES : type == VSK_T6_K ? T6K_BYTES : type == VSK_T5_K ? T5K_BYTES
                         : type == VSK_T3_K ? T3K_BYTES : type == VSK_T2_K ? T2K_BYTES : TIQ4XS_BYTES;
    return (size_t)(K / 256) * bytes;
}

/* Q4_0 and IQ4_NL (18-byte blocks: f16 d, 16 bytes of nibbles), Q4_1 (20: f16 d, f16 m, 16 of nibbles) and Q5_0 (22:
 * f16 d, 4 bytes of fifth bits, 16 of nibbles) into T4_0 / T4_1 / T5_0: the same nibble chunks, T5_0 adding
 * its fifth bits after them, T4_1 its minimums */
static void repack_nibble32(int type, const uint8_t *src, size_t row_bytes, int N, int K, uint8_t *dst) {
    const int five = type == VSK_Q5_0, one = type == VSK_Q4_1;
    const int strips = (N + 15) / 16, blocks = K / 32, in_bytes = five ? 22 : one ? 20 : 18;
    const int nibbles = five ? 6 : one ? 4 : 2;
    const size_t out_bytes = vsk_tile_strip_bytes(five ? VSK_T5_0 : one ? VSK_T4_1 : VSK_T4_0, 32);
    memset(dst, 0, out_bytes * (size_t)blocks * (size_t)strips);
    for (int t = 0; t < strips; t++)
        for (int b = 0; b < blocks; b++) {
            uint8_t *out = dst + ((size_t)t * blocks + b) * out_bytes;
            uint8_t values[16][256];
            memset(values, 0, sizeof values);
            for (int n = 0; n < 16 && 16 * t + n < N; n++) {
                const uint8_t *blk = src + (size_t)(16 * t + n) * row_bytes + (size_t)b * in_bytes;
                memcpy(out + 2 * n, blk, 2);
                if (one) memcpy(out + 288 + 2 * n, blk + 2, 2);
                const uint32_t qh = five ? rd32(blk + 2) : 0;
                for (int j = 0; j < 16; j++) {
                    values[n][j] = (uint8_t)((blk[nibbles + j] & 0x0F) | (((qh >> j) & 1u) << 4));
                    values[n][j + 16] = (uint8_t)((blk[nibbles + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
                }
            }
            pack_nibbles((const uint8_t (*)[256])values, 0, out + 32);
            for (int g = 0; g < 8 && five; g++)
                for (int n = 0; n < 16; n++)
                    for (int c = 0; c < 4; c++)
                        out[288 + 4 * n + c] |= (uint8_t)(((values[n][group_index(g, c)] >> 4) & 1) << g);
        }
}

static void repack_q8_0(const uint8_t *src, size_t row_bytes, int N, int K, uint8_t *dst) {
    const int strips = (N + 15) / 16, blocks = K / 32;
    memset(dst, 0, vsk_tile_strip_bytes(VSK_T8_0, K) * (size_t)strips);
    for (int t = 0; t < strips; t++)
        for (int b = 0; b < blocks; b++) {
            uint8_t *out = dst + ((size_t)t * blocks + b) * T80_BYTES;
            for (int n = 0; n < 16; n++) {
                const uint8_t *blk = 16 * t + n < N ? src + (size_t)(16 * t + n) * row_bytes + (size_t)b * 34 : NULL;
                if (blk) memcpy(out + 2 * n, blk, 2);
                for (int g = 0; g < 8; g++)
                    for (int c = 0; c < 4; c++) /* rows past N: weight 0, d 0 */
                        out[32 + 64 * g + 4 * n + c] = (uint8_t)((blk ? blk[2 + group_index(g, c)] : 0) ^ 0x80);
            }
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

static void repack_kblocks(int type, const uint8_t *src, size_t row_bytes, int N, int K, uint8_t *dst) {
    const int tile = type + 100, strips = (N + 15) / 16, blocks = K / 256;
    const size_t block_bytes = vsk_tile_strip_bytes(tile, 256), in_bytes = (size_t)vsk_kblock_bytes(type);
    memset(dst, 0, block_bytes * (size_t)blocks * (size_t)strips);
    for (int t = 0; t < strips; t++)
        for (int b = 0; b < blocks; b++) {
            vsk_kblock k[16];
            memset(k, 0, sizeof k); /* rows past N: all zero */
            for (int n = 0; n < 16 && 16 * t + n < N; n++)
                vsk_kblock_of(type, src + (size_t)(16 * t + n) * row_bytes + (size_t)b * in_bytes, &k[n]);
            pack_kblocks(tile, k, dst + ((size_t)t * blocks + b) * block_bytes);
        }
}

/* __attribute__((visibility)) is set on the entry point in vsk_core.c */
void vsk_repack_rows(int type, const uint8_t *src, size_t row_bytes, int N, int K, uint8_t *dst) {
    if (type == VSK_Q2_K || type == VSK_Q3_K || type == VSK_Q5_K || type == VSK_IQ4_XS) {
        repack_kblocks(type, src, row_bytes, N, K, dst);
        return;
    }
    if (type == VSK_Q4_0 || type == VSK_Q4_1 || type == VSK_Q5_0 || type == VSK_IQ4_NL) {
        repack_nibble32(type, src, row_bytes, N, K, dst);
        return;
    }
    if (type == VSK_Q8_0) {
        repack_q8_0(src, row_bytes, N, K, dst);
        return;
    }
    const int strips = (N + 15) / 16, blocks = K / 256;
    const size_t strip_bytes = vsk_tile_strip_bytes(type == VSK_Q4_K ? VSK_T4_K : VSK_T6_K, K);
    memset(dst, 0, strip_bytes * (size_t)strips);
    for (int t = 0; t < strips; t++) {
        for (int b = 0; b < blocks; b++) {
            uint8_t *out = dst + (size_t)t * strip_bytes + (size_t)b * (type == VSK_Q4_K ? T4K_BYTES : T6K_BYTES);
            uint8_t values[16][256];
            memset(values, 0, sizeof values);
            for (int n = 0; n < 16 && 16 * t + n < N; n++) {
                const uint8_t *blk = src + (size_t)(16 * t + n) * row_bytes + (size_t)b * (type == VSK_Q4_K ? Q4_K_BYTES : Q6_K_BYTES);
                if (type == VSK_Q4_K) {
                    uint8_t sc[8], mn[8];
                    memcpy(out + 2 * n, blk, 2);
                    memcpy(out + 32 + 2 * n, blk + 2, 2);
                    q4_k_scales(blk + 4, sc, mn);
                    for (int j = 0; j < 8; j++) {
                        out[64 + 16 * j + n] = sc[j];
                        out[192 + 16 * j + n] = mn[j];
                    }
                    q4_k_values(blk + 16, values[n]);
                } else {
                    memcpy(out + 2 * n, blk + 208, 2);
                    for (int j = 0; j < 16; j++) out[32 + 16 * j + n] = blk[192 + j];
                    q6_k_values(blk, values[n]);
                }
            }
            uint8_t *nibbles = out + (type == VSK_Q4_K ? 320 : 288);
            for (int j = 0; j < 8; j++) pack_nibbles((const uint8_t (*)[256])values, j, nibbles + 256 * j);
            if (type == VSK_Q6_K) {
                uint8_t *high = out + 288 + 2048;
                for (int j = 0; j < 8; j++)
                    for (int g = 0; g < 8; g++)
                        for (int n = 0; n < 16; n++)
                            for (int c = 0; c < 4; c++)
                                high[128 * j + 64 * (g / 4) + 4 * n + c] |=
                                    (uint8_t)(((values[n][32 * j + group_index(g, c)] >> 4) & 3) << (2 * (g % 4)));
            }
        }
    }
}

/* ---- the portable kernels over tiles ----------------------------------------------------------------- */

/* rows' sums of tile t into y (the weight rows below n1) */
static void store_tile(float (*acc)[16], int rows, float *y, int ldy, int t, int n1) {
    for (int m = 0; m < rows; m++)
        for (int n = 0; n < 16; n++)
            if (16 * t + n < n1) y[(size_t)m * ldy + 16 * t + n] = acc[m][n];
}

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

/* Per row and superblock: each sub-block's integer sum meets its scale (times the superblock's d), the
 * minimums (Q4_K) or the values' offset of 32 (Q6_K) are one integer sum over the activations' sub-block
 * sums, and the superblock's total meets the activations' scale once. */
static void tile_kernel(int type, const uint8_t *W, int n0, int n1, int K, const uint8_t *xq, size_t x_stride,
                        int M, float *y, int ldy) {
    const int blocks = K / 256, six = type == VSK_T6_K;
    const size_t strip_bytes = vsk_tile_strip_bytes(type, K), block_bytes = six ? T6K_BYTES : T4K_BYTES;
    for (int t = n0 / 16; t < (n1 + 15) / 16; t++) {
        for (int r0 = 0; r0 < M; r0 += MAX_ROWS) {
            const int rows = M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS;
            float acc[MAX_ROWS][16] = {{0}};
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk = W + (size_t)t * strip_bytes + (size_t)b * block_bytes;
                for (int n = 0; n < 16; n++) {
                    const float d = vsk_fp16_to_fp32(rd16(blk + 2 * n));
                    float sb[MAX_ROWS] = {0};
                    for (int j = 0; j < 8; j++) {
                        uint8_t w[32];
                        unpack_sub(blk + (six ? 288 : 320) + 256 * j, six ? blk + 2336 + 128 * j : NULL, n, w);
                        for (int m = 0; m < rows; m++) {
                            const vsk_act256 *x = (const vsk_act256 *)(xq + (size_t)(r0 + m) * x_stride) + b;
                            int32_t s[2] = {0, 0};
                            for (int i = 0; i < 32; i++) s[i / 16] += (int32_t)w[i] * x->q[32 * j + i];
                            if (six) {
                                for (int h = 0; h < 2; h++)
                                    sb[m] += (d * (float)(int8_t)blk[32 + 16 * (2 * j + h) + n]) * (float)s[h];
                            } else {
                                sb[m] += (d * (float)blk[64 + 16 * j + n]) * (float)(s[0] + s[1]);
                            }
                        }
                    }
                    for (int m = 0; m < rows; m++) {
                        const vsk_act256 *x = (const vsk_act256 *)(xq + (size_t)(r0 + m) * x_stride) + b;
                        int32_t terms = 0; /* Q4_K: sum_j min_j sum32_j; Q6_K: sum_j scale_j bsum_j */
                        if (six) {
                            for (int j = 0; j < 16; j++) terms += (int32_t)(int8_t)blk[32 + 16 * j + n] * x->bsum[j];
                            sb[m] -= (32.0f * d) * (float)terms;
                        } else {
                            for (int j = 0; j < 8; j++) terms += (int32_t)blk[192 + 16 * j + n] * x->sum32[j];
                            sb[m] -= vsk_fp16_to_fp32(rd16(blk + 32 + 2 * n)) * (float)terms;
                        }
                        acc[m][n] += sb[m] * x->d;
                    }
                }
            }
            store_tile(acc, rows, y + (size_t)r0 * ldy, ldy, t, n1);
        }
    }
}

VSK_TILE_ENTRY(kernel_t4_k, tile_kernel, VSK_T4_K)

/* T2_K, T3_K, T5_K and TIQ4_XS: each row's superblock unpacked to the portable form and dotted as the row layout's
 * portable kernel does (vsk_scalar.c), so the same bits */
static void kblock_tile_kernel(int type, const uint8_t *W, int n0, int n1, int K, const uint8_t *xq, size_t x_stride,
                               int M, float *y, int ldy) {
    const int blocks = K / 256;
    const size_t block_bytes = vsk_tile_strip_bytes(type, 256);
    for (int t = n0 / 16; t < (n1 + 15) / 16; t++) {
        for (int r0 = 0; r0 < M; r0 += MAX_ROWS) {
            const int rows = M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS;
            float acc[MAX_ROWS][16] = {{0}};
            for (int b = 0; b < blocks; b++)
                for (int n = 0; n < 16; n++) {
                    vsk_kblock k;
                    unpack_kblock(type, W + ((size_t)t * blocks + b) * block_bytes, n, &k);
                    for (int m = 0; m < rows; m++) {
                        const vsk_act256 *x = (const vsk_act256 *)(xq + (size_t)(r0 + m) * x_stride) + b;
                        acc[m][n] += vsk_kblock_dot(gguf_of_tile(type), &k, x);
                    }
                }
            store_tile(acc, rows, y + (size_t)r0 * ldy, ldy, t, n1);
        }
    }
}

VSK_TILE_ENTRY(kernel_t2_k, kblock_tile_kernel, VSK_T2_K)

VSK_TILE_ENTRY(kernel_t3_k, kblock_tile_kernel, VSK_T3_K)

VSK_TILE_ENTRY(kernel_t5_k, kblock_tile_kernel, VSK_T5_K)

VSK_TILE_ENTRY(kernel_tiq4_xs, kblock_tile_kernel, VSK_TIQ4_XS)

/* the 32-weight tile forms: T4_0 (values 0..15, the weight d (value - 8)), T4_1 (values 0..15, the weight
 * d value + m), T5_0 (values 0..31, the weight d (value - 16)), T8_0 (bytes weight + 128) and TIQ4_NL (indices,
 * taken as their level + 128 like T8_0's bytes) */
static void tile32_kernel(int type, const uint8_t *W, int n0, int n1, int K, const uint8_t *xq, size_t x_stride,
                          int M, float *y, int ldy) {
    const int blocks = K / 32;
    const int offset = type == VSK_T8_0 || type == VSK_TIQ4_NL ? 128 : type == VSK_T5_0 ? 16 : type == VSK_T4_0 ? 8 : 0;
    const size_t block_bytes = vsk_tile_strip_bytes(type, 32);
    for (int t = n0 / 16; t < (n1 + 15) / 16; t++) {
        for (int r0 = 0; r0 < M; r0 += MAX_ROWS) {
            const int rows = M - r0 < MAX_ROWS ? M - r0 : MAX_ROWS;
            float acc[MAX_ROWS][16] = {{0}};
            for (int b = 0; b < blocks; b++) {
                const uint8_t *blk = W + ((size_t)t * blocks + b) * block_bytes;
                for (int n = 0; n < 16; n++) {
                    const float d = vsk_fp16_to_fp32(rd16(blk + 2 * n));
                    const float mn = type == VSK_T4_1 ? vsk_fp16_to_fp32(rd16(blk + 288 + 2 * n)) : 0.0f;
                    uint8_t w[32];
                    if (type == VSK_T8_0) {
                        for (int g = 0; g < 8; g++)
                            for (int c = 0; c < 4; c++) w[group_index(g, c)] = blk[32 + 64 * g + 4 * n + c];
                    } else {
                        unpack_sub(blk + 32, NULL, n, w);
                        for (int g = 0; g < 8 && type == VSK_T5_0; g++)
                            for (int c = 0; c < 4; c++)
                                w[group_index(g, c)] |= (uint8_t)(((blk[288 + 4 * n + c] >> g) & 1) << 4);
                        for (int i = 0; i < 32 && type == VSK_TIQ4_NL; i++) w[i] = (uint8_t)(vsk_iq4_levels[w[i]] + 128);
                    }
                    for (int m = 0; m < rows; m++) {
                        const vsk_act32 *x = (const vsk_act32 *)(xq + (size_t)(r0 + m) * x_stride) + b;
                        int32_t s = -offset * (x->half[0] + x->half[1]);
                        for (int i = 0; i < 32; i++) s += (int32_t)w[i] * x->q[i];
                        acc[m][n] += (d * x->d) * (float)s + mn * (x->d * (float)(x->half[0] + x->half[1]));
                    }
                }
            }
            store_tile(acc, rows, y + (size_t)r0 * ldy, ldy, t, n1);
        }
    }
}

VSK_TILE_ENTRY(kernel_t4_0, tile32_kernel, VSK_T4_0)

VSK_TILE_ENTRY(kernel_t4_1, tile32_kernel, VSK_T4_1)

VSK_TILE_ENTRY(kernel_t5_0, tile32_kernel, VSK_T5_0)

VSK_TILE_ENTRY(kernel_t8_0, tile32_kernel, VSK_T8_0)

VSK_TILE_ENTRY(kernel_tiq4_nl, tile32_kernel, VSK_TIQ4_NL)

VSK_TILE_ENTRY(kernel_t6_k, tile_kernel, VSK_T6_K)

vsk_kernel vsk_tile_kernel_scalar(int type) {
    return type == VSK_T4_K   ? kernel_t4_k
           : type == VSK_T6_K ? kernel_t6_k
           : type == VSK_T4_0 ? kernel_t4_0
           : type == VSK_T4_1 ? kernel_t4_1
           : type == VSK_T5_0 ? kernel_t5_0
           : type == VSK_T8_0 ? kernel_t8_0
           : type == VSK_T2_K ? kernel_t2_k
           : type == VSK_T3_K ? kernel_t3_k
           : type == VSK_T5_K ? kernel_t5_k
           : type == VSK_TIQ4_XS ? kernel_tiq4_xs
           : type == VSK_TIQ4_NL ? kernel_tiq4_nl
                              : NULL;
}
