/* Layer norm along contiguous rows: the mean and the variance from the row (read
 * twice while it is in cache; the two-pass variance has no cancellation), then one
 * pass that normalizes, scales and shifts. float rows are centered and scaled in
 * double, so a mean far from zero costs no precision. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include "kernels-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/kernels/kernels.h"
#include "row-stats-private.h"

#define MT__LAYER_NORM(T, ACC, S)                                           \
  MT__ROW_SUM(T, ACC, S)                                                    \
  MT__VECTOR_CLONES static void layer_norm_##S(int64_t rows, int64_t n, const T *x, const T *w, \
                             const T *b, double eps, T *y) {                \
    for (int64_t r = 0; r < rows; ++r, x += n, y += n) {                    \
      ACC mean = row_sum_##S(x, n, 0, 0) / (ACC)n;                          \
      ACC var = row_sum_##S(x, n, mean, 1) / (ACC)n;                        \
      ACC rstd = (ACC)(1.0 / sqrt((double)var + eps));                      \
      for (int64_t i = 0; i < n; ++i) {                                     \
        T t = (T)(((ACC)x[i] - mean) * rstd);                               \
        if (w != NULL) t *= w[i];                                           \
        if (b != NULL) t += b[i];                                           \
        y[i] = t;                                                           \
      }                                                                     \
    }                                                                       \
  }

MT__LAYER_NORM(float, double, f32)
MT__LAYER_NORM(double, double, f64)

int mt_layer_norm_rows(int dtype, int64_t rows, int64_t cols, const void *x,
                       const void *weight, const void *bias, double eps, void *y,
                       mt_error *err) {
  int rc = mt__check_float(dtype, "layer_norm", err);
  if (rc != MT_OK) return rc;
  if (rows < 0 || cols < 0) {
    return mt_error_set(err, MT_EINVAL,
                        "layer_norm: negative size (%" PRId64 ", %" PRId64 ")", rows,
                        cols);
  }
  if (rows == 0 || cols == 0) return MT_OK;
  if (x == NULL || y == NULL)
    return mt_error_set(err, MT_EINVAL, "layer_norm: NULL buffer");
  if (dtype == MT_DTYPE_FLOAT32) {
    layer_norm_f32(rows, cols, x, weight, bias, eps, y);
  } else {
    layer_norm_f64(rows, cols, x, weight, bias, eps, y);
  }
  return MT_OK;
}
