/* What the nn kernels (activation.c, softmax.c, layer_norm.c, attention.c)
 * share: the dtype check and the exponential they vectorize. */
#ifndef MPITENSOR_KERNELS_PRIVATE_H
#define MPITENSOR_KERNELS_PRIVATE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "mpitensor/core/status.h"
#include "mpitensor/kernels/kernels.h"

/* The hot loops are compiled for AVX-512 and AVX2 as well as for the baseline, and
 * the loader picks the widest the CPU runs (GCC's and clang's function
 * multiversioning, an ifunc); elsewhere plain functions. The results are the same
 * bits on every path: the sources are ISO C without contraction into FMAs. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MT__VECTOR_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MT__VECTOR_CLONES
#endif

/* MT_OK when dtype is float32 or float64, else MT_ETYPE naming `what`. */
int mt__check_float(int dtype, const char *what, mt_error *err);

/* mt_gemm with op(a) too: a (m, k), or with `trans_a` a^T for a stored (k, m) (lda
 * then at least m); the backward products contract over rows (gemm.c). */
int mt__gemm2(const mt_blas *blas, int dtype, int trans_a, int trans_b, int64_t m,
              int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
              const void *b, int64_t ldb, double beta, void *c, int64_t ldc,
              mt_error *err);

/* One row of n >= 1 elements: y = softmax(x), or log_softmax(x) with `log`;
 * y may be x (softmax.c). Hidden by name: GCC gives the ifunc of a multiversioned
 * function default visibility whatever the preset, which would export it from
 * mpitensor._C. */
__attribute__((visibility("hidden"))) void mt__softmax_row_f32(const float *x, float *y,
                                                               int64_t n, int log);
__attribute__((visibility("hidden"))) void mt__softmax_row_f64(const double *x, double *y,
                                                               int64_t n, int log);

/* exp(x) in float, within 2 ulp, written without calls or branches so that a loop
 * of it vectorizes: 2^n * p(r) with n = round(x / ln 2), r = x - n ln 2 (ln 2 in
 * two parts, Cody and Waite) and p the degree-7 Taylor polynomial, whose
 * remainder on |r| <= ln(2)/2 is under 6e-9. Below -87 the result is 0 (where
 * the float would be subnormal), above 88 it is inf, and NaN stays NaN. */
static inline float mt__exp_f32(float x) {
  float c = x >= -87.0f ? (x <= 88.0f ? x : 88.0f) : -87.0f;
  float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round */
  float r = (c - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.0f / 5040.0f + r * (1.0f / 40320.0f);
  p = 1.0f / 720.0f + r * p;
  p = 1.0f / 120.0f + r * p;
  p = 1.0f / 24.0f + r * p;
  p = 1.0f / 6.0f + r * p;
  p = 0.5f + r * p;
  p = 1.0f + r * p;
  p = 1.0f + r * p;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float y = p * scale;
  y = x > 88.0f ? HUGE_VALF : y;
  y = x < -87.0f ? 0.0f : y;
  return x == x ? y : x;
}

#endif
