/* IEEE half precision to single, in portable C (the GGUF blocks' scales; every path calls it). */
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
