/* Counting a local array into equal bins, as numpy.histogram does with a number
 * of bins, and into a bin per value, as numpy.bincount does: in one pass, where
 * NumPy makes several. Local; touches only caller memory. */
#ifndef MPITENSOR_HISTOGRAM_H
#define MPITENSOR_HISTOGRAM_H

#include <stdint.h>

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most bins mt_histogram_uniform takes: with fewer, the bin each element's
 * arithmetic estimate points at is off by at most one even in float32, which is
 * what numpy.histogram's one corrective step against the edges assumes. */
#define MT_HISTOGRAM_MAX_BINS 65536

/* Local. Adds to counts[0..bins) the elements of `x` (`n` of `dtype`: float32,
 * float64, or an integer type of at most 32 bits, which double holds exactly) in
 * the equal bins whose `bins + 1` increasing, finite edges are `edges`: element v
 * counts in bin i when edges[i] <= v < edges[i + 1], the last bin closed on the
 * right; v outside [edges[0], edges[bins]] or NaN counts nowhere. This is
 * numpy.histogram's rule for a number of bins, whose edges are float32 for float32
 * data and float64 otherwise (given here as doubles, which hold both exactly).
 * MT_ETYPE for another dtype, MT_EINVAL for bins outside [1,
 * MT_HISTOGRAM_MAX_BINS], n < 0, or edges not increasing and finite.
 *
 *   double edges[3] = {0.0, 0.5, 1.0};
 *   int64_t counts[2] = {0, 0};
 *   mt_histogram_uniform(MT_DTYPE_FLOAT64, n, x, 2, edges, counts, &err);
 */
MT_EXPORT int mt_histogram_uniform(int dtype, int64_t n, const void *x, int64_t bins,
                                   const double *edges, int64_t *counts, mt_error *err);

/* Local. numpy.bincount's counting in one pass, where NumPy first finds the
 * extremes in a pass of its own: from index *pos, each value v of `x` (`n` int64)
 * in [0, size) adds one to counts[v] (`weights` NULL) or weights[i] to sums[v]
 * (`weights`: n doubles; sums in element order, as NumPy adds them), and *max
 * becomes the largest value counted if larger. It stops at the first value
 * outside [0, size) and leaves its index in *pos (n when there is none), so that a
 * caller grows the table and resumes there, or finds the value negative: NumPy's
 * error. MT_EINVAL for n < 0, *pos outside [0, n], size < 0, or a missing array.
 *
 *   int64_t pos = 0, max = -1;
 *   mt_bincount(n, x, NULL, size, counts, NULL, &pos, &max, &err);
 *   // pos < n: x[pos] is negative or >= size
 */
MT_EXPORT int mt_bincount(int64_t n, const int64_t *x, const double *weights,
                          int64_t size, int64_t *counts, double *sums, int64_t *pos,
                          int64_t *max, mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
