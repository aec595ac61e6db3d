/* The nn kernels against plain double-precision formulas written out here: GELU
 * (both forms), row softmax and log-softmax, layer norm, gemm and attention (causal
 * and not, L != S, strided heads, empty sizes), in float64 (1e-12) and float32
 * (1e-5, with an absolute floor), plus every error path. The BLAS is a reference
 * loop handed to the kernels, once with LP64 and once with ILP64 signatures,
 * so the test needs no BLAS library. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/status.h"
#include "mpitensor/kernels/kernels.h"

/* A fixed pseudo-random sequence in [-scale, scale) (an LCG: reproducible, no libc
 * rand state). */
static double next_value(uint64_t *state, double scale) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return ((double)(*state >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale;
}

static void fill(double *d, float *f, int64_t n, uint64_t seed, double scale) {
  for (int64_t i = 0; i < n; ++i) {
    d[i] = next_value(&seed, scale);
    if (f != NULL) f[i] = (float)d[i];
  }
}

/* |got - want| <= rtol |want| + atol, and NaN only where want is NaN. */
static int close_to(double got, double want, double rtol, double atol) {
  if (isnan(want)) return isnan(got);
  return fabs(got - want) <= rtol * fabs(want) + atol;
}

/* The reference BLAS: row-major CBLAS gemm as a loop, accumulating in double. */
static int ref_calls;
static void ref_gemm(int f32, int order, int ta, int tb, int64_t m, int64_t n, int64_t k,
                     double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                     double beta, void *c, int64_t ldc) {
  ++ref_calls;
  CHECK(order == 101 && (ta == 111 || ta == 112) && (tb == 111 || tb == 112));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        int64_t ia = ta == 112 ? p * lda + i : i * lda + p;
        int64_t ib = tb == 112 ? j * ldb + p : p * ldb + j;
        acc += f32 ? (double)((const float *)a)[ia] * (double)((const float *)b)[ib]
                   : ((const double *)a)[ia] * ((const double *)b)[ib];
      }
      if (f32) {
        float *e = (float *)c + i * ldc + j;
        *e = (float)(alpha * acc + (beta == 0.0 ? 0.0 : beta * (double)*e));
      } else {
        double *e = (double *)c + i * ldc + j;
        *e = alpha * acc + (beta == 0.0 ? 0.0 : beta * *e);
      }
    }
}

static void ref_sgemm(int o, int ta, int tb, int m, int n, int k, float alpha,
                      const float *a, int lda, const float *b, int ldb, float beta,
                      float *c, int ldc) {
  ref_gemm(1, o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
static void ref_dgemm(int o, int ta, int tb, int m, int n, int k, double alpha,
                      const double *a, int lda, const double *b, int ldb, double beta,
                      double *c, int ldc) {
  ref_gemm(0, o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
static void ref_sgemm64(int o, int ta, int tb, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float beta, float *c, int64_t ldc) {
  ref_gemm(1, o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
static void ref_dgemm64(int o, int ta, int tb, int64_t m, int64_t n, int64_t k,
                        double alpha, const double *a, int64_t lda, const double *b,
                        int64_t ldb, double beta, double *c, int64_t ldc) {
  ref_gemm(0, o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static const mt_blas lp64 = {ref_sgemm, ref_dgemm, NULL, NULL};
static const mt_blas ilp64 = {NULL, NULL, ref_sgemm64, ref_dgemm64};

/* The BLAS that the kernels under test are handed. */
static const mt_blas *blas = &lp64;

static double gelu_ref(double x, int approx) {
  if (approx == MT_GELU_TANH) { /* 0.5 x (1 + tanh u) = x / (1 + exp(-2u)), exactly */
    double u = 0.79788456080286535588 /* sqrt(2 / pi) */ * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
  }
  return 0.5 * x * erfc(-x / sqrt(2.0));
}

static void test_gelu(void) {
  enum { N = 1001 };
  static double x[N], y[N];
  static float xf[N], yf[N];
  fill(x, xf, N, 1, 12.0);
  x[0] = xf[0] = 0.0f;
  x[1] = -INFINITY, xf[1] = -INFINITY;
  x[2] = NAN, xf[2] = NAN;
  for (int approx = 0; approx < 2; ++approx) {
    CHECK(mt_gelu(MT_DTYPE_FLOAT64, approx, N, x, y, NULL) == MT_OK);
    CHECK(mt_gelu(MT_DTYPE_FLOAT32, approx, N, xf, yf, NULL) == MT_OK);
    for (int i = 3; i < N; ++i) {
      double want = gelu_ref(x[i], approx), wantf = gelu_ref((double)xf[i], approx);
      CHECK_MSG(close_to(y[i], want, 1e-12, 1e-300), "approx %d x %g: %.17g vs %.17g",
                approx, x[i], y[i], want);
      CHECK_MSG(close_to(yf[i], wantf, 1e-5, 1e-30), "approx %d x %g: %.9g vs %.9g",
                approx, (double)xf[i], (double)yf[i], wantf);
    }
    CHECK(y[0] == 0.0 && yf[0] == 0.0f);
    CHECK(isnan(y[2]) && isnan(yf[2]));
    /* In place. */
    memcpy(yf, xf, sizeof xf);
    CHECK(mt_gelu(MT_DTYPE_FLOAT32, approx, N, yf, yf, NULL) == MT_OK);
    CHECK(close_to(yf[5], gelu_ref((double)xf[5], approx), 1e-5, 1e-30));
  }
  /* Where exp in float saturates: far below -87 and above 88. */
  float big[4] = {-200.0f, -60.0f, 60.0f, 200.0f}, out[4];
  CHECK(mt_gelu(MT_DTYPE_FLOAT32, MT_GELU_TANH, 4, big, out, NULL) == MT_OK);
  CHECK(out[0] == 0.0f && fabsf(out[1]) < 1e-30f && out[2] == 60.0f && out[3] == 200.0f);
}

/* d gelu / dx, in double: Phi(x) + x phi(x), or for the tanh form
 * s + 2 x s (1 - s) u' with s = sigmoid(2u). */
static double gelu_grad_ref(double x, int approx) {
  if (approx == MT_GELU_TANH) {
    double c = 0.79788456080286535588;
    double e = exp(-2.0 * c * (x + 0.044715 * x * x * x));
    double s = 1.0 / (1.0 + e);
    return s + 2.0 * x * (e * s) * s * c * (1.0 + 3.0 * 0.044715 * x * x);
  }
  return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / 2.5066282746310002 /* sqrt(2 pi) */;
}

static void test_gelu_backward(void) {
  enum { N = 1001 };
  static double x[N], g[N], gx[N];
  static float xf[N], gf[N], gxf[N];
  fill(x, xf, N, 3, 12.0);
  fill(g, gf, N, 4, 1.0);
  for (int approx = 0; approx < 2; ++approx) {
    CHECK(mt_gelu_backward(MT_DTYPE_FLOAT64, approx, N, x, g, gx, NULL) == MT_OK);
    CHECK(mt_gelu_backward(MT_DTYPE_FLOAT32, approx, N, xf, gf, gxf, NULL) == MT_OK);
    for (int i = 0; i < N; ++i) {
      double want = g[i] * gelu_grad_ref(x[i], approx);
      double wantf = (double)gf[i] * gelu_grad_ref((double)xf[i], approx);
      /* The derivative crosses 0 near x = -0.75: absolute error there. */
      CHECK_MSG(close_to(gx[i], want, 1e-12, 1e-13), "approx %d x %g: %.17g vs %.17g",
                approx, x[i], gx[i], want);
      CHECK_MSG(close_to(gxf[i], wantf, 1e-5, 1e-6), "approx %d x %g: %.9g vs %.9g",
                approx, (double)xf[i], (double)gxf[i], wantf);
    }
    /* In place into g. */
    memcpy(gx, g, sizeof g);
    CHECK(mt_gelu_backward(MT_DTYPE_FLOAT64, approx, N, x, gx, gx, NULL) == MT_OK);
    CHECK(close_to(gx[7], g[7] * gelu_grad_ref(x[7], approx), 1e-12, 1e-13));
  }
  /* Tails: 0 far below (no inf * 0), 1 far above; NaN stays NaN. */
  float t[5] = {-200.0f, -60.0f, 60.0f, 200.0f, NAN}, one[5] = {1, 1, 1, 1, 1}, out[5];
  double td[5] = {-800.0, -60.0, 60.0, 800.0, NAN}, oned[5] = {1, 1, 1, 1, 1}, outd[5];
  for (int approx = 0; approx < 2; ++approx) {
    CHECK(mt_gelu_backward(MT_DTYPE_FLOAT32, approx, 5, t, one, out, NULL) == MT_OK);
    CHECK(mt_gelu_backward(MT_DTYPE_FLOAT64, approx, 5, td, oned, outd, NULL) == MT_OK);
    CHECK_MSG(out[0] == 0.0f && out[1] == 0.0f && out[2] == 1.0f && out[3] == 1.0f,
              "approx %d: %g %g %g %g", approx, (double)out[0], (double)out[1],
              (double)out[2], (double)out[3]);
    CHECK_MSG(outd[0] == 0.0 && fabs(outd[1]) < 1e-300 && outd[2] == 1.0 && outd[3] == 1.0,
              "approx %d: %g %g %g %g", approx, outd[0], outd[1], outd[2], outd[3]);
    CHECK(isnan(out[4]) && isnan(outd[4]));
  }
}

/* Adam's step against the formula written out, element by element in float: the
 * same bits, with AdamW's decay, Adam's L2 term, maximize and amsgrad. */
static void test_adam_update(void) {
  enum { N = 37 };
  static double pd[N], gd[N];
  static float p[N], g[N], m[N], v[N], vmax[N], rp[N], rm[N], rv[N], rvmax[N];
  fill(pd, p, N, 5, 1.0);
  fill(gd, g, N, 6, 1.0);
  for (int variant = 0; variant < 3; ++variant) {
    mt_adam_hyper h = {variant == 0 ? 1.0 - 0.01 * 0.1 : 1.0, variant == 1 ? 0.1 : 0.0,
                       0.9, 0.999, 0.01 / (1.0 - 0.9), sqrt(1.0 - 0.999), 1e-8,
                       variant == 2};
    for (int i = 0; i < N; ++i) {
      rp[i] = p[i];
      m[i] = rm[i] = 0.1f * (float)i;
      v[i] = rv[i] = 0.01f * (float)i;
      vmax[i] = rvmax[i] = 0.02f * (float)(i % 3);
    }
    float *ams = variant == 1 ? vmax : NULL;
    CHECK(mt_adam_update(MT_DTYPE_FLOAT32, N, p, g, m, v, ams, &h, NULL) == MT_OK);
    for (int i = 0; i < N; ++i) {
      float gi = variant == 2 ? -g[i] : g[i];
      float pi = rp[i] * (float)h.decay;
      if (variant == 1) gi = gi + (float)h.l2 * pi;
      rm[i] = rm[i] + (float)(1.0 - h.beta1) * (gi - rm[i]);
      rv[i] = rv[i] * (float)h.beta2;
      rv[i] = rv[i] + ((float)(1.0 - h.beta2) * gi) * gi;
      float vi = rv[i];
      if (ams != NULL) vi = rvmax[i] = rvmax[i] > vi ? rvmax[i] : vi;
      rp[i] = pi - (float)h.step_size * (rm[i] / (sqrtf(vi) / (float)h.bias_correction2_sqrt +
                                                  (float)h.eps));
      CHECK_MSG(p[i] == rp[i] && m[i] == rm[i] && v[i] == rv[i] &&
                    (ams == NULL || vmax[i] == rvmax[i]),
                "variant %d element %d: %.9g vs %.9g", variant, i, (double)p[i],
                (double)rp[i]);
    }
  }
  mt_adam_hyper h = {1.0, 0.0, 0.9, 0.999, 1.0, 1.0, 1e-8, 0};
  mt_error err = {0};
  CHECK(mt_adam_update(MT_DTYPE_INT32, N, p, g, m, v, NULL, &h, &err) == MT_ETYPE);
  CHECK(mt_adam_update(MT_DTYPE_FLOAT32, -1, p, g, m, v, NULL, &h, &err) == MT_EINVAL);
  CHECK(mt_adam_update(MT_DTYPE_FLOAT32, N, p, NULL, m, v, NULL, &h, &err) == MT_EINVAL);
  CHECK(mt_adam_update(MT_DTYPE_FLOAT32, N, p, g, m, v, NULL, NULL, &err) == MT_EINVAL);
  CHECK(mt_adam_update(MT_DTYPE_FLOAT64, 0, NULL, NULL, NULL, NULL, NULL, &h, &err) == MT_OK);
}

/* softmax (or log-softmax) of each row, in double. */
static void softmax_ref(const double *x, double *y, int64_t rows, int64_t cols,
                        int want_log) {
  for (int64_t r = 0; r < rows; ++r) {
    const double *a = x + r * cols;
    double m = a[0], s = 0.0;
    for (int64_t i = 1; i < cols; ++i) m = a[i] > m ? a[i] : m;
    for (int64_t i = 0; i < cols; ++i) s += exp(a[i] - m);
    for (int64_t i = 0; i < cols; ++i) {
      y[r * cols + i] = want_log ? (a[i] - m) - log(s) : exp(a[i] - m) / s;
    }
  }
}

static void test_softmax(void) {
  static const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 8}, {2, 17}, {4, 300}};
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; ++t) {
    int64_t rows = shapes[t][0], cols = shapes[t][1], n = rows * cols;
    double *x = malloc((size_t)n * 3 * sizeof(double));
    float *xf = malloc((size_t)n * 2 * sizeof(float));
    double *y = x + n, *ref = x + 2 * n;
    float *yf = xf + n;
    fill(x, xf, n, 7 + (uint64_t)t, 30.0);
    for (int want_log = 0; want_log < 2; ++want_log) {
      CHECK(mt_softmax_rows(MT_DTYPE_FLOAT64, want_log, rows, cols, x, y, NULL) == MT_OK);
      softmax_ref(x, ref, rows, cols, want_log);
      for (int64_t i = 0; i < n; ++i) {
        /* log-softmax near 0 (the row's maximum) is -log(sum): absolute accuracy. */
        CHECK_MSG(close_to(y[i], ref[i], 1e-12, want_log ? 1e-14 : 1e-300), "f64 log %d [%lld]: %.17g vs %.17g",
                  want_log, (long long)i, y[i], ref[i]);
      }
      CHECK(mt_softmax_rows(MT_DTYPE_FLOAT32, want_log, rows, cols, xf, yf, NULL) == MT_OK);
      for (int64_t i = 0; i < n; ++i) x[i] = (double)xf[i];
      softmax_ref(x, ref, rows, cols, want_log);
      for (int64_t i = 0; i < n; ++i) {
        CHECK_MSG(close_to(yf[i], ref[i], 1e-5, 1e-6), "f32 log %d [%lld]: %.9g vs %.9g",
                  want_log, (long long)i, (double)yf[i], ref[i]);
      }
      fill(x, NULL, n, 7 + (uint64_t)t, 30.0);
    }
    /* In place, and -inf entries (masked) give exact zeros. */
    xf[0] = -INFINITY;
    CHECK(mt_softmax_rows(MT_DTYPE_FLOAT32, 0, rows, cols, xf, xf, NULL) == MT_OK);
    CHECK(cols == 1 ? isnan(xf[0]) : xf[0] == 0.0f);
    free(x);
    free(xf);
  }
}

static void layer_norm_ref(const double *x, const double *w, const double *b, double eps,
                           int64_t rows, int64_t cols, double *y) {
  for (int64_t r = 0; r < rows; ++r) {
    const double *a = x + r * cols;
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < cols; ++i) mean += a[i];
    mean /= (double)cols;
    for (int64_t i = 0; i < cols; ++i) var += (a[i] - mean) * (a[i] - mean);
    var /= (double)cols;
    for (int64_t i = 0; i < cols; ++i) {
      double t = (a[i] - mean) / sqrt(var + eps);
      y[r * cols + i] = t * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
    }
  }
}

static void test_layer_norm(void) {
  enum { ROWS = 6, COLS = 37, N = ROWS * COLS };
  static double x[N], y[N], ref[N], w[COLS], b[COLS];
  static float xf[N], yf[N], wf[COLS], bf[COLS];
  fill(x, xf, N, 3, 5.0);
  for (int i = 0; i < N; ++i) x[i] += 100.0, xf[i] += 100.0f; /* a large mean */
  fill(w, wf, COLS, 4, 2.0);
  fill(b, bf, COLS, 5, 1.0);
  for (int with = 0; with < 4; ++with) {
    const double *wp = with & 1 ? w : NULL, *bp = with & 2 ? b : NULL;
    CHECK(mt_layer_norm_rows(MT_DTYPE_FLOAT64, ROWS, COLS, x, wp, bp, 1e-5, y, NULL) ==
          MT_OK);
    layer_norm_ref(x, wp, bp, 1e-5, ROWS, COLS, ref);
    for (int i = 0; i < N; ++i) CHECK(close_to(y[i], ref[i], 1e-12, 1e-12));
    CHECK(mt_layer_norm_rows(MT_DTYPE_FLOAT32, ROWS, COLS, xf, with & 1 ? wf : NULL,
                             with & 2 ? bf : NULL, 1e-5, yf, NULL) == MT_OK);
    double xd[N], wd[COLS], bd[COLS];
    for (int i = 0; i < N; ++i) xd[i] = (double)xf[i];
    for (int i = 0; i < COLS; ++i) wd[i] = (double)wf[i], bd[i] = (double)bf[i];
    layer_norm_ref(xd, with & 1 ? wd : NULL, with & 2 ? bd : NULL, 1e-5, ROWS, COLS, ref);
    for (int i = 0; i < N; ++i) {
      CHECK_MSG(close_to(yf[i], ref[i], 1e-5, 1e-5), "f32 [%d]: %.9g vs %.9g", i,
                (double)yf[i], ref[i]);
    }
  }
  /* A constant row is all bias (variance 0, eps keeps it finite). */
  double flat[4] = {2.0, 2.0, 2.0, 2.0}, out[4];
  CHECK(mt_layer_norm_rows(MT_DTYPE_FLOAT64, 1, 4, flat, NULL, b, 1e-5, out, NULL) == MT_OK);
  CHECK(out[0] == b[0] && out[3] == b[3]);
}

/* Element (b, h, i, j) of an attention operand. */
static int64_t at(const mt_attn_operand *a, int64_t b, int64_t h, int64_t i, int64_t j) {
  return b * a->batch_stride + h * a->head_stride + i * a->row_stride + j;
}

/* softmax(q k^T scale) v per head in double, from the operands' float or double data. */
static void attention_ref(int f32, const mt_attn_shape *s, const mt_attn_operand *q,
                          const mt_attn_operand *k, const mt_attn_operand *v, double scale,
                          int causal, double *out /* (batch, heads, L, Ev) */) {
#define MT_T_GET(op, idx) \
  (f32 ? (double)((const float *)(op)->data)[idx] : ((const double *)(op)->data)[idx])
  double *p = malloc((size_t)(s->S > 0 ? s->S : 1) * sizeof(double));
  for (int64_t b = 0; b < s->batch; ++b) {
    for (int64_t h = 0; h < s->heads; ++h) {
      for (int64_t i = 0; i < s->L; ++i) {
        int64_t keys = causal && i + 1 < s->S ? i + 1 : s->S;
        double m = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < s->E; ++e) {
            dot += MT_T_GET(q, at(q, b, h, i, e)) * MT_T_GET(k, at(k, b, h, j, e));
          }
          p[j] = dot * scale;
          m = p[j] > m ? p[j] : m;
        }
        for (int64_t j = 0; j < keys; ++j) sum += (p[j] = exp(p[j] - m));
        for (int64_t c = 0; c < s->Ev; ++c) {
          double acc = 0.0;
          for (int64_t j = 0; j < keys; ++j) acc += p[j] / sum * MT_T_GET(v, at(v, b, h, j, c));
          out[((b * s->heads + h) * s->L + i) * s->Ev + c] = acc;
        }
      }
    }
  }
  free(p);
#undef MT_T_GET
}

/* One attention case: q and out laid out (batch, L, heads, cols), as a projection's
 * output is, k and v contiguous per head. */
static void check_attention(int f32, mt_attn_shape s, int causal) {
  size_t isz = f32 ? sizeof(float) : sizeof(double);
  int64_t nq = s.batch * s.heads * s.L * s.E, nk = s.batch * s.heads * s.S * s.E;
  int64_t nv = s.batch * s.heads * s.S * s.Ev, no = s.batch * s.heads * s.L * s.Ev;
  void *qd = calloc((size_t)nq + 1, isz), *kd = calloc((size_t)nk + 1, isz);
  void *vd = calloc((size_t)nv + 1, isz), *od = calloc((size_t)no + 1, isz);
  double *tmp = malloc((size_t)(nq + nk + nv + 1) * sizeof(double));
  double *ref = malloc((size_t)(no + 1) * sizeof(double));
  fill(tmp, NULL, nq + nk + nv, 11, 1.5);
  for (int64_t i = 0; i < nq + nk + nv; ++i) {
    void *dst = i < nq ? qd : i < nq + nk ? kd : vd;
    int64_t j = i < nq ? i : i < nq + nk ? i - nq : i - nq - nk;
    if (f32) ((float *)dst)[j] = (float)tmp[i];
    else ((double *)dst)[j] = tmp[i];
  }
  mt_attn_operand q = {qd, s.L * s.heads * s.E, s.E, s.heads * s.E};
  mt_attn_operand k = {kd, s.heads * s.S * s.E, s.S * s.E, s.E};
  mt_attn_operand v = {vd, s.heads * s.S * s.Ev, s.S * s.Ev, s.Ev};
  mt_attn_operand o = {od, s.L * s.heads * s.Ev, s.Ev, s.heads * s.Ev};
  double scale = 1.0 / sqrt((double)(s.E > 0 ? s.E : 1));
  int rc = mt_attention(blas, f32 ? MT_DTYPE_FLOAT32 : MT_DTYPE_FLOAT64, &s, &q, &k, &v,
                        &o, scale, causal, NULL);
  CHECK(rc == MT_OK);
  attention_ref(f32, &s, &q, &k, &v, scale, causal, ref);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.L; ++i)
        for (int64_t c = 0; c < s.Ev; ++c) {
          int64_t idx = at(&o, b, h, i, c);
          double got = f32 ? (double)((float *)od)[idx] : ((double *)od)[idx];
          double want = ref[((b * s.heads + h) * s.L + i) * s.Ev + c];
          CHECK_MSG(close_to(got, want, f32 ? 1e-5 : 1e-12, f32 ? 1e-5 : 1e-13),
                    "f32 %d causal %d L %lld S %lld (%lld %lld %lld %lld): %.17g vs %.17g",
                    f32, causal, (long long)s.L, (long long)s.S, (long long)b,
                    (long long)h, (long long)i, (long long)c, got, want);
        }
  free(qd), free(kd), free(vd), free(od), free(tmp), free(ref);
}

/* Attention's gradients per head in double from the formula written out:
 * P = softmax(q k^T scale), dV = P^T g, dS = P (g v^T - rowsum(P g v^T)) scale,
 * dQ = dS k, dK = dS^T q; the results are (batch, heads, rows, cols) arrays. */
static void attention_grad_ref(int f32, const mt_attn_shape *s, const mt_attn_operand *q,
                               const mt_attn_operand *k, const mt_attn_operand *v,
                               const mt_attn_operand *g, double scale, int causal,
                               double *dq, double *dk, double *dv) {
#define MT_T_GET(op, idx) \
  (f32 ? (double)((const float *)(op)->data)[idx] : ((const double *)(op)->data)[idx])
  int64_t S1 = s->S > 0 ? s->S : 1;
  double *p = malloc((size_t)S1 * sizeof(double)), *ds = malloc((size_t)S1 * sizeof(double));
  memset(dk, 0, (size_t)(s->batch * s->heads * s->S * s->E + 1) * sizeof(double));
  memset(dv, 0, (size_t)(s->batch * s->heads * s->S * s->Ev + 1) * sizeof(double));
  for (int64_t b = 0; b < s->batch; ++b)
    for (int64_t h = 0; h < s->heads; ++h) {
      int64_t bh = b * s->heads + h;
      for (int64_t i = 0; i < s->L; ++i) {
        int64_t keys = causal && i + 1 < s->S ? i + 1 : s->S;
        double m = -INFINITY, sum = 0.0, dot = 0.0;
        for (int64_t j = 0; j < keys; ++j) {
          double acc = 0.0;
          for (int64_t e = 0; e < s->E; ++e)
            acc += MT_T_GET(q, at(q, b, h, i, e)) * MT_T_GET(k, at(k, b, h, j, e));
          p[j] = acc * scale;
          m = p[j] > m ? p[j] : m;
        }
        for (int64_t j = 0; j < keys; ++j) sum += (p[j] = exp(p[j] - m));
        for (int64_t j = 0; j < keys; ++j) {
          p[j] /= sum;
          double acc = 0.0;
          for (int64_t c = 0; c < s->Ev; ++c) {
            double gc = MT_T_GET(g, at(g, b, h, i, c));
            acc += gc * MT_T_GET(v, at(v, b, h, j, c));
            dv[(bh * s->S + j) * s->Ev + c] += p[j] * gc;
          }
          ds[j] = acc;
          dot += acc * p[j];
        }
        for (int64_t j = 0; j < keys; ++j) ds[j] = p[j] * (ds[j] - dot) * scale;
        for (int64_t e = 0; e < s->E; ++e) {
          double acc = 0.0;
          for (int64_t j = 0; j < keys; ++j) {
            acc += ds[j] * MT_T_GET(k, at(k, b, h, j, e));
            dk[(bh * s->S + j) * s->E + e] += ds[j] * MT_T_GET(q, at(q, b, h, i, e));
          }
          dq[(bh * s->L + i) * s->E + e] = acc;
        }
      }
    }
  free(p), free(ds);
#undef MT_T_GET
}

/* One backward case: q, g and dq laid out (batch, L, heads, cols) as a projection's
 * output is, the rest contiguous per head; each gradient against the reference. */
static void check_attention_backward(int f32, mt_attn_shape s, int causal) {
  size_t isz = f32 ? sizeof(float) : sizeof(double);
  int64_t n[4] = {s.batch * s.heads * s.L * s.E, s.batch * s.heads * s.S * s.E,
                  s.batch * s.heads * s.S * s.Ev, s.batch * s.heads * s.L * s.Ev};
  void *in[4], *out[3];
  double *tmp = malloc((size_t)(n[0] + n[1] + n[2] + n[3] + 1) * sizeof(double));
  fill(tmp, NULL, n[0] + n[1] + n[2] + n[3], 17, 1.5);
  for (int i = 0, off = 0; i < 4; off += (int)n[i], ++i) {
    in[i] = calloc((size_t)n[i] + 1, isz);
    if (i < 3) out[i] = calloc((size_t)n[i] + 1, isz);
    for (int64_t j = 0; j < n[i]; ++j) {
      if (f32) ((float *)in[i])[j] = (float)tmp[off + j];
      else ((double *)in[i])[j] = tmp[off + j];
    }
  }
  mt_attn_operand q = {in[0], s.L * s.heads * s.E, s.E, s.heads * s.E};
  mt_attn_operand k = {in[1], s.heads * s.S * s.E, s.S * s.E, s.E};
  mt_attn_operand v = {in[2], s.heads * s.S * s.Ev, s.S * s.Ev, s.Ev};
  mt_attn_operand g = {in[3], s.L * s.heads * s.Ev, s.Ev, s.heads * s.Ev};
  mt_attn_operand dq = {out[0], s.L * s.heads * s.E, s.E, s.heads * s.E};
  mt_attn_operand dk = {out[1], s.heads * s.S * s.E, s.S * s.E, s.E};
  mt_attn_operand dv = {out[2], s.heads * s.S * s.Ev, s.S * s.Ev, s.Ev};
  double scale = 1.0 / sqrt((double)(s.E > 0 ? s.E : 1));
  int rc = mt_attention_backward(blas, f32 ? MT_DTYPE_FLOAT32 : MT_DTYPE_FLOAT64, &s, &q,
                                 &k, &v, &g, &dq, &dk, &dv, scale, causal, NULL);
  CHECK(rc == MT_OK);
  double *ref[3];
  for (int i = 0; i < 3; ++i) ref[i] = malloc((size_t)(n[i] + 1) * sizeof(double));
  attention_grad_ref(f32, &s, &q, &k, &v, &g, scale, causal, ref[0], ref[1], ref[2]);
  const mt_attn_operand *ops[3] = {&dq, &dk, &dv};
  int64_t rows[3] = {s.L, s.S, s.S}, cols[3] = {s.E, s.E, s.Ev};
  for (int t = 0; t < 3; ++t)
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < rows[t]; ++i)
          for (int64_t c = 0; c < cols[t]; ++c) {
            int64_t idx = at(ops[t], b, h, i, c);
            double got = f32 ? (double)((float *)out[t])[idx] : ((double *)out[t])[idx];
            double want = ref[t][((b * s.heads + h) * rows[t] + i) * cols[t] + c];
            CHECK_MSG(close_to(got, want, f32 ? 1e-4 : 1e-11, f32 ? 1e-5 : 1e-13),
                      "d%c f32 %d causal %d L %lld S %lld (%lld %lld %lld %lld): %.17g vs "
                      "%.17g", "qkv"[t], f32, causal, (long long)s.L, (long long)s.S,
                      (long long)b, (long long)h, (long long)i, (long long)c, got, want);
          }
  for (int i = 0; i < 4; ++i) free(in[i]);
  for (int i = 0; i < 3; ++i) free(out[i]), free(ref[i]);
  free(tmp);
}

static void test_attention(void) {
  /* batch, heads, L, S, E, Ev: blocks of 64 query rows, ragged last block, L < S,
   * L > S, one row, and the empty sizes. */
  static const mt_attn_shape shapes[] = {
      {2, 3, 130, 130, 16, 8}, {1, 2, 70, 150, 9, 5}, {1, 2, 150, 70, 9, 12},
      {1, 1, 1, 1, 4, 4},      {1, 2, 5, 0, 4, 3},    {1, 2, 5, 6, 0, 3},
      {1, 2, 0, 6, 4, 3},      {0, 2, 5, 6, 4, 3},
  };
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; ++t)
    for (int f32 = 0; f32 < 2; ++f32)
      for (int causal = 0; causal < 2; ++causal) {
        check_attention(f32, shapes[t], causal);
        check_attention_backward(f32, shapes[t], causal);
      }
}

/* c (m, n) in a buffer of row stride n + 3, a and b with padded rows too, against
 * the formula written out here (the provider is itself a loop, so this checks the
 * strides, transposes, alpha/beta and the special sizes mt_gemm handles). */
static void check_gemm(int f32, int tb, int64_t m, int64_t n, int64_t k, double beta) {
  int64_t lda = k + 2, ldb = (tb ? k : n) + 1, ldc = n + 3, brows = tb ? n : k;
  int64_t na = m * lda + 1, nb = brows * ldb + 1, nc = m * ldc + 1;
  double *ad = malloc((size_t)(na + nb + 2 * nc) * sizeof(double));
  float *af = malloc((size_t)(na + nb + nc) * sizeof(float));
  double *bd = ad + na, *cd = bd + nb, *c0 = cd + nc;
  float *bf = af + na, *cf = bf + nb;
  fill(ad, af, na, 11, 1.0), fill(bd, bf, nb, 12, 1.0), fill(c0, cf, nc, 13, 1.0);
  memcpy(cd, c0, (size_t)nc * sizeof(double));
  if (m > 0 && n > 0) c0[0] = cd[0] = NAN, cf[0] = NAN; /* beta == 0 must drop it */
  int rc = mt_gemm(blas, f32 ? MT_DTYPE_FLOAT32 : MT_DTYPE_FLOAT64, tb, m, n, k, 0.5,
                   f32 ? (void *)af : (void *)ad, lda, f32 ? (void *)bf : (void *)bd,
                   ldb, beta, f32 ? (void *)cf : (void *)cd, ldc, NULL);
  CHECK(rc == MT_OK);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      double want = c0[i * ldc + j]; /* the padding stays as it was */
      if (j < n) {
        double acc = 0.0;
        for (int64_t p = 0; p < k; ++p)
          acc += ad[i * lda + p] * bd[tb ? j * ldb + p : p * ldb + j];
        want = 0.5 * acc + (beta == 0.0 ? 0.0 : beta * want);
      }
      double got = f32 ? (double)cf[i * ldc + j] : cd[i * ldc + j];
      CHECK_MSG(close_to(got, want, f32 ? 1e-5 : 1e-12, f32 ? 1e-5 : 1e-13),
                "f32 %d tb %d (%lld %lld %lld) beta %g at (%lld %lld): %.17g vs %.17g",
                f32, tb, (long long)m, (long long)n, (long long)k, beta, (long long)i,
                (long long)j, got, want);
    }
  free(ad), free(af);
}

static void test_gemm(void) {
  static const int64_t sizes[][3] = {{5, 7, 3}, {1, 4, 6}, {6, 1, 1}, {3, 4, 0},
                                     {0, 4, 3}, {3, 0, 2}, {33, 17, 29}};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; ++t)
    for (int f32 = 0; f32 < 2; ++f32)
      for (int tb = 0; tb < 2; ++tb)
        for (int b = 0; b < 2; ++b)
          check_gemm(f32, tb, sizes[t][0], sizes[t][1], sizes[t][2], b ? 1.0 : 0.0);
}

static void test_errors(void) {
  mt_error err = {0};
  float x[4] = {0}, y[4];
  CHECK(mt_gelu(MT_DTYPE_INT32, 0, 4, x, y, &err) == MT_ETYPE);
  CHECK(strstr(err.msg, "int32") != NULL);
  CHECK(mt_gelu(MT_DTYPE_FLOAT32, 2, 4, x, y, &err) == MT_EINVAL);
  CHECK(mt_gelu(MT_DTYPE_FLOAT32, 0, -1, x, y, &err) == MT_EINVAL);
  CHECK(mt_gelu(MT_DTYPE_FLOAT32, 0, 4, NULL, y, &err) == MT_EINVAL);
  CHECK(mt_gelu(MT_DTYPE_FLOAT32, 0, 0, NULL, NULL, &err) == MT_OK);
  CHECK(mt_gelu_backward(MT_DTYPE_INT32, 0, 4, x, x, y, &err) == MT_ETYPE);
  CHECK(mt_gelu_backward(MT_DTYPE_FLOAT32, 2, 4, x, x, y, &err) == MT_EINVAL);
  CHECK(mt_gelu_backward(MT_DTYPE_FLOAT32, 0, -1, x, x, y, &err) == MT_EINVAL);
  CHECK(mt_gelu_backward(MT_DTYPE_FLOAT32, 0, 4, x, NULL, y, &err) == MT_EINVAL);
  CHECK(mt_gelu_backward(MT_DTYPE_FLOAT32, 0, 0, NULL, NULL, NULL, &err) == MT_OK);
  CHECK(mt_softmax_rows(MT_DTYPE_FLOAT16, 0, 1, 4, x, y, &err) == MT_ETYPE);
  CHECK(mt_softmax_rows(MT_DTYPE_FLOAT32, 0, -1, 4, x, y, &err) == MT_EINVAL);
  CHECK(mt_softmax_rows(MT_DTYPE_FLOAT32, 0, 1, 4, x, NULL, &err) == MT_EINVAL);
  CHECK(mt_softmax_rows(MT_DTYPE_FLOAT32, 0, 0, 4, NULL, NULL, &err) == MT_OK);
  CHECK(mt_layer_norm_rows(MT_DTYPE_INT8, 1, 4, x, NULL, NULL, 1e-5, y, &err) == MT_ETYPE);
  CHECK(mt_layer_norm_rows(MT_DTYPE_FLOAT32, 1, -4, x, NULL, NULL, 1e-5, y, &err) ==
        MT_EINVAL);
  CHECK(mt_layer_norm_rows(MT_DTYPE_FLOAT32, 1, 4, NULL, NULL, NULL, 1e-5, y, &err) ==
        MT_EINVAL);
  mt_attn_shape s = {1, 1, 2, 2, 2, 2};
  mt_attn_operand a = {x, 4, 4, 2}, overlap = {x, 4, 4, 1}, none = {NULL, 4, 4, 2};
  CHECK(mt_attention(blas, MT_DTYPE_INT64, &s, &a, &a, &a, &a, 1.0, 0, &err) ==
        MT_ETYPE);
  CHECK(mt_attention(blas, MT_DTYPE_FLOAT32, NULL, &a, &a, &a, &a, 1.0, 0, &err) ==
        MT_EINVAL);
  CHECK(mt_attention(blas, MT_DTYPE_FLOAT32, &s, &a, &overlap, &a, &a, 1.0, 0, &err) ==
        MT_EINVAL);
  CHECK(strstr(err.msg, "overlap") != NULL);
  CHECK(mt_attention(blas, MT_DTYPE_FLOAT32, &s, &a, &a, &none, &a, 1.0, 0, &err) ==
        MT_EINVAL);
  mt_attn_shape neg = {1, -1, 2, 2, 2, 2};
  CHECK(mt_attention(blas, MT_DTYPE_FLOAT32, &neg, &a, &a, &a, &a, 1.0, 0, &err) ==
        MT_EINVAL);
  CHECK(mt_attention(blas, MT_DTYPE_FLOAT32, &s, &a, &a, &a, &a, 1.0, 0, NULL) ==
        MT_OK);
  CHECK(mt_gemm(blas, MT_DTYPE_INT32, 0, 1, 1, 1, 1.0, x, 1, x, 1, 0.0, y, 1, &err) ==
        MT_ETYPE);
  CHECK(mt_gemm(blas, MT_DTYPE_FLOAT32, 0, -1, 1, 1, 1.0, x, 1, x, 1, 0.0, y, 1,
                &err) == MT_EINVAL);
  CHECK(mt_gemm(blas, MT_DTYPE_FLOAT32, 0, 2, 2, 2, 1.0, x, 1, x, 2, 0.0, y, 2, &err) ==
        MT_EINVAL);
  CHECK(strstr(err.msg, "stride") != NULL);
  CHECK(mt_gemm(blas, MT_DTYPE_FLOAT32, 0, 2, 2, 2, 1.0, NULL, 2, x, 2, 0.0, y, 2,
                &err) == MT_EINVAL);
}

/* Checking a BLAS, kernels without one, and the int of an LP64 BLAS. */
static void test_provider(void) {
  mt_error err = {0};
  float x[4] = {1, 2, 3, 4}, y[4] = {0};
  mt_blas half = {ref_sgemm, NULL, NULL, NULL}, mixed = {ref_sgemm, ref_dgemm, ref_sgemm64,
                                                         ref_dgemm64};
  mt_blas none = {NULL, NULL, NULL, NULL};
  CHECK(mt_blas_check(&half, &err) == MT_EINVAL);
  CHECK(strstr(err.msg, "LP64") != NULL);
  CHECK(mt_blas_check(&mixed, &err) == MT_EINVAL && !mt_blas_available(&mixed));
  CHECK(mt_blas_check(NULL, &err) == MT_OK && !mt_blas_available(NULL));
  CHECK(mt_blas_check(&none, &err) == MT_OK && !mt_blas_available(&none));
  CHECK(mt_blas_check(&ilp64, &err) == MT_OK && mt_blas_available(&ilp64));
  CHECK(mt_gemm(&none, MT_DTYPE_FLOAT32, 0, 2, 2, 2, 1.0, x, 2, x, 2, 0.0, y, 2,
                &err) == MT_ENOTSUP);
  CHECK(mt_gemm(&half, MT_DTYPE_FLOAT32, 0, 2, 2, 2, 1.0, x, 2, x, 2, 0.0, y, 2,
                &err) == MT_ENOTSUP);
  mt_attn_shape s = {1, 1, 2, 2, 2, 2};
  mt_attn_operand a = {x, 4, 4, 2};
  CHECK(mt_attention(NULL, MT_DTYPE_FLOAT32, &s, &a, &a, &a, &a, 1.0, 0, &err) ==
        MT_ENOTSUP);
  ref_calls = 0;
  CHECK(mt_gemm(&lp64, MT_DTYPE_FLOAT32, 0, (int64_t)INT_MAX + 1, 1, 1, 1.0, x, 1, x, 1,
                0.0, y, 1, &err) == MT_EOVERFLOW);
  CHECK(mt_gemm(&lp64, MT_DTYPE_FLOAT32, 1, 2, 2, 2, 1.0, x, (int64_t)INT_MAX + 1, x, 2,
                0.0, y, 2, &err) == MT_EOVERFLOW);
  CHECK(ref_calls == 0);
  CHECK(mt_gemm(&lp64, MT_DTYPE_FLOAT32, 1, 2, 2, 2, 1.0, x, 2, x, 2, 0.0, y, 2,
                &err) == MT_OK);
  CHECK(ref_calls == 1 && y[0] == 5.0f && y[1] == 11.0f && y[3] == 25.0f);
}

int main(void) {
  test_gelu();
  test_gelu_backward();
  test_adam_update();
  test_softmax();
  test_layer_norm();
  test_provider();
  const mt_blas *providers[] = {&lp64, &ilp64};
  for (int p = 0; p < 2; ++p) {
    blas = providers[p];
    ref_calls = 0;
    test_gemm();
    test_attention();
    test_errors();
    CHECK(ref_calls > 0);
  }
  return mt_test_exit("test_kernels");
}
