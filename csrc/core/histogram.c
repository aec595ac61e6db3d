/* Equal-bin counts in one pass (histogram.h). Each element's bin is estimated by
 * arithmetic and then settled against the edges themselves, so the result is the
 * edges' rule exactly, whatever the rounding of the estimate. Counts per value
 * (mt_bincount) in one pass too, the largest value tracked as they are made. */
#include "mpitensor/core/histogram.h"

#include <math.h>
#include <stdint.h>

#include "mpitensor/core/dtype.h"

/* The bin of v in [lo, hi] (checked by the caller): the estimate, clamped, then
 * one step down or up where an edge says so (the estimate is within one bin). */
static inline int64_t bin_of(double v, double lo, double scale, int64_t bins,
                             const double *edges) {
  int64_t k = (int64_t)((v - lo) * scale);
  if (k >= bins) k = bins - 1;
  if (k < 0) k = 0;
  if (v < edges[k]) {
    --k;
  } else if (k < bins - 1 && v >= edges[k + 1]) {
    ++k;
  }
  return k;
}

#define MT__COUNT(type)                                                  \
  do {                                                                   \
    const type *p = (const type *)x;                                     \
    for (int64_t i = 0; i < n; ++i) {                                    \
      double v = (double)p[i];                                           \
      if (v >= lo && v <= hi) ++counts[bin_of(v, lo, scale, bins, edges)]; \
    }                                                                    \
  } while (0)

int mt_histogram_uniform(int dtype, int64_t n, const void *x, int64_t bins,
                         const double *edges, int64_t *counts, mt_error *err) {
  if (n < 0 || bins < 1 || bins > MT_HISTOGRAM_MAX_BINS || (n > 0 && x == NULL) ||
      edges == NULL || counts == NULL) {
    return mt_error_set(err, MT_EINVAL,
                        "mt_histogram_uniform: n >= 0, 1 <= bins <= %d, and the "
                        "arrays are required", MT_HISTOGRAM_MAX_BINS);
  }
  for (int64_t i = 0; i <= bins; ++i) {
    if (!isfinite(edges[i]) || (i > 0 && !(edges[i] > edges[i - 1]))) {
      return mt_error_set(err, MT_EINVAL,
                          "mt_histogram_uniform: the edges must be finite and "
                          "increasing");
    }
  }
  const double lo = edges[0], hi = edges[bins];
  const double scale = (double)bins / (hi - lo);
  if (!isfinite(scale)) {
    return mt_error_set(err, MT_EINVAL,
                        "mt_histogram_uniform: the range of the edges is too wide or "
                        "too narrow for a double");
  }
  switch (dtype) {
    case MT_DTYPE_FLOAT32: MT__COUNT(float); break;
    case MT_DTYPE_FLOAT64: MT__COUNT(double); break;
    case MT_DTYPE_INT8: MT__COUNT(int8_t); break;
    case MT_DTYPE_INT16: MT__COUNT(int16_t); break;
    case MT_DTYPE_INT32: MT__COUNT(int32_t); break;
    case MT_DTYPE_UINT8: MT__COUNT(uint8_t); break;
    case MT_DTYPE_UINT16: MT__COUNT(uint16_t); break;
    case MT_DTYPE_UINT32: MT__COUNT(uint32_t); break;
    default:
      return mt_error_set(err, MT_ETYPE,
                          "mt_histogram_uniform: float32, float64 or an integer type of "
                          "at most 32 bits");
  }
  return MT_OK;
}

/* Counts from i until a value outside [0, size): four at a time while the
 * largest of the four, compared unsigned (a negative value is then above any
 * size), is in, so that the loads and the maxima overlap; the returned index is
 * the first value not counted. */
static int64_t count_values(int64_t n, const int64_t *x, int64_t i, int64_t size,
                            int64_t *counts, int64_t *max) {
  const uint64_t limit = (uint64_t)size;
  int64_t m = *max;
  for (; i + 4 <= n; i += 4) {
    uint64_t a = (uint64_t)x[i], b = (uint64_t)x[i + 1], c = (uint64_t)x[i + 2],
             d = (uint64_t)x[i + 3];
    uint64_t ab = a > b ? a : b, cd = c > d ? c : d, abcd = ab > cd ? ab : cd;
    if (abcd >= limit) break;
    ++counts[a], ++counts[b], ++counts[c], ++counts[d];
    m = (int64_t)abcd > m ? (int64_t)abcd : m;
  }
  for (; i < n && (uint64_t)x[i] < limit; ++i) {
    ++counts[x[i]];
    m = x[i] > m ? x[i] : m;
  }
  *max = m;
  return i;
}

/* As count_values, adding weights: one at a time, in element order. */
static int64_t sum_weights(int64_t n, const int64_t *x, const double *weights, int64_t i,
                           int64_t size, double *sums, int64_t *max) {
  const uint64_t limit = (uint64_t)size;
  int64_t m = *max;
  for (; i < n && (uint64_t)x[i] < limit; ++i) {
    sums[x[i]] += weights[i];
    m = x[i] > m ? x[i] : m;
  }
  *max = m;
  return i;
}

int mt_bincount(int64_t n, const int64_t *x, const double *weights, int64_t size,
                int64_t *counts, double *sums, int64_t *pos, int64_t *max, mt_error *err) {
  if (n < 0 || size < 0 || pos == NULL || max == NULL || *pos < 0 || *pos > n ||
      (n > 0 && x == NULL) || (size > 0 && (weights != NULL ? sums == NULL : counts == NULL))) {
    return mt_error_set(err, MT_EINVAL,
                        "mt_bincount: n >= 0, 0 <= *pos <= n, size >= 0, and the arrays "
                        "are required");
  }
  *pos = weights != NULL ? sum_weights(n, x, weights, *pos, size, sums, max)
                         : count_values(n, x, *pos, size, counts, max);
  return MT_OK;
}
