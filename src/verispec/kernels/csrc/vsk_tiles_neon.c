/* Tile kernels (see vsk_tiles.c) on NEON, compiled three times: plain Advanced SIMD (widening multiplies), with
 * VSK_DOTPROD (vsk_tiles_neon_dot.c, built with +dotprod: sdot by lane) and with VSK_I8MM (vsk_tiles_neon_i8mm.c,
 * built with +dotprod+i8mm: smmla, two activation rows against two weight rows per instruction). The builds
 * differ only in how a sub-block's exact integer sums are formed (sums32 below); every float step is the portable
 * tile kernel's (vsk_tiles.c) on the same operands in the same order, a tile's 16 weight rows in four vectors of
 * four lanes. So each path computes the portable path's bits, and a row's result never depends on other rows. */
#include "vsk.h"

#if defined(VSK_I8MM)
#define NAME(x) x##_neon_i8mm
#elif defined(VSK_DOTPROD)
#define NAME(x) x##_neon_dot
#else
#define NAME(x) x##_neon
#endif

#if !defined(__aarch64__) || (defined(VSK_DOTPROD) && !defined(__ARM_FEATURE_DOTPROD)) ||                     \
    (defined(VSK_I8MM) && !defined(__ARM_FEATURE_MATMUL_INT8))
vsk_kernel NAME(vsk_tile_kernel)(int type) {
    (void)type;
    return NULL;
}
#else

#include "vsk_blocks.h"
#include "vsk_neon.h"

/* a sub-block of 32 weights of a tile's 16 rows as signed bytes: g[i][v] holds weights 4i .. 4i + 3 (the
 * group i of vsk_tiles.c) of rows 4v .. 4v + 3, four bytes per row */
typedef struct {
    int8x16_t g[8][4];
} sub_t;

/* the 16 bytes of rows 4v .. 4v + 3 in the 64-byte chunk at p */
static inline uint8x16_t chunk(const uint8_t *p, int v) { return vld1q_u8(p + 16 * v); }

/* bytes >> k (k a run-time value) */
static inline uint8x16_t shr(uint8x16_t x, int k) { return vshlq_u8(x, vdupq_n_s8((int8_t)-k)); }

/* group i's nibbles (chunk i % 4: low nibbles for i < 4, high ones after) */
static inline uint8x16_t nibble(const uint8_t *nibbles, int i, int v) {
    const uint8x16_t c = chunk(nibbles + 64 * (i % 4), v);
    return i < 4 ? vandq_u8(c, vdupq_n_u8(0x0F)) : vshrq_n_u8(c, 4);
}

/* group i's 2-bit values (chunk i / 4, bits 2 (i % 4)) */
static inline uint8x16_t crumb(const uint8_t *crumbs, int i, int v) {
    return vandq_u8(shr(chunk(crumbs + 64 * (i / 4), v), 2 * (i % 4)), vdupq_n_u8(3));
}

/* the sub-block j (32 weights) of a block of tile form `type` at blk, as the values the portable tile kernel dots:
 * T4_K's, T6_K's and T4_1's values as stored (0..15, 0..63), the others' signed weights or levels (T4_0 value - 8,
 * T5_0 value - 16, T8_0 the GGUF's byte, TIQ4_NL and TIQ4_XS their level, T3_K value - 4, T2_K and T5_K their
 * value). The portable kernels dot the unsigned values and take the offset off with the activations' sums: the
 * same integers. */
VSK_NEON_INLINE void unpack_sub(int type, const uint8_t *blk, int j, sub_t *w) {
    const int8x16_t levels = vld1q_s8(vsk_iq4_levels);
    for (int i = 0; i < 8; i++)
        for (int v = 0; v < 4; v++) {
            uint8x16_t u;
            int8x16_t s;
            switch (type) {
            case VSK_T4_K: s = vreinterpretq_s8_u8(nibble(blk + 320 + 256 * j, i, v)); break;
            case VSK_T6_K: {
                const uint8x16_t high = vandq_u8(shr(chunk(blk + 2336 + 128 * j + 64 * (i / 4), v), 2 * (i % 4)),
                                                 vdupq_n_u8(3));
                s = vreinterpretq_s8_u8(vorrq_u8(nibble(blk + 288 + 256 * j, i, v), vshlq_n_u8(high, 4)));
                break;
            }
            case VSK_T5_K:
                u = vandq_u8(shr(chunk(blk + 2368 + 64 * j, v), i), vdupq_n_u8(1));
                s = vreinterpretq_s8_u8(vorrq_u8(nibble(blk + 320 + 256 * j, i, v), vshlq_n_u8(u, 4)));
                break;
            case VSK_TIQ4_XS: s = vqtbl1q_s8(levels, nibble(blk + 160 + 256 * j, i, v)); break;
            case VSK_T3_K:
                u = vandq_u8(shr(chunk(blk + 1312 + 64 * j, v), i), vdupq_n_u8(1));
                s = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(crumb(blk + 288 + 128 * j, i, v), vshlq_n_u8(u, 2))),
                             vdupq_n_s8(4));
                break;
            case VSK_T2_K: s = vreinterpretq_s8_u8(crumb(blk + 320 + 128 * j, i, v)); break;
            case VSK_T4_0: s = vsubq_s8(vreinterpretq_s8_u8(nibble(blk + 32, i, v)), vdupq_n_s8(8)); break;
            case VSK_T4_1: s = vreinterpretq_s8_u8(nibble(blk + 32, i, v)); break;
            case VSK_T5_0:
                u = vandq_u8(shr(chunk(blk + 288, v), i), vdupq_n_u8(1));
                s = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nibble(blk + 32, i, v), vshlq_n_u8(u, 4))), vdupq_n_s8(16));
                break;
            case VSK_TIQ4_NL: s = vqtbl1q_s8(levels, nibble(blk + 32, i, v)); break;
            default: /* VSK_T8_0: weight + 128 stored */
                s = vreinterpretq_s8_u8(veorq_u8(chunk(blk + 32 + 64 * i, v), vdupq_n_u8(0x80)));
                break;
            }
            w->g[i][v] = s;
        }
}

/* The exact integer sums of a sub-block: S[h][m][v] = sum over the groups of half h (weights 16h .. 16h + 15) of
 * activation row m's bytes q[m][0..31] times rows 4v .. 4v + 3's values (one lane each), by smmla, sdot or widening
 * multiplies (each build its own). |products| <= 128 x 127, so two of them fit an int16 lane on the plain path. */
#if defined(VSK_I8MM)
/* rows n, n + 1's eight bytes of groups 2p, 2p + 1 side by side: b[p][v][k], one smmla operand per pair of weight
 * rows n = 4v + 2k */
static void pair_operands(const sub_t *w, int8x16_t (*b)[4][2]) {
    for (int p = 0; p < 4; p++)
        for (int v = 0; v < 4; v++) {
            const int32x4_t lo = vreinterpretq_s32_s8(w->g[2 * p][v]), hi = vreinterpretq_s32_s8(w->g[2 * p + 1][v]);
            b[p][v][0] = vreinterpretq_s8_s32(vzip1q_s32(lo, hi));
            b[p][v][1] = vreinterpretq_s8_s32(vzip2q_s32(lo, hi));
        }
}

static void sums32(const sub_t *w, const int8_t *const *q, int rows, int32x4_t (*S)[MAX_ROWS][4]) {
    int8x16_t b[4][4][2];
    pair_operands(w, b);
    for (int m = 0; m < rows; m += 2) {
        const int8_t *q0 = q[m], *q1 = q[m + 1 < rows ? m + 1 : m]; /* an odd last row meets itself (not kept) */
        for (int h = 0; h < 2; h++) {
            int32x4_t acc[4][2];
            for (int v = 0; v < 4; v++) acc[v][0] = acc[v][1] = vdupq_n_s32(0);
            for (int p = 2 * h; p < 2 * h + 2; p++) {
                const int8x16_t a = vcombine_s8(vld1_s8(q0 + 8 * p), vld1_s8(q1 + 8 * p));
                for (int v = 0; v < 4; v++) {
                    acc[v][0] = vmmlaq_s32(acc[v][0], a, b[p][v][0]);
                    acc[v][1] = vmmlaq_s32(acc[v][1], a, b[p][v][1]);
                }
            }
            /* acc[v][k] = (m x n, m x n + 1, m + 1 x n, m + 1 x n + 1) for n = 4v + 2k */
            for (int v = 0; v < 4; v++) {
                const int64x2_t a0 = vreinterpretq_s64_s32(acc[v][0]), a1 = vreinterpretq_s64_s32(acc[v][1]);
                S[h][m][v] = vreinterpretq_s32_s64(vzip1q_s64(a0, a1));
                if (m + 1 < rows) S[h][m + 1][v] = vreinterpretq_s32_s64(vzip2q_s64(a0, a1));
            }
        }
    }
}
#elif defined(VSK_DOTPROD)
static void sums32(const sub_t *w, const int8_t *const *q, int rows, int32x4_t (*S)[MAX_ROWS][4]) {
    for (int m = 0; m < rows; m++) {
        const int8x16_t a0 = vld1q_s8(q[m]), a1 = vld1q_s8(q[m] + 16);
        for (int v = 0; v < 4; v++) {
            const int32x4_t z = vdupq_n_s32(0);
            int32x4_t s0 = vdotq_laneq_s32(z, w->g[0][v], a0, 0), s1 = vdotq_laneq_s32(z, w->g[4][v], a1, 0);
            s0 = vdotq_laneq_s32(s0, w->g[1][v], a0, 1);
            s1 = vdotq_laneq_s32(s1, w->g[5][v], a1, 1);
            s0 = vdotq_laneq_s32(s0, w->g[2][v], a0, 2);
            s1 = vdotq_laneq_s32(s1, w->g[6][v], a1, 2);
            s0 = vdotq_laneq_s32(s0, w->g[3][v], a0, 3);
            s1 = vdotq_laneq_s32(s1, w->g[7][v], a1, 3);
            S[0][m][v] = s0;
            S[1][m][v] = s1;
        }
    }
}
#else
static void sums32(const sub_t *w, const int8_t *const *q, int rows, int32x4_t (*S)[MAX_ROWS][4]) {
    for (int m = 0; m < rows; m++)
        for (int h = 0; h < 2; h++) {
            /* lo: (row 4v: bytes 0+1, 2+3; row 4v + 1: 0+1, 2+3), hi: the same of rows 4v + 2, 4v + 3 */
            int32x4_t lo[4], hi[4];
            for (int v = 0; v < 4; v++) lo[v] = hi[v] = vdupq_n_s32(0);
            for (int i = 4 * h; i < 4 * h + 4; i++) {
                int32_t group;
                memcpy(&group, q[m] + 4 * i, 4);
                const int8x16_t a = vreinterpretq_s8_s32(vdupq_n_s32(group));
                for (int v = 0; v < 4; v++) {
                    lo[v] = vpadalq_s16(lo[v], vmull_s8(vget_low_s8(w->g[i][v]), vget_low_s8(a)));
                    hi[v] = vpadalq_s16(hi[v], vmull_high_s8(w->g[i][v], a));
                }
            }
            for (int v = 0; v < 4; v++) S[h][m][v] = vpaddq_s32(lo[v], hi[v]);
        }
}
#endif

/* the sums S of sub-block j (32 weights) of the block at blk against the activation rows' bytes q[m] + 32 j */
VSK_NEON_INLINE void sub_sums(int form, const uint8_t *blk, int j, const int8_t *const *q, int rows,
                              int32x4_t (*S)[MAX_ROWS][4]) {
    const int8_t *at[MAX_ROWS];
    sub_t w;
    for (int m = 0; m < rows; m++) at[m] = q[m] + 32 * j;
    unpack_sub(form, blk, j, &w);
    sums32(&w, at, rows, S);
}

/* 4 halves of rows 4v .. 4v + 3 at p as float32 (exact) */
static inline float32x4_t halves(const uint8_t *p, int v) { return halves4(p + 8 * v); }

/* 4 bytes of rows 4v .. 4v + 3 at p as float32 (exact), signed or not */
static inline float32x4_t byte_floats(const uint8_t *p, int v, int is_signed) {
    return vcvtq_f32_s32(bytes4(p + 4 * v, is_signed));
}

/* rows' sums into y (the weight rows below `lanes`) */
static inline void store_tile(float32x4_t (*acc)[4], int rows, float *y, int ldy, int lanes) {
    for (int m = 0; m < rows; m++) {
        float out[16];
        for (int v = 0; v < 4; v++) vst1q_f32(out + 4 * v, acc[m][v]);
        memcpy(y + (size_t)m * ldy, out, sizeof(float) * (size_t)lanes);
    }
}

/* T4_K and T6_K, as k_rows in vsk_tiles.c: per superblock and lane, sb sums (d x scale) x (the sub-block's integer
 * sum) over the sub-blocks in order, then takes off dmin x (minimums . sum32) (T4_K) or (32 d) x (scales . bsum)
 * (T6_K), and the accumulator gains sb x the activations' d */
VSK_NEON_INLINE void k_block(int form, const uint8_t *blk, const int8_t *const *q, const vsk_act256 *const *x,
                             int rows, float32x4_t (*acc)[4]) {
    const int six = form == VSK_T6_K;
    float32x4_t d[4], sb[MAX_ROWS][4];
    memset(sb, 0, sizeof sb[0] * (size_t)rows);
    for (int v = 0; v < 4; v++) d[v] = halves(blk, v);
    for (int j = 0; j < 8; j++) {
        int32x4_t S[2][MAX_ROWS][4];
        sub_sums(form, blk, j, q, rows, S);
        for (int v = 0; v < 4; v++)
            for (int h = 0; h < 2 && six; h++) {
                const float32x4_t scale = vmulq_f32(d[v], byte_floats(blk + 32 + 16 * (2 * j + h), v, 1));
                for (int m = 0; m < rows; m++)
                    sb[m][v] = vaddq_f32(sb[m][v], vmulq_f32(scale, vcvtq_f32_s32(S[h][m][v])));
            }
        for (int v = 0; v < 4 && !six; v++) {
            const float32x4_t scale = vmulq_f32(d[v], byte_floats(blk + 64 + 16 * j, v, 0));
            for (int m = 0; m < rows; m++)
                sb[m][v] = vaddq_f32(sb[m][v], vmulq_f32(scale, vcvtq_f32_s32(vaddq_s32(S[0][m][v], S[1][m][v]))));
        }
    }
    for (int v = 0; v < 4; v++) {
        int32x4_t c[16]; /* T6_K: the scales of the 16 sub-blocks; T4_K: the minimums of the 8 */
        const int count = six ? 16 : 8;
        for (int j = 0; j < count; j++)
            c[j] = six ? bytes4(blk + 32 + 16 * j + 4 * v, 1) : bytes4(blk + 192 + 16 * j + 4 * v, 0);
        const float32x4_t factor = six ? vmulq_n_f32(d[v], 32.0f) : halves(blk + 32, v);
        for (int m = 0; m < rows; m++) {
            const int16_t *sub = six ? x[m]->bsum : x[m]->sum32;
            int32x4_t terms = vdupq_n_s32(0);
            for (int j = 0; j < count; j++) terms = vmlaq_n_s32(terms, c[j], sub[j]);
            const float32x4_t total = vsubq_f32(sb[m][v], vmulq_f32(factor, vcvtq_f32_s32(terms)));
            acc[m][v] = vaddq_f32(acc[m][v], vmulq_n_f32(total, x[m]->d));
        }
    }
}

/* the scales of the 16 weights 32j + 16h .. of rows 4v .. 4v + 3 of a T2_K, T3_K, T5_K or TIQ4_XS superblock */
VSK_NEON_INLINE int32x4_t kblock_scale(int form, const uint8_t *blk, int j, int h, int v) {
    if (form == VSK_T3_K) return bytes4(blk + 32 + 16 * (2 * j + h) + 4 * v, 1);
    if (form == VSK_T2_K) return vandq_s32(bytes4(blk + 64 + 16 * (2 * j + h) + 4 * v, 0), vdupq_n_s32(0x0F));
    if (form == VSK_T5_K) return bytes4(blk + 64 + 16 * j + 4 * v, 0);
    return bytes4(blk + 32 + 16 * j + 4 * v, 1); /* TIQ4_XS */
}

/* acc += x->d (d isum) - x->d (dmin msum) per lane: the minimums' sums msum against the activations' sums */
VSK_NEON_INLINE void kblock_end(int form, const uint8_t *blk, const vsk_act256 *const *x, int rows,
                                int32x4_t (*isum)[4], float32x4_t (*acc)[4]) {
    const int mins = form == VSK_T2_K || form == VSK_T5_K;
    for (int v = 0; v < 4; v++) {
        const float32x4_t d = halves(blk, v), dmin = mins ? halves(blk + 32, v) : vdupq_n_f32(0.0f);
        int32x4_t mn[16]; /* per 16 weights (T2_K), or per 32 (T5_K, against sum32: the same integers) */
        for (int j = 0; j < 16 && mins; j++)
            mn[j] = form == VSK_T2_K ? vshrq_n_s32(bytes4(blk + 64 + 16 * j + 4 * v, 0), 4)
                                     : bytes4(blk + 192 + 16 * (j % 8) + 4 * v, 0);
        for (int m = 0; m < rows; m++) {
            int32x4_t msum = vdupq_n_s32(0);
            for (int j = 0; j < 16 && form == VSK_T2_K; j++) msum = vmlaq_n_s32(msum, mn[j], x[m]->bsum[j]);
            for (int j = 0; j < 8 && form == VSK_T5_K; j++) msum = vmlaq_n_s32(msum, mn[j], x[m]->sum32[j]);
            const float32x4_t a = vmulq_n_f32(vmulq_f32(d, vcvtq_f32_s32(isum[m][v])), x[m]->d);
            const float32x4_t c = vmulq_n_f32(vmulq_f32(dmin, vcvtq_f32_s32(msum)), x[m]->d);
            acc[m][v] = vaddq_f32(acc[m][v], vsubq_f32(a, c));
        }
    }
}

/* T2_K, T3_K, T5_K and TIQ4_XS, as vsk_kblock_dot (vsk_blocks.h) per lane: isum = scales . (sums per 16 weights),
 * msum = minimums . bsum, then x->d (d isum) - x->d (dmin msum) added to the accumulator */
VSK_NEON_INLINE void kblock_block(int form, const uint8_t *blk, const int8_t *const *q, const vsk_act256 *const *x,
                                  int rows, float32x4_t (*acc)[4]) {
    int32x4_t isum[MAX_ROWS][4];
    memset(isum, 0, sizeof isum[0] * (size_t)rows);
    for (int j = 0; j < 8; j++) {
        int32x4_t S[2][MAX_ROWS][4];
        sub_sums(form, blk, j, q, rows, S);
        for (int h = 0; h < 2; h++)
            for (int v = 0; v < 4; v++) {
                const int32x4_t scale = kblock_scale(form, blk, j, h, v);
                for (int m = 0; m < rows; m++) isum[m][v] = vmlaq_s32(isum[m][v], scale, S[h][m][v]);
            }
    }
    kblock_end(form, blk, x, rows, isum, acc);
}

/* the 32-weight forms, as rows32 in vsk_tiles.c: acc += (d x->d) s [+ m (x->d (its sum)) for T4_1]. (The other
 * forms' minimum term is 0 x a finite value: adding that zero changes no accumulator, which starts at +0 and so is
 * never -0.) */
VSK_NEON_INLINE void block32(int form, const uint8_t *blk, const int8_t *const *q, const vsk_act32 *const *x,
                             int rows, float32x4_t (*acc)[4]) {
    int32x4_t S[2][MAX_ROWS][4];
    sub_sums(form, blk, 0, q, rows, S);
    for (int v = 0; v < 4; v++) {
        const float32x4_t d = halves(blk, v);
        const float32x4_t mn = form == VSK_T4_1 ? halves(blk + 288, v) : vdupq_n_f32(0.0f);
        for (int m = 0; m < rows; m++) {
            const int32x4_t s = vaddq_s32(S[0][m][v], S[1][m][v]);
            float32x4_t step = vmulq_f32(vmulq_n_f32(d, x[m]->d), vcvtq_f32_s32(s));
            if (form == VSK_T4_1)
                step = vaddq_f32(step, vmulq_n_f32(mn, x[m]->d * (float)(x[m]->half[0] + x[m]->half[1])));
            acc[m][v] = vaddq_f32(acc[m][v], step);
        }
    }
}

/* the tile body (vsk_forms.h): each block of the strip against the activation rows, a tile's 16 weight rows in four
 * vectors of four lanes */
VSK_NEON_INLINE void tile_rows(int form, const uint8_t *strip, int blocks, const uint8_t *xq, size_t x_stride,
                               int rows, float *y, int ldy, int lanes) {
    const size_t block_bytes = (size_t)vsk_block_bytes(form);
    float32x4_t acc[MAX_ROWS][4];
    for (int m = 0; m < rows; m++)
        for (int v = 0; v < 4; v++) acc[m][v] = vdupq_n_f32(0.0f);
    for (int b = 0; b < blocks; b++) {
        const uint8_t *blk = strip + (size_t)b * block_bytes;
        const vsk_act32 *x32[MAX_ROWS];
        const vsk_act256 *x256[MAX_ROWS];
        const int8_t *q[MAX_ROWS]; /* the rows' activation bytes of the block */
        for (int m = 0; m < rows; m++) {
            x32[m] = vsk_act32_at(xq, x_stride, m, b);
            x256[m] = vsk_act256_at(xq, x_stride, m, b);
            q[m] = vsk_block_weights(form) == 32 ? x32[m]->q : x256[m]->q;
        }
        if (vsk_block_weights(form) == 32)
            block32(form, blk, q, x32, rows, acc);
        else if (form == VSK_T4_K || form == VSK_T6_K)
            k_block(form, blk, q, x256, rows, acc);
        else
            kblock_block(form, blk, q, x256, rows, acc);
    }
    store_tile(acc, rows, y, ldy, lanes);
}

/* every family of tile forms runs the one body (vsk_forms.h) */
#define TILES_tile32(entry, ...) entry(tile_rows, MAX_ROWS, __VA_ARGS__)
#define TILES_tile256(entry, ...) entry(tile_rows, MAX_ROWS, __VA_ARGS__)
#define TILES_tile_kblock(entry, ...) entry(tile_rows, MAX_ROWS, __VA_ARGS__)

VSK_TILE_KERNELS(NAME(vsk_tile_kernel))

#endif /* __aarch64__ */
