/* What the TSQR files share: the LAPACK calls with int64_t arguments, whatever the
 * integer size of the library behind them (lapack.c), for one element type. */
#ifndef MPITENSOR_LINALG_PRIVATE_H
#define MPITENSOR_LINALG_PRIVATE_H

#include <stdint.h>

#include "mpitensor/core/status.h"
#include "mpitensor/linalg/tsqr.h"

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

/* tpqrt of the n x n upper triangles a over b (l = n): R into a, the reflectors'
 * V into b, their block factor into t (nb x n). work: nb * n elements. */
int mt__tpqrt(const mt__lapack_ops *ops, int64_t n, int64_t nb, void *a, void *b,
              void *t, void *work, mt_error *err);

/* tpmqrt, from the left, not transposed: [a; b] (each n x n) = Q [a; b] for the Q of
 * one tpqrt (v, t). work: nb * n elements. */
int mt__tpmqrt(const mt__lapack_ops *ops, int64_t n, int64_t nb, const void *v,
               const void *t, void *a, void *b, void *work, mt_error *err);

/* ormqr (unmqr), from the left, not transposed: c (m x n, ldc) = Q c for the Q of
 * geqrf's n reflectors in a (m x n, lda) and tau. */
int mt__ormqr(const mt__lapack_ops *ops, int64_t m, int64_t n, const void *a,
              int64_t lda, const void *tau, void *c, int64_t ldc, void *work,
              int64_t lwork, mt_error *err);

#endif
