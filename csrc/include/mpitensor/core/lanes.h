/* Kernels along one axis of a local array: running sums and products (NumPy's
 * cumsum and cumprod) and the first extreme (argmax, argmin). The array is
 * C-contiguous and seen as `outer` blocks of `n` rows of `inner` elements: each of
 * its outer * inner lanes runs along the rows. All calls are Local and touch only
 * caller memory. */
#ifndef MPITENSOR_LANES_H
#define MPITENSOR_LANES_H

#include <stdint.h>

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The shape an axis splits a C-contiguous array into: the dims before it
 * multiplied (`outer`), its length (`n`) and the dims after it (`inner`). */
typedef struct mt_lanes {
  int64_t outer, n, inner;
} mt_lanes;

/* Local. Running sums (`op` MT_REDUCE_SUM) or products (MT_REDUCE_PRODUCT) of
 * `in` along its lanes, left to right as numpy.cumsum and numpy.cumprod compute
 * them, each lane starting from init[o, j] when `init` (outer x inner) is given:
 * out[o, i, j] = init[o, j] op in[o, 0, j] op ... op in[o, i, j]. `out` (the shape
 * of `in`) may be NULL, when only `last` is wanted; `last` (outer x inner, or
 * NULL) receives each lane's final value (init, or the identity, for n == 0).
 * Integers wrap as NumPy's do; bool sums are logical or, products logical and;
 * float16 is computed in float and rounded each step. MT_ETYPE for an unknown
 * dtype, MT_EINVAL for another op or negative extents.
 *
 *   mt_lanes l = {1, n, 1};
 *   mt_cumulate(out, &total, x, NULL, &l, MT_DTYPE_FLOAT64, MT_REDUCE_SUM, &err);
 */
MT_EXPORT int mt_cumulate(void *out, void *last, const void *in, const void *init,
                          const mt_lanes *l, int dtype, int op, mt_error *err);

/* Local. The first extreme of each lane of `in` as numpy.argmax (`largest`) or
 * numpy.argmin finds it: index[o, j] the row of the first maximum (minimum), a NaN
 * counting as the extreme (the first NaN wins), complex numbers ordered by real
 * then imaginary part; value[o, j] that element. Both outer x inner. MT_EINVAL
 * when n < 1 or an extent is negative, MT_ETYPE for an unknown dtype.
 *
 *   mt_lanes l = {1, rows, cols};
 *   mt_arg_extreme(index, value, x, &l, MT_DTYPE_FLOAT64, 1, &err);
 */
MT_EXPORT int mt_arg_extreme(int64_t *index, void *value, const void *in,
                             const mt_lanes *l, int dtype, int largest, mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
