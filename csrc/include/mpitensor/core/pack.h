/* Kernels on local buffers: N-D box copies, elementwise reductions (float16
 * included) and scaling. Every call is Local and touches only caller memory. */
#ifndef MPITENSOR_PACK_H
#define MPITENSOR_PACK_H

#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Local. Copies the box `extent` (shape extent->shape; extent->offset ignored)
 * from the C-contiguous array `src` of shape `src_shape`, starting at element
 * `src_off`, to the C-contiguous array `dst` of shape `dst_shape` at `dst_off`.
 * All three have extent->ndim dims and elements of `itemsize` bytes. The innermost
 * contiguous run is copied with mt_copy_bytes; runs that span whole rows are merged. */
void mt_copy_box(const void *src, const int64_t *src_shape, const int64_t *src_off,
                 void *dst, const int64_t *dst_shape, const int64_t *dst_off,
                 const mt_box *extent, int64_t itemsize);

/* Local. Copies `n` bytes (n <= 0: none) from `src` to `dst`, which must not
 * overlap: memcpy, but with streaming stores for destinations larger than the
 * caches on the CPUs where that is faster (copy.c). Every copy of tensor data in
 * the library goes through it.
 *
 *   mt_copy_bytes(out + row * out_stride, in + row * in_stride, row_bytes);
 */
void mt_copy_bytes(void *dst, const void *src, int64_t n);

/* Local. inout[i] = inout[i] (op) in[i] for n elements of `dtype` (mt_dtype) with
 * `op` an mt_reduce_op; MT_REDUCE_AVG reduces as a sum (the caller divides). bool
 * sums and maxima are logical or, products and minima logical and. Complex max/min
 * are MT_ETYPE (no order); float16 and bfloat16 are computed in float and rounded to
 * nearest even at each step, as NumPy (and for bfloat16 torch's collectives) do. */
int mt_reduce(void *inout, const void *in, int64_t n, int dtype, int op, mt_error *err);

/* Local. buf[i] /= divisor for n elements of a float or complex `dtype` (float16
 * and bfloat16 included); integers are divided rounding toward negative infinity, as NumPy's //. */
int mt_divide(void *buf, int64_t n, int dtype, int64_t divisor, mt_error *err);

/* Local. IEEE binary16 <-> binary32 conversions (round to nearest even). */
float mt_half_to_float(uint16_t h);
uint16_t mt_float_to_half(float f);

/* Local. bfloat16 <-> binary32: widening is exact; narrowing rounds to nearest
 * even, overflows to inf and keeps a NaN a (quiet) NaN of the same sign. */
float mt_bfloat16_to_float(uint16_t b);
uint16_t mt_float_to_bfloat16(float f);

#ifdef __cplusplus
}
#endif
#endif
