/* verispec kernels: quantized matrix products over GGUF blocks as they are stored.
 *
 * y[m][n] = sum_k x[m][k] * W[n][k] for M activation rows (M small: a decode step, a verify pass, or a slice
 * of a prefill) and N weight rows stored in one GGUF block type. Activations are first quantized per row to
 * 8-bit blocks (vsk_act32 for the 32-weight block types, vsk_act256 for the 256-weight K-quants, IQ4_XS and
 * their tile forms: one scale per 256 values lets a K-quant superblock's sub-block sums meet their integer scales
 * before a single float step per row, as llama.cpp's Q8_K).
 *
 * Rules every path keeps:
 *  - one sweep over the weights serves all M rows: a weight block is loaded and unpacked once, then dotted
 *    with every row;
 *  - row independence: each y[m][n] is summed in one fixed order (block by block along K) that depends on
 *    neither M nor the other rows' values; threads split the N weight rows, never the sum.
 */
#ifndef VSK_H
#define VSK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "vsk_forms.h" /* the ids of the GGML types with a native kernel and of their tile forms: VSK_Q4_K, VSK_T4_K */

/* the paths: portable C, then the x86-64 family and the AArch64 family (a CPU runs the portable path and those
 * of its own family up to its best); NEON is plain Advanced SIMD, NEON_DOT adds sdot (FEAT_DotProd), NEON_I8MM
 * adds smmla (FEAT_I8MM) */
enum {
    VSK_ISA_SCALAR = 0, VSK_ISA_AVX2 = 1, VSK_ISA_AVX512 = 2, VSK_ISA_NEON = 3, VSK_ISA_NEON_DOT = 4,
    VSK_ISA_NEON_I8MM = 5,
};

/* quantized activations: q[i] * d ~ x[i]; half[h] = sum of q[16h .. 16h+15] (the offset and minimum terms) */
typedef struct {
    float d;
    int16_t half[2];
    int8_t q[32];
} vsk_act32;

/* bsum[j] = sum of q[16j .. 16j+15] (the offset and minimum terms of the types with 16 weights per scale: Q6_K,
 * Q3_K, Q2_K), sum32[j] = sum of q[32j .. 32j+31] (those of 32 per scale: Q4_K, Q5_K, IQ4_XS's levels + 128) */
typedef struct {
    float d;
    int16_t bsum[16];
    int16_t sum32[8];
    int8_t q[256];
} vsk_act256;

/* one path's kernel: W rows [n0, n1) of `row_bytes` bytes each, against M quantized rows `xq` (stride
 * `x_stride` bytes), into y[m * ldy + n] */
typedef void (*vsk_kernel)(const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,
                           size_t x_stride, int M, float *y, int ldy);

/* per path: the kernel of a weight type, or NULL when that path lacks it */
vsk_kernel vsk_kernel_scalar(int type);
vsk_kernel vsk_tile_kernel_scalar(int type);
vsk_kernel vsk_tile_kernel_avx2(int type);
vsk_kernel vsk_tile_kernel_avx512(int type);
vsk_kernel vsk_kernel_avx2(int type);
vsk_kernel vsk_kernel_avx512(int type);
/* the NEON paths (NULL off AArch64, or where the compiler lacked the instructions' flag) */
vsk_kernel vsk_kernel_neon(int type);
vsk_kernel vsk_kernel_neon_dot(int type);
vsk_kernel vsk_tile_kernel_neon(int type);
vsk_kernel vsk_tile_kernel_neon_dot(int type);
vsk_kernel vsk_tile_kernel_neon_i8mm(int type);

float vsk_fp16_to_fp32(uint16_t h);
uint16_t vsk_fp32_to_fp16(float f);

/* one row of K values of a GGUF matrix of `type` as float32 (the `gguf` package's bits; vsk_embed.c): 0, or -1
 * for a type without a definition */
int vsk_row_to_floats(int type, const uint8_t *row, int K, float *out);

/* ---- inside the library: the thread pool and what runs on it -------------------------------------------- */

/* one weight matrix of a product: its type (GGUF or tile form), data, bytes per row (0 for a tile form), rows */
typedef struct {
    int type;
    const uint8_t *W;
    size_t row_bytes;
    int N;
} vsk_part;

/* y = x [W_0; W_1; ...]^T for up to 4 parts sharing one activation format: part p's outputs fill the columns
 * after those of the parts before it, in rows of `ldy` floats; the pool splits all parts' rows in one job.
 * 0, or -1 when a part's type has no kernel. */
int vsk_products(const vsk_part *parts, int count, int K, const uint8_t *xq, size_t x_stride, int M, float *y,
                 int ldy);
/* the same with each part's own activations (parts whose types take different activation formats) */
int vsk_products_each(const vsk_part *parts, int count, int K, const uint8_t *const *xq, const size_t *x_stride,
                      int M, float *y, int ldy);

/* task(ctx, begin, end) over [0, count), split among the pool's threads */
void vsk_parallel_for(void (*task)(const void *ctx, int begin, int end), const void *ctx, int count);

void vsk_quantize(int type, const float *x, int M, int K, uint8_t *out);
size_t vsk_act_row_bytes(int type, int K);
/* values per activation block for weights of `type` (GGUF or tile form): 32 or 256, or 1 for the dense types
 * (F32, F16, BF16), whose activations are the float32 rows themselves */
int vsk_act_block(int type);

/* where a paged KV cache keeps its keys and values: per layer a pool of blocks [blocks][kvH][block_size][D], and per
 * cache slot a row of `table` listing its blocks in position order. Position t of slot s, head g, is row
 * t % block_size of block table[s][t / block_size]. Where blocks lie never changes what is computed from them. */
typedef struct {
    const int32_t *table;
    int table_stride;                 /* entries per slot's row */
    int block_size;                   /* positions per block */
    size_t block_stride, head_stride; /* elements: kvH * block_size * D, block_size * D */
} vsk_pages;

/* the element where position t of slot s, head g starts (its D values follow) */
static inline size_t vsk_kv_at(const vsk_pages *p, int s, int g, int t, int D) {
    const size_t block = (size_t)p->table[(size_t)s * p->table_stride + t / p->block_size];
    return block * p->block_stride + (size_t)g * p->head_stride + (size_t)(t % p->block_size) * D;
}

/* per query row: the attention of a decode or verify pass (vsk_attention.c) */
typedef struct {
    const float *q;             /* [M][H][D] */
    const void *keys, *values;  /* one layer's cache pools (vsk_pages), float32, or IEEE half when `half` */
    vsk_pages pages;
    const int *slot, *pos;      /* per row: its sequence's cache slot, its position */
    int H, kvH, D;
    float scale;
    float *out;                 /* [M][H][D] */
    int half;
    /* a token tree's rows (NULL for none): row m reads its first direct[m] keys in place, and its keys
     * direct[m] .. pos[m] (its ancestors in the tree, then itself) from the positions tail[m][0 ..], stored
     * elsewhere in its slot; tail holds VSK_ATTENTION_ROWS entries per row */
    const int *direct, *tail;
    int window;    /* a query at position p sees the keys at positions above p - window only; 0: all */
    float softcap; /* scores -> softcap * tanh(score / softcap) before the softmax; 0: none */
} vsk_attention_t;

void vsk_attend(const vsk_attention_t *a, int M);

/* the rows of a pass cut into blocks of consecutive positions of one sequence (at most VSK_ATTENTION_ROWS
 * each); an item is one block and one key/value head: the group's query heads of the block's rows over the keys
 * and values they share, read once (vsk_attention.c) */
#define VSK_ATTENTION_ROWS 16
typedef struct {
    const vsk_attention_t *a;
    const int *first; /* per block: its first row; first[blocks] = M */
    int blocks;
} vsk_attention_job;

/* the keys row m reads in place (all of them, pos[m] + 1, outside a tree) */
static inline int vsk_direct_keys(const vsk_attention_t *a, int m) {
    return a->direct ? a->direct[m] : a->pos[m] + 1;
}

/* the first key (logical position) row m sees: 0, or the first inside its window */
static inline int vsk_first_key(const vsk_attention_t *a, int m) {
    return a->window && a->pos[m] + 1 > a->window ? a->pos[m] + 1 - a->window : 0;
}

/* over the rows m0 .. m1 - 1: the first key any of them sees */
static inline int vsk_block_first_key(const vsk_attention_t *a, int m0, int m1) {
    int first = a->pos[m0] + 1;
    for (int m = m0; m < m1; m++) {
        const int key = vsk_first_key(a, m);
        first = key < first ? key : first;
    }
    return first;
}

/* soft-capping of one row's scores [0, n) in place (tanhf: the same bits on every path) */
static inline void vsk_softcap(float *scores, int n, float cap) {
    for (int t = 0; t < n; t++) scores[t] = cap * tanhf(scores[t] / cap);
}

/* over the rows m0 .. m1 - 1: the most keys one reads in place (`direct`), or the most it reads at all */
static inline int vsk_block_keys(const vsk_attention_t *a, int m0, int m1, int direct) {
    int most = 0;
    for (int m = m0; m < m1; m++) {
        const int keys = direct ? vsk_direct_keys(a, m) : a->pos[m] + 1;
        most = keys > most ? keys : most;
    }
    return most;
}

typedef void (*vsk_task)(const void *ctx, int begin, int end);
vsk_task vsk_attention_task_avx2(void); /* NULL off x86-64; items of a vsk_attention_job */
vsk_task vsk_attention_task_avx512(void); /* the same on 512-bit vectors, for head sizes that are a multiple of 16 */
int vsk_get_isa(void);
int vsk_isa_neon(int isa); /* whether a path is one of the NEON family */

#endif
