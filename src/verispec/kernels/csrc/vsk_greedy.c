/* Greedy drafting in one call: a draft model's steps for M sequences, each step feeding the token the step
 * before chose (embedding row, the stack, final norm, head, argmax). A greedy draft of k tokens used to cost
 * k - 1 round trips through Python between the library's calls; here it is one. Each step runs the functions a
 * step driven from Python runs (vsk_row_to_floats, vsk_stack_forward, vsk_rms_norm, vsk_quantize, the head's
 * product), in the same order, so it chooses the same tokens. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vsk.h"
#include "vsk_rows.h"
#include "vsk_stack.h"

/* what follows the stack in a greedy step */
typedef struct {
    int embed_type;         /* the token embeddings: a GGUF matrix [vocab][embed_row_bytes] */
    const uint8_t *embed;
    size_t embed_row_bytes;
    int vocab;
    const float *norm;      /* the final RMSNorm's weights [hidden] */
    vsk_part head;          /* the output head's rows (one part) */
    const float *head_bias; /* [head.N], or NULL */
    const int64_t *ids;     /* the token id of each head row, or NULL: the row's index */
    int rows;               /* argmax over the first `rows` head rows */
    float softcap;          /* logits -> softcap * tanh(logit / softcap) before the argmax (ties as Python sees them) */
} vsk_greedy_head;

#define VSK_GREEDY_ROWS 256 /* rows of a pass, at most */

static size_t aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* scratch for passes of up to R rows (R >= M): the stack's, then the rows, the sequences' last rows
 * normalized, their head activations and logits */
VSK_API size_t vsk_greedy_scratch_bytes(const vsk_model *md, const vsk_greedy_head *g, int R) {
    return aligned(vsk_stack_scratch_bytes(md, R)) + 2 * aligned((size_t)R * md->hidden * sizeof(float)) +
           aligned((size_t)R * vsk_act_row_bytes(g->head.type, md->hidden)) +
           aligned((size_t)R * g->head.N * sizeof(float));
}

/* the head's argmax after one pass of R rows: row last[m] is sequence m's; its token into chosen[m * steps + s] */
static int choose(const vsk_model *md, const vsk_greedy_head *g, const float *x, int M, const int *last,
                  uint8_t *work, int steps, int s, int64_t *chosen) {
    const int hidden = md->hidden;
    const size_t x_stride = vsk_act_row_bytes(g->head.type, hidden);
    float *normed = (float *)work;
    uint8_t *xq = work + aligned((size_t)M * hidden * sizeof(float));
    float *logits = (float *)(xq + aligned((size_t)M * x_stride));
    for (int m = 0; m < M; m++)
        vsk_rms_norm(x + (size_t)last[m] * hidden, g->norm, 1, hidden, md->eps, normed + (size_t)m * hidden);
    vsk_quantize(g->head.type, normed, M, hidden, xq);
    const uint8_t *each[1] = {xq};
    const double begin = vsk_seconds();
    if (vsk_products_each(&g->head, 1, hidden, each, &x_stride, M, logits, g->head.N)) return -1;
    vsk_count_head_seconds(vsk_seconds() - begin);
    for (int m = 0; m < M; m++) {
        float *row = logits + (size_t)m * g->head.N;
        if (g->head_bias)
            for (int i = 0; i < g->head.N; i++) row[i] += g->head_bias[i];
        if (g->softcap)
            for (int i = 0; i < g->rows; i++) row[i] = tanhf(row[i] / g->softcap) * g->softcap;
        const int best = vsk_rows()->argmax(row, g->rows);
        chosen[(size_t)m * steps + s] = g->ids ? g->ids[best] : best;
    }
    return 0;
}

/* Greedy steps for M sequences. The first pass feeds sequence m its count[m] >= 1 tokens (`tokens` holds them
 * sequence after sequence) at positions pos[m], pos[m] + 1, ... of cache slot slot[m]; each pass after feeds the
 * token the one before chose, at the next position. chosen [M][steps]: each pass's choice. At most
 * VSK_GREEDY_ROWS rows in the first pass and M <= that; scratch: vsk_greedy_scratch_bytes for that many rows,
 * 64-byte aligned. 0; -1 when a weight type has no kernel or the rows are too many; -2 when a token is outside
 * the embeddings (then nothing ran). */
VSK_API int vsk_greedy_steps(const vsk_model *md, const vsk_cache *c, const vsk_greedy_head *g, int M,
                             const int *slot, const int *pos, const int *count, const int64_t *tokens, int steps,
                             int64_t *chosen, uint8_t *scratch) {
    int R = 0, row_slot[VSK_GREEDY_ROWS], row_pos[VSK_GREEDY_ROWS], last[VSK_GREEDY_ROWS];
    for (int m = 0; m < M; m++) {
        if (count[m] < 1 || R + count[m] > VSK_GREEDY_ROWS) return -1;
        for (int i = 0; i < count[m]; i++, R++) {
            if (tokens[R] < 0 || tokens[R] >= g->vocab) return -2;
            row_slot[R] = slot[m];
            row_pos[R] = pos[m] + i;
        }
        last[m] = R - 1;
    }
    const int hidden = md->hidden;
    float *x = (float *)(scratch + aligned(vsk_stack_scratch_bytes(md, R)));
    uint8_t *work = (uint8_t *)x + aligned((size_t)R * hidden * sizeof(float));
    for (int s = 0; s < steps; s++) {
        const int rows = s == 0 ? R : M;
        for (int r = 0; r < rows; r++) {
            const int64_t token = s == 0 ? tokens[r] : chosen[(size_t)r * steps + s - 1];
            if (s > 0) {
                row_slot[r] = slot[r];
                row_pos[r] = pos[r] + count[r] + s - 1;
                last[r] = r;
            }
            if (vsk_row_to_floats(g->embed_type, g->embed + (size_t)token * g->embed_row_bytes, hidden,
                                  x + (size_t)r * hidden))
                return -1;
        }
        if (vsk_stack_forward(md, c, x, rows, row_slot, row_pos, scratch)) return -1;
        if (choose(md, g, x, M, last, work, steps, s, chosen)) return -1;
    }
    return 0;
}
