/* The one place the kernels call BLAS: row-major sgemm/dgemm through the CBLAS
 * functions of the mt_blas each call is handed (mpitensor.nn loads MKL or NumPy's
 * OpenBLAS at import and keeps them; the C tests hand a reference loop). The
 * kernels link no BLAS, so they build and test without one; with none every
 * product reports MT_ENOTSUP and the Python layer computes with NumPy instead. */
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>

#include "kernels-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/kernels/kernels.h"

/* The reference CBLAS's enum values, which every vendor keeps. */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

int mt_blas_check(const mt_blas *blas, mt_error *err) {
  if (blas == NULL) return MT_OK;
  int lp64 = blas->sgemm != NULL && blas->dgemm != NULL;
  int ilp64 = blas->sgemm64 != NULL && blas->dgemm64 != NULL;
  int any32 = blas->sgemm != NULL || blas->dgemm != NULL;
  int any64 = blas->sgemm64 != NULL || blas->dgemm64 != NULL;
  if (!any32 && !any64) return MT_OK;
  if (lp64 + ilp64 != 1 || (lp64 && any64) || (ilp64 && any32)) {
    return mt_error_set(
        err, MT_EINVAL,
        "blas: set both sgemm and dgemm of one integer size (LP64 or ILP64)");
  }
  return MT_OK;
}

int mt_blas_available(const mt_blas *blas) {
  return blas != NULL && mt_blas_check(blas, NULL) == MT_OK &&
         (blas->sgemm != NULL || blas->sgemm64 != NULL);
}

int mt__check_float(int dtype, const char *what, mt_error *err) {
  if (dtype == MT_DTYPE_FLOAT32 || dtype == MT_DTYPE_FLOAT64) return MT_OK;
  return mt_error_set(err, MT_ETYPE, "%s: float32 or float64 only, got %s", what,
                      mt_dtype_name(dtype));
}

static int64_t at_least_1(int64_t v) {
  return v > 1 ? v : 1;
}

static int check_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      const void *a, int64_t lda, const void *b, int64_t ldb,
                      const void *c, int64_t ldc, mt_error *err) {
  if (m < 0 || n < 0 || k < 0) {
    return mt_error_set(err, MT_EINVAL,
                        "gemm: negative size (%" PRId64 ", %" PRId64 ", %" PRId64 ")",
                        m, n, k);
  }
  if (lda < at_least_1(trans_a ? m : k) || ldb < at_least_1(trans_b ? k : n) ||
      ldc < at_least_1(n)) {
    return mt_error_set(err, MT_EINVAL,
                        "gemm: row strides (%" PRId64 ", %" PRId64 ", %" PRId64
                        ") shorter than the rows",
                        lda, ldb, ldc);
  }
  if ((m > 0 && n > 0 && c == NULL) || (m > 0 && n > 0 && k > 0 && (a == NULL || b == NULL))) {
    return mt_error_set(err, MT_EINVAL, "gemm: NULL operand");
  }
  return MT_OK;
}

/* c = beta * c, what a product over k == 0 leaves (beta == 0 writes zeros, as BLAS
 * does, so NaNs in c do not survive). */
static void scale_c(int dtype, int64_t m, int64_t n, double beta, void *c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (dtype == MT_DTYPE_FLOAT32) {
        float *e = (float *)c + i * ldc + j;
        *e = beta == 0.0 ? 0.0f : (float)beta * *e;
      } else {
        double *e = (double *)c + i * ldc + j;
        *e = beta == 0.0 ? 0.0 : beta * *e;
      }
    }
  }
}

static int fits_int(int64_t v) {
  return v <= INT_MAX;
}

static int gemm_lp64(const mt_blas *blas, int dtype, int ta, int tb, int64_t m,
                     int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                     const void *b, int64_t ldb, double beta, void *c, int64_t ldc,
                     mt_error *err) {
  if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) ||
      !fits_int(ldb) || !fits_int(ldc)) {
    return mt_error_set(err, MT_EOVERFLOW,
                        "gemm: sizes (%" PRId64 ", %" PRId64 ", %" PRId64
                        ") or strides exceed the int of an LP64 BLAS",
                        m, n, k);
  }
  if (dtype == MT_DTYPE_FLOAT32) {
    blas->sgemm(CBLAS_ROW_MAJOR, ta, tb, (int)m, (int)n, (int)k,
                (float)alpha, a, (int)lda, b, (int)ldb, (float)beta, c, (int)ldc);
  } else {
    blas->dgemm(CBLAS_ROW_MAJOR, ta, tb, (int)m, (int)n, (int)k, alpha, a,
                (int)lda, b, (int)ldb, beta, c, (int)ldc);
  }
  return MT_OK;
}

int mt_gemm(const mt_blas *blas, int dtype, int trans_b, int64_t m, int64_t n,
            int64_t k, double alpha, const void *a, int64_t lda, const void *b,
            int64_t ldb, double beta, void *c, int64_t ldc, mt_error *err) {
  return mt__gemm2(blas, dtype, 0, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                   err);
}

int mt__gemm2(const mt_blas *blas, int dtype, int trans_a, int trans_b, int64_t m,
              int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
              const void *b, int64_t ldb, double beta, void *c, int64_t ldc,
              mt_error *err) {
  /* A single row's stride is never used, and NumPy gives size-1 dims any stride;
   * BLAS checks it all the same. */
  if ((trans_a ? k : m) == 1) lda = at_least_1(trans_a ? m : k);
  if (m == 1) ldc = at_least_1(n);
  if ((trans_b ? n : k) == 1) ldb = at_least_1(trans_b ? k : n);
  int rc = mt__check_float(dtype, "gemm", err);
  if (rc == MT_OK) rc = check_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, err);
  if (rc != MT_OK) return rc;
  if (!mt_blas_available(blas)) {
    return mt_error_set(err, MT_ENOTSUP, "gemm: no BLAS given (see mt_blas)");
  }
  if (m == 0 || n == 0) return MT_OK;
  if (k == 0) {
    scale_c(dtype, m, n, beta, c, ldc);
    return MT_OK;
  }
  int ta = trans_a ? CBLAS_TRANS : CBLAS_NO_TRANS;
  int tb = trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS;
  if (blas->sgemm == NULL) {
    if (dtype == MT_DTYPE_FLOAT32) {
      blas->sgemm64(CBLAS_ROW_MAJOR, ta, tb, m, n, k, (float)alpha, a, lda, b, ldb,
                    (float)beta, c, ldc);
    } else {
      blas->dgemm64(CBLAS_ROW_MAJOR, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                    ldc);
    }
    return MT_OK;
  }
  return gemm_lp64(blas, dtype, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                   err);
}
