/* The one place the core calls BLAS: row-major sgemm/dgemm through CBLAS, when the
 * build found one (MT_HAVE_CBLAS); else every product reports MT_ENOTSUP and the
 * Python layer computes with NumPy instead. */
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>

#include "core-private.h"
#include "kernels-private.h"
#include "mpitensor/dtype.h"
#include "mpitensor/kernels.h"

#ifdef MT_HAVE_CBLAS
/* The two CBLAS entry points the kernels use, with the reference CBLAS's enum
 * values and its 32-bit int sizes, declared here so that the build needs the
 * library only (each vendor ships its cblas.h in a place of its own). */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c,
                 int ldc);
void cblas_dgemm(int order, int trans_a, int trans_b, int m, int n, int k, double alpha,
                 const double *a, int lda, const double *b, int ldb, double beta,
                 double *c, int ldc);
#endif

int mt_kernels_have_blas(void) {
#ifdef MT_HAVE_CBLAS
  return 1;
#else
  return 0;
#endif
}

int mt__check_float(int dtype, const char *what, mt_error *err) {
  if (dtype == MT_DTYPE_FLOAT32 || dtype == MT_DTYPE_FLOAT64) return MT_OK;
  return mt__fail(err, MT_ETYPE, "%s: float32 or float64 only, got %s", what,
                  mt_dtype_name(dtype));
}

#ifdef MT_HAVE_CBLAS
static int fits_int(int64_t v) {
  return v > 0 && v <= INT_MAX;
}

int mt__gemm(int dtype, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
             const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
             void *c, int64_t ldc, mt_error *err) {
  if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) ||
      !fits_int(ldb) || !fits_int(ldc)) {
    return mt__fail(err, MT_EOVERFLOW,
                    "gemm: sizes (%" PRId64 ", %" PRId64 ", %" PRId64
                    ") or strides exceed the BLAS int",
                    m, n, k);
  }
  int tb = trans_b ? CBLAS_TRANS : CBLAS_NO_TRANS;
  if (dtype == MT_DTYPE_FLOAT32) {
    cblas_sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, tb, (int)m, (int)n, (int)k,
                (float)alpha, a, (int)lda, b, (int)ldb, (float)beta, c, (int)ldc);
  } else {
    cblas_dgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, tb, (int)m, (int)n, (int)k, alpha, a,
                (int)lda, b, (int)ldb, beta, c, (int)ldc);
  }
  return MT_OK;
}
#else
int mt__gemm(int dtype, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
             const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
             void *c, int64_t ldc, mt_error *err) {
  (void)dtype, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a;
  (void)lda, (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
  return mt__fail(err, MT_ENOTSUP, "mpitensor was built without a BLAS");
}
#endif
