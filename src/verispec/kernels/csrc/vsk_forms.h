/* The forms of weights the kernels take, listed once: the GGUF block types with a native kernel and their tile
 * forms (vsk_tiles.c). Whatever lists the forms expands these tables: the type ids, the sizes of their
 * blocks, and each path's entry points and lookup, the path naming the body that serves each family of forms.
 *
 * A new form is a line here, plus its layout wherever a body must know it; a new path is its bodies, one line per
 * family saying which serves it (or none), and VSK_ROW_KERNELS / VSK_TILE_KERNELS. */
#ifndef VSK_FORMS_H
#define VSK_FORMS_H

/* X(TYPE, name, id, weights, bytes, family): the GGML type VSK_<TYPE> = id, in blocks of `weights` values of
 * `bytes` bytes (the dense types: blocks of 1, whose activations are the float32 rows themselves); the types of a
 * family share their body on every path */
#define VSK_TYPES(X)                        \
    X(F32, f32, 0, 1, 4, dense)             \
    X(F16, f16, 1, 1, 2, dense)             \
    X(Q4_0, q4_0, 2, 32, 18, q32)           \
    X(Q4_1, q4_1, 3, 32, 20, q32)           \
    X(Q5_0, q5_0, 6, 32, 22, q32)           \
    X(Q8_0, q8_0, 8, 32, 34, q32)           \
    X(Q2_K, q2_k, 10, 256, 84, kblock)      \
    X(Q3_K, q3_k, 11, 256, 110, kblock)     \
    X(Q4_K, q4_k, 12, 256, 144, q4_k)       \
    X(Q5_K, q5_k, 13, 256, 176, kblock)     \
    X(Q6_K, q6_k, 14, 256, 210, q6_k)       \
    X(IQ4_NL, iq4_nl, 20, 32, 18, q32)      \
    X(IQ4_XS, iq4_xs, 23, 256, 136, kblock) \
    X(BF16, bf16, 30, 1, 2, dense)          \
    X(MXFP4, mxfp4, 39, 32, 17, mxfp4)

/* X(TILE, name, TYPE, bytes, family): the tile form VSK_<TILE> = 100 + VSK_<TYPE> of a type above, 16 weight rows
 * interleaved: `bytes` per block of the 16 rows (as many values per row as the type's block) */
#define VSK_TILES(X)                          \
    X(T4_0, t4_0, Q4_0, 288, tile32)          \
    X(T4_1, t4_1, Q4_1, 320, tile32)          \
    X(T5_0, t5_0, Q5_0, 352, tile32)          \
    X(T8_0, t8_0, Q8_0, 544, tile32)          \
    X(T2_K, t2_k, Q2_K, 1344, tile_kblock)    \
    X(T3_K, t3_k, Q3_K, 1824, tile_kblock)    \
    X(T4_K, t4_k, Q4_K, 2368, tile256)        \
    X(T5_K, t5_k, Q5_K, 2880, tile_kblock)    \
    X(T6_K, t6_k, Q6_K, 3360, tile256)        \
    X(TIQ4_NL, tiq4_nl, IQ4_NL, 288, tile32)  \
    X(TIQ4_XS, tiq4_xs, IQ4_XS, 2208, tile_kblock)

#define VSK_TYPE_ID(NAME, name, id, ...) VSK_##NAME = id,
#define VSK_TILE_ID(TILE, name, TYPE, ...) VSK_##TILE = 100 + VSK_##TYPE,

/* the GGML type ids of the types with a native kernel, and the tile forms */
enum { VSK_TYPES(VSK_TYPE_ID) };
enum { VSK_TILES(VSK_TILE_ID) };

#define VSK_TYPE_WEIGHTS(NAME, name, id, weights, ...) case VSK_##NAME: return weights;
#define VSK_TILE_WEIGHTS(TILE, name, TYPE, ...) case VSK_##TILE: return vsk_type_weights(VSK_##TYPE);
#define VSK_TYPE_BYTES(NAME, name, id, weights, bytes, ...) case VSK_##NAME: return bytes;
#define VSK_TILE_BYTES(TILE, name, TYPE, bytes, ...) case VSK_##TILE: return bytes;
#define VSK_TILE_CASE_1(TILE, ...) case VSK_##TILE: return 1;

static inline int vsk_type_weights(int type) {
    switch (type) {
        VSK_TYPES(VSK_TYPE_WEIGHTS)
    default: return 0;
    }
}

/* values per block of a type or tile form (0 for neither) */
static inline int vsk_block_weights(int type) {
    switch (type) {
        VSK_TILES(VSK_TILE_WEIGHTS)
    default: return vsk_type_weights(type);
    }
}

/* bytes per block of a type (of one row) or of a tile form (of 16 rows); 0 for neither */
static inline int vsk_block_bytes(int type) {
    switch (type) {
        VSK_TYPES(VSK_TYPE_BYTES)
        VSK_TILES(VSK_TILE_BYTES)
    default: return 0;
    }
}

/* whether `type` is a tile form */
static inline int vsk_is_tile(int type) {
    switch (type) {
        VSK_TILES(VSK_TILE_CASE_1)
    default: return 0;
    }
}

/* ---- one path's entry points (vsk_kernel, vsk.h) and their lookup --------------------------------------------
 *
 * A path defines, for every family of VSK_TYPES, ROWS_<family>(entry, ...) as entry(body, __VA_ARGS__) with the
 * body that serves the family there, or as nothing where the portable kernels serve it; then VSK_ROW_KERNELS(lookup)
 * defines an entry point per type it serves and `vsk_kernel lookup(int type)`. Likewise TILES_<family> for the
 * families of VSK_TILES and VSK_TILE_KERNELS, as entry(body, most, __VA_ARGS__): the body and the most activation
 * rows it takes per call (at most MAX_ROWS). The bodies take the type as a constant of each entry point, so that
 * an always-inline body's tests of it fold away:
 *   row body:  body(type, row, K, xq, x_stride, rows, y, ldy): one weight row against `rows` activation rows
 *              (at most MAX_ROWS; every row for the dense types), y[m * ldy] for m < rows;
 *   tile body: body(form, strip, blocks, xq, x_stride, rows, y, ldy, lanes): the 16 weight rows of a strip of
 *              `blocks` blocks against `rows` activation rows (at most `most`), y[m * ldy + n] for n < lanes. */

#define VSK_ROW_ENTRY(body, name, type)                                                                         \
    static void row_##name(const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,         \
                           size_t x_stride, int M, float *y, int ldy) {                                         \
        const int most = vsk_block_weights(type) == 1 ? M : MAX_ROWS;                                           \
        for (int r0 = 0; r0 < M; r0 += most)                                                                    \
            for (int n = n0; n < n1; n++)                                                                       \
                body(type, W + (size_t)n * row_bytes, K, xq + (size_t)r0 * x_stride, x_stride,                  \
                     M - r0 < most ? M - r0 : most, y + (size_t)r0 * ldy + n, ldy);                             \
    }

#define VSK_TILE_ENTRY(body, most, name, form)                                                                  \
    static void tile_##name(const uint8_t *W, size_t row_bytes, int n0, int n1, int K, const uint8_t *xq,        \
                            size_t x_stride, int M, float *y, int ldy) {                                        \
        const int blocks = K / vsk_block_weights(form);                                                         \
        const size_t strip_bytes = (size_t)blocks * (size_t)vsk_block_bytes(form);                              \
        (void)row_bytes;                                                                                        \
        for (int t = n0 / 16; t < (n1 + 15) / 16; t++)                                                          \
            for (int r0 = 0; r0 < M; r0 += most)                                                                \
                body(form, W + (size_t)t * strip_bytes, blocks, xq + (size_t)r0 * x_stride, x_stride,           \
                     M - r0 < most ? M - r0 : most, y + (size_t)r0 * ldy + 16 * t, ldy,                         \
                     n1 - 16 * t < 16 ? n1 - 16 * t : 16);                                                     \
    }

#define VSK_ROW_CASE(body, name, type) case type: return row_##name;
#define VSK_TILE_CASE(body, most, name, form) case form: return tile_##name;
#define VSK_ROW_ENTRY_OF(NAME, name, id, weights, bytes, family) ROWS_##family(VSK_ROW_ENTRY, name, VSK_##NAME)
#define VSK_ROW_CASE_OF(NAME, name, id, weights, bytes, family) ROWS_##family(VSK_ROW_CASE, name, VSK_##NAME)
#define VSK_TILE_ENTRY_OF(TILE, name, TYPE, bytes, family) TILES_##family(VSK_TILE_ENTRY, name, VSK_##TILE)
#define VSK_TILE_CASE_OF(TILE, name, TYPE, bytes, family) TILES_##family(VSK_TILE_CASE, name, VSK_##TILE)

#define VSK_ROW_KERNELS(lookup)                   \
    VSK_TYPES(VSK_ROW_ENTRY_OF)                   \
    vsk_kernel lookup(int type) {                 \
        switch (type) {                           \
            VSK_TYPES(VSK_ROW_CASE_OF)            \
        default: return NULL;                     \
        }                                         \
    }

#define VSK_TILE_KERNELS(lookup)                  \
    VSK_TILES(VSK_TILE_ENTRY_OF)                  \
    vsk_kernel lookup(int type) {                 \
        switch (type) {                           \
            VSK_TILES(VSK_TILE_CASE_OF)           \
        default: return NULL;                     \
        }                                         \
    }

#endif
