/* The 256-bit vector path, compiled twice: for AVX2 (u8 x s8 products through maddubs) and, with VSK_VNNI
 * defined (vsk_avx512.c), for CPUs with AVX-512 VNNI, whose 256-bit forms fuse the widening adds.
 * Integer sums are exact on both, so the two give the same integers; each keeps one float order per output.
 */
#include "vsk.h"

#if defined(VSK_VNNI)
#define NAME(x) x##_avx512
#else
#define NAME(x) x##_avx2
#endif

#if !defined(__x86_64__)
vsk_kernel NAME(vsk_kernel)(int type) {
    (void)type;
    return NULL;
}
#else

#if defined(VSK_VNNI)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

#include "vsk_blocks.h"


static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float half(const uint8_t *p) { return _cvtsh_ss(rd16(p)); }

/* int32 lanes += sums of 4 products u8 x s8 */
static inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if defined(VSK_VNNI)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

/* int32 lanes += sums of 2 products of int16 pairs */
static inline __m256i dot_s16(__m256i acc, __m256i a, __m256i b) {
#if defined(VSK_VNNI)
    return _mm256_dpwssd_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* ---- 32-weight block types: each block unpacked to 32 signed bytes ------------------------------------ */

/* byte j = 0xFF where bit j of the 32-bit word is set */
static inline __m256i bits_to_bytes(uint32_t word) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)word), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
}

/* 16 bytes of nibbles -> 32 bytes: weights 0..15 (low nibbles), then 16..31 (high nibbles), 0..15 */
static inline __m256i nibbles(const uint8_t *p) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)p);
    const __m128i mask = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
}

/* signed weights (Q4_0, Q5_0, Q8_0, IQ4_NL's levels), or unsigned 0..15 with a minimum (Q4_1) */
static inline __m256i unpack32(int type, const uint8_t *b, float *d, float *mn) {
    switch (type) {
    case VSK_Q4_0:
        *d = half(b);
        return _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
    case VSK_IQ4_NL:
        *d = half(b);
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)vsk_iq4_levels)),
                                   nibbles(b + 2));
    case VSK_MXFP4:
        *d = vsk_e8m0_half(b[0]);
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)vsk_mxfp4_levels)),
                                   nibbles(b + 1));
    case VSK_Q4_1:
        *d = half(b);
        *mn = half(b + 2);
        return nibbles(b + 4);
    case VSK_Q5_0: {
        *d = half(b);
        /* q - 16 = the nibble where the fifth bit is set, the nibble | 0xF0 where it is not */
        const __m256i high = _mm256_andnot_si256(bits_to_bytes(rd32(b + 2)), _mm256_set1_epi8((char)0xF0));
        return _mm256_or_si256(nibbles(b + 6), high);
    }
    default: /* VSK_Q8_0 */
        *d = half(b);
        return _mm256_loadu_si256((const __m256i *)(b + 2));
    }
}

/* the row bodies (vsk_forms.h): one weight row against `rows` activation rows. The 32-weight types: the weights'
 * magnitudes against the activations carrying their signs (Q4_1's unsigned values as they are, its minimum apart) */
static inline __attribute__((always_inline)) void q32_rows(int type, const uint8_t *row, int K, const uint8_t *xq,
                                                           size_t x_stride, int rows, float *y, int ldy) {
    const int with_min = type == VSK_Q4_1;
    __m256 acc[MAX_ROWS];
    float mins[MAX_ROWS];
    for (int m = 0; m < rows; m++) {
        acc[m] = _mm256_setzero_ps();
        mins[m] = 0.0f;
    }
    for (int b = 0; b < K / 32; b++) {
        float d, mn = 0.0f;
        const __m256i w = unpack32(type, row + (size_t)b * vsk_block_bytes(type), &d, &mn);
        const __m256i u = with_min ? w : _mm256_sign_epi8(w, w); /* |w| */
        for (int m = 0; m < rows; m++) {
            const vsk_act32 *x = vsk_act32_at(xq, x_stride, m, b);
            __m256i s = _mm256_loadu_si256((const __m256i *)x->q);
            if (!with_min) s = _mm256_sign_epi8(s, w); /* the weight's sign moves to the activation */
            const __m256i p = dot_u8s8(_mm256_setzero_si256(), u, s);
            acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(d * x->d), _mm256_cvtepi32_ps(p), acc[m]);
            if (with_min) mins[m] += mn * (x->d * (float)(x->half[0] + x->half[1]));
        }
    }
    for (int m = 0; m < rows; m++) y[(size_t)m * ldy] = hsum(acc[m]) + mins[m];
}

/* ---- Q4_K and Q6_K: a superblock's values unpacked once, then each row's sub-block sums meet their scales -- */

/* Q4_K's 256 values 0..15, 32 per register: register j is sub-block j */
static inline void q4_k_unpack(const uint8_t *qs, __m256i *q) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        q[2 * c] = _mm256_and_si256(raw, low);
        q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    }
}

/* one superblock of a weight row against each activation row (acc[m]: row m's lanes) */
static inline void q4_k_step(const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows, __m256 *acc) {
    const float d = half(blk), dmin = half(blk + 2);
    uint8_t sc[8], mn[8];
    __m256i q[8];
    q4_k_scales(blk + 4, sc, mn);
    q4_k_unpack(blk + 16, q);
    /* mins as int16 pairs [m0, m0, m1, m1, ...] against the activation's 16-sums */
    const __m256i mins = _mm256_cvtepu8_epi16(
        _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)mn), _mm_loadl_epi64((const __m128i *)mn)));
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i s = _mm256_loadu_si256((const __m256i *)(x->q + 32 * j));
            isum = dot_s16(isum, _mm256_maddubs_epi16(q[j], s), _mm256_set1_epi16(sc[j]));
        }
        const __m256i msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsum), mins);
        acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(x->d * d), _mm256_cvtepi32_ps(isum), acc[m]);
        acc[m] = _mm256_fnmadd_ps(_mm256_set1_ps(x->d * dmin), _mm256_cvtepi32_ps(msum), acc[m]);
    }
}

/* Q6_K's 256 values 0..63 in weight order, 32 per register: register j spans scales 2j and 2j + 1 */
static inline void q6_k_unpack(const uint8_t *blk, __m256i *q) {
    const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_and_si256(_mm256_slli_epi16(hb, 4), two));
        q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_and_si256(_mm256_slli_epi16(hb, 2), two));
        q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), _mm256_and_si256(hb, two));
        q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                       _mm256_and_si256(_mm256_srli_epi16(hb, 2), two));
    }
}

static inline void q6_k_step(const uint8_t *blk, const uint8_t *xq, size_t x_stride, int b, int rows, __m256 *acc) {
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = half(blk + 208);
    __m256i q[8], scale[8];
    q6_k_unpack(blk, q);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)); /* for the offset */
    for (int j = 0; j < 8; j++) scale[j] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * j + 1]), _mm_set1_epi16(sc[2 * j]));
    for (int m = 0; m < rows; m++) {
        const vsk_act256 *x = vsk_act256_at(xq, x_stride, m, b);
        __m256i isum = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i s = _mm256_loadu_si256((const __m256i *)(x->q + 32 * j));
            isum = dot_s16(isum, _mm256_maddubs_epi16(q[j], s), scale[j]);
        }
        /* the values are offset by 32: subtract 32 * sum_j scale_j * bsum_j */
        const __m256i offset = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsum), sc16);
        isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(offset, 5));
        acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(d * x->d), _mm256_cvtepi32_ps(isum), acc[m]);
    }
}

/* the row body of Q4_K and Q6_K (vsk_forms.h) */
static inline __attribute__((always_inline)) void k_rows(int type, const uint8_t *row, int K, const uint8_t *xq,
                                                         size_t x_stride, int rows, float *y, int ldy) {
    __m256 acc[MAX_ROWS];
    for (int m = 0; m < rows; m++) acc[m] = _mm256_setzero_ps();
    for (int b = 0; b < K / 256; b++) {
        const uint8_t *blk = row + (size_t)b * (size_t)vsk_block_bytes(type);
        if (type == VSK_Q4_K)
            q4_k_step(blk, xq, x_stride, b, rows, acc);
        else
            q6_k_step(blk, xq, x_stride, b, rows, acc);
    }
    for (int m = 0; m < rows; m++) y[(size_t)m * ldy] = hsum(acc[m]);
}

/* ---- dense types (F32, F16, BF16): the rule's 16 lanes in two vectors (vsk_dense.h) ----------------------- */

typedef __m256 dense_vec;

/* weights k .. k + 15 of a dense row as float32 */
static inline void dense_weights(int type, const uint8_t *row, int k, __m256 *w) {
    for (int h = 0; h < 2; h++) {
        if (type == VSK_F32) {
            w[h] = _mm256_loadu_ps((const float *)row + k + 8 * h);
            continue;
        }
        const __m128i raw = _mm_loadu_si128((const __m128i *)(row + 2 * ((size_t)k + 8 * h)));
        w[h] = type == VSK_F16 ? _mm256_cvtph_ps(raw)
                               : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    }
}

#define VSK_DENSE_VECTORS 1
#include "vsk_dense.h"

/* the body serving each family of types (vsk_forms.h); Q2_K, Q3_K, Q5_K and IQ4_XS run the portable kernels */
#define ROWS_q32(entry, ...) entry(q32_rows, __VA_ARGS__)
#define ROWS_mxfp4(entry, ...) entry(q32_rows, __VA_ARGS__)
#define ROWS_q4_k(entry, ...) entry(k_rows, __VA_ARGS__)
#define ROWS_q6_k(entry, ...) entry(k_rows, __VA_ARGS__)
#define ROWS_kblock(entry, ...)
#define ROWS_dense(entry, ...) entry(dense_rows, __VA_ARGS__)

VSK_ROW_KERNELS(NAME(vsk_kernel))

#endif /* __x86_64__ */
