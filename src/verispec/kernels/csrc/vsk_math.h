/* Elementwise helpers without libm calls, so that loops over them vectorize; deterministic per element. */
#ifndef VSK_MATH_H
#define VSK_MATH_H

#include <stdint.h>
#include <string.h>

/* round to the nearest integer, ties to even (as nearbyintf in the default mode), for |x| < 2^22 */
static inline float vsk_round(float x) { return (x + 12582912.0f) - 12582912.0f; }

/* e^x: 2^n e^r with n = round(x / ln 2) and |r| <= ln 2 / 2, e^r by the Cephes polynomial (relative error
 * about 2e-7); x is clamped to [-87, 88], where e^x is a normal float */
static inline float vsk_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = vsk_round(x * 1.44269504089f);
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    const float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
                     1.6666665459e-1f) * r + 5.0000001201e-1f;
    const float e = p * (r * r) + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return e * scale;
}

#endif
