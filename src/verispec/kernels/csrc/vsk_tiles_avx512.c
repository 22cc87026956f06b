/* Tile kernels (see vsk_tiles.c) on AVX-512 VNNI: one register holds a 4-weight group of 16 rows, and one
 * vpdpbusd meets it with a broadcast group of activations. */
#include "vsk.h"

#if !defined(__x86_64__)
vsk_kernel vsk_tile_kernel_avx512(int type) {
    (void)type;
    return NULL;
}
#else

#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#include <immintrin.h>

#include "vsk_blocks.h"


static inline __m512 bytes_to_floats(const uint8_t *p, int is_signed) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)p);
    return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(raw) : _mm512_cvtepu8_epi32(raw));
}

/* a | (b & mask) in one instruction */
static inline __m512i or_masked(__m512i a, __m512i b, __m512i mask) { return _mm512_ternarylogic_epi32(a, b, mask, 0xF8); }

/* rows' sums into y (the lanes of weight rows below `lanes`) */
static inline void store_tile(const __m512 *acc, int rows, float *y, int ldy, int lanes) {
    const __mmask16 keep = (__mmask16)((1u << lanes) - 1u);
    for (int m = 0; m < rows; m++) _mm512_mask_storeu_ps(y + (size_t)m * ldy, keep, acc[m]);
}

/* 4 activation bytes broadcast to the 16 lanes */
static inline __m512i broadcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* group g (0..7) of a 32-block: weights 4g.. of the first 16 for g < 4, of the second 16 after */
static inline __m512i broadcast_group(const int8_t *q, int g) { return broadcast4(q + (g < 4 ? 4 * g : 16 + 4 * (g - 4))); }

/* s + a row's dot products of the eight 4-weight groups w[g] of a 32-block with its activations q. `split` (a
 * constant: four rows or more, where the products are compute-bound) runs them as two chains of four, each half
 * the latency of eight, added once: integer sums, so the same bits (an 8-row pass 6% faster on Zen 4, e599401) */
static inline __attribute__((always_inline)) __m512i dot_groups(const int split, __m512i s, const __m512i *w,
                                                                const int8_t *q) {
    __m512i s1 = _mm512_setzero_si512();
    for (int g = 0; g < 8; g++) {
        if (split && g >= 4)
            s1 = _mm512_dpbusd_epi32(s1, w[g], broadcast_group(q, g));
        else
            s = _mm512_dpbusd_epi32(s, w[g], broadcast_group(q, g));
    }
    return split ? _mm512_add_epi32(s, s1) : s;
}

/* bit g of each byte of h moved to bit `to` (shifts of 16-bit lanes: the bits kept never cross a byte) */
static inline __m512i bit_at(__m512i h, int g, int to) {
    return g < to ? _mm512_slli_epi16(h, (unsigned)(to - g)) : _mm512_srli_epi16(h, (unsigned)(g - to));
}

/* The 256-weight forms, told apart by constants (each instance folds them away):
 *  - sub-blocks of 32 (T4_K, T5_K, TIQ4_XS: one scale per 32 weights) or 16 (T6_K, T3_K, T2_K: the groups 0..3
 *    and 4..7 of 32 weights have their own scales);
 *  - an offset of the values (T6_K 32, T3_K 4, TIQ4_XS's levels + 128: 128) that starts each integer sum at
 *    -offset x the activations' sum;
 *  - minimums (T4_K, T5_K per 32 weights, T2_K per 16) taken off per superblock. */
static inline int value_offset(int form) {
    return form == VSK_T6_K ? 32 : form == VSK_T3_K ? 4 : form == VSK_TIQ4_XS ? 128 : 0;
}

/* superblocks read ahead: about 7 KiB (e599401: three Q4_K or two Q6_K; four of either left a Zen 4's T(1) 3-8%
 * slower) */
static inline int kblocks_ahead(int form) {
    return form == VSK_T6_K || form == VSK_T5_K ? 2 : form == VSK_T3_K ? 4 : form == VSK_T2_K ? 5 : 3;
}

/* the eight 4-weight groups of sub-block pair j (32 weights) of 16 rows, as unsigned bytes */
static inline __attribute__((always_inline)) void unpack_pair(const int form, const uint8_t *blk, int j, __m512i *w) {
    const __m512i low = _mm512_set1_epi8(0x0F), crumb = _mm512_set1_epi8(3);
    if (form == VSK_T3_K || form == VSK_T2_K) { /* crumbs: two chunks of four groups */
        const uint8_t *crumbs = blk + (form == VSK_T3_K ? 288 : 320) + 128 * j;
        for (int k = 0; k < 2; k++) {
            const __m512i p = _mm512_loadu_si512((const void *)(crumbs + 64 * k));
            w[4 * k] = _mm512_and_si512(p, crumb);
            for (int i = 1; i < 4; i++) w[4 * k + i] = _mm512_and_si512(_mm512_srli_epi16(p, 2 * i), crumb);
        }
        if (form == VSK_T3_K) { /* the third bits */
            const __m512i h = _mm512_loadu_si512((const void *)(blk + 1312 + 64 * j)), three = _mm512_set1_epi8(4);
            for (int g = 0; g < 8; g++) w[g] = or_masked(w[g], bit_at(h, g, 2), three);
        }
        return;
    }
    const uint8_t *nibbles = blk + (form == VSK_T6_K ? 288 : form == VSK_TIQ4_XS ? 160 : 320) + 256 * j;
    for (int i = 0; i < 4; i++) {
        const __m512i p = _mm512_loadu_si512((const void *)(nibbles + 64 * i));
        w[i] = _mm512_and_si512(p, low);
        w[4 + i] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
    }
    if (form == VSK_T6_K) {
        const uint8_t *high = blk + 2336 + 128 * j;
        const __m512i two = _mm512_set1_epi8(0x30);
        for (int k = 0; k < 2; k++) {
            const __m512i h = _mm512_loadu_si512((const void *)(high + 64 * k));
            w[4 * k + 0] = or_masked(w[4 * k + 0], _mm512_slli_epi16(h, 4), two);
            w[4 * k + 1] = or_masked(w[4 * k + 1], _mm512_slli_epi16(h, 2), two);
            w[4 * k + 2] = or_masked(w[4 * k + 2], h, two);
            w[4 * k + 3] = or_masked(w[4 * k + 3], _mm512_srli_epi16(h, 2), two);
        }
    } else if (form == VSK_T5_K) {
        const __m512i h = _mm512_loadu_si512((const void *)(blk + 2368 + 64 * j)), five = _mm512_set1_epi8(0x10);
        for (int g = 0; g < 8; g++) w[g] = or_masked(w[g], bit_at(h, g, 4), five);
    } else if (form == VSK_TIQ4_XS) { /* indices to their levels + 128 */
        const __m512i levels = _mm512_broadcast_i32x4(
            _mm_add_epi8(_mm_loadu_si128((const __m128i *)vsk_iq4_levels), _mm_set1_epi8((char)0x80)));
        for (int g = 0; g < 8; g++) w[g] = _mm512_shuffle_epi8(levels, w[g]);
    }
}

/* d x the 16 rows' scales of sub-block pair j: of its groups 0..3 (scale[0]) and 4..7 (scale[1], sub16 forms) */
static inline __attribute__((always_inline)) void pair_scales(const int form, const uint8_t *blk, int j, __m512 d,
                                                              __m512 *scale) {
    if (form == VSK_T4_K || form == VSK_T5_K) {
        scale[0] = _mm512_mul_ps(d, bytes_to_floats(blk + 64 + 16 * j, 0));
    } else if (form == VSK_TIQ4_XS) {
        scale[0] = _mm512_mul_ps(d, bytes_to_floats(blk + 32 + 16 * j, 1));
    } else {
        for (int k = 0; k < 2; k++) {
            const uint8_t *s = blk + (form == VSK_T2_K ? 64 : 32) + 16 * (2 * j + k);
            if (form == VSK_T2_K) { /* the low nibbles of scale | min << 4 */
                const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s));
                scale[k] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F))));
            } else {
                scale[k] = _mm512_mul_ps(d, bytes_to_floats(s, 1));
            }
        }
    }
}

/* the 16 rows' minimums of sub-blocks 2i and 2i + 1 as int16 pairs: T4_K and T5_K of 32 weights (bytes), T2_K of
 * 16 (the high nibbles of scale | min << 4) */
static inline __m512i min_pairs(int form, const uint8_t *blk, int i) {
    const uint8_t *a = blk + (form == VSK_T2_K ? 64 : 192) + 32 * i;
    __m512i first = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)a));
    __m512i second = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(a + 16)));
    if (form == VSK_T2_K) {
        first = _mm512_srli_epi32(first, 4);
        second = _mm512_srli_epi32(second, 4);
    }
    return _mm512_or_si512(first, _mm512_slli_epi32(second, 16));
}

/* sb[m] += sub-block pair j's sums of activation row m, each times its scale (times the superblock's d), for
 * `rows` rows (a constant) */
static inline __attribute__((always_inline)) void pair_step(const int form, const int rows, const uint8_t *blk, int j,
                                                            __m512 d, const uint8_t *xq, size_t x_stride, int b,
                                                            __m512 *sb) {
    const int offset = value_offset(form);
    __m512i w[8];
    __m512 scale[2];
    unpack_pair(form, blk, j, w);
    pair_scales(form, blk, j, d, scale);
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        const int8_t *q = x->q + 32 * j;
        if (vsk_sub16(form)) { /* two sums of 16 weights, each its own chain */
            __m512i lo = _mm512_set1_epi32(-offset * x->bsum[2 * j]);
            __m512i hi = _mm512_set1_epi32(-offset * x->bsum[2 * j + 1]);
            for (int g = 0; g < 4; g++) lo = _mm512_dpbusd_epi32(lo, w[g], broadcast_group(q, g));
            for (int g = 4; g < 8; g++) hi = _mm512_dpbusd_epi32(hi, w[g], broadcast_group(q, g));
            sb[m] = _mm512_fmadd_ps(scale[0], _mm512_cvtepi32_ps(lo), sb[m]);
            sb[m] = _mm512_fmadd_ps(scale[1], _mm512_cvtepi32_ps(hi), sb[m]);
        } else {
            const __m512i s = dot_groups(rows >= 4, _mm512_set1_epi32(-offset * x->sum32[j]), w, q);
            sb[m] = _mm512_fmadd_ps(scale[0], _mm512_cvtepi32_ps(s), sb[m]);
        }
    }
}

/* acc[m] += the superblock's sb[m], less dmin sum_j min_j sum_j(activations) (an integer dot product over the
 * activations' sums), times the activations' scale */
static inline __attribute__((always_inline)) void superblock_end(const int form, const int rows, const uint8_t *blk,
                                                                 __m512 d, const uint8_t *xq, size_t x_stride, int b,
                                                                 __m512 *sb, __m512 *acc) {
    const int mins = form == VSK_T4_K || form == VSK_T5_K ? 4 : form == VSK_T2_K ? 8 : 0;
    __m512i pairs[8];
    for (int i = 0; i < mins; i++) pairs[i] = min_pairs(form, blk, i);
    const __m512 dmin = mins ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32))) : d;
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        if (mins) {
            const int16_t *sums = form == VSK_T2_K ? x->bsum : x->sum32;
            __m512i terms = _mm512_setzero_si512();
            for (int i = 0; i < mins; i++) terms = _mm512_dpwssd_epi32(terms, pairs[i], broadcast4(sums + 2 * i));
            sb[m] = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(terms), sb[m]);
        }
        acc[m] = _mm512_fmadd_ps(sb[m], _mm512_set1_ps(x->d), acc[m]);
    }
}

/* `rows` (1..8, a constant in each instance, so that each row's sums stay in registers) activation rows of 256-
 * blocks against a strip of a 256-weight form. Per row and superblock: each sub-block's integer sum meets its scale
 * (times the superblock's d) in one multiply-add (an offset of the values starts each sum, from the activations'
 * sums), the minimums are one integer dot product over the activations' sums (vpdpwssd), and the superblock meets
 * the activations' scale once. vpdpbusd, multiply-adds and vpdpwssd share the multiply units (AMD Zen 4: one 512-bit
 * operation per cycle between them; broadcasts, conversions and integer adds are beside them), so each of these
 * steps saved is time saved at every row. */
static inline __attribute__((always_inline)) void tile_rows(const int form, const int rows, const uint8_t *strip,
                                                            int blocks, const uint8_t *xq, size_t x_stride,
                                                            float *y, int ldy, int lanes) {
    const size_t block_bytes = (size_t)vsk_block_bytes(form), pair_bytes = block_bytes / 8;
    __m512 acc[8], sb[8];
    for (int m = 0; m < rows; m++) acc[m] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = strip + (size_t)b * block_bytes;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        for (int m = 0; m < rows; m++) sb[m] = _mm512_setzero_ps();
        for (int j = 0; j < 8; j++) {
            /* keep memory busy while the rows are computed: ask for the data about 7 KiB ahead, into L2 (L1's few
             * fill buffers held too few reads in flight: 25 % slower on Sapphire Rapids, 0686372) */
            for (int l = 0; l < (int)((pair_bytes + 63) / 64); l++)
                _mm_prefetch((const char *)blk + kblocks_ahead(form) * block_bytes + (size_t)j * pair_bytes + 64 * l,
                             _MM_HINT_T1);
            pair_step(form, rows, blk, j, d, xq, x_stride, b, sb);
        }
        superblock_end(form, rows, blk, d, xq, x_stride, b, sb, acc);
    }
    store_tile(acc, rows, y, ldy, lanes);
}

/* the tile body of the 256-weight forms (vsk_forms.h): up to 8 rows, an instance of tile_rows per count (a strip is
 * unpacked once per 8 rows) */
static inline __attribute__((always_inline)) void tile_groups(const int form, const uint8_t *strip, int blocks,
                                                              const uint8_t *xq, size_t x_stride, int rows, float *y,
                                                              int ldy, int lanes) {
    switch (rows) {
#define ROWS(r)                                                                                                   \
    case r: tile_rows(form, r, strip, blocks, xq, x_stride, y, ldy, lanes); break;
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#undef ROWS
    }
}

/* the 32-weight tile forms. T4_0: values 0..15 (nibbles), the weight d (value - 8); T4_1: d value + m. T5_0: values 0..31
 * (nibbles and a fifth bit), the weight d (value - 16). T8_0: unsigned bytes (weight + 128), which vpdpbusd
 * takes as they are; TIQ4_NL: nibbles looked up (one shuffle per group) as their levels + 128, the same. Either way
 * the offset times the activations' sum is taken off. */
static inline void unpack32(int type, const uint8_t *blk, __m512i *w) {
    if (type == VSK_T8_0) {
        for (int g = 0; g < 8; g++) w[g] = _mm512_loadu_si512((const void *)(blk + 32 + 64 * g));
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0F), five = _mm512_set1_epi8(0x10);
    for (int i = 0; i < 4; i++) {
        const __m512i p = _mm512_loadu_si512((const void *)(blk + 32 + 64 * i));
        w[i] = _mm512_and_si512(p, low);
        w[4 + i] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
    }
    if (type == VSK_TIQ4_NL) {
        const __m512i levels = _mm512_broadcast_i32x4(
            _mm_add_epi8(_mm_loadu_si128((const __m128i *)vsk_iq4_levels), _mm_set1_epi8((char)0x80)));
        for (int g = 0; g < 8; g++) w[g] = _mm512_shuffle_epi8(levels, w[g]);
    }
    if (type != VSK_T5_0) return;
    const __m512i h = _mm512_loadu_si512((const void *)(blk + 288));
    w[0] = or_masked(w[0], _mm512_slli_epi16(h, 4), five);
    w[1] = or_masked(w[1], _mm512_slli_epi16(h, 3), five);
    w[2] = or_masked(w[2], _mm512_slli_epi16(h, 2), five);
    w[3] = or_masked(w[3], _mm512_slli_epi16(h, 1), five);
    w[4] = or_masked(w[4], h, five);
    w[5] = or_masked(w[5], _mm512_srli_epi16(h, 1), five);
    w[6] = or_masked(w[6], _mm512_srli_epi16(h, 2), five);
    w[7] = or_masked(w[7], _mm512_srli_epi16(h, 3), five);
}

/* `rows` activation rows (at most MAX_ROWS) against a strip; a constant `rows` (1..8) keeps each row's sums in
 * registers */
static inline __attribute__((always_inline)) void tile32_rows(const int type, const int rows, const uint8_t *strip,
                                                              int blocks, const uint8_t *xq, size_t x_stride,
                                                              float *y, int ldy, int lanes) {
    const int one = type == VSK_T4_1;
    const int offset = type == VSK_T8_0 || type == VSK_TIQ4_NL ? 128 : type == VSK_T5_0 ? 16 : type == VSK_T4_0 ? 8 : 0;
    const size_t block_bytes = (size_t)vsk_block_bytes(type);
    /* prefetch into L2 about 6 KiB ahead: 3 KiB (0686372 to 61c27d6) left a Zen 4's draft step 9-18% slower,
     * 12 KiB gained nothing more (in-process alternation, 9dc9d67) */
    const int lines = (int)(block_bytes / 64) + 1, ahead = type == VSK_T8_0 ? 12 : 16;
    __m512 acc[MAX_ROWS];
    for (int m = 0; m < rows; m++) acc[m] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = strip + (size_t)b * block_bytes;
        for (int l = 0; l < lines; l++) _mm_prefetch((const char *)blk + ahead * block_bytes + 64 * l, _MM_HINT_T1);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 mins = one ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 288))) : d;
        __m512i w[8];
        unpack32(type, blk, w);
        for (int m = 0; m < rows; m++) {
            const vsk_act32 *x = vsk_act32_at(xq, x_stride, m, b);
            const __m512i s = dot_groups(rows >= 4, _mm512_set1_epi32(-offset * (x->half[0] + x->half[1])), w, x->q);
            acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x->d)), _mm512_cvtepi32_ps(s), acc[m]);
            if (one) /* T4_1's minimums times the activations' sum */
                acc[m] = _mm512_fmadd_ps(mins, _mm512_set1_ps(x->d * (float)(x->half[0] + x->half[1])), acc[m]);
        }
    }
    store_tile(acc, rows, y, ldy, lanes);
}

/* the tile body of the 32-weight forms (vsk_forms.h): up to 8 rows an instance per count (the decode steps and
 * verify passes); more, one sweep of them (each row's operations are the same either way, so its bits are too) */
static void tile32_sweep(int type, const uint8_t *strip, int blocks, const uint8_t *xq, size_t x_stride, int rows,
                         float *y, int ldy, int lanes) {
    switch (rows) {
#define ROWS(r)                                                                                                   \
    case r: tile32_rows(type, r, strip, blocks, xq, x_stride, y, ldy, lanes); break;
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#undef ROWS
    default: tile32_rows(type, rows, strip, blocks, xq, x_stride, y, ldy, lanes);
    }
}

/* the body serving each family of tile forms (vsk_forms.h) */
#define TILES_tile32(entry, ...) entry(tile32_sweep, MAX_ROWS, __VA_ARGS__)
#define TILES_tile256(entry, ...) entry(tile_groups, 8, __VA_ARGS__)
#define TILES_tile_kblock(entry, ...) entry(tile_groups, 8, __VA_ARGS__)

VSK_TILE_KERNELS(vsk_tile_kernel_avx512)

#endif
