/* The dotprod build of the NEON tile kernels (vsk_tiles_neon.c): compiled with +dotprod (setup.py), chosen at run
 * time on cores with sdot. */
#define VSK_DOTPROD 1
#include "vsk_tiles_neon.c"
