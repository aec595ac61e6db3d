/* ScaLAPACK drivers for square matrices sharded over a mesh.
 *
 * ScaLAPACK is reached through a table of its routines filled at run time
 * (mt_scalapack_open, a dlopen), never linked: a machine without it still builds
 * and imports mpitensor, and only these calls fail, with a message that names the
 * package to install.
 *
 * A matrix arrives as the local block of a block distribution (torch.chunk's: a
 * block of ceil(n/P) rows or columns, one per process) in row-major order, as
 * NumPy holds it (contiguous). The mesh dim that shards its rows (`row_dim`, -1
 * when they are not sharded) and the one that shards its columns (`col_dim`) make
 * the Pr x Pc process grid; the members that share their coordinates on the other
 * mesh dims make one grid each and run the same computation side by side. The
 * routines, which need square blocks, run on a column-major block-cyclic copy:
 * each rank packs the pieces of its block that each other rank owns there, one
 * message per pair, and the results come back the same way. A block distribution
 * whose blocks are square already (and not too large) is its own cyclic layout:
 * then no rank sends anything.
 *
 * `type` is LAPACK's letter of the element type: 's', 'd', 'c' or 'z'. `info`
 * is the routine's INFO, the same on every member (a positive value is LAPACK's:
 * a singular matrix, one not positive definite, an eigenproblem that failed). */
#ifndef MPITENSOR_LINALG_SCALAPACK_H
#define MPITENSOR_LINALG_SCALAPACK_H

#include <stdint.h>

#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The routines of one ScaLAPACK (BLACS included), opened by dlopen. */
typedef struct mt_scalapack mt_scalapack;

/* Local. Opens the ScaLAPACK library `path` (a file name the dynamic loader
 * searches for, or a path) and fills the table of its routines. MT_ENOTSUP, with
 * the loader's message or the name of the routine that is missing, when it cannot.
 *
 *   mt_scalapack *sl = NULL;
 *   rc = mt_scalapack_open("libscalapack-openmpi.so.2.2", &sl, &err);
 */
MT_EXPORT int mt_scalapack_open(const char *path, mt_scalapack **out, mt_error *err);

/* Local. As mt_scalapack_open, for a ScaLAPACK that comes as `count` libraries
 * which do not name each other, as MKL's (core, threading layer, interface, BLACS,
 * ScaLAPACK): they are opened in the order given, all but the last into the global
 * namespace for good (the later ones find their symbols there), and the routines
 * are looked up from the last back. Up to 8 libraries.
 *
 *   const char *mkl[] = {"libmkl_core.so.3", "libmkl_sequential.so.3",
 *                        "libmkl_intel_lp64.so.3", "libmkl_blacs_openmpi_lp64.so.2",
 *                        "libmkl_scalapack_lp64.so.2"};
 *   rc = mt_scalapack_open_libraries(mkl, 5, &sl, &err);
 */
MT_EXPORT int mt_scalapack_open_libraries(const char *const *paths, int count,
                                          mt_scalapack **out, mt_error *err);

/* Local. Closes the library and frees the table; NULL is a no-op. The process
 * grids the drivers made are cached on each mesh's communicator and freed with it
 * (mt_mesh_destroy); a table closed while some mesh still holds its grids stays
 * loaded until the last of those meshes is destroyed. */
MT_EXPORT void mt_scalapack_close(mt_scalapack *sl);

/* Collective on the mesh. Solves A X = B: `a` is the local block of the n x n A
 * (read only), `b` that of the n x nrhs B, whose rows
 * are sharded as A's and its columns over `col_dim` (blocks of ceil(nrhs/Pc));
 * X replaces B. `info` > 0: A is singular.
 *
 *   rc = mt_scalapack_solve(sl, mesh, 0, -1, 'd', n, a, nrhs, b, &info, &err);
 */
MT_EXPORT int mt_scalapack_solve(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                                 int col_dim, int type, int64_t n, const void *a,
                                 int64_t nrhs, void *b, int *info, mt_error *err);

/* Collective on the mesh. The inverse of the n x n A replaces `a`'s block.
 * `info` > 0: A is singular. */
MT_EXPORT int mt_scalapack_inv(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                               int col_dim, int type, int64_t n, void *a, int *info,
                               mt_error *err);

/* Collective on the mesh. The determinant of A as out[0] = log|det A| and
 * out[1] = its phase in radians (0 or pi for a real A), on every member; out[0]
 * is -inf for a singular A. `a`'s block is only read. */
MT_EXPORT int mt_scalapack_slogdet(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                                   int col_dim, int type, int64_t n, const void *a,
                                   double *out, mt_error *err);

/* Collective on the mesh. The Cholesky factor of the Hermitian positive definite
 * A replaces `a`'s block: lower (L L^H = A, from A's lower triangle) or, with
 * `upper`, upper (U^H U = A, from its upper triangle); the other triangle is zero.
 * `info` > 0: A is not positive definite. */
MT_EXPORT int mt_scalapack_cholesky(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                                    int col_dim, int type, int64_t n, void *a,
                                    int upper, int *info, mt_error *err);

/* Collective on the mesh. The eigenvalues of the Hermitian A (from its lower
 * triangle, or its upper one with `upper`) go to `w` (n reals of A's precision, in
 * ascending order, on every member); with `vectors`, the eigenvectors replace
 * `a`'s block (column j belongs to w[j]), else `a`'s block is only read.
 * `info` > 0: the eigensolver failed to converge. */
MT_EXPORT int mt_scalapack_eigh(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                                int col_dim, int type, int64_t n, void *a, int upper,
                                int vectors, void *w, int *info, mt_error *err);

/* Collective on the mesh. The QR factorization of the m x n A (`a`'s block,
 * read only): the first `rrows` rows of R (min(m, n) to m; zero below the
 * diagonal) into `r`, the block of an rrows x n matrix, and, unless `q` is NULL,
 * the first `qcols` columns of Q (min(m, n) to m) into `q`, the block of an
 * m x qcols matrix. Every block is torch.chunk's, rows over `row_dim` and columns
 * over `col_dim`.
 *
 *   rc = mt_scalapack_qr(sl, mesh, 0, -1, 'd', m, n, a, k, r, k, q, &err);
 */
MT_EXPORT int mt_scalapack_qr(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                              int col_dim, int type, int64_t m, int64_t n,
                              const void *a, int64_t rrows, void *r, int64_t qcols,
                              void *q, mt_error *err);

/* Collective on the mesh. LAPACK's geqrf of the m x n A, as NumPy's
 * qr(mode='raw') gives it: `a`'s block (torch.chunk's, as mt_scalapack_qr's) is
 * overwritten by R on and above the diagonal and the Householder vectors below it,
 * and `tau` gets the min(m, n) scalars of the reflectors, on every member.
 *
 *   rc = mt_scalapack_geqrf(sl, mesh, 0, -1, 'd', m, n, a, tau, &err);
 */
MT_EXPORT int mt_scalapack_geqrf(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                                 int col_dim, int type, int64_t m, int64_t n, void *a,
                                 void *tau, mt_error *err);

/* Collective on the mesh. The singular values of the m x n A (`a`'s block,
 * read only) into `s` (min(m, n) reals of A's precision, descending, on every
 * member) and, unless NULL, the left singular vectors into `u` (the block of the
 * m x `ucols` U: min(m, n) columns, or up to m, the columns past min(m, n) an
 * orthonormal basis of the rest of the space, as NumPy's full_matrices) and the
 * right ones into `vt` (the block of the min(m, n) x n V^H), blocks as
 * mt_scalapack_qr's. `info` > 0: the SVD did not converge.
 *
 *   rc = mt_scalapack_svd(sl, mesh, 0, 1, 'z', m, n, a, s, u, k, vt, &info, &err);
 */
MT_EXPORT int mt_scalapack_svd(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                               int col_dim, int type, int64_t m, int64_t n,
                               const void *a, void *s, void *u, int64_t ucols, void *vt,
                               int *info, mt_error *err);

/* Local (on a created mesh, or a slice that a driver ran on). How many process
 * grids `sl` keeps cached on `mesh`: one per layout of rows and columns the
 * drivers ran on there, the oldest dropped past a few; 0 before the first call,
 * or when MPI was not initialized at mt_scalapack_open and nothing is cached.
 *
 *   mt_scalapack_solve(sl, mesh, 0, -1, ...);   // mt_scalapack_cached_grids -> 1
 */
MT_EXPORT int mt_scalapack_cached_grids(const mt_scalapack *sl, mt_mesh *mesh);

/* Local. How many meshes hold grids of `sl`: each counts until it is destroyed. */
MT_EXPORT int mt_scalapack_cached_meshes(const mt_scalapack *sl);

#ifdef __cplusplus
}
#endif

#endif
