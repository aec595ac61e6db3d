/* TSQR: the QR factorization of a tall-skinny matrix whose rows are cut into one
 * block per rank of a communicator, without gathering the matrix.
 *
 * Each rank factors its block a cache-sized chunk of rows at a time (geqrf of the
 * first, tpqrt of each next one under R); the ranks then combine their R factors as a
 * butterfly (recursive doubling, tpqrt on two stacked triangles), so that every rank
 * holds the same R at the end without a broadcast. A rank count that is not a power of
 * two first folds the ranks beyond the largest power of two into their partners, and
 * receives R from them afterwards. Q is formed by applying the tree's Householder
 * blocks back down (tpmqrt, no communication but the folded ranks' one block) and then
 * the rank's own reflectors (tpmqrt per chunk, ormqr): each rank's rows of Q, and
 * nothing of A moves.
 *
 * The LAPACK routines are not linked: the caller hands in those of the library it
 * has loaded (NumPy's OpenBLAS), as Fortran functions taking every argument by
 * address, with 32-bit (LP64) or 64-bit (ILP64) integers. */
#ifndef MPITENSOR_LINALG_TSQR_H
#define MPITENSOR_LINALG_TSQR_H

#include <stdint.h>

#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A LAPACK routine's address; each is called through its own Fortran prototype. */
typedef void mt_lapack_fn(void);

/* The LAPACK routines TSQR calls, per element type: s float32, d float64, c
 * complex64, z complex128 (for complex, ungqr's family: tpqrt, tpmqrt and unmqr,
 * whose slot is named ormqr). A NULL routine leaves its element type unsupported
 * (MT_ENOTSUP). `ilp64` is 1 when the library takes 64-bit integers. */
typedef struct mt_lapack {
  mt_lapack_fn *sgeqrf;
  mt_lapack_fn *dgeqrf;
  mt_lapack_fn *cgeqrf;
  mt_lapack_fn *zgeqrf;
  mt_lapack_fn *stpqrt;
  mt_lapack_fn *dtpqrt;
  mt_lapack_fn *ctpqrt;
  mt_lapack_fn *ztpqrt;
  mt_lapack_fn *stpmqrt;
  mt_lapack_fn *dtpmqrt;
  mt_lapack_fn *ctpmqrt;
  mt_lapack_fn *ztpmqrt;
  mt_lapack_fn *sormqr;
  mt_lapack_fn *dormqr;
  mt_lapack_fn *cormqr;
  mt_lapack_fn *zormqr;
  int ilp64;
} mt_lapack;

/* Local. 1 when `lapack` holds the four routines of element type `dtype`
 * (MT_DTYPE_FLOAT32, FLOAT64, COMPLEX64 or COMPLEX128), else 0. */
MT_EXPORT int mt_lapack_supports(const mt_lapack *lapack, int dtype);

/* Collective on mesh dim `dim`. The QR factorization of the matrix whose rows are
 * the members' blocks in the order of their coordinate on that dim. This rank's
 * block is `a`: m rows and n columns of `dtype`, column-major with leading
 * dimension lda (>= max(1, m)); it is overwritten (by its Householder reflectors).
 * Every member must pass m >= n and the same n and dtype, else every member
 * returns MT_EINVAL (an agreement runs before anything moves, carrying the first
 * failing member's message). On return every member's `r` (n x n, column-major,
 * leading dimension ldr) holds the same R, upper triangular with zeros below;
 * when `q` is not NULL, it receives this rank's m x n rows of the reduced Q
 * (column-major, leading dimension ldq), so that the members' blocks of Q stacked
 * times R is the matrix. Counted as one all-reduce of the bytes this rank sends.
 * MT_ENOTSUP when `lapack` lacks a routine of `dtype`; MT_ESTATE on a rank outside
 * the mesh.
 *
 *   rc = mt_tsqr(mesh, 0, &lapack, MT_DTYPE_FLOAT64, m, n, a, m, r, n, q, m, &err);
 */
MT_EXPORT int mt_tsqr(const mt_mesh *mesh, int dim, const mt_lapack *lapack, int dtype,
                      int64_t m, int64_t n, void *a, int64_t lda, void *r, int64_t ldr,
                      void *q, int64_t ldq, mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
