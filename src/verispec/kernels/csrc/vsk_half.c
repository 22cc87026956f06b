/* IEEE half precision to single and back, in portable C (the GGUF blocks' scales; every path calls them). */
#include <string.h>

#include "vsk.h"

float vsk_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13); /* inf, nan */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        exponent = 113;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            exponent--;
        }
        bits = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* single to half, rounding to nearest even (overflow to infinity, underflow through the subnormals to zero) */
uint16_t vsk_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t mantissa = x & 0x7FFFFF;
    const int exponent = (int)((x >> 23) & 0xFF) - 127 + 15;
    if (((x >> 23) & 0xFF) == 0xFF) return (uint16_t)(sign | 0x7C00 | (mantissa ? 0x200 : 0)); /* inf, nan */
    if (exponent >= 31) return (uint16_t)(sign | 0x7C00);
    if (exponent <= 0) { /* a subnormal half, or zero */
        if (exponent < -10) return sign;
        const uint32_t full = mantissa | 0x800000;
        const int shift = 14 - exponent;
        uint32_t h = full >> shift;
        const uint32_t rest = full & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)exponent << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry into the exponent is still right */
    return (uint16_t)(sign | h);
}
