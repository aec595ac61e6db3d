/* What the TSQR files share: the LAPACK calls with int64_t arguments, whatever the
 * integer size of the library behind them (lapack.c), for one element type. */
#ifndef MPITENSOR_LINALG_PRIVATE_H
#define MPITENSOR_LINALG_PRIVATE_H

#include <stdint.h>

#include "mpitensor/comm/watchdog.h"
#include "mpitensor/core/status.h"
#include "mpitensor/linalg/tsqr.h"

/* The collective watchdog (watchdog.h) sees this library's blocking MPI calls as
 * it sees comm's own: MT__LA_MPI evaluates to the call's return code, `what` (a
 * string literal) naming it. The routines of other libraries that communicate
 * inside (ScaLAPACK's, BLACS's) go between mt_watchdog_wait_begin(name, 1) and
 * mt_watchdog_wait_end(). A process stuck in either ends the job, saying where. */
static inline int mt__la_waited(int rc) {
  mt_watchdog_wait_end();
  return rc;
}
#define MT__LA_MPI(what, call) (mt_watchdog_wait_begin((what), 0), mt__la_waited(call))

/* One element type's four routines and the library's integer size. */
typedef struct mt__lapack_ops {
  mt_lapack_fn *geqrf, *tpqrt, *tpmqrt, *ormqr;
  int ilp64;
  int single; /* float32 or complex64 */
  int64_t itemsize;
} mt__lapack_ops;

/* The routines of `dtype`, MT_ENOTSUP when `lapack` lacks one, MT_ETYPE for an
 * element type LAPACK has no routines of. */
int mt__lapack_ops_of(const mt_lapack *lapack, int dtype, mt__lapack_ops *out,
                      mt_error *err);

/* The optimal workspace, in elements, of geqrf on m x n and of ormqr applying its
 * n reflectors to an m x n matrix from the left (LAPACK's query, lwork = -1). */
int mt__lapack_lwork(const mt__lapack_ops *ops, int64_t m, int64_t n, int64_t *lwork,
                     mt_error *err);

/* geqrf: the QR factorization of a (m x n, lda) in place, tau n elements. */
int mt__geqrf(const mt__lapack_ops *ops, int64_t m, int64_t n, void *a, int64_t lda,
              void *tau, void *work, int64_t lwork, mt_error *err);

/* The operands of one tpqrt: the n x n upper triangle a (lda) over the m x n
 * pentagon b (ldb) whose last l rows are upper trapezoidal (l = 0: b is full;
 * l = m = n: b is a triangle too), blocked by nb columns. After tpqrt, b holds
 * the reflectors' V, which tpmqrt reads with the same shape. */
typedef struct mt__pentagon {
  int64_t m, n, l, nb;
  void *a, *b;
  int64_t lda, ldb;
} mt__pentagon;

/* tpqrt of [a; b] as `p` describes: R into a's upper triangle (what lies below its
 * diagonal is left alone), V into b, their block factor into t (nb x n, ldt nb).
 * work: nb * n elements. */
int mt__tpqrt(const mt__lapack_ops *ops, const mt__pentagon *p, void *t, void *work,
              mt_error *err);

/* tpmqrt, from the left, not transposed: [c; d] = Q [c; d] for the Q of the tpqrt
 * that `p` (V in p->b) and t describe; c is n x n (ldc), d m x n (ldd), the
 * columns n as many as the reflectors. work: nb * n elements. */
int mt__tpmqrt(const mt__lapack_ops *ops, const mt__pentagon *p, const void *t, void *c,
               int64_t ldc, void *d, int64_t ldd, void *work, mt_error *err);

/* ormqr (unmqr), from the left, not transposed: c (m x n, ldc) = Q c for the Q of
 * geqrf's n reflectors in a (m x n, lda) and tau. */
int mt__ormqr(const mt__lapack_ops *ops, int64_t m, int64_t n, const void *a,
              int64_t lda, const void *tau, void *c, int64_t ldc, void *work,
              int64_t lwork, mt_error *err);

#endif
