/* neon_check: the AArch64 paths of the native kernels against the portable path, bit for bit.
 *
 * Built for AArch64 with the kernel sources (tools/neon-check.sh) and run on an AArch64 CPU or under qemu-user.
 * It runs every path this CPU has (portable, NEON, NEON + sdot, NEON + smmla; the CPU's features read from the
 * auxiliary vector, as the library does) over random blocks of every block type, and checks:
 *  - each path's row-layout and tile kernels give the portable kernels' bits, for M = 1 .. 33 activation rows
 *    (more than one sweep of 16) and N not a multiple of 16, and the same bits when the weight rows are split
 *    among calls as the thread pool splits them;
 *  - a row's result is the same bits when computed alone (batch invariance);
 *  - the per-row steps (activation quantization, sum of squares, SwiGLU, argmax) give the portable bits;
 *  - the library's own dispatch: its best path is the one the CPU's features call for (and, given as argv[1],
 *    the one expected), it refuses paths beyond it and the x86 ones, and vsk_linear on each path it accepts gives
 *    the portable path's bits;
 *  - negative control: one flipped weight bit is detected by the same comparison, for every type and path.
 * With --digest it prints a hash of the portable path's results instead (the script compares the AArch64 build's
 * with an x86-64 build's). Exit status 0 when all hold. NEON_CHECK_SEED (a nonzero integer) draws other random blocks. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "vsk.h"
#include "vsk_rows.h"

#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif

/* the library's entry points (vsk_core.c) */
int vsk_best_isa(void);
int vsk_set_isa(int isa);
void vsk_set_threads(int n);
size_t vsk_repacked_bytes(int type, int N, int K);
int vsk_repack(int type, const uint8_t *src, size_t row_bytes, int N, int K, uint8_t *dst);
int vsk_linear(int type, const uint8_t *W, size_t row_bytes, int N, int K, const float *x, int M, uint8_t *scratch,
               float *y);

static uint64_t state = 0x9E3779B97F4A7C15ull;

static uint32_t next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (uint32_t)(state >> 16);
}

static float uniform(void) { return (float)(next() & 0xFFFFFF) / 8388608.0f - 1.0f; } /* [-1, 1) */

typedef struct {
    const char *name;
    int type, block, bytes; /* weights and bytes per GGUF block (1 and the value's size for the dense types) */
    int half[2];            /* offsets of the block's float16 factors (-1: none) */
    int value_byte;         /* a byte of the first block holding weight values (the negative control's) */
} type_t;

static const type_t TYPES[] = {
    {"Q4_0", VSK_Q4_0, 32, 18, {0, -1}, 5},       {"Q4_1", VSK_Q4_1, 32, 20, {0, 2}, 7},
    {"Q5_0", VSK_Q5_0, 32, 22, {0, -1}, 9},       {"Q8_0", VSK_Q8_0, 32, 34, {0, -1}, 9},
    {"IQ4_NL", VSK_IQ4_NL, 32, 18, {0, -1}, 5},   {"Q2_K", VSK_Q2_K, 256, 84, {80, 82}, 20},
    {"Q3_K", VSK_Q3_K, 256, 110, {108, -1}, 40},  {"Q4_K", VSK_Q4_K, 256, 144, {0, 2}, 20},
    {"Q5_K", VSK_Q5_K, 256, 176, {0, 2}, 60},     {"Q6_K", VSK_Q6_K, 256, 210, {208, -1}, 10},
    {"IQ4_XS", VSK_IQ4_XS, 256, 136, {0, -1}, 20}, {"F32", VSK_F32, 1, 4, {-1, -1}, 6},
    {"F16", VSK_F16, 1, 2, {-1, -1}, 6},          {"BF16", VSK_BF16, 1, 2, {-1, -1}, 6},
};
#define TYPE_COUNT (int)(sizeof TYPES / sizeof TYPES[0])

typedef struct {
    const char *name;
    int isa;
    vsk_kernel (*rows)(int type);
    vsk_kernel (*tiles)(int type);
    int needs; /* 0: Advanced SIMD; 1: sdot; 2: sdot and smmla */
} path_t;

/* the row layouts of the i8mm path are the dotprod ones (vsk_core.c: kernel_for) */
static const path_t PATHS[] = {
    {"neon", VSK_ISA_NEON, vsk_kernel_neon, vsk_tile_kernel_neon, 0},
    {"neon_dot", VSK_ISA_NEON_DOT, vsk_kernel_neon_dot, vsk_tile_kernel_neon_dot, 1},
    {"neon_i8mm", VSK_ISA_NEON_I8MM, vsk_kernel_neon_dot, vsk_tile_kernel_neon_i8mm, 2},
};

static long checks = 0, failures = 0, controls = 0;

static void fail(const char *what, const char *type, const char *path, int M) {
    failures++;
    if (failures <= 20) printf("FAIL %s: %s on %s, M = %d\n", what, type, path, M);
}

/* random weights: random bytes, the float16 factors small normal numbers (no inf or NaN) */
static void random_weights(const type_t *t, int N, int K, uint8_t *W) {
    const size_t row_bytes = (size_t)(K / t->block) * t->bytes;
    for (size_t i = 0; i < (size_t)N * row_bytes; i++) W[i] = (uint8_t)next();
    for (int n = 0; n < N; n++)
        for (int b = 0; b < K / t->block; b++) {
            uint8_t *blk = W + (size_t)n * row_bytes + (size_t)b * t->bytes;
            if (t->type == VSK_F32) {
                const float f = uniform();
                memcpy(blk, &f, 4);
            } else if (t->type == VSK_F16) {
                const uint16_t h = vsk_fp32_to_fp16(uniform());
                memcpy(blk, &h, 2);
            } else if (t->type == VSK_BF16) {
                const float f = uniform();
                uint32_t bits;
                memcpy(&bits, &f, 4);
                const uint16_t h = (uint16_t)(bits >> 16);
                memcpy(blk, &h, 2);
            }
            for (int i = 0; i < 2; i++)
                if (t->half[i] >= 0) {
                    const uint16_t h = vsk_fp32_to_fp16(uniform() * 0.05f);
                    memcpy(blk + t->half[i], &h, 2);
                }
        }
}

/* random activations, with exact zeros and one block of 32 zeros per row (a scale of 0) */
static void random_rows(int M, int K, float *x) {
    for (int i = 0; i < M * K; i++) x[i] = next() % 17 == 0 ? 0.0f : uniform() * 3.0f;
    for (int m = 0; m < M; m++) memset(x + (size_t)m * K + 32 * (m % (K / 32)), 0, 32 * sizeof(float));
}

/* xq: M rows quantized by the portable path (or the floats themselves, for the dense types) */
static size_t quantize_rows(int type, const float *x, int M, int K, uint8_t *xq) {
    const int block = vsk_act_block(type);
    const size_t stride = vsk_act_row_bytes(type, K);
    for (int m = 0; m < M; m++) {
        if (block == 1)
            memcpy(xq + (size_t)m * stride, x + (size_t)m * K, stride);
        else if (block == 256)
            vsk_rows_portable()->quantize256(x + (size_t)m * K, K, (vsk_act256 *)(xq + (size_t)m * stride));
        else
            vsk_rows_portable()->quantize32(x + (size_t)m * K, K, (vsk_act32 *)(xq + (size_t)m * stride));
    }
    return stride;
}

static int same_bits(const float *a, const float *b, size_t count) {
    checks++;
    return memcmp(a, b, count * sizeof(float)) == 0;
}

/* the kernel over all N rows in one call, or split at 16 (as the pool splits by 16-row chunks) */
static void run(vsk_kernel k, const uint8_t *W, size_t row_bytes, int N, int K, const uint8_t *xq, size_t stride,
                int M, float *y, int split) {
    if (split && N > 16) {
        k(W, row_bytes, 0, 16, K, xq, stride, M, y, N);
        k(W, row_bytes, 16, N, K, xq, stride, M, y, N);
    } else {
        k(W, row_bytes, 0, N, K, xq, stride, M, y, N);
    }
}

/* one layout (rows or tiles) of one type on one path against the portable kernel */
static void check_layout(const type_t *t, const path_t *p, int tile, vsk_kernel ref, vsk_kernel got,
                         const uint8_t *W, const uint8_t *flipped, size_t row_bytes, int N, int K) {
    static const int Ms[] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 33};
    char what[64];
    snprintf(what, sizeof what, "%s kernel", tile ? "tile" : "row");
    if (!got) {
        fail("missing kernel", t->name, p->name, 0);
        return;
    }
    const int type = tile ? t->type + 100 : t->type;
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        const int M = Ms[i];
        float *x = malloc(sizeof(float) * (size_t)M * K);
        uint8_t *xq = malloc(vsk_act_row_bytes(type, K) * (size_t)M + 64);
        float *want = malloc(sizeof(float) * (size_t)M * N), *have = malloc(sizeof(float) * (size_t)M * N);
        random_rows(M, K, x);
        const size_t stride = quantize_rows(type, x, M, K, xq);
        run(ref, W, row_bytes, N, K, xq, stride, M, want, 0);
        run(got, W, row_bytes, N, K, xq, stride, M, have, 0);
        if (!same_bits(want, have, (size_t)M * N)) fail(what, t->name, p->name, M);
        run(got, W, row_bytes, N, K, xq, stride, M, have, 1);
        if (!same_bits(want, have, (size_t)M * N)) fail("split rows", t->name, p->name, M);
        if (M == 17) /* each row alone: the same bits (batch invariance) */
            for (int m = 0; m < M; m++) {
                float alone[64];
                run(got, W, row_bytes, N, K, xq + (size_t)m * stride, stride, 1, alone, 0);
                if (!same_bits(want + (size_t)m * N, alone, (size_t)N)) fail("row alone", t->name, p->name, M);
            }
        if (M == 5) { /* negative control: the flipped bit must show, and give the portable kernel's bits */
            run(got, flipped, row_bytes, N, K, xq, stride, M, have, 0);
            checks++;
            if (memcmp(want, have, sizeof(float) * (size_t)M * N) == 0)
                fail("negative control (a flipped weight bit went unseen)", t->name, p->name, M);
            else
                controls++;
            run(ref, flipped, row_bytes, N, K, xq, stride, M, want, 0);
            if (!same_bits(want, have, (size_t)M * N)) fail("flipped weights", t->name, p->name, M);
        }
        free(x);
        free(xq);
        free(want);
        free(have);
    }
}

/* flipped: W with one bit of a value byte of weight row 3 flipped, the first (from t->value_byte on) that changes
 * the portable kernel's result (a flip can be invisible to any kernel: a sub-block whose scale is 0) */
static void flip_visible(const type_t *t, const uint8_t *W, uint8_t *flipped, size_t row_bytes, int N, int K) {
    enum { M = 5 };
    float *x = malloc(sizeof(float) * M * K), want[M * 64], have[M * 64];
    uint8_t *xq = malloc(vsk_act_row_bytes(t->type, K) * M);
    random_rows(M, K, x);
    const size_t stride = quantize_rows(t->type, x, M, K, xq);
    const vsk_kernel ref = vsk_kernel_scalar(t->type);
    run(ref, W, row_bytes, N, K, xq, stride, M, want, 0);
    for (int i = 0; i < 64; i++) {
        memcpy(flipped, W, row_bytes * N);
        flipped[row_bytes * 3 + t->value_byte + i / 8] ^= (uint8_t)(1 << (i % 8));
        run(ref, flipped, row_bytes, N, K, xq, stride, M, have, 0);
        if (memcmp(want, have, sizeof(float) * M * N) != 0) break;
    }
    free(x);
    free(xq);
}

static void check_kernels(int have_dot, int have_i8mm) {
    const int N = 37;
    for (int ti = 0; ti < TYPE_COUNT; ti++) {
        const type_t *t = &TYPES[ti];
        const int K = t->block == 1 ? 500 : 512; /* the dense rule's tail: K not a multiple of 16 */
        const size_t row_bytes = (size_t)(K / t->block) * t->bytes;
        uint8_t *W = malloc(row_bytes * N), *flipped = malloc(row_bytes * N);
        random_weights(t, N, K, W);
        flip_visible(t, W, flipped, row_bytes, N, K);
        const size_t tile_bytes = vsk_repacked_bytes(t->type, N, K);
        uint8_t *T = tile_bytes ? malloc(tile_bytes) : NULL, *Tflipped = tile_bytes ? malloc(tile_bytes) : NULL;
        if (T && (vsk_repack(t->type, W, row_bytes, N, K, T) < 0 || vsk_repack(t->type, flipped, row_bytes, N, K, Tflipped) < 0))
            fail("repack", t->name, "portable", 0);
        for (int pi = 0; pi < 3; pi++) {
            const path_t *p = &PATHS[pi];
            if ((p->needs >= 1 && !have_dot) || (p->needs >= 2 && !have_i8mm)) continue;
            check_layout(t, p, 0, vsk_kernel_scalar(t->type), p->rows(t->type), W, flipped, row_bytes, N, K);
            if (T)
                check_layout(t, p, 1, vsk_tile_kernel_scalar(t->type + 100), p->tiles(t->type + 100), T, Tflipped, 0,
                             N, K);
        }
        free(W);
        free(flipped);
        free(T);
        free(Tflipped);
    }
}

static void check_rows(void) {
    const vsk_row_ops *ref = vsk_rows_portable(), *got = vsk_rows_neon();
    if (!got) {
        fail("missing row ops", "-", "neon", 0);
        return;
    }
    enum { K = 1024 };
    static float x[K], y[K], a[K], b[K];
    for (int round = 0; round < 20; round++) {
        random_rows(1, K, x);
        for (int i = 0; i < K; i++) x[i] *= (float)(1 + round) * 0.37f;
        vsk_act32 q32a[K / 32], q32b[K / 32];
        vsk_act256 q256a[K / 256], q256b[K / 256];
        ref->quantize32(x, K, q32a);
        got->quantize32(x, K, q32b);
        checks++;
        if (memcmp(q32a, q32b, sizeof q32a)) fail("quantize32", "-", "neon", round);
        ref->quantize256(x, K, q256a);
        got->quantize256(x, K, q256b);
        checks++;
        if (memcmp(q256a, q256b, sizeof q256a)) fail("quantize256", "-", "neon", round);
        for (int n = 1; n <= 100; n += 7) {
            const float s = ref->sum_squares(x, n), t = got->sum_squares(x, n);
            if (!same_bits(&s, &t, 1)) fail("sum_squares", "-", "neon", n);
        }
        for (int i = 0; i < K; i++) y[i] = uniform() * (round < 10 ? 8.0f : 120.0f);
        ref->swiglu(y, x, a, K - round);
        got->swiglu(y, x, b, K - round);
        if (!same_bits(a, b, (size_t)(K - round))) fail("swiglu", "-", "neon", round);
        /* argmax: ties (a repeated maximum), and a NaN in the last rounds */
        for (int i = 0; i < K; i++) y[i] = (float)(next() % 50);
        if (round >= 15) y[next() % K] = NAN;
        for (int n = 1; n <= K; n = 2 * n + 1) {
            checks++;
            if (ref->argmax(y, n) != got->argmax(y, n)) fail("argmax", "-", "neon", n);
        }
    }
}

static const char *isa_name(int isa) {
    static const char *names[] = {"scalar", "avx2", "avx512", "neon", "neon_dot", "neon_i8mm"};
    return isa >= 0 && isa <= 5 ? names[isa] : "?";
}

/* the library's dispatch: its best path, what vsk_set_isa accepts, and vsk_linear's bits on each path */
static void check_dispatch(int expected, const char *asked) {
    const int best = vsk_best_isa();
    printf("neon_check: the library's best path: %s (the CPU's features call for %s)\n", isa_name(best),
           isa_name(expected));
    checks++;
    if (best != expected) fail("best path", "-", isa_name(best), 0);
    if (asked) {
        checks++;
        if (strcmp(asked, isa_name(best)) != 0) fail("best path is not the one expected", asked, isa_name(best), 0);
    }
    for (int isa = 0; isa <= 6; isa++) {
        const int runs = isa == VSK_ISA_SCALAR || (isa >= VSK_ISA_NEON && isa <= best);
        checks++;
        if ((vsk_set_isa(isa) == 0) != runs) fail("vsk_set_isa", isa_name(isa), isa_name(best), 0);
    }
    vsk_set_threads(2);
    enum { N = 40, K = 512, M = 6 };
    for (int ti = 0; ti < TYPE_COUNT; ti++) {
        const type_t *t = &TYPES[ti];
        const size_t row_bytes = (size_t)(K / t->block) * t->bytes;
        uint8_t *W = malloc(row_bytes * N), *T = malloc(vsk_repacked_bytes(t->type, N, K) + 1);
        random_weights(t, N, K, W);
        const int tile = vsk_repacked_bytes(t->type, N, K) ? vsk_repack(t->type, W, row_bytes, N, K, T) : -1;
        float x[M * K], want[2][M * N], have[M * N];
        static uint8_t scratch[M * K * 4];
        random_rows(M, K, x);
        vsk_set_isa(VSK_ISA_SCALAR);
        vsk_linear(t->type, W, row_bytes, N, K, x, M, scratch, want[0]);
        if (tile >= 0) vsk_linear(tile, T, 0, N, K, x, M, scratch, want[1]);
        for (int isa = VSK_ISA_NEON; isa <= best; isa++) {
            vsk_set_isa(isa);
            vsk_linear(t->type, W, row_bytes, N, K, x, M, scratch, have);
            if (!same_bits(want[0], have, (size_t)M * N)) fail("vsk_linear (rows)", t->name, isa_name(isa), M);
            if (tile < 0) continue;
            vsk_linear(tile, T, 0, N, K, x, M, scratch, have);
            if (!same_bits(want[1], have, (size_t)M * N)) fail("vsk_linear (tiles)", t->name, isa_name(isa), M);
        }
        free(W);
        free(T);
    }
    vsk_set_isa(best);
}

/* --digest: a hash of the portable path's results (activation quantization, row and tile kernels of every type) on
 * fixed random blocks, so that builds for two architectures can be compared: the same digest on x86-64 and on
 * AArch64 means the portable path, and so every NEON path, gives the x86-64 portable build's bits */
static uint64_t digest_bytes(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001B3ull;
    return h;
}

static int digest(void) {
    enum { N = 37, M = 7 };
    uint64_t h = 0xCBF29CE484222325ull;
    for (int ti = 0; ti < TYPE_COUNT; ti++) {
        const type_t *t = &TYPES[ti];
        const int K = t->block == 1 ? 500 : 512;
        const size_t row_bytes = (size_t)(K / t->block) * t->bytes, tile_bytes = vsk_repacked_bytes(t->type, N, K);
        uint8_t *W = malloc(row_bytes * N), *T = malloc(tile_bytes + 1), *xq = malloc(vsk_act_row_bytes(t->type, K) * M);
        float *x = malloc(sizeof(float) * M * K), y[M * N];
        random_weights(t, N, K, W);
        random_rows(M, K, x);
        const size_t stride = quantize_rows(t->type, x, M, K, xq);
        h = digest_bytes(h, xq, stride * M);
        run(vsk_kernel_scalar(t->type), W, row_bytes, N, K, xq, stride, M, y, 0);
        h = digest_bytes(h, y, sizeof y);
        if (tile_bytes) {
            vsk_repack(t->type, W, row_bytes, N, K, T);
            h = digest_bytes(h, T, tile_bytes);
            run(vsk_tile_kernel_scalar(t->type + 100), T, 0, N, K, xq, stride, M, y, 0);
            h = digest_bytes(h, y, sizeof y);
        }
        free(W);
        free(T);
        free(xq);
        free(x);
    }
    printf("neon_check: portable digest %016llx\n", (unsigned long long)h);
    return 0;
}

int main(int argc, char **argv) {
    const char *seed = getenv("NEON_CHECK_SEED"); /* another draw of the random blocks (nonzero) */
    if (seed && strtoull(seed, NULL, 0)) state = strtoull(seed, NULL, 0);
    if (argc > 1 && strcmp(argv[1], "--digest") == 0) return digest();
    const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
    const int dot = (hwcap & HWCAP_ASIMDDP) != 0, i8mm = dot && (hwcap2 & HWCAP2_I8MM) != 0;
    printf("neon_check: this CPU: sdot %s, smmla %s; paths run: portable, neon%s%s\n", dot ? "yes" : "no",
           i8mm ? "yes" : "no", dot ? ", neon_dot" : "", i8mm ? ", neon_i8mm" : "");
    check_rows();
    check_kernels(dot, i8mm);
    check_dispatch(i8mm ? VSK_ISA_NEON_I8MM : dot ? VSK_ISA_NEON_DOT : VSK_ISA_NEON, argc > 1 ? argv[1] : NULL);
    if (failures) {
        printf("neon_check: FAILED: %ld of %ld comparisons\n", failures, checks);
        return 1;
    }
    printf("neon_check: OK: %ld comparisons bit-exact against the portable path; %ld negative controls (a flipped "
           "weight bit) detected\n",
           checks, controls);
    return 0;
}
