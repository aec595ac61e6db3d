/* GELU in one pass over the elements. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include "kernels-private.h"
#include "mpitensor/dtype.h"
#include "mpitensor/kernels.h"

#define MT__SQRT_2_OVER_PI 0.79788456080286535588
#define MT__SQRT_HALF 0.70710678118654752440

/* tanh-GELU as x * sigmoid(2u) = x / (1 + exp(-2u)): equal to 0.5 x (1 + tanh u)
 * but without the cancellation of 1 + tanh u at negative x; the float loop uses
 * the vectorizable exponential. */
MT__VECTOR_CLONES static void gelu_tanh_f32(int64_t n, const float *x, float *y) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = (float)MT__SQRT_2_OVER_PI * (v + 0.044715f * v * v * v);
    y[i] = v / (1.0f + mt__exp_f32(-2.0f * u));
  }
}

static void gelu_tanh_f64(int64_t n, const double *x, double *y) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    y[i] = v / (1.0 + exp(-2.0 * MT__SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)));
  }
}

/* Exact GELU: Phi(x) = erfc(-x / sqrt 2) / 2, which keeps its relative accuracy
 * where 1 + erf(x / sqrt 2) would cancel (x < -3). */
static void gelu_erf_f32(int64_t n, const float *x, float *y) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    y[i] = 0.5f * v * erfcf(-v * (float)MT__SQRT_HALF);
  }
}

static void gelu_erf_f64(int64_t n, const double *x, double *y) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    y[i] = 0.5 * v * erfc(-v * MT__SQRT_HALF);
  }
}

int mt_gelu(int dtype, int approx, int64_t n, const void *x, void *y, mt_error *err) {
  int rc = mt__check_float(dtype, "gelu", err);
  if (rc != MT_OK) return rc;
  if (approx != MT_GELU_ERF && approx != MT_GELU_TANH) {
    return mt_error_set(err, MT_EINVAL,
                        "gelu: approximation %d is neither erf (0) nor tanh (1)",
                        approx);
  }
  if (n < 0) return mt_error_set(err, MT_EINVAL, "gelu: negative size %" PRId64, n);
  if (n > 0 && (x == NULL || y == NULL)) {
    return mt_error_set(err, MT_EINVAL, "gelu: NULL buffer");
  }
  int f32 = dtype == MT_DTYPE_FLOAT32;
  if (approx == MT_GELU_TANH) {
    if (f32) gelu_tanh_f32(n, x, y);
    else gelu_tanh_f64(n, x, y);
  } else {
    if (f32) gelu_erf_f32(n, x, y);
    else gelu_erf_f64(n, x, y);
  }
  return MT_OK;
}
