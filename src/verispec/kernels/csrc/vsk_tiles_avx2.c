/* Tile kernels (see vsk_tiles.c) on AVX2: a tile's 16 rows as two halves of 8 lanes (bytes 0..31 and 32..63
 * of each 64-byte chunk); u8 x s8 group dot products through maddubs (no VNNI). */
#include "vsk.h"

#if !defined(__x86_64__)
vsk_kernel vsk_tile_kernel_avx2(int type) {
    (void)type;
    return NULL;
}
#else

#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "vsk_blocks.h"


/* rows' sums into y (the lanes of weight rows below `lanes`) */
static inline void store_tile(__m256 (*acc)[2], int rows, float *y, int ldy, int lanes) {
    for (int m = 0; m < rows; m++) {
        float out[16];
        _mm256_storeu_ps(out, acc[m][0]);
        _mm256_storeu_ps(out + 8, acc[m][1]);
        memcpy(y + (size_t)m * ldy, out, sizeof(float) * (size_t)lanes);
    }
}

static inline __m256i broadcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __m256i broadcast_group(const vsk_act32 *x, int g) {
    return broadcast4(x->q + (g < 4 ? 4 * g : 16 + 4 * (g - 4)));
}

/* v, kept where it is in the chain of sums it belongs to. Without it GCC starts a row's eight products at once,
 * which leaves too few of AVX2's 16 registers for the unpacked weights: it spills them and reloads them for every
 * row (a Q4_K product over 16 or 64 rows 35 % slower, measured on Zen 5). Only the compiler's order changes: the
 * sums are the same integers in the same order. */
static inline __m256i in_order(__m256i v) {
    __asm__("" : "+x"(v));
    return v;
}

static inline __m256i dot(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

/* 8 lanes' bytes p[0..7] as int16 pairs (p[i], q[i]) per 32-bit lane, sign-extended or not */
static inline __m256i byte_pairs(const uint8_t *p, const uint8_t *q, int is_signed) {
    const __m128i a = _mm_loadl_epi64((const __m128i *)p), b = _mm_loadl_epi64((const __m128i *)q);
    const __m256i lo = is_signed ? _mm256_cvtepi8_epi32(a) : _mm256_cvtepu8_epi32(a);
    const __m256i hi = is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(hi, 16));
}

/* bit g of each byte of h moved to bit `to` (shifts of 16-bit lanes: the bits kept never cross a byte) */
static inline __m256i bit_at(__m256i h, int g, int to) {
    return g < to ? _mm256_slli_epi16(h, to - g) : _mm256_srli_epi16(h, g - to);
}

/* the eight 4-weight groups of sub-block pair j (32 weights) of rows 8v .. 8v + 7: unsigned bytes, or for TIQ4_XS
 * the levels (signed) */
static inline __attribute__((always_inline)) void unpack_pair(const int form, const uint8_t *blk, int j, int v,
                                                              __m256i *w) {
    const __m256i low = _mm256_set1_epi8(0x0F), crumb = _mm256_set1_epi8(3);
    if (form == VSK_T3_K || form == VSK_T2_K) {
        const uint8_t *crumbs = blk + (form == VSK_T3_K ? 288 : 320) + 128 * j + 32 * v;
        for (int k = 0; k < 2; k++) {
            const __m256i p = _mm256_loadu_si256((const __m256i *)(crumbs + 64 * k));
            for (int i = 0; i < 4; i++) w[4 * k + i] = _mm256_and_si256(_mm256_srli_epi16(p, 2 * i), crumb);
        }
        if (form == VSK_T3_K) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 1312 + 64 * j + 32 * v));
            for (int g = 0; g < 8; g++)
                w[g] = _mm256_or_si256(w[g], _mm256_and_si256(bit_at(h, g, 2), _mm256_set1_epi8(4)));
        }
        return;
    }
    const uint8_t *nibbles = blk + (form == VSK_T6_K ? 288 : form == VSK_TIQ4_XS ? 160 : 320) + 256 * j + 32 * v;
    for (int i = 0; i < 4; i++) {
        const __m256i p = _mm256_loadu_si256((const __m256i *)(nibbles + 64 * i));
        w[i] = _mm256_and_si256(p, low);
        w[4 + i] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
    }
    if (form == VSK_T6_K) {
        const __m256i two = _mm256_set1_epi8(0x30);
        for (int k = 0; k < 2; k++) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 2336 + 128 * j + 64 * k + 32 * v));
            w[4 * k + 0] = _mm256_or_si256(w[4 * k + 0], _mm256_and_si256(_mm256_slli_epi16(h, 4), two));
            w[4 * k + 1] = _mm256_or_si256(w[4 * k + 1], _mm256_and_si256(_mm256_slli_epi16(h, 2), two));
            w[4 * k + 2] = _mm256_or_si256(w[4 * k + 2], _mm256_and_si256(h, two));
            w[4 * k + 3] = _mm256_or_si256(w[4 * k + 3], _mm256_and_si256(_mm256_srli_epi16(h, 2), two));
        }
    } else if (form == VSK_T5_K) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 2368 + 64 * j + 32 * v));
        for (int g = 0; g < 8; g++)
            w[g] = _mm256_or_si256(w[g], _mm256_and_si256(bit_at(h, g, 4), _mm256_set1_epi8(0x10)));
    } else if (form == VSK_TIQ4_XS) {
        const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)vsk_iq4_levels));
        for (int g = 0; g < 8; g++) w[g] = _mm256_shuffle_epi8(levels, w[g]);
    }
}

/* the scales of sub-block pair j, rows 8v .. 8v + 7, as int16 pairs (s, s) per lane: of groups 0..3 and 4..7 */
static inline __attribute__((always_inline)) void pair_scales(const int form, const uint8_t *blk, int j, int v,
                                                              __m256i *scale) {
    if (!vsk_sub16(form)) {
        const uint8_t *sc = blk + (form == VSK_TIQ4_XS ? 32 : 64) + 16 * j + 8 * v;
        scale[0] = scale[1] = byte_pairs(sc, sc, form == VSK_TIQ4_XS);
        return;
    }
    for (int k = 0; k < 2; k++) {
        const uint8_t *sc = blk + (form == VSK_T2_K ? 64 : 32) + 16 * (2 * j + k) + 8 * v;
        scale[k] = byte_pairs(sc, sc, form != VSK_T2_K);
        if (form == VSK_T2_K) scale[k] = _mm256_and_si256(scale[k], _mm256_set1_epi16(0x0F)); /* scale | min << 4 */
    }
}

/* rows 8v .. 8v + 7's int16 pairs that meet the activations' sub-block sums per superblock: minimums of 32 weights
 * (T4_K, T5_K: 4 pairs, against sum32) or of 16 (T2_K: 8, against bsum), or the scales of 16 (T6_K, T3_K: 8, the
 * values' offset); returns the count (0 for TIQ4_XS) */
static inline __attribute__((always_inline)) int term_pairs(const int form, const uint8_t *blk, int v, __m256i *pairs) {
    if (form == VSK_TIQ4_XS) return 0;
    const int count = form == VSK_T4_K || form == VSK_T5_K ? 4 : 8;
    for (int i = 0; i < count; i++) {
        if (form == VSK_T4_K || form == VSK_T5_K)
            pairs[i] = byte_pairs(blk + 192 + 32 * i + 8 * v, blk + 208 + 32 * i + 8 * v, 0);
        else if (form == VSK_T2_K) /* the high nibbles of scale | min << 4 */
            pairs[i] = _mm256_srli_epi16(byte_pairs(blk + 64 + 32 * i + 8 * v, blk + 80 + 32 * i + 8 * v, 0), 4);
        else
            pairs[i] = byte_pairs(blk + 32 + 32 * i + 8 * v, blk + 48 + 32 * i + 8 * v, 1);
    }
    return count;
}

/* How many groups' maddubs pairs are summed in int16 before one madd takes them to 32 bits (1: each group its own
 * madd). With unsigned values below 2^b and activations of magnitude at most 128 a pair is at most
 * 2 x (2^b - 1) x 128, so `run` pairs stay below 2^15 and the int16 adds never wrap: the integer sums, and so every
 * bit of the results, are the ones a madd per group gives, with one multiply-add instruction fewer per group summed.
 * Runs never cross a scale's groups (4 for the 16-weight sub-blocks). On CPUs without VNNI maddubs and madd share
 * the multiply units, which bound a pass over several rows: 16 of them per row and 32 weights become 9 (T4_K). */
static inline int int16_run(int form) {
    switch (form) {
    case VSK_T4_K: /* 0..15: 8 x 3840 */
    case VSK_T4_0:
    case VSK_T4_1: return 8;
    case VSK_T5_K: /* 0..31: 4 x 7936 */
    case VSK_T5_0:
    case VSK_T3_K: /* 0..7, a scale per 4 groups */
    case VSK_T2_K: return 4;
    case VSK_T6_K: return 2; /* 0..63: 2 x 16128 */
    default: return 1;       /* signed levels' magnitudes up to 128 (TIQ4_XS, T8_0, TIQ4_NL) */
    }
}

/* the integer sums of sub-block pair j (32 weights) of a superblock: sums[m][v] (rows 8v .. 8v + 7 of the tile)
 * gains each group's products with activation row m (at q + m x_stride), scaled inside madd */
static inline __attribute__((always_inline)) void pair_sums(const int form, const uint8_t *blk, int j, const int8_t *q,
                                                            size_t x_stride, int rows, __m256i (*sums)[2]) {
    const int iq4 = form == VSK_TIQ4_XS, run = int16_run(form);
    for (int v = 0; v < 2; v++) { /* rows 8v .. 8v + 7 of the tile */
        __m256i w[8], scale[2];
        unpack_pair(form, blk, j, v, w);
        pair_scales(form, blk, j, v, scale);
        const int8_t *x = q; /* row m's activations: one step of x_stride per row (no multiply in the loop) */
        for (int m = 0; m < rows; m++, x += x_stride) {
            __m256i s = sums[m][v];
            for (int g0 = 0; g0 < 8; g0 += run) {
                __m256i pairs = _mm256_setzero_si256();
                for (int g = g0; g < g0 + run; g++) {
                    const __m256i a = broadcast4(x + (g < 4 ? 4 * g : 16 + 4 * (g - 4)));
                    /* TIQ4_XS: maddubs takes unsigned x signed, so the level's magnitude meets the activation
                     * carrying the level's sign (pairs below 2^15, as T8_0's) */
                    const __m256i p = iq4 ? _mm256_maddubs_epi16(_mm256_abs_epi8(w[g]), _mm256_sign_epi8(a, w[g]))
                                          : _mm256_maddubs_epi16(w[g], a);
                    pairs = in_order(g == g0 ? p : _mm256_add_epi16(pairs, p));
                }
                s = in_order(_mm256_add_epi32(s, _mm256_madd_epi16(pairs, scale[g0 / 4])));
            }
            sums[m][v] = s;
        }
    }
}

/* the superblock's float step per row: its integer total (less the values' offset) times d and the activations'
 * scale, then the minimums' sum times dmin taken off */
static inline __attribute__((always_inline)) void superblock_step(const int form, const uint8_t *blk,
                                                                  const uint8_t *xq, size_t x_stride, int b, int rows,
                                                                  __m256i (*sums)[2], __m256 (*acc)[2]) {
    const int mins = form == VSK_T4_K || form == VSK_T5_K || form == VSK_T2_K;
    for (int v = 0; v < 2; v++) {
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * v)));
        const __m256 dmin = mins ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * v))) : d;
        __m256i pairs[8];
        const int count = term_pairs(form, blk, v, pairs);
        for (int m = 0; m < rows; m++) {
            const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
            const int16_t *sub = count == 4 ? x->sum32 : x->bsum; /* the activations' sub-block sums */
            __m256i terms = _mm256_setzero_si256();
            for (int i = 0; i < count; i++)
                terms = _mm256_add_epi32(terms, _mm256_madd_epi16(pairs[i], broadcast4((const int8_t *)(sub + 2 * i))));
            const __m256 dx = _mm256_set1_ps(x->d);
            __m256i total = sums[m][v];
            if (form == VSK_T6_K) total = _mm256_sub_epi32(total, _mm256_slli_epi32(terms, 5));
            if (form == VSK_T3_K) total = _mm256_sub_epi32(total, _mm256_slli_epi32(terms, 2));
            acc[m][v] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(total), acc[m][v]);
            if (mins) acc[m][v] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(terms), acc[m][v]);
        }
    }
}

/* The 256-weight tiles with activations in 256-blocks: per row, superblock and half, the whole superblock is one
 * integer sum (each sub-block's products scaled by its integer scale inside madd; the minimums (T4_K, T5_K, T2_K)
 * and the values' offset (T6_K 32, T3_K 4) as sums over the activations' sub-block sums), then one float step with
 * d and the activations' scale. Exact integers: |sum| < 2^31 (at most 256 x 127 x 127 x 32, TIQ4_XS). The tile
 * body of these forms (vsk_forms.h). */
static inline __attribute__((always_inline)) void tile_rows(const int form, const uint8_t *strip, int blocks,
                                                            const uint8_t *xq, size_t x_stride, int rows, float *y,
                                                            int ldy, int lanes) {
    const size_t block_bytes = (size_t)vsk_block_bytes(form), pair_bytes = block_bytes / 8;
    __m256 acc[MAX_ROWS][2];
    for (int m = 0; m < rows; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = strip + (size_t)b * block_bytes;
        __m256i sums[MAX_ROWS][2];
        for (int m = 0; m < rows; m++) sums[m][0] = sums[m][1] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            /* keep memory busy while the rows are computed: ask for the data four superblocks ahead, into L2 (L1's
             * few fill buffers held too few reads in flight: 25 % slower on Sapphire Rapids, 0686372) */
            for (int l = 0; l < (int)((pair_bytes + 63) / 64); l++)
                _mm_prefetch((const char *)blk + 4 * block_bytes + (size_t)j * pair_bytes + 64 * l, _MM_HINT_T1);
            pair_sums(form, blk, j, vsk_act256_at(xq, x_stride, 0, b)->q + 32 * j, x_stride, rows, sums);
        }
        superblock_step(form, blk, xq, x_stride, b, rows, sums, acc);
    }
    store_tile(acc, rows, y, ldy, lanes);
}

/* the 32-weight tile forms, rows 8v .. 8v + 7 of a tile. T4_0: values 0..15 (nibbles), the weight d (value - 8);
 * T4_1: values 0..15, the weight d value + m (the minimum times the activations' sum added); T5_0: values 0..31
 * (nibbles and a fifth bit), the weight d (value - 16); all dotted through maddubs with the offset taken off. T8_0:
 * maddubs takes unsigned x signed bytes and saturates pairs at 16 bits, so the stored bytes (weight + 128) are
 * flipped back to signed and the weight's magnitude (at most 128) meets the activation carrying the weight's sign:
 * pairs stay below 2^15. TIQ4_NL: the nibbles looked up (one shuffle per group) as their levels (-127..113), then
 * dotted as T8_0's weights. */
static inline void unpack32(int type, const uint8_t *blk, int v, __m256i *w, __m256i *magnitude) {
    if (type == VSK_T8_0) {
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        for (int g = 0; g < 8; g++) {
            w[g] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 32 + 64 * g + 32 * v)), flip);
            magnitude[g] = _mm256_abs_epi8(w[g]);
        }
        return;
    }
    const __m256i low = _mm256_set1_epi8(0x0F), five = _mm256_set1_epi8(0x10);
    for (int i = 0; i < 4; i++) {
        const __m256i p = _mm256_loadu_si256((const __m256i *)(blk + 32 + 64 * i + 32 * v));
        w[i] = _mm256_and_si256(p, low);
        w[4 + i] = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
    }
    if (type == VSK_TIQ4_NL) { /* the indices' levels, signed: dotted as T8_0's weights */
        const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)vsk_iq4_levels));
        for (int g = 0; g < 8; g++) {
            w[g] = _mm256_shuffle_epi8(levels, w[g]);
            magnitude[g] = _mm256_abs_epi8(w[g]);
        }
    }
    if (type != VSK_T5_0) return;
    const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 288 + 32 * v));
    w[0] = _mm256_or_si256(w[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), five));
    w[1] = _mm256_or_si256(w[1], _mm256_and_si256(_mm256_slli_epi16(h, 3), five));
    w[2] = _mm256_or_si256(w[2], _mm256_and_si256(_mm256_slli_epi16(h, 2), five));
    w[3] = _mm256_or_si256(w[3], _mm256_and_si256(_mm256_slli_epi16(h, 1), five));
    w[4] = _mm256_or_si256(w[4], _mm256_and_si256(h, five));
    w[5] = _mm256_or_si256(w[5], _mm256_and_si256(_mm256_srli_epi16(h, 1), five));
    w[6] = _mm256_or_si256(w[6], _mm256_and_si256(_mm256_srli_epi16(h, 2), five));
    w[7] = _mm256_or_si256(w[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), five));
}

/* the integer sum of activation row x against rows 8v .. 8v + 7's weights w (their magnitudes where signed) */
static inline __attribute__((always_inline)) __m256i dot32(int type, const __m256i *w, const __m256i *magnitude,
                                                           const vsk_act32 *x) {
    const int offset = type == VSK_T5_0 ? 16 : type == VSK_T4_0 ? 8 : 0; /* T8_0's products are signed */
    const int run = int16_run(type);
    __m256i s = _mm256_set1_epi32(-offset * (x->half[0] + x->half[1]));
    if (type == VSK_T8_0 || type == VSK_TIQ4_NL) { /* signed weights */
        for (int g = 0; g < 8; g++) s = in_order(dot(s, magnitude[g], _mm256_sign_epi8(broadcast_group(x, g), w[g])));
        return s;
    }
    for (int g0 = 0; g0 < 8; g0 += run) { /* int16 sums of `run` groups (int16_run) */
        __m256i pairs = _mm256_maddubs_epi16(w[g0], broadcast_group(x, g0));
        for (int g = g0 + 1; g < g0 + run; g++)
            pairs = in_order(_mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[g], broadcast_group(x, g))));
        s = in_order(_mm256_add_epi32(s, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))));
    }
    return s;
}

/* the tile body of the 32-weight forms (vsk_forms.h) */
static void tile32_rows(int type, const uint8_t *strip, int blocks, const uint8_t *xq, size_t x_stride, int rows,
                        float *y, int ldy, int lanes) {
    const int one = type == VSK_T4_1;
    const size_t block_bytes = (size_t)vsk_block_bytes(type);
    /* prefetch into L2 about 6 KiB ahead, as the AVX-512 path: 3 KiB held a Zen 4's one-row Q4_0 products to
     * 30 GB/s where the K-quant forms read 53 */
    const int lines = (int)(block_bytes / 64) + 1, ahead = type == VSK_T8_0 ? 12 : 16;
    __m256 acc[MAX_ROWS][2];
    for (int m = 0; m < rows; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = strip + (size_t)b * block_bytes;
        for (int l = 0; l < lines; l++)
            _mm_prefetch((const char *)blk + ahead * block_bytes + 64 * l, _MM_HINT_T1); /* into L2 */
        for (int v = 0; v < 2; v++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * v)));
            const __m256 mins = one ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 288 + 16 * v))) : d;
            __m256i w[8], magnitude[8];
            unpack32(type, blk, v, w, magnitude);
            const uint8_t *row = xq + (size_t)b * sizeof(vsk_act32);
            for (int m = 0; m < rows; m++, row += x_stride) {
                const vsk_act32 *x = (const vsk_act32 *)row;
                const __m256i s = dot32(type, w, magnitude, x);
                acc[m][v] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x->d)), _mm256_cvtepi32_ps(s), acc[m][v]);
                if (one) /* T4_1's minimums times the activations' sum */
                    acc[m][v] =
                        _mm256_fmadd_ps(mins, _mm256_set1_ps(x->d * (float)(x->half[0] + x->half[1])), acc[m][v]);
            }
        }
    }
    store_tile(acc, rows, y, ldy, lanes);
}

/* the body serving each family of tile forms (vsk_forms.h) */
#define TILES_tile32(entry, ...) entry(tile32_rows, MAX_ROWS, __VA_ARGS__)
#define TILES_tile256(entry, ...) entry(tile_rows, MAX_ROWS, __VA_ARGS__)
#define TILES_tile_kblock(entry, ...) entry(tile_rows, MAX_ROWS, __VA_ARGS__)

VSK_TILE_KERNELS(vsk_tile_kernel_avx2)

#endif
