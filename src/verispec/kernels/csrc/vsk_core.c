/* Entry points: CPU feature dispatch, activation quantization, and a persistent thread pool that splits the
 * weight rows of a product among threads (never the sum along K). */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vsk.h"
#include "vsk_blocks.h"
#include "vsk_math.h"
#include "vsk_rows.h"

#define VSK_API __attribute__((visibility("default")))
#define MAX_THREADS 64

/* ---- which path ----------------------------------------------------------------------------------------- */

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1UL << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1UL << 13)
#endif
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>

static int sysctl_flag(const char *name) {
    int value = 0;
    size_t size = sizeof value;
    return sysctlbyname(name, &value, &size, NULL, 0) == 0 && value != 0;
}
#endif

int vsk_isa_neon(int isa) { return isa >= VSK_ISA_NEON && isa <= VSK_ISA_NEON_I8MM; }

static int best_isa(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return VSK_ISA_AVX512;
    if (avx2) return VSK_ISA_AVX2;
#elif defined(__aarch64__)
    /* Advanced SIMD is part of every AArch64 core Linux and macOS run on; sdot and smmla are optional, asked of
     * the kernel (Linux: the auxiliary vector; macOS: sysctl), and taken only where this build has their kernels */
    int simd = 1, dot = 0, i8mm = 0;
#if defined(__linux__)
    const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
    simd = (hwcap & HWCAP_ASIMD) != 0;
    dot = (hwcap & HWCAP_ASIMDDP) != 0;
    i8mm = (hwcap2 & HWCAP2_I8MM) != 0;
#elif defined(__APPLE__)
    dot = sysctl_flag("hw.optional.arm.FEAT_DotProd");
    i8mm = sysctl_flag("hw.optional.arm.FEAT_I8MM");
#endif
    if (!simd || !vsk_kernel_neon(VSK_Q8_0)) return VSK_ISA_SCALAR;
    if (!dot || !vsk_kernel_neon_dot(VSK_Q8_0) || !vsk_tile_kernel_neon_dot(VSK_T8_0)) return VSK_ISA_NEON;
    if (!i8mm || !vsk_tile_kernel_neon_i8mm(VSK_T8_0)) return VSK_ISA_NEON_DOT;
    return VSK_ISA_NEON_I8MM;
#endif
    return VSK_ISA_SCALAR;
}

static int current_isa = -1;

/* the kernel of a type on a path: the path's own, else the best below it in its family, else the portable one */
static vsk_kernel kernel_for(int isa, int type) {
    const int tile = vsk_is_tile(type);
    vsk_kernel k = NULL;
    if (vsk_isa_neon(isa)) {
        if (isa >= VSK_ISA_NEON_I8MM && tile) k = vsk_tile_kernel_neon_i8mm(type);
        if (!k && isa >= VSK_ISA_NEON_DOT) k = tile ? vsk_tile_kernel_neon_dot(type) : vsk_kernel_neon_dot(type);
        if (!k) k = tile ? vsk_tile_kernel_neon(type) : vsk_kernel_neon(type);
    } else {
        if (isa >= VSK_ISA_AVX512) k = tile ? vsk_tile_kernel_avx512(type) : vsk_kernel_avx512(type);
        if (!k && isa >= VSK_ISA_AVX2) k = tile ? vsk_tile_kernel_avx2(type) : vsk_kernel_avx2(type);
    }
    if (!k) k = tile ? vsk_tile_kernel_scalar(type) : vsk_kernel_scalar(type);
    return k;
}

VSK_API int vsk_best_isa(void) { return best_isa(); }

VSK_API int vsk_get_isa(void) {
    if (current_isa < 0) current_isa = best_isa();
    return current_isa;
}

/* 0, or -1 when this CPU cannot run that path: the portable path, or one of its own family up to its best */
VSK_API int vsk_set_isa(int isa) {
    const int best = best_isa();
    const int runs = isa == VSK_ISA_SCALAR ||
                     (isa > VSK_ISA_SCALAR && isa <= best && vsk_isa_neon(isa) == vsk_isa_neon(best));
    if (!runs) return -1;
    current_isa = isa;
    return 0;
}

const vsk_row_ops *vsk_rows(void) {
    const int isa = vsk_get_isa();
    const vsk_row_ops *vector = vsk_isa_neon(isa) ? vsk_rows_neon() : isa >= VSK_ISA_AVX2 ? vsk_rows_avx2() : NULL;
    return vector ? vector : vsk_rows_portable();
}

VSK_API int vsk_has_kernel(int type) { return kernel_for(VSK_ISA_SCALAR, type) != NULL; }

/* ---- tiles ---------------------------------------------------------------------------------------------- */

void vsk_repack_rows(int type, const uint8_t *src, size_t row_bytes, int N, int K, uint8_t *dst);

/* the tile form of a GGUF type (its id + 100), or -1 */
static int tile_type(int type) {
    return type >= 0 && type < 100 && vsk_tile_kernel_scalar(type + 100) ? type + 100 : -1;
}

/* bytes of the tile form of an [N, K] matrix of `type`, or 0 when the type has none */
VSK_API size_t vsk_repacked_bytes(int type, int N, int K) {
    return tile_type(type) < 0 ? 0 : vsk_strip_bytes(tile_type(type), K) * (size_t)((N + 15) / 16);
}

/* writes the tile form into dst (vsk_repacked_bytes) and returns its type, or -1 */
VSK_API int vsk_repack(int type, const uint8_t *src, size_t row_bytes, int N, int K, uint8_t *dst) {
    if (tile_type(type) < 0 || K % vsk_act_block(type)) return -1;
    vsk_repack_rows(type, src, row_bytes, N, K, dst);
    return tile_type(type);
}

/* ---- activations ---------------------------------------------------------------------------------------- */

/* values per activation block (vsk_forms.h): the 256-weight types (the K-quants, IQ4_XS) and their tile forms take
 * one scale per 256 values, the dense types float rows (1), every other type one scale per 32 values */
VSK_API int vsk_act_block(int type) {
    const int weights = vsk_block_weights(type);
    return weights == 1 || weights == 256 ? weights : 32;
}

VSK_API size_t vsk_act_row_bytes(int type, int K) {
    switch (vsk_act_block(type)) {
    case 1: return (size_t)K * sizeof(float);
    case 256: return (size_t)(K / 256) * sizeof(vsk_act256);
    default: return (size_t)(K / 32) * sizeof(vsk_act32);
    }
}

/* symmetric 8-bit per block: d = max|x| / 127, q = round(x / d); every row on its own (vsk_rows.c); the dense
 * types' activations are the rows as they are */
VSK_API void vsk_quantize(int type, const float *x, int M, int K, uint8_t *out) {
    const size_t row_bytes = vsk_act_row_bytes(type, K);
    const vsk_row_ops *rows = vsk_rows();
    for (int m = 0; m < M; m++) {
        uint8_t *row = out + (size_t)m * row_bytes;
        const int block = vsk_act_block(type);
        if (block == 1)
            memcpy(row, x + (size_t)m * K, sizeof(float) * (size_t)K);
        else if (block == 256)
            rows->quantize256(x + (size_t)m * K, K, (vsk_act256 *)row);
        else
            rows->quantize32(x + (size_t)m * K, K, (vsk_act32 *)row);
    }
}

/* for tests: the current path's per-row steps on whole arrays */
VSK_API float vsk_sum_squares(const float *x, int n) { return vsk_rows()->sum_squares(x, n); }

VSK_API void vsk_swiglu(const float *gate, const float *up, float *out, int n) { vsk_rows()->swiglu(gate, up, out, n); }

VSK_API int vsk_argmax(const float *x, int n) { return vsk_rows()->argmax(x, n); }

/* ---- thread pool ---------------------------------------------------------------------------------------- */

#define MAX_PARTS 4

typedef struct {
    /* either a task over `count` independent items, or products split by 16-row chunks of weight rows */
    void (*task)(const void *ctx, int begin, int end);
    const void *ctx;
    int count;
    int parts;
    vsk_kernel kernel[MAX_PARTS];
    vsk_part part[MAX_PARTS];
    int column[MAX_PARTS];     /* where part p's outputs start in a row of y */
    int chunks[MAX_PARTS + 1]; /* part p owns the chunks [chunks[p], chunks[p + 1]) */
    int K;
    const uint8_t *xq[MAX_PARTS]; /* part p's quantized activations, rows x_stride[p] bytes apart */
    size_t x_stride[MAX_PARTS];
    int M;
    float *y;
    int ldy;
} job_t;

static struct {
    int threads;  /* including the caller */
    int started;  /* workers running */
    job_t job;
    atomic_int generation;
    int base_generation; /* the generation when the workers were started */
    atomic_int pending;
    int sleepers;
    int stop;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t workers[MAX_THREADS];
} pool = {.threads = 1, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* the chunks [c0, c1) of a product job: 16-row chunks numbered across all its parts (a chunk is a tile) */
static void run_chunks(const job_t *job, int c0, int c1) {
    for (int p = 0; p < job->parts; p++) {
        const int a = c0 > job->chunks[p] ? c0 : job->chunks[p], b = c1 < job->chunks[p + 1] ? c1 : job->chunks[p + 1];
        if (a >= b) continue;
        const vsk_part *w = &job->part[p];
        const int n0 = (a - job->chunks[p]) * 16, n1e = (b - job->chunks[p]) * 16, n1 = n1e < w->N ? n1e : w->N;
        job->kernel[p](w->W, w->row_bytes, n0, n1, job->K, job->xq[p], job->x_stride[p], job->M,
                       job->y + job->column[p], job->ldy);
    }
}

/* per thread: its share of a product job's chunks not yet claimed, packed front << 32 | back */
static struct {
    _Alignas(64) _Atomic unsigned long long range;
} shares[MAX_THREADS];

static unsigned long long pack(int front, int back) { return (unsigned long long)front << 32 | (unsigned)back; }

/* claims a grain of thread v's share into [c0, c1): a quarter of what is left from its front (v's own claims), or
 * half from its back (another thread's), at least `least` chunks; 0 when the share is empty */
static int take(int v, int from_back, int least, int *c0, int *c1) {
    unsigned long long range = atomic_load_explicit(&shares[v].range, memory_order_relaxed);
    for (;;) {
        const int front = (int)(range >> 32), back = (int)(range & 0xffffffffu), left = back - front;
        if (left <= 0) return 0;
        int grain = from_back ? left / 2 : left / 4;
        grain = grain < least ? least : grain;
        grain = grain < left ? grain : left;
        const unsigned long long after = from_back ? pack(front, back - grain) : pack(front + grain, back);
        if (atomic_compare_exchange_weak_explicit(&shares[v].range, &range, after, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *c0 = from_back ? back - grain : front;
            *c1 = from_back ? back : front + grain;
            return 1;
        }
    }
}

/* Thread t's part of a job. Items of a task: an equal share each. Chunks of products: an equal contiguous
 * share each, claimed from its front in shrinking grains; a thread done with its own takes grains from the back
 * of the others', so threads finish together when one runs slower (another tenant, a page walk). Which thread
 * computes a chunk never changes its values (threads split the output columns, never a sum). */
static void run_slice(const job_t *job, int t, int threads) {
    if (job->task) {
        const int begin = (int)((long)job->count * t / threads), end = (int)((long)job->count * (t + 1) / threads);
        if (begin < end) job->task(job->ctx, begin, end);
        return;
    }
    const int total = job->chunks[job->parts];
    if (threads == 1) {
        run_chunks(job, 0, total);
        return;
    }
    const int least = total / 64 > 1 ? total / 64 : 1;
    int c0, c1;
    while (take(t, 0, least, &c0, &c1)) run_chunks(job, c0, c1);
    for (int v = (t + 1) % threads; v != t; v = (v + 1) % threads)
        while (take(v, 1, least, &c0, &c1)) run_chunks(job, c0, c1);
}

static void *worker_main(void *arg) {
    const int t = (int)(intptr_t)arg;
    int seen = pool.base_generation; /* jobs posted before this worker existed are not its own */
    for (;;) {
        int spins = 0, g;
        while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
            if (++spins < 20000) {
                relax();
                continue;
            }
            pthread_mutex_lock(&pool.lock);
            pool.sleepers++;
            while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            pool.sleepers--;
            pthread_mutex_unlock(&pool.lock);
        }
        seen = g;
        if (pool.stop) return NULL;
        run_slice(&pool.job, t, pool.threads);
        atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_release);
    }
}

static void stop_workers(void) {
    if (!pool.started) return;
    pthread_mutex_lock(&pool.lock);
    pool.stop = 1;
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    for (int t = 1; t < pool.started; t++) pthread_join(pool.workers[t], NULL);
    pool.started = 0;
    pool.stop = 0;
}

VSK_API void vsk_set_threads(int n) {
    n = n < 1 ? 1 : (n > MAX_THREADS ? MAX_THREADS : n);
    if (n == pool.threads && (n == 1 || pool.started == n)) return;
    stop_workers();
    pool.threads = n;
    pool.base_generation = atomic_load(&pool.generation);
    for (int t = 1; t < n; t++) pthread_create(&pool.workers[t], NULL, worker_main, (void *)(intptr_t)t);
    pool.started = n;
}

VSK_API int vsk_get_threads(void) { return pool.threads; }

static pthread_mutex_t one_caller = PTHREAD_MUTEX_INITIALIZER; /* the pool serves one job at a time */

static void run(const job_t *job) {
    const int threads = pool.threads > 1 && (job->task ? job->count >= 2 : job->chunks[job->parts] >= 2) ? pool.threads : 1;
    if (threads == 1) {
        run_slice(job, 0, 1);
        return;
    }
    pthread_mutex_lock(&one_caller);
    pool.job = *job;
    if (!job->task)
        for (int t = 0; t < threads; t++) {
            const long total = job->chunks[job->parts];
            atomic_store_explicit(&shares[t].range, pack((int)(total * t / threads), (int)(total * (t + 1) / threads)),
                                  memory_order_relaxed);
        }
    atomic_store_explicit(&pool.pending, threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add_explicit(&pool.generation, 1, memory_order_release);
    if (pool.sleepers) pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    run_slice(job, 0, threads);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) relax();
    pthread_mutex_unlock(&one_caller);
}

void vsk_parallel_for(void (*task)(const void *ctx, int begin, int end), const void *ctx, int count) {
    job_t job = {0};
    job.task = task;
    job.ctx = ctx;
    job.count = count;
    run(&job);
}

int vsk_products_each(const vsk_part *parts, int count, int K, const uint8_t *const *xq, const size_t *x_stride,
                      int M, float *y, int ldy) {
    if (count < 1 || count > MAX_PARTS) return -1;
    job_t job = {0};
    job.parts = count;
    for (int p = 0, column = 0; p < count; p++) {
        job.kernel[p] = kernel_for(vsk_get_isa(), parts[p].type);
        if (!job.kernel[p]) return -1;
        job.part[p] = parts[p];
        job.column[p] = column;
        job.chunks[p + 1] = job.chunks[p] + (parts[p].N + 15) / 16;
        job.xq[p] = xq[p];
        job.x_stride[p] = x_stride[p];
        column += parts[p].N;
    }
    job.K = K;
    job.M = M;
    job.y = y;
    job.ldy = ldy;
    run(&job);
    return 0;
}

int vsk_products(const vsk_part *parts, int count, int K, const uint8_t *xq, size_t x_stride, int M, float *y,
                 int ldy) {
    const uint8_t *each[MAX_PARTS] = {xq, xq, xq, xq};
    const size_t strides[MAX_PARTS] = {x_stride, x_stride, x_stride, x_stride};
    return vsk_products_each(parts, count, K, each, strides, M, y, ldy);
}

/* y[m][n] for m < M, n < N; 0, or -1 for a type without a kernel */
VSK_API int vsk_matmul(int type, const uint8_t *W, size_t row_bytes, int N, int K, const uint8_t *xq, int M,
                       float *y) {
    const vsk_part part = {type, W, row_bytes, N};
    return vsk_products(&part, 1, K, xq, vsk_act_row_bytes(type, K), M, y, N);
}

/* quantize x [M][K] into `scratch` (vsk_act_row_bytes(type, K) * M bytes), then y = x W^T */
VSK_API int vsk_linear(int type, const uint8_t *W, size_t row_bytes, int N, int K, const float *x, int M,
                       uint8_t *scratch, float *y) {
    vsk_quantize(type, x, M, K, scratch);
    return vsk_matmul(type, W, row_bytes, N, K, scratch, M, y);
}

/* ---- the machine's read bandwidth (for the bench's GB/s figures) ---------------------------------------- */

typedef struct {
    const uint64_t *words;
    size_t per_chunk;
    uint64_t sums[MAX_THREADS];
} read_t;

static void read_chunks(const void *ctx, int begin, int end) {
    read_t *r = (read_t *)ctx;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = (size_t)begin * r->per_chunk; i < (size_t)end * r->per_chunk; i += 4) {
        a += r->words[i];
        b += r->words[i + 1];
        c += r->words[i + 2];
        d += r->words[i + 3];
    }
    r->sums[begin % MAX_THREADS] += a + b + c + d; /* kept, so the reads are not optimised away */
}

/* reads `bytes` (a multiple of 64 KiB) with the pool's threads; returns a checksum */
VSK_API uint64_t vsk_read(const uint8_t *buf, size_t bytes) {
    read_t r = {(const uint64_t *)buf, 8192, {0}};
    vsk_parallel_for(read_chunks, &r, (int)(bytes / 65536));
    uint64_t total = 0;
    for (int t = 0; t < MAX_THREADS; t++) total += r.sums[t];
    return total;
}
