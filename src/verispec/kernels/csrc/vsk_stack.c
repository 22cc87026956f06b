/* The decoder stack of a Llama-family model (pre-norm blocks: RMSNorm, q/k/v with optional bias, rotary
 * embedding, grouped-query attention, SwiGLU MLP) for a pass of M rows, in one call. What other families add
 * is per block or per model and off by default (vsk_stack.h): per-head q/k norms (Qwen3, Gemma 3), a rotary table
 * per block or none (Gemma 3's local layers, SmolLM3's), sliding windows, attention soft-capping and scale,
 * norms after the attention and the MLP, GeGLU, scaled embeddings (Gemma).
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
#include "vsk_stack.h"

/* the activation formats a product's parts may take: 32-blocks, 256-blocks, float rows (dense types) */
#define FORMATS 3

static int format_of(int type) {
    const int block = vsk_act_block(type);
    return block == 32 ? 0 : block == 256 ? 1 : 2;
}

/* bytes of one row's activations in a format */
static size_t format_row_bytes(int format, int K) {
    return format == 0 ? (size_t)(K / 32) * sizeof(vsk_act32)
           : format == 1 ? (size_t)(K / 256) * sizeof(vsk_act256)
                         : (size_t)K * sizeof(float);
}

/* whether any product of the model takes float rows (a dense part): only then is room made for them */
static int has_dense_parts(const vsk_model *md) {
    for (int l = 0; l < md->layers; l++) {
        const vsk_block *b = &md->blocks[l];
        for (int p = 0; p < b->qkv_parts; p++)
            if (format_of(b->qkv[p].type) == 2) return 1;
        if (b->experts) {
            if (format_of(b->router.type) == 2) return 1;
            for (int e = 0; e < md->experts; e++) {
                const vsk_expert *x = &b->experts[e];
                for (int p = 0; p < x->gate_up_parts; p++)
                    if (format_of(x->gate_up[p].type) == 2) return 1;
                if (format_of(x->down.type) == 2) return 1;
            }
        } else {
            for (int p = 0; p < b->gate_up_parts; p++)
                if (format_of(b->gate_up[p].type) == 2) return 1;
            if (format_of(b->down.type) == 2) return 1;
        }
        if (format_of(b->o.type) == 2) return 1;
    }
    return 0;
}

/* seconds spent in the stack, in its products, in its attention, and in the output heads of greedy steps
 * (vsk_greedy.c) since the last vsk_stack_timing (the bench's split) */
static double stack_seconds, product_seconds, attention_seconds, head_seconds;

double vsk_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void vsk_count_head_seconds(double seconds) { head_seconds += seconds; }

/* out[0] = seconds in vsk_stack_forward, out[1] = of which in products, out[2] = in greedy steps' heads,
 * out[3] = in the stack's attention; all restart from zero */
VSK_API void vsk_stack_timing(double *out) {
    out[0] = stack_seconds;
    out[1] = product_seconds;
    out[2] = head_seconds;
    out[3] = attention_seconds;
    stack_seconds = product_seconds = head_seconds = attention_seconds = 0.0;
}

/* where one row's activations in format f (format_of) start in xq: M rows of each format in turn (the float rows,
 * last, only where the model has dense parts) */
static uint8_t *act_row(uint8_t *xq, int format, int M, int K, int m) {
    size_t offset = 0;
    for (int f = 0; f < format; f++) offset += (size_t)M * format_row_bytes(f, K);
    return xq + offset + (size_t)m * format_row_bytes(format, K);
}

/* what the rows of a product need before it: the pending residual added (x += tmp), the rows normalized (when
 * `norm`) into `in`, and quantized in every format the parts take */
typedef struct {
    const vsk_part *parts;
    int count, K, M;
    float *x;          /* [M][K] the rows (the residual stream when norm is set), or the product's input */
    const float *tmp;  /* [M][K] the residual to add to x first, or NULL */
    const float *norm; /* RMSNorm weights, or NULL: quantize x as it is */
    float eps;
    float *normed; /* [M][K] the normalized rows (when norm) */
    uint8_t *xq;
} prepare_t;

/* out = x / sqrt(mean(x^2) + eps) * weight, the sum of squares in the fixed order of vsk_rows.h */
static void rms_norm(const float *x, const float *weight, int n, float eps, float *out) {
    const float sum = vsk_rows()->sum_squares(x, n);
    const float r = 1.0f / sqrtf(sum / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * r) * weight[i];
}

/* item = row: each row's steps in a fixed order that depends on that row alone */
static void prepare_rows(const void *ctx, int begin, int end) {
    const prepare_t *p = ctx;
    for (int m = begin; m < end; m++) {
        float *row = p->x + (size_t)m * p->K;
        if (p->tmp)
            for (int i = 0; i < p->K; i++) row[i] += p->tmp[(size_t)m * p->K + i];
        const float *in = row;
        if (p->norm) {
            rms_norm(row, p->norm, p->K, p->eps, p->normed + (size_t)m * p->K);
            in = p->normed + (size_t)m * p->K;
        }
        int done[FORMATS] = {0}; /* per format: quantized already */
        for (int q = 0; q < p->count; q++) {
            const int format = format_of(p->parts[q].type);
            if (!done[format]) {
                done[format] = 1;
                vsk_quantize(p->parts[q].type, in, 1, p->K, act_row(p->xq, format, p->M, p->K, m));
            }
        }
    }
}

/* y = the products of `parts` over the rows `prepare` made: all parts in one job of the pool */
static int products(const prepare_t *prepare, float *y, int ldy) {
    vsk_parallel_for(prepare_rows, prepare, prepare->M);
    const uint8_t *each[4];
    size_t strides[4];
    for (int q = 0; q < prepare->count; q++) {
        const int format = format_of(prepare->parts[q].type);
        each[q] = act_row(prepare->xq, format, prepare->M, prepare->K, 0);
        strides[q] = format_row_bytes(format, prepare->K);
    }
    const double begin = vsk_seconds();
    const int status = vsk_products_each(prepare->parts, prepare->count, prepare->K, each, strides, prepare->M, y, ldy);
    product_seconds += vsk_seconds() - begin;
    return status;
}

static size_t floats_bytes(size_t n) { return (n * sizeof(float) + 63) / 64 * 64; }

/* bytes of M rows' activations of width K in every format the model may take */
static size_t act_bytes(const vsk_model *md, int M, int K, int dense) {
    (void)md;
    return (size_t)M * (format_row_bytes(0, K) + format_row_bytes(1, K) + (dense ? format_row_bytes(2, K) : 0));
}

/* scratch for M rows: normed rows, q/k/v, attention output, gate/up, the SwiGLU product, quantized rows */
static size_t dense_scratch_bytes(const vsk_model *md, int M, int dense) {
    const size_t qkv = (size_t)(md->heads + 2 * md->kv_heads) * md->head_dim, att = (size_t)md->heads * md->head_dim;
    int widest = md->hidden > (int)att ? md->hidden : (int)att;
    widest = md->inter > widest ? md->inter : widest;
    const size_t bytes = floats_bytes((size_t)M * md->hidden) * 2 + floats_bytes((size_t)M * qkv) +
                         floats_bytes((size_t)M * att) + floats_bytes((size_t)M * 2 * md->inter) +
                         floats_bytes((size_t)M * md->inter) + act_bytes(md, M, widest, dense) + 64;
    return (bytes + 63) / 64 * 64; /* what follows (the mixtures') starts on a 64-byte boundary */
}

/* the mixtures' scratch (after the rest): router logits; per row and rank the expert, its weight and its output;
 * per expert, the rows it takes (their index, their row and rank), their activations gathered, gate/up, the
 * SwiGLU product, its activations and the expert's output */
typedef struct {
    float *logits, *weight, *y, *gate_up, *act, *out;
    int *choice, *rows, *slots;
    uint8_t *gathered, *xq;
} moe_scratch_t;

static moe_scratch_t moe_scratch(const vsk_model *md, int M, int dense, uint8_t *at) {
    const int k = md->experts_per_token, H = md->hidden, I = md->expert_inter;
    moe_scratch_t s;
    s.logits = (float *)at, at += floats_bytes((size_t)M * md->experts);
    s.weight = (float *)at, at += floats_bytes((size_t)M * k);
    s.y = (float *)at, at += floats_bytes((size_t)M * k * H);
    s.gate_up = (float *)at, at += floats_bytes((size_t)M * 2 * I);
    s.act = (float *)at, at += floats_bytes((size_t)M * I);
    s.out = (float *)at, at += floats_bytes((size_t)M * H);
    s.choice = (int *)at, at += floats_bytes((size_t)M * k);
    s.rows = (int *)at, at += floats_bytes((size_t)M);
    s.slots = (int *)at, at += floats_bytes((size_t)M);
    s.gathered = at, at += (act_bytes(md, M, H, dense) + 63) / 64 * 64;
    s.xq = at;
    return s;
}

static size_t moe_scratch_bytes(const vsk_model *md, int M, int dense) {
    const size_t k = (size_t)md->experts_per_token, H = (size_t)md->hidden, I = (size_t)md->expert_inter;
    return floats_bytes((size_t)M * md->experts) + floats_bytes(M * k) + floats_bytes(M * k * H) +
           floats_bytes(M * 2 * I) + floats_bytes(M * I) + floats_bytes(M * H) + floats_bytes(M * k) +
           2 * floats_bytes((size_t)M) + (act_bytes(md, M, (int)H, dense) + 63) / 64 * 64 +
           act_bytes(md, M, (int)I, dense) + 64;
}

VSK_API size_t vsk_stack_scratch_bytes(const vsk_model *md, int M) {
    const int dense = has_dense_parts(md);
    return dense_scratch_bytes(md, M, dense) + (md->experts ? moe_scratch_bytes(md, M, dense) : 0);
}

/* out [M][n] = each row of x [M][n] normalized as in the stack (a model's final norm) */
VSK_API void vsk_rms_norm(const float *x, const float *weight, int M, int n, float eps, float *out) {
    for (int m = 0; m < M; m++) rms_norm(x + (size_t)m * n, weight, n, eps, out + (size_t)m * n);
}

/* item = row: rms_norm of each row of x [M][n] in place (the outputs of the attention or the MLP, Gemma) */
typedef struct {
    float *x;
    const float *weight;
    int n;
    float eps;
} norm_rows_t;

static void norm_rows(const void *ctx, int begin, int end) {
    const norm_rows_t *p = ctx;
    for (int m = begin; m < end; m++) rms_norm(p->x + (size_t)m * p->n, p->weight, p->n, p->eps, p->x + (size_t)m * p->n);
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
    int gelu;
} swiglu_t;

#define SWIGLU_CHUNK 256

/* gelu with tanh (PyTorch's approximate="tanh") of each gate times its up; plain C with tanhf, so the same bits
 * on every path */
static void geglu(const float *gate, const float *up, float *out, int n) {
    for (int i = 0; i < n; i++) {
        const float x = gate[i], inner = 0.7978845608028654f * (x + 0.044715f * (x * x * x));
        out[i] = 0.5f * x * (1.0f + tanhf(inner)) * up[i];
    }
}

/* item = (row, chunk of SWIGLU_CHUNK values): silu(gate) * up, or gelu(gate) * up */
static void swiglu_items(const void *ctx, int begin, int end) {
    const swiglu_t *s = ctx;
    const int chunks = (s->inter + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK;
    for (int item = begin; item < end; item++) {
        const int m = item / chunks, i0 = item % chunks * SWIGLU_CHUNK;
        const int i1 = i0 + SWIGLU_CHUNK < s->inter ? i0 + SWIGLU_CHUNK : s->inter;
        const float *gate = s->gate_up + (size_t)m * 2 * s->inter, *up = gate + s->inter;
        (s->gelu ? geglu : s->ops->swiglu)(gate + i0, up + i0, s->out + (size_t)m * s->inter + i0, i1 - i0);
    }
}

typedef struct {
    const vsk_model *md;
    const vsk_block *b;
    const vsk_cache *c;
    float *qkv;
    void *keys, *values;
    const vsk_pass_rows *rows;
} rotate_t;

/* D values into the cache at element `at`: copied, or rounded to halves */
static void store(void *cache, size_t at, const float *from, int D, int half) {
    if (!half) {
        memcpy((float *)cache + at, from, sizeof(float) * D);
        return;
    }
    uint16_t *to = (uint16_t *)cache + at;
    for (int i = 0; i < D; i++) to[i] = vsk_fp32_to_fp16(from[i]);
}

/* item = row: q/k/v bias, q/k norms, rotary embedding of q and k at the row's position (the block's table), the
 * row's keys and values into its cache slot where it is stored (through the slot's block table), and its queries
 * packed [H][D] at the row's start (the attention's layout) */
static void rotate_rows(const void *ctx, int begin, int end) {
    const rotate_t *r = ctx;
    const int H = r->md->heads, kvH = r->md->kv_heads, D = r->md->head_dim, width = (H + 2 * kvH) * D;
    for (int m = begin; m < end; m++) {
        float *row = r->qkv + (size_t)m * width;
        if (r->b->qkv_bias)
            for (int i = 0; i < width; i++) row[i] += r->b->qkv_bias[i];
        if (r->b->q_norm)
            for (int head = 0; head < H + kvH; head++) {
                float *v = row + (size_t)head * D;
                rms_norm(v, head < H ? r->b->q_norm : r->b->k_norm, D, r->md->eps, v);
            }
        const int pos = r->rows->pos[m], at = r->rows->at ? r->rows->at[m] : pos;
        if (r->b->rope >= 0) {
            const size_t table = (size_t)r->b->rope * r->c->rope_stride + (size_t)pos * D;
            for (int head = 0; head < H + kvH; head++) rotate(row + (size_t)head * D, r->c->cos + table, r->c->sin + table, D);
        }
        for (int head = 0; head < kvH; head++) {
            const size_t to = vsk_kv_at(&r->c->pages, r->rows->slot[m], head, at, D);
            store(r->keys, to, row + (size_t)(H + head) * D, D, r->c->half);
            store(r->values, to, row + (size_t)(H + kvH + head) * D, D, r->c->half);
        }
    }
}

/* the router's choice for one row: its top k experts by softmax probability (ties: the lower expert), and their
 * weights (renormalized to sum to 1 when norm); the softmax in float, by vsk_exp, experts in order */
static void route(const float *logits, int E, int k, int norm, int *choice, float *weight) {
    float top = logits[0], total = 0.0f, chosen = 0.0f;
    for (int e = 1; e < E; e++) top = logits[e] > top ? logits[e] : top;
    for (int e = 0; e < E; e++) total += vsk_exp(logits[e] - top);
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= choice[i] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        choice[j] = best;
        weight[j] = vsk_exp(logits[best] - top) / total;
        chosen += weight[j];
    }
    if (norm)
        for (int j = 0; j < k; j++) weight[j] /= chosen;
}

/* The MLP of a block whose MLP is a mixture: x += the pending residual, normalized; each row through its experts,
 * an expert's rows in one product of theirs (a row's result depends on that row alone: the products keep their
 * per-row order), the outputs summed per row in the order of its choice, into tmp. */
static int moe_forward(const vsk_model *md, const vsk_block *b, float *x, int M, float *tmp, int pending, float *h,
                       uint8_t *xq, const moe_scratch_t *s) {
    const int E = md->experts, k = md->experts_per_token, H = md->hidden, I = md->expert_inter;
    vsk_part in[3] = {b->router, b->experts[0].gate_up[0], b->experts[0].gate_up[b->experts[0].gate_up_parts - 1]};
    const prepare_t mlp_in = {in, 3, H, M, x, pending ? tmp : NULL, b->mlp_norm, md->eps, h, xq};
    vsk_parallel_for(prepare_rows, &mlp_in, M);
    const uint8_t *each[2];
    size_t strides[2];
    each[0] = act_row(xq, format_of(b->router.type), M, H, 0);
    strides[0] = format_row_bytes(format_of(b->router.type), H);
    if (vsk_products_each(&b->router, 1, H, each, strides, M, s->logits, E)) return -1;
    for (int m = 0; m < M; m++) route(s->logits + (size_t)m * E, E, k, md->norm_topk, s->choice + m * k, s->weight + m * k);
    for (int e = 0; e < E; e++) {
        const vsk_expert *x_e = &b->experts[e];
        int n = 0;
        for (int slot = 0; slot < M * k; slot++)
            if (s->choice[slot] == e) s->rows[n] = slot / k, s->slots[n++] = slot;
        if (!n) continue;
        for (int q = 0; q < x_e->gate_up_parts; q++) { /* the rows' activations, gathered in each format the parts take */
            const int f = format_of(x_e->gate_up[q].type);
            for (int i = 0; i < n; i++)
                memcpy(act_row(s->gathered, f, n, H, i), act_row(xq, f, M, H, s->rows[i]), format_row_bytes(f, H));
            each[q] = act_row(s->gathered, f, n, H, 0);
            strides[q] = format_row_bytes(f, H);
        }
        const double begin = vsk_seconds();
        const int status = vsk_products_each(x_e->gate_up, x_e->gate_up_parts, H, each, strides, n, s->gate_up, 2 * I);
        product_seconds += vsk_seconds() - begin;
        if (status) return -1;
        const swiglu_t act = {s->gate_up, s->act, I, vsk_rows(), md->gelu};
        vsk_parallel_for(swiglu_items, &act, n * ((I + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK));
        const prepare_t down_in = {&x_e->down, 1, I, n, s->act, NULL, NULL, 0.0f, NULL, s->xq};
        if (products(&down_in, s->out, H)) return -1;
        for (int i = 0; i < n; i++) memcpy(s->y + (size_t)s->slots[i] * H, s->out + (size_t)i * H, sizeof(float) * H);
    }
    for (int m = 0; m < M; m++)
        for (int d = 0; d < H; d++) {
            float sum = 0.0f;
            for (int j = 0; j < k; j++) sum += s->weight[m * k + j] * s->y[((size_t)m * k + j) * H + d];
            tmp[(size_t)m * H + d] = sum;
        }
    return 0;
}

/* One block for M rows. Its output leaves the last product in `tmp`, to be added to x by the next block's
 * first step (or by the stack at the end): `pending` says whether tmp holds such a residual on entry. */
static int block_forward(const vsk_model *md, const vsk_block *b, void *keys, void *values, const vsk_cache *c,
                         float *x, int M, const vsk_pass_rows *rows, uint8_t *scratch, int pending) {
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
    const prepare_t attn_in = {b->qkv, b->qkv_parts, hidden, M, x, pending ? tmp : NULL, b->attn_norm, md->eps, h, xq};
    if (products(&attn_in, qkv, width)) return -1;
    const rotate_t r = {md, b, c, qkv, keys, values, rows};
    vsk_parallel_for(rotate_rows, &r, M);
    for (int m = 0; m < M; m++) /* the queries, packed [M][H][D] for the attention */
        memmove(qkv + (size_t)m * H * D, qkv + (size_t)m * width, sizeof(float) * H * D);
    const float scale = md->scale ? md->scale : 1.0f / sqrtf((float)D);
    const vsk_attention_t a = {.q = qkv, .keys = keys, .values = values, .pages = c->pages, .slot = rows->slot,
                               .pos = rows->pos, .H = H, .kvH = kvH, .D = D, .scale = scale, .out = att,
                               .half = c->half, .direct = rows->direct, .tail = rows->tail, .window = b->window,
                               .softcap = md->softcap};
    const double attention_begin = vsk_seconds();
    vsk_attend(&a, M);
    attention_seconds += vsk_seconds() - attention_begin;
    const prepare_t o_in = {&b->o, 1, H * D, M, att, NULL, NULL, 0.0f, NULL, xq};
    if (products(&o_in, tmp, hidden)) return -1;
    if (b->post_attn_norm) {
        const norm_rows_t post = {tmp, b->post_attn_norm, hidden, md->eps};
        vsk_parallel_for(norm_rows, &post, M);
    }

    /* MLP */
    if (b->experts) {
        const int dense = has_dense_parts(md);
        const moe_scratch_t ms = moe_scratch(md, M, dense, scratch + dense_scratch_bytes(md, M, dense));
        if (moe_forward(md, b, x, M, tmp, 1, h, xq, &ms)) return -1;
    } else {
        const prepare_t mlp_in = {b->gate_up, b->gate_up_parts, hidden, M, x, tmp, b->mlp_norm, md->eps, h, xq};
        if (products(&mlp_in, gate_up, 2 * inter)) return -1;
        const swiglu_t s = {gate_up, act, inter, vsk_rows(), md->gelu};
        vsk_parallel_for(swiglu_items, &s, M * ((inter + SWIGLU_CHUNK - 1) / SWIGLU_CHUNK));
        const prepare_t down_in = {&b->down, 1, inter, M, act, NULL, NULL, 0.0f, NULL, xq};
        if (products(&down_in, tmp, hidden)) return -1;
    }
    if (b->post_mlp_norm) {
        const norm_rows_t post = {tmp, b->post_mlp_norm, hidden, md->eps};
        vsk_parallel_for(norm_rows, &post, M);
    }
    return 0;
}

static int stack_forward(const vsk_model *md, const vsk_cache *c, float *x, int M, const vsk_pass_rows *rows,
                         uint8_t *scratch) {
    const double begin = vsk_seconds();
    int status = 0;
    if (md->embed_scale)
        for (size_t i = 0; i < (size_t)M * md->hidden; i++) x[i] *= md->embed_scale;
    for (int l = 0; l < md->layers && !status; l++)
        status = block_forward(md, &md->blocks[l], c->keys[l], c->values[l], c, x, M, rows, scratch, l > 0);
    const float *tmp = (const float *)(scratch + floats_bytes((size_t)M * md->hidden)); /* the last residual */
    for (size_t i = 0; !status && md->layers && i < (size_t)M * md->hidden; i++) x[i] += tmp[i];
    stack_seconds += vsk_seconds() - begin;
    return status ? -1 : 0;
}

/* x [M][hidden] through every block, in place. Row m is at position pos[m] of the sequence in cache slot
 * slot[m] (whose table holds a block for it); its keys and values are written there before any row attends, so
 * the rows of one sequence may share a call in position order. `scratch`: vsk_stack_scratch_bytes(md, M), 64-byte aligned.
 * 0, or -1 when a weight type has no kernel. */
VSK_API int vsk_stack_forward(const vsk_model *md, const vsk_cache *c, float *x, int M, const int *slot,
                              const int *pos, uint8_t *scratch) {
    const vsk_pass_rows rows = {slot, pos, NULL, NULL, NULL};
    return stack_forward(md, c, x, M, &rows, scratch);
}

/* vsk_stack_forward for passes that hold token trees: parent[m] is the row of row m's parent node, or -1 for a row
 * that follows its sequence's previous position (a tree's root, or a row outside any tree). A tree's rows follow
 * its root, at most VSK_ATTENTION_ROWS of them, parents first; a row at depth d sits at position pos[root] + d
 * (its rotary position), is stored at pos[root] + its row's distance from the root (siblings share a position, so
 * they cannot share where they are stored), and attends to the sequence before the root, then to its ancestors
 * and itself in order: exactly the keys and values, in the order, of a chain pass along its path, hence the same
 * bits. 0; -1 as vsk_stack_forward; -2 when the parents do not make such trees. */
VSK_API int vsk_stack_forward_tree(const vsk_model *md, const vsk_cache *c, float *x, int M, const int *slot,
                                   const int *pos, const int *parent, uint8_t *scratch) {
    int *at = malloc(sizeof(int) * (size_t)M * (3 + VSK_ATTENTION_ROWS)), *root = at + M, *direct = root + M;
    int *tail = direct + M, status = 0;
    for (int m = 0; m < M && !status; m++) {
        const int p = parent[m];
        if (p < 0) {
            root[m] = m, at[m] = pos[m];
            continue;
        }
        if (p >= m) {
            status = -2;
            break;
        }
        root[m] = root[p];
        at[m] = at[root[m]] + (m - root[m]);
        if (slot[p] != slot[m] || pos[p] + 1 != pos[m] || m - root[m] >= VSK_ATTENTION_ROWS) status = -2;
    }
    for (int m = 0; m < M && !status; m++) { /* the path root .. m; the leading part stored in place is read so */
        const int r = root[m], depth = pos[m] - pos[r];
        int path[VSK_ATTENTION_ROWS];
        for (int node = m, j = depth; j >= 0; node = parent[node], j--) path[j] = node;
        int k = 0;
        while (k <= depth && at[path[k]] == pos[r] + k) k++;
        direct[m] = pos[r] + k;
        for (int j = k; j <= depth; j++) tail[(size_t)m * VSK_ATTENTION_ROWS + j - k] = at[path[j]];
    }
    const vsk_pass_rows rows = {slot, pos, at, direct, tail};
    if (!status) status = stack_forward(md, c, x, M, &rows, scratch);
    free(at);
    return status;
}
