/* The decoder stack's view of a model and its KV cache (vsk_stack.c), shared with what drives the stack
 * (vsk_greedy.c). */
#ifndef VSK_STACK_H
#define VSK_STACK_H

#include <stddef.h>

#include "vsk.h"

#ifndef VSK_API
#define VSK_API __attribute__((visibility("default")))
#endif

/* one expert of a mixture: its gate and up (one or two parts: the outputs are the gates, then the ups) and down */
typedef struct {
    vsk_part gate_up[2], down;
    int gate_up_parts;
} vsk_expert;

/* one block's weights (any types with a kernel; each product's activations are quantized in the formats its
 * parts take, vsk_act_block), and what departs from a Llama block (NULL, 0: nothing) */
typedef struct {
    const float *attn_norm, *mlp_norm; /* [hidden] */
    const float *qkv_bias;             /* [(H + 2 kvH) D], or NULL */
    vsk_part qkv[3], o, gate_up[2], down;
    int qkv_parts, gate_up_parts;
    const float *q_norm, *k_norm;               /* [D]: each head of q and k RMS-normalized before the rotary */
    const float *post_attn_norm, *post_mlp_norm; /* [hidden]: the attention's and the MLP's outputs normalized */
    int rope;                                   /* the rotary table the block takes, or -1: no rotary */
    int window;                                 /* keys a query sees (itself and those before), 0: all */
    /* a mixture of experts in place of gate_up and down (NULL: a dense MLP): the router [experts][hidden] and
     * vsk_model.experts experts of vsk_model.expert_inter */
    vsk_part router;
    const vsk_expert *experts;
} vsk_block;

typedef struct {
    int hidden, heads, kv_heads, head_dim, inter, layers;
    float eps;
    const vsk_block *blocks;
    float scale;       /* attention scores' scale, 0: 1 / sqrt(head_dim) */
    float softcap;     /* attention scores -> softcap * tanh(score / softcap) before the softmax, 0: none */
    float embed_scale; /* rows multiplied by it on entry (Gemma's sqrt(hidden)), 0: not */
    int gelu;          /* the MLP's activation: 0 silu (SwiGLU), 1 gelu with tanh (GeGLU) */
    /* the mixtures' shape (blocks with experts): each row goes through its top `experts_per_token` experts by the
     * router's softmax, their weights renormalized to sum to 1 when `norm_topk` */
    int experts, experts_per_token, expert_inter, norm_topk;
} vsk_model;

/* a KV cache: per layer a pool of keys and another of values, paged (vsk_pages: each slot's blocks in its row of the
 * table; float32, or IEEE half when `half`: what the stack writes is rounded to nearest even once, and read back
 * exactly), and the rotary tables [tables][length][D] (`rope_stride` floats apart) */
typedef struct {
    void *const *keys, *const *values;
    vsk_pages pages;
    const float *cos, *sin;
    int half;
    size_t rope_stride;
} vsk_cache;

/* a pass's rows: cache slot and position of each, and for token trees (else NULL) where each is stored and what
 * its attention reads in place and elsewhere (vsk_attention_t's direct and tail) */
typedef struct {
    const int *slot, *pos, *at, *direct, *tail;
} vsk_pass_rows;

VSK_API size_t vsk_stack_scratch_bytes(const vsk_model *md, int M);
VSK_API int vsk_stack_forward(const vsk_model *md, const vsk_cache *c, float *x, int M, const int *slot, const int *pos,
                              uint8_t *scratch);
VSK_API int vsk_stack_forward_tree(const vsk_model *md, const vsk_cache *c, float *x, int M, const int *slot,
                                   const int *pos, const int *parent, uint8_t *scratch);
/* a monotonic clock in seconds; greedy steps add their heads' product time to the stack's timing */
double vsk_seconds(void);
void vsk_count_head_seconds(double seconds);
VSK_API void vsk_rms_norm(const float *x, const float *weight, int M, int n, float eps, float *out);

#endif
