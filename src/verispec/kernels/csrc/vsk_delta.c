/* Qwen3.5's Gated DeltaNet recurrence (models/delta_net.py, `recurrent`): T tokens of one sequence through one layer.
 *
 * Per value head h, its state S [K][V] (row-major) and per token t, with d = exp(g[t][h]) and b = beta[t][h]:
 *     r_k = S^T k, r_q = S^T q                  (one read of S; sums over i = 0 .. K-1 in that order)
 *     u = (v - d r_k) b
 *     S' = d S + k u^T                          (written to states[t]: every token's state is kept, a rollback
 *                                                picks one by reference)
 *     out = d r_q + (q . k) u                   (= S'^T q)
 * The heads are independent: the pool splits them, each thread runs its heads through all T tokens, so a head's state
 * stays in cache from one token to the next. A head's result depends on nothing but its own inputs, in one fixed order
 * whatever the thread count: the same bits alone or beside other work. */
#include <math.h>

#include "vsk.h"

#define VSK_API __attribute__((visibility("default")))
#define VSK_DELTA_MAX_V 1024

typedef struct {
    const float *state; /* [H][K][V]: the state before the first token */
    float *states;      /* [T][H][K][V]: the state after each token */
    const float *q, *k; /* [T][H][K] */
    const float *v;     /* [T][H][V] */
    const float *g, *beta; /* [T][H] */
    float *out;         /* [T][H][V] */
    int T, H, K, V;
} delta_job;

static void delta_heads(const void *ctx, int begin, int end) {
    const delta_job *j = ctx;
    const int T = j->T, H = j->H, K = j->K, V = j->V;
    const size_t head = (size_t)K * V, step = (size_t)H * head;
    float scratch[3 * VSK_DELTA_MAX_V]; /* V <= VSK_DELTA_MAX_V: native.delta_steps checks */
    float *rk = scratch, *rq = scratch + V, *u = scratch + 2 * V;
    for (int h = begin; h < end; h++) {
        const float *S = j->state + h * head;
        for (int t = 0; t < T; t++) {
            float *N = j->states + t * step + h * head;
            const float *q = j->q + ((size_t)t * H + h) * K, *k = j->k + ((size_t)t * H + h) * K;
            const float *v = j->v + ((size_t)t * H + h) * V;
            const float d = expf(j->g[t * H + h]), b = j->beta[t * H + h];
            float qk = 0.0f;
            for (int x = 0; x < V; x++) rk[x] = rq[x] = 0.0f;
            for (int i = 0; i < K; i++) {
                const float *row = S + (size_t)i * V;
                const float ki = k[i], qi = q[i];
                qk += qi * ki;
                for (int x = 0; x < V; x++) {
                    rk[x] += ki * row[x];
                    rq[x] += qi * row[x];
                }
            }
            float *o = j->out + ((size_t)t * H + h) * V;
            for (int x = 0; x < V; x++) {
                u[x] = (v[x] - d * rk[x]) * b;
                o[x] = d * rq[x] + qk * u[x];
            }
            for (int i = 0; i < K; i++) {
                const float *row = S + (size_t)i * V;
                float *next = N + (size_t)i * V;
                const float ki = k[i];
                for (int x = 0; x < V; x++) next[x] = d * row[x] + ki * u[x];
            }
            S = N;
        }
    }
}

VSK_API void vsk_delta_steps(const float *state, float *states, const float *q, const float *k, const float *v,
                             const float *g, const float *beta, float *out, int T, int H, int K, int V) {
    const delta_job j = {.state = state, .states = states, .q = q, .k = k, .v = v, .g = g, .beta = beta, .out = out,
                         .T = T, .H = H, .K = K, .V = V};
    vsk_parallel_for(delta_heads, &j, H);
}
