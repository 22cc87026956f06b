/* Elementwise helpers without libm calls, so that loops over them vectorize; deterministic per element. */
#ifndef VSK_MATH_H
#define VSK_MATH_H

#include <stdint.h>
#include <string.h>

/* round to the nearest integer, ties to even (as nearbyintf in the default mode), for |x| < 2^22 */
static inline float vsk_round(float x) { return (x + 12582912.0f) - 12582912.0f; }

/* e^x: 2^n e^r with n = round(x / ln 2) and |r| <= ln 2 / 2, e^r by the Cephes polynomial (relative error
 * about 2e-7); x is clamped to [-87, 88], where e^x is a normal float. Written once for a float and for each path's
 * vectors of floats: `name(x)` of type T, given T's clamp of x and `pow2(n)`, 2^n for integral n (|n| <= 127). On a
 * vector (GCC's vector extensions: each operation lane by lane, a scalar operand in every lane) every lane takes
 * the float's operations in the same order (no fused multiply-adds: -ffp-contract=off), so the same bits. */
#define VSK_EXP(name, T, clamp, pow2)                                                        \
    static inline T name(T x) {                                                              \
        x = clamp(x);                                                                        \
        const T n = (x * 1.44269504089f + 12582912.0f) - 12582912.0f; /* vsk_round */       \
        const T r = (x - n * 0.693359375f) + n * 2.12194440e-4f;                             \
        T p = r * 1.9875691500e-4f + 1.3981999507e-3f;                                       \
        p = p * r + 8.3334519073e-3f;                                                        \
        p = p * r + 4.1665795894e-2f;                                                        \
        p = p * r + 1.6666665459e-1f;                                                        \
        p = p * r + 5.0000001201e-1f;                                                        \
        return (p * (r * r) + r + 1.0f) * pow2(n);                                           \
    }

static inline float vsk_exp_clamp(float x) { return x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x); }

static inline float vsk_pow2(float n) {
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return scale;
}

VSK_EXP(vsk_exp, float, vsk_exp_clamp, vsk_pow2)

#endif
