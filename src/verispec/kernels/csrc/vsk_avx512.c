/* The AVX-512 VNNI build of the 256-bit path (see vsk_avx2.c). */
#define VSK_VNNI 1
#include "vsk_avx2.c"
