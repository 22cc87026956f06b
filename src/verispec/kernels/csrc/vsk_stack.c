/* The decoder stack of a Llama-family model (pre-norm blocks: RMSNorm, q/k/v with optional bias, rotary
 * embedding, grouped-query attention, SwiGLU MLP) for a pass of M rows, in one call.
 *
 * Everything around the products runs here too, so that a decode step or a verify pass costs one call
 * instead of about twenty PyTorch ops per block. Each row's results depend on that row alone: norms,
 * rotary embedding and SwiGLU are per row in a fixed order, the products keep their per-row order
 * (vsk.h), and attention runs per query (vsk_attention.c).
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vsk.h"
#include "vsk_math.h"
#include "vsk_rows.h"

#define VSK_API __attribute__((visibility("default")))

/* one block's weights (their activations are 32-blocks: tile forms, Q4_0, Q4_1, Q5_0, Q8_0) */
typedef struct {
    const float *attn_norm, *mlp_norm; /* [hidden] */
    const float *qkv_bias;             /* [(H + 2 kvH) D], or NULL */
    vsk_part qkv[3], o, gate_up[2], down;
    int qkv_parts, gate_up_parts;
} vsk_block;

typedef struct {
    int hidden, heads, kv_heads, head_dim, inter, layers;
    float eps;
    const vsk_block *blocks;
} vsk_model;

/* a KV cache: per layer [slots][kvH][length][D] keys and values, and the rotary tables [length][D] */
typedef struct {
    float *const *keys, *const *values;
    size_t slot_stride, head_stride;
    const float *cos, *sin;
} vsk_cache;

static size_t act_bytes(int K) { return (size_t)(K / 32) * sizeof(vsk_act32); }

/* seconds spent in the stack and in its products since the last vsk_stack_timing (the bench's split) */
static double stack_seconds, product_seconds;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* out[0] = seconds in vsk_stack_forward, out[1] = of which in products; both restart from zero */
VSK_API void vsk_stack_timing(double *out) {
    out[0] = stack_seconds;
    out[1] = product_seconds;
    stack_seconds = product_seconds = 0.0;
}

static int products(const vsk_part *parts, int count, int K, const uint8_t *xq, int M, float *y, int ldy) {
    const double begin = now();
    const int status = vsk_products(parts, count, K, xq, act_bytes(K), M, y, ldy);
    product_seconds += now() - begin;
    return status;
}

static size_t floats_bytes(size_t n) { return (n * sizeof(float) + 63) / 64 * 64; }

/* scratch for M rows: normed rows, q/k/v, attention output, gate/up, the SwiGLU product, quantized rows */
VSK_API size_t vsk_stack_scratch_bytes(const vsk_model *md, int M) {
    const size_t qkv = (size_t)(md->heads + 2 * md->kv_heads) * md->head_dim, att = (size_t)md->heads * md->head_dim;
    int widest = md->hidden > (int)att ? md->hidden : (int)att;
    widest = md->inter > widest ? md->inter : widest;
    return floats_bytes((size_t)M * md->hidden) * 2 + floats_bytes((size_t)M * qkv) + floats_bytes((size_t)M * att) +
           floats_bytes((size_t)M * 2 * md->inter) + floats_bytes((size_t)M * md->inter) + act_bytes(widest) * M + 64;
}

/* out = x / sqrt(mean(x^2) + eps) * weight, the sum of squares in the fixed order of vsk_rows.h */
static void rms_norm(const float *x, const float *weight, int n, float eps, float *out) {
    const float sum = vsk_rows()->sum_squares(x, n);
    const float r = 1.0f / sqrtf(sum / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * r) * weight[i];
}

/* out [M][n] = each row of x [M][n] normalized as in the stack (a model's final norm) */
VSK_API void vsk_rms_norm(const float *x, const float *weight, int M, int n, float eps, float *out) {
    for (int m = 0; m < M; m++) rms_norm(x + (size_t)m * n, weight, n, eps, out + (size_t)m * n);
}

/* rotary embedding of one head (the rotate-half form): cos/sin rows hold the position's D values */
static void rotate(float *v, const float *cos, const float *sin, int D) {
    const int half = D / 2;
    for (int i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

typedef struct {
    const float *gate_up; /* [M][2 inter]: gates then ups */
    float *out;           /* [M][inter] */
    int inter;
    const vsk_row_ops *ops;
} swiglu_t;

#define SWIGLU_CHUNK 256

/* item = (row, chunk of SWIGLU_CHUNK values): silu(gate) * up */
static void swiglu_items(const void *ctx, int begin, int end) {
    const swiglu_t *s = ctx;
    const int chunks = (s->inter + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK;
    for (int item = begin; item < end; item++) {
        const int m = item / chunks, i0 = item % chunks * SWIGLU_CHUNK;
        const int i1 = i0 + SWIGLU_CHUNK < s->inter ? i0 + SWIGLU_CHUNK : s->inter;
        const float *gate = s->gate_up + (size_t)m * 2 * s->inter, *up = gate + s->inter;
        s->ops->swiglu(gate + i0, up + i0, s->out + (size_t)m * s->inter + i0, i1 - i0);
    }
}

/* x [M][hidden] += the products of `parts` over quantized rows xq, through `tmp` [M][hidden] */
static int add_products(const vsk_part *parts, int count, int K, const uint8_t *xq, int M, float *tmp, float *x,
                        int hidden) {
    if (products(parts, count, K, xq, M, tmp, hidden)) return -1;
    for (size_t i = 0; i < (size_t)M * hidden; i++) x[i] += tmp[i];
    return 0;
}

static int block_forward(const vsk_model *md, const vsk_block *b, float *keys, float *values, const vsk_cache *c,
                         float *x, int M, const int *slot, const int *pos, uint8_t *scratch) {
    const int H = md->heads, kvH = md->kv_heads, D = md->head_dim, hidden = md->hidden, inter = md->inter;
    const int width = (H + 2 * kvH) * D;
    float *h = (float *)scratch;
    float *tmp = (float *)((uint8_t *)h + floats_bytes((size_t)M * hidden));
    float *qkv = (float *)((uint8_t *)tmp + floats_bytes((size_t)M * hidden));
    float *att = (float *)((uint8_t *)qkv + floats_bytes((size_t)M * width));
    float *gate_up = (float *)((uint8_t *)att + floats_bytes((size_t)M * H * D));
    float *act = (float *)((uint8_t *)gate_up + floats_bytes((size_t)M * 2 * inter));
    uint8_t *xq = (uint8_t *)act + floats_bytes((size_t)M * inter);

    /* attention */
    for (int m = 0; m < M; m++) rms_norm(x + (size_t)m * hidden, b->attn_norm, hidden, md->eps, h + (size_t)m * hidden);
    vsk_quantize(VSK_Q8_0, h, M, hidden, xq);
    if (products(b->qkv, b->qkv_parts, hidden, xq, M, qkv, width)) return -1;
    for (int m = 0; m < M; m++) {
        float *row = qkv + (size_t)m * width;
        if (b->qkv_bias)
            for (int i = 0; i < width; i++) row[i] += b->qkv_bias[i];
        const float *cos = c->cos + (size_t)pos[m] * D, *sin = c->sin + (size_t)pos[m] * D;
        for (int head = 0; head < H + kvH; head++) rotate(row + (size_t)head * D, cos, sin, D);
        for (int head = 0; head < kvH; head++) {
            const size_t at = (size_t)slot[m] * c->slot_stride + (size_t)head * c->head_stride + (size_t)pos[m] * D;
            memcpy(keys + at, row + (size_t)(H + head) * D, sizeof(float) * D);
            memcpy(values + at, row + (size_t)(H + kvH + head) * D, sizeof(float) * D);
        }
    }
    for (int m = 0; m < M; m++) /* the queries, packed [M][H][D] for the attention */
        memmove(qkv + (size_t)m * H * D, qkv + (size_t)m * width, sizeof(float) * H * D);
    const vsk_attention_t a = {qkv, keys, values, c->slot_stride, c->head_stride, slot, pos, H, kvH, D,
                               1.0f / sqrtf((float)D), att};
    vsk_attend(&a, M);
    vsk_quantize(VSK_Q8_0, att, M, H * D, xq);
    if (add_products(&b->o, 1, H * D, xq, M, tmp, x, hidden)) return -1;

    /* MLP */
    for (int m = 0; m < M; m++) rms_norm(x + (size_t)m * hidden, b->mlp_norm, hidden, md->eps, h + (size_t)m * hidden);
    vsk_quantize(VSK_Q8_0, h, M, hidden, xq);
    if (products(b->gate_up, b->gate_up_parts, hidden, xq, M, gate_up, 2 * inter)) return -1;
    const swiglu_t s = {gate_up, act, inter, vsk_rows()};
    vsk_parallel_for(swiglu_items, &s, M * ((inter + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK));
    vsk_quantize(VSK_Q8_0, act, M, inter, xq);
    return add_products(&b->down, 1, inter, xq, M, tmp, x, hidden);
}

/* x [M][hidden] through every block, in place. Row m is at position pos[m] of the sequence in cache slot
 * slot[m]; its keys and values are written there before any row attends, so the rows of one sequence may
 * share a call in position order. `scratch`: vsk_stack_scratch_bytes(md, M), 64-byte aligned.
 * 0, or -1 when a weight type has no kernel. */
VSK_API int vsk_stack_forward(const vsk_model *md, const vsk_cache *c, float *x, int M, const int *slot,
                              const int *pos, uint8_t *scratch) {
    const double begin = now();
    int status = 0;
    for (int l = 0; l < md->layers && !status; l++)
        status = block_forward(md, &md->blocks[l], c->keys[l], c->values[l], c, x, M, slot, pos, scratch);
    stack_seconds += now() - begin;
    return status ? -1 : 0;
}
