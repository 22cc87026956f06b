/* The i8mm build of the NEON tile kernels (vsk_tiles_neon.c): compiled with +dotprod+i8mm (setup.py), chosen at run
 * time on cores with smmla (and sdot). */
#define VSK_DOTPROD 1
#define VSK_I8MM 1
#include "vsk_tiles_neon.c"
