/* Softmax and log-softmax along contiguous rows: a pass for the maximum, one for
 * the exponentials and their sum, one to normalize, all on a row still in cache. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include "kernels-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/kernels/kernels.h"
#include "row-stats-private.h"

static inline double exp_f64(double x) {
  return exp(x);
}

/* softmax_row_S(x, y, n, log): one row of n >= 1 elements; y may be x. */
#define MT__SOFTMAX_ROW(T, S, EXP)                                         \
  MT__ROW_MAX(T, S)                                                        \
  MT__ROW_SUM(T, T, S)                                                     \
  static inline T exp_sum_##S(const T *x, int64_t n) {                            \
    T acc[MT__LANES] = {0};                                                \
    int64_t i = 0;                                                         \
    for (; i + MT__LANES <= n; i += MT__LANES) {                           \
      for (int j = 0; j < MT__LANES; ++j) acc[j] += EXP(x[i + j]);         \
    }                                                                      \
    T s = 0;                                                               \
    for (int j = 0; j < MT__LANES; ++j) s += acc[j];                       \
    for (; i < n; ++i) s += EXP(x[i]);                                     \
    return s;                                                              \
  }                                                                        \
  MT__VECTOR_CLONES void mt__softmax_row_##S(const T *x, T *y, int64_t n, int log) {         \
    T m = row_max_##S(x, n);                                               \
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - m;                       \
    if (log) {                                                             \
      T lse = (T)log_##S(exp_sum_##S(y, n));                       \
      for (int64_t i = 0; i < n; ++i) y[i] -= lse;                         \
      return;                                                              \
    }                                                                      \
    for (int64_t i = 0; i < n; ++i) y[i] = EXP(y[i]);                      \
    T inv = (T)1 / row_sum_##S(y, n, 0, 0);                                \
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;                           \
  }

static inline float log_f32(float s) {
  return logf(s);
}
static inline double log_f64(double s) {
  return log(s);
}

MT__SOFTMAX_ROW(float, f32, mt__exp_f32)
MT__SOFTMAX_ROW(double, f64, exp_f64)

int mt_softmax_rows(int dtype, int log, int64_t rows, int64_t cols, const void *x,
                    void *y, mt_error *err) {
  int rc = mt__check_float(dtype, "softmax", err);
  if (rc != MT_OK) return rc;
  if (rows < 0 || cols < 0) {
    return mt_error_set(err, MT_EINVAL,
                        "softmax: negative size (%" PRId64 ", %" PRId64 ")", rows,
                        cols);
  }
  if (rows == 0 || cols == 0) return MT_OK;
  if (x == NULL || y == NULL)
    return mt_error_set(err, MT_EINVAL, "softmax: NULL buffer");
  for (int64_t r = 0; r < rows; ++r) {
    if (dtype == MT_DTYPE_FLOAT32) {
      mt__softmax_row_f32((const float *)x + r * cols, (float *)y + r * cols, cols, log);
    } else {
      mt__softmax_row_f64((const double *)x + r * cols, (double *)y + r * cols, cols, log);
    }
  }
  return MT_OK;
}
