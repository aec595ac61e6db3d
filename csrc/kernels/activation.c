/* GELU in one pass over the elements. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include "kernels-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/kernels/kernels.h"

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

/* exp(x) in double to about 1e-10 relative, without calls or branches so that a
 * loop of it vectorizes (the float loops below compute in double through it):
 * 2^n * p(r) as mt__exp_f32, with n taken from the bits of a rounded sum (no
 * double-to-integer conversion, which AVX2 lacks) and the degree-9 Taylor
 * polynomial. Below -708 the result is 0, NaN stays NaN; callers pass at most 1
 * (the clamp at 709 keeps the exponent's bits valid, not the value). */
static inline double exp_f64_vec(double x) {
  double c = x >= -708.0 ? (x <= 709.0 ? x : 709.0) : -708.0;
  double shifted = c * 1.4426950408889634 + 6755399441055744.0; /* 1.5 * 2^52 */
  double n = shifted - 6755399441055744.0;
  double r = (c - n * 0.693145751953125) - n * 1.4286068203094173e-06;
  double p = 1.0 / 362880.0;
  p = 1.0 / 40320.0 + r * p;
  p = 1.0 / 5040.0 + r * p;
  p = 1.0 / 720.0 + r * p;
  p = 1.0 / 120.0 + r * p;
  p = 1.0 / 24.0 + r * p;
  p = 1.0 / 6.0 + r * p;
  p = 0.5 + r * p;
  p = 1.0 + r * p;
  p = 1.0 + r * p;
  uint64_t bits;
  memcpy(&bits, &shifted, sizeof bits); /* n + 1023 in the low bits, then shifted up */
  bits = (bits + 1023u) << 52;
  double scale;
  memcpy(&scale, &bits, sizeof scale);
  double y = p * scale;
  y = x < -708.0 ? 0.0 : y;
  return x == x ? y : x;
}

/* erfc(z) for float results, in double: Numerical Recipes' Chebyshev fit
 * t exp(-z^2 + P(t)), t = 1 / (1 + |z| / 2), whose relative error is under 1.2e-7
 * for every z >= 0 (so also in the tail, where erfc is tiny), and 2 - erfc(-z)
 * below 0. */
static inline double erfc_for_f32(double z) {
  double a = z < 0.0 ? -z : z;
  double t = 1.0 / (1.0 + 0.5 * a);
  double p = 0.17087277;
  p = -0.82215223 + t * p;
  p = 1.48851587 + t * p;
  p = -1.13520398 + t * p;
  p = 0.27886807 + t * p;
  p = -0.18628806 + t * p;
  p = 0.09678418 + t * p;
  p = 0.37409196 + t * p;
  p = 1.00002368 + t * p;
  p = -1.26551223 + t * p;
  double e = t * exp_f64_vec(p - a * a);
  return z < 0.0 ? 2.0 - e : e;
}

/* Exact GELU: Phi(x) = erfc(-x / sqrt 2) / 2, which keeps its relative accuracy
 * where 1 + erf(x / sqrt 2) would cancel (x < -3). The float loop computes erfc
 * in double by the vectorizable fit (libm's erfcf is a call per element). */
MT__VECTOR_CLONES static void gelu_erf_f32(int64_t n, const float *x, float *y) {
  for (int64_t i = 0; i < n; ++i) {
    double v = (double)x[i];
    y[i] = (float)(0.5 * v * erfc_for_f32(-v * MT__SQRT_HALF));
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

#define MT__INV_SQRT_2PI 0.39894228040143267794

/* d gelu / dx times g: Phi(x) + x phi(x) for the exact GELU; for the tanh form,
 * with s = sigmoid(2u) = 1 / (1 + e), e = exp(-2u), s + 2 x s (1 - s) u'(x) where
 * s (1 - s) = e / (1 + e)^2 (no cancellation of 1 - s). */
MT__VECTOR_CLONES static void gelu_tanh_grad_f32(int64_t n, const float *x, const float *g,
                                                 float *gx) {
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = (float)MT__SQRT_2_OVER_PI * (v + 0.044715f * v * v * v);
    float du = (float)MT__SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * v * v);
    float e = mt__exp_f32(-2.0f * u);
    float s = 1.0f / (1.0f + e);
    float d = s + 2.0f * v * ((e * s) * s) * du;
    gx[i] = g[i] * (e == HUGE_VALF ? 0.0f : d); /* far below 0: the limit 0 */
  }
}

static void gelu_tanh_grad_f64(int64_t n, const double *x, const double *g, double *gx) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    double u = MT__SQRT_2_OVER_PI * (v + 0.044715 * v * v * v);
    double du = MT__SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * v * v);
    double e = exp(-2.0 * u);
    double s = 1.0 / (1.0 + e);
    gx[i] = g[i] * (isinf(e) ? 0.0 : s + 2.0 * v * ((e * s) * s) * du);
  }
}

MT__VECTOR_CLONES static void gelu_erf_grad_f32(int64_t n, const float *x, const float *g,
                                                float *gx) {
  for (int64_t i = 0; i < n; ++i) {
    double v = (double)x[i];
    double d = 0.5 * erfc_for_f32(-v * MT__SQRT_HALF) +
               v * MT__INV_SQRT_2PI * exp_f64_vec(-0.5 * v * v);
    gx[i] = (float)((double)g[i] * d);
  }
}

static void gelu_erf_grad_f64(int64_t n, const double *x, const double *g, double *gx) {
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    double d = 0.5 * erfc(-v * MT__SQRT_HALF) + v * MT__INV_SQRT_2PI * exp(-0.5 * v * v);
    gx[i] = g[i] * d;
  }
}

int mt_gelu_backward(int dtype, int approx, int64_t n, const void *x, const void *g,
                     void *gx, mt_error *err) {
  int rc = mt__check_float(dtype, "gelu_backward", err);
  if (rc != MT_OK) return rc;
  if (approx != MT_GELU_ERF && approx != MT_GELU_TANH) {
    return mt_error_set(err, MT_EINVAL,
                        "gelu_backward: approximation %d is neither erf (0) nor tanh (1)",
                        approx);
  }
  if (n < 0) return mt_error_set(err, MT_EINVAL, "gelu_backward: negative size %" PRId64, n);
  if (n > 0 && (x == NULL || g == NULL || gx == NULL)) {
    return mt_error_set(err, MT_EINVAL, "gelu_backward: NULL buffer");
  }
  int f32 = dtype == MT_DTYPE_FLOAT32;
  if (approx == MT_GELU_TANH) {
    if (f32) gelu_tanh_grad_f32(n, x, g, gx);
    else gelu_tanh_grad_f64(n, x, g, gx);
  } else {
    if (f32) gelu_erf_grad_f32(n, x, g, gx);
    else gelu_erf_grad_f64(n, x, g, gx);
  }
  return MT_OK;
}
