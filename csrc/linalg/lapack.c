/* The LAPACK calls of TSQR through the routines the caller handed in (tsqr.h:
 * mt_lapack). Fortran takes every argument by address, so one prototype per
 * routine serves both integer sizes: the integers are passed as the addresses of
 * int64_t values (ILP64) or of int copies (LP64), which `ints` holds. Character
 * arguments carry gfortran's hidden lengths at the end. */
#include <stddef.h>

#include "linalg-private.h"
#include "mpitensor/core/dtype.h"

typedef void geqrf_fn(void *m, void *n, void *a, void *lda, void *tau, void *work,
                      void *lwork, void *info);
typedef void tpqrt_fn(void *m, void *n, void *l, void *nb, void *a, void *lda, void *b,
                      void *ldb, void *t, void *ldt, void *work, void *info);
typedef void tpmqrt_fn(const char *side, const char *trans, void *m, void *n, void *k,
                       void *l, void *nb, const void *v, void *ldv, const void *t,
                       void *ldt, void *a, void *lda, void *b, void *ldb, void *work,
                       void *info, size_t side_len, size_t trans_len);
typedef void ormqr_fn(const char *side, const char *trans, void *m, void *n, void *k,
                      const void *a, void *lda, const void *tau, void *c, void *ldc,
                      void *work, void *lwork, void *info, size_t side_len,
                      size_t trans_len);

/* The integer arguments of one call, in the library's size. */
typedef struct ints {
  int64_t wide[12];
  int narrow[12];
  int ilp64;
} ints;

/* The address of integer argument k, set to v. */
static void *arg(ints *s, int k, int64_t v) {
  s->wide[k] = v;
  s->narrow[k] = (int)v;
  return s->ilp64 ? (void *)&s->wide[k] : (void *)&s->narrow[k];
}

static int64_t value(const ints *s, int k) {
  return s->ilp64 ? s->wide[k] : s->narrow[k];
}

static int info_status(const ints *s, int k, const char *routine, mt_error *err) {
  int64_t info = value(s, k);
  if (info == 0) return MT_OK;
  return mt_error_set(err, MT_EINVAL, "%s: LAPACK reports info = %lld", routine,
                      (long long)info);
}

int mt_lapack_supports(const mt_lapack *lapack, int dtype) {
  mt__lapack_ops ops;
  return mt__lapack_ops_of(lapack, dtype, &ops, NULL) == MT_OK;
}

int mt__lapack_ops_of(const mt_lapack *lapack, int dtype, mt__lapack_ops *out,
                      mt_error *err) {
  int k = dtype == MT_DTYPE_FLOAT32      ? 0
          : dtype == MT_DTYPE_FLOAT64    ? 1
          : dtype == MT_DTYPE_COMPLEX64  ? 2
          : dtype == MT_DTYPE_COMPLEX128 ? 3
                                         : -1;
  if (k < 0) {
    return mt_error_set(err, MT_ETYPE, "TSQR: float32, float64, complex64 or "
                        "complex128, got %s", mt_dtype_name(dtype));
  }
  mt_lapack_fn *const geqrf[4] = {lapack->sgeqrf, lapack->dgeqrf, lapack->cgeqrf,
                                  lapack->zgeqrf};
  mt_lapack_fn *const tpqrt[4] = {lapack->stpqrt, lapack->dtpqrt, lapack->ctpqrt,
                                  lapack->ztpqrt};
  mt_lapack_fn *const tpmqrt[4] = {lapack->stpmqrt, lapack->dtpmqrt, lapack->ctpmqrt,
                                   lapack->ztpmqrt};
  mt_lapack_fn *const ormqr[4] = {lapack->sormqr, lapack->dormqr, lapack->cormqr,
                                  lapack->zormqr};
  mt__lapack_ops ops = {geqrf[k], tpqrt[k], tpmqrt[k], ormqr[k], lapack->ilp64 != 0,
                        k % 2 == 0, (int64_t)mt_dtype_size(dtype)};
  if (!ops.geqrf || !ops.tpqrt || !ops.tpmqrt || !ops.ormqr) {
    return mt_error_set(err, MT_ENOTSUP, "TSQR: no LAPACK routines of %s were loaded",
                        mt_dtype_name(dtype));
  }
  *out = ops;
  return MT_OK;
}

/* The size a workspace query wrote into work[0], whose real part leads in every
 * type: a float in single precision, a double in double. */
static int64_t queried(const mt__lapack_ops *ops, const void *work) {
  double v = ops->single ? (double)*(const float *)work : *(const double *)work;
  return v > 1.0 ? (int64_t)v : 1;
}

int mt__lapack_lwork(const mt__lapack_ops *ops, int64_t m, int64_t n, int64_t *lwork,
                     mt_error *err) {
  double work[2] = {0.0, 0.0}; /* room for one element of any type */
  ints s = {.ilp64 = ops->ilp64};
  ((geqrf_fn *)ops->geqrf)(arg(&s, 0, m), arg(&s, 1, n), NULL, arg(&s, 2, m > 1 ? m : 1),
                           NULL, work, arg(&s, 3, -1), arg(&s, 4, 0));
  int rc = info_status(&s, 4, "geqrf", err);
  if (rc != MT_OK) return rc;
  int64_t best = queried(ops, work);
  ((ormqr_fn *)ops->ormqr)("L", "N", arg(&s, 0, m), arg(&s, 1, n), arg(&s, 2, n), NULL,
                           arg(&s, 3, m > 1 ? m : 1), NULL, NULL, arg(&s, 5, m > 1 ? m : 1),
                           work, arg(&s, 6, -1), arg(&s, 7, 0), 1, 1);
  rc = info_status(&s, 7, "ormqr", err);
  if (rc != MT_OK) return rc;
  int64_t other = queried(ops, work);
  *lwork = best > other ? best : other;
  return MT_OK;
}

int mt__geqrf(const mt__lapack_ops *ops, int64_t m, int64_t n, void *a, int64_t lda,
              void *tau, void *work, int64_t lwork, mt_error *err) {
  ints s = {.ilp64 = ops->ilp64};
  ((geqrf_fn *)ops->geqrf)(arg(&s, 0, m), arg(&s, 1, n), a, arg(&s, 2, lda), tau, work,
                           arg(&s, 3, lwork), arg(&s, 4, 0));
  return info_status(&s, 4, "geqrf", err);
}

int mt__tpqrt(const mt__lapack_ops *ops, const mt__pentagon *p, void *t, void *work,
              mt_error *err) {
  ints s = {.ilp64 = ops->ilp64};
  ((tpqrt_fn *)ops->tpqrt)(arg(&s, 0, p->m), arg(&s, 1, p->n), arg(&s, 2, p->l),
                           arg(&s, 3, p->nb), p->a, arg(&s, 4, p->lda), p->b,
                           arg(&s, 5, p->ldb), t, arg(&s, 6, p->nb), work,
                           arg(&s, 7, 0));
  return info_status(&s, 7, "tpqrt", err);
}

int mt__tpmqrt(const mt__lapack_ops *ops, const mt__pentagon *p, const void *t, void *c,
               int64_t ldc, void *d, int64_t ldd, void *work, mt_error *err) {
  ints s = {.ilp64 = ops->ilp64};
  ((tpmqrt_fn *)ops->tpmqrt)("L", "N", arg(&s, 0, p->m), arg(&s, 1, p->n),
                             arg(&s, 2, p->n), arg(&s, 3, p->l), arg(&s, 4, p->nb),
                             p->b, arg(&s, 5, p->ldb), t, arg(&s, 6, p->nb), c,
                             arg(&s, 7, ldc), d, arg(&s, 8, ldd), work, arg(&s, 9, 0),
                             1, 1);
  return info_status(&s, 9, "tpmqrt", err);
}

int mt__ormqr(const mt__lapack_ops *ops, int64_t m, int64_t n, const void *a,
              int64_t lda, const void *tau, void *c, int64_t ldc, void *work,
              int64_t lwork, mt_error *err) {
  ints s = {.ilp64 = ops->ilp64};
  ((ormqr_fn *)ops->ormqr)("L", "N", arg(&s, 0, m), arg(&s, 1, n), arg(&s, 2, n), a,
                           arg(&s, 3, lda), tau, c, arg(&s, 4, ldc), work,
                           arg(&s, 5, lwork), arg(&s, 6, 0), 1, 1);
  return info_status(&s, 6, "ormqr", err);
}
