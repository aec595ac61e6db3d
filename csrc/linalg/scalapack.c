/* The ScaLAPACK drivers: each copies the caller's block-distributed matrix to a
 * block-cyclic one (the factorizations want square blocks, and the cyclic layout
 * balances their work; scalapack_exchange.c), runs the routine and copies the
 * result back into the caller's blocks. */
#include <complex.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "scalapack-private.h"

/* A half turn, in radians (HALF_TURN is POSIX, not C11). */
static const double HALF_TURN = 3.14159265358979323846;

typedef mt__sl_job job;

/* The routines' names, for the watchdog's report. */
static const char *const GESV[4] = MT__SL_NAMES(psgesv, pdgesv, pcgesv, pzgesv);
static const char *const GETRS[4] = MT__SL_NAMES(psgetrs, pdgetrs, pcgetrs, pzgetrs);
static const char *const GETRI[4] = MT__SL_NAMES(psgetri, pdgetri, pcgetri, pzgetri);
static const char *const POTRF[4] = MT__SL_NAMES(pspotrf, pdpotrf, pcpotrf, pzpotrf);
static const char *const EVD[4] = MT__SL_NAMES(pssyevd, pdsyevd, pcheevd, pzheevd);
static const char *const EVR[4] = MT__SL_NAMES(pssyevr, pdsyevr, pcheevr, pzheevr);

/* Collective on the grid. Copies the cyclic matrix back into the caller's block. */
static int job_back(job *j, void *a, mt_error *err) {
  return mt__sl_cyclic_to_rows(j, &j->cg, j->n, j->n, &j->cyc, a, err);
}

/* The pivots of a cyclic matrix's local rows (pXgetrf's IPIV), agreed allocated. */
static int pivots(job *j, int **ipiv, mt_error *err) {
  *ipiv = malloc((size_t)(j->cyc.local_rows + j->nb) * sizeof **ipiv);
  int rc = *ipiv != NULL ? MT_OK : mt_error_set(err, MT_ENOMEM, "out of memory");
  return mt__sl_agree(&j->g, rc, err);
}

/* The most right-hand sides solved on a relabelled copy, each process holding
 * them all (mt__sl_lu_solve_relabelled); more go to the block-cyclic copy. */
#define RELABEL_NRHS 64

/* mt_scalapack_solve on a relabelled copy: no message but the LU's and the
 * substitutions'. Closes the job. */
static int solve_relabelled(job *j, int64_t nrhs, void *b, int *info, mt_error *err) {
  int *ipiv = NULL;
  int rc = pivots(j, &ipiv, err);
  if (rc == MT_OK) rc = mt__sl_lu(j, ipiv, info, err);
  if (rc == MT_OK && *info == 0) rc = mt__sl_lu_solve_relabelled(j, ipiv, nrhs, b, err);
  free(ipiv);
  mt__sl_job_close(j);
  return rc;
}

int mt_scalapack_solve(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                       int type, int64_t n, const void *a, int64_t nrhs, void *b,
                       int *info, mt_error *err) {
  job j;
  if (nrhs < 1) return mt_error_set(err, MT_EINVAL, "solve wants nrhs >= 1");
  /* Rows sharded alone: the LU of A's transpose, whose columns the caller's rows
   * are (no transposition on the way), on the 1 x P grid turned from theirs, where
   * each panel lies on one process; A = (A^T)^T solves from it. */
  int flip = row_dim >= 0 && col_dim < 0;
  int rc = flip ? mt__sl_job_open_flipped(sl, mesh, row_dim, col_dim, type, n, a,
                                          nrhs <= RELABEL_NRHS, &j, err)
                : mt__sl_job_open_turned(sl, mesh, row_dim, col_dim, type, n, n, a, &j,
                                         err);
  if (rc != MT_OK) return rc;
  if (j.relabelled) return solve_relabelled(&j, nrhs, b, info, err);
  mt__sl_matrix bcyc = {0};
  int *ipiv = NULL;
  rc = mt__sl_matrix_init(sl, &j.cg, n, nrhs, j.nb, j.nb, j.itemsize, NULL, &bcyc, err);
  rc = mt__sl_agree(&j.g, rc, err);
  if (rc == MT_OK) rc = pivots(&j, &ipiv, err);
  if (rc == MT_OK) rc = mt__sl_rows_to_cyclic(&j, &j.cg, n, nrhs, b, &bcyc, err);
  if (rc == MT_OK) {
    int m = (int)nrhs;
    if (flip) {
      rc = mt__sl_lu(&j, ipiv, info, err);
      if (rc == MT_OK && *info == 0) {
        mt_watchdog_wait_begin(GETRS[j.k], 1);
        j.t->getrs("T", &j.n, &m, j.cyc.data, &j.one, &j.one, j.cyc.desc, ipiv,
                   bcyc.data, &j.one, &j.one, bcyc.desc, info, 1);
        mt_watchdog_wait_end();
      }
    } else {
      mt_watchdog_wait_begin(GESV[j.k], 1);
      j.t->gesv(&j.n, &m, j.cyc.data, &j.one, &j.one, j.cyc.desc, ipiv, bcyc.data,
                &j.one, &j.one, bcyc.desc, info);
      mt_watchdog_wait_end();
    }
    if (rc == MT_OK) rc = mt__sl_agree_info(&j.g, info, err);
  }
  if (rc == MT_OK && *info == 0)
    rc = mt__sl_cyclic_to_rows(&j, &j.cg, n, nrhs, &bcyc, b, err);
  free(ipiv);
  mt__sl_matrix_free(&bcyc);
  mt__sl_job_close(&j);
  return rc;
}

/* pXgetri on the factored cyclic matrix, with the workspace it asks for. */
static int invert(job *j, const int *ipiv, int *info, mt_error *err) {
  double wq[2] = {0, 0};
  int iq = 0, minus = -1, lwork, liwork;
  void *work = NULL, *iwork = NULL;
  mt_watchdog_wait_begin(GETRI[j->k], 1);
  j->t->getri(&j->n, j->cyc.data, &j->one, &j->one, j->cyc.desc, ipiv, wq, &minus, &iq,
              &minus, info);
  mt_watchdog_wait_end();
  lwork = mt__sl_query_size(j, wq), liwork = iq + 1;
  int rc = mt__sl_alloc(j, &work, lwork, j->itemsize, err);
  if (rc == MT_OK) rc = mt__sl_alloc(j, &iwork, liwork, sizeof(int), err);
  if (rc == MT_OK) {
    mt_watchdog_wait_begin(GETRI[j->k], 1);
    j->t->getri(&j->n, j->cyc.data, &j->one, &j->one, j->cyc.desc, ipiv, work, &lwork,
                iwork, &liwork, info);
    mt_watchdog_wait_end();
    rc = mt__sl_agree_info(&j->g, info, err);
  }
  free(work);
  free(iwork);
  return rc;
}

int mt_scalapack_inv(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                     int type, int64_t n, void *a, int *info, mt_error *err) {
  job j;
  int *ipiv = NULL;
  int rc = mt__sl_job_open(sl, mesh, row_dim, col_dim, type, n, n, a, &j, err);
  if (rc != MT_OK) return rc;
  rc = pivots(&j, &ipiv, err);
  if (rc == MT_OK) {
    rc = mt__sl_lu(&j, ipiv, info, err);
  }
  if (rc == MT_OK && *info == 0) rc = invert(&j, ipiv, info, err);
  if (rc == MT_OK && *info == 0) rc = job_back(&j, a, err);
  free(ipiv);
  mt__sl_job_close(&j);
  return rc;
}

/* The diagonal entry g of the cyclic matrix, when this process holds it. */
static const char *diagonal_at(const job *j, int g) {
  const mt__sl_grid *cg = &j->cg;
  int block = g / j->nb, within = g % j->nb;
  if (block % cg->nprow != cg->myrow || block % cg->npcol != cg->mycol) return NULL;
  int64_t i = (int64_t)(block / cg->nprow) * j->nb + within;
  int64_t c = (int64_t)(block / cg->npcol) * j->nb + within;
  int64_t lld = j->cyc.desc[8];
  return (const char *)j->cyc.data + (size_t)(i + c * lld) * j->itemsize;
}

/* The log of the modulus and the argument of an element of the job's type. */
static void polar(const job *j, const char *p, double *logabs, double *angle) {
  /* memcpy: the bytes are an element of the job's type, at any alignment. */
  float f[2] = {0, 0};
  double d[2] = {0, 0};
  if (j->k % 2 == 0)
    memcpy(f, p, j->itemsize);
  else
    memcpy(d, p, j->itemsize);
  double complex v = j->k % 2 == 0 ? CMPLX(f[0], f[1]) : CMPLX(d[0], d[1]);
  *logabs = log(cabs(v));
  *angle = carg(v);
}

/* This process's share of log|det| and of the phase of the factored cyclic
 * matrix: its diagonal entries, and a half turn for each row swap it made. */
static void det_share(const job *j, const int *ipiv, double share[2]) {
  for (int g = 0; g < j->n; ++g) {
    const char *p = diagonal_at(j, g);
    if (p == NULL) continue;
    double logabs, angle;
    polar(j, p, &logabs, &angle);
    share[0] += logabs;
    share[1] += angle;
    int64_t i = (int64_t)(g / j->nb / j->cg.nprow) * j->nb + g % j->nb;
    if (ipiv[i] != g + 1) share[1] += HALF_TURN;
  }
}

int mt_scalapack_slogdet(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                         int col_dim, int type, int64_t n, const void *a, double *out,
                         mt_error *err) {
  job j;
  int *ipiv = NULL, info = 0;
  /* Rows sharded alone: det(A) = det(A^T), whose LU on the turned grid is solve's. */
  int rc = row_dim >= 0 && col_dim < 0
               ? mt__sl_job_open_flipped(sl, mesh, row_dim, col_dim, type, n, a, 0, &j,
                                         err)
               : mt__sl_job_open(sl, mesh, row_dim, col_dim, type, n, n, a, &j, err);
  if (rc != MT_OK) return rc;
  rc = pivots(&j, &ipiv, err);
  if (rc == MT_OK) rc = mt__sl_lu(&j, ipiv, &info, err);
  if (rc == MT_OK) {
    double share[2] = {0, 0};
    det_share(&j, ipiv, share);
    int mpi = MT__LA_MPI("MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, share, 2,
                                                        MPI_DOUBLE, MPI_SUM, j.g.comm));
    rc = mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Allreduce");
    out[0] = share[0], out[1] = remainder(share[1], 2 * HALF_TURN);
  }
  free(ipiv);
  mt__sl_job_close(&j);
  return rc;
}

/* Zeroes the strict triangle of the cyclic matrix opposite `uplo`'s. */
static void zero_other_triangle(job *j, char uplo) {
  double zero[2] = {0, 0};
  int m = j->n - 1, two = 2;
  if (m < 1) return;
  if (uplo == 'L')
    j->t->laset("U", &m, &m, zero, zero, j->cyc.data, &j->one, &two, j->cyc.desc, 1);
  else
    j->t->laset("L", &m, &m, zero, zero, j->cyc.data, &two, &j->one, j->cyc.desc, 1);
}

int mt_scalapack_cholesky(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                          int col_dim, int type, int64_t n, void *a, int upper, int *info,
                          mt_error *err) {
  job j;
  int rc = mt__sl_job_open(sl, mesh, row_dim, col_dim, type, n, n, a, &j, err);
  if (rc != MT_OK) return rc;
  const char *uplo = upper ? "U" : "L";
  mt_watchdog_wait_begin(POTRF[j.k], 1);
  j.t->potrf(uplo, &j.n, j.cyc.data, &j.one, &j.one, j.cyc.desc, info, 1);
  mt_watchdog_wait_end();
  rc = mt__sl_agree_info(&j.g, info, err);
  if (rc == MT_OK && *info == 0) {
    zero_other_triangle(&j, *uplo);
    rc = job_back(&j, a, err);
  }
  mt__sl_job_close(&j);
  return rc;
}

/* The eigensolver on the cyclic matrix, all eigenvalues: with `jobz` "V" the
 * divide and conquer of pXsyevd or pXheevd (LAPACK's eigh's own method, and the
 * faster of ScaLAPACK's for every eigenvector), with "N" the MRRR of pXsyevr or
 * pXheevr (pXsyevd always forms the vectors). Z is described by `z`, workspaces of
 * `sizes` (work, rwork, iwork; -1 asks). */
static void eigh_call(job *j, const char *jobz, const char *uplo, void *w,
                      const mt__sl_matrix *z, void *work, void *rwork, int *iwork,
                      const int sizes[3], int *info) {
  double bound = 0;
  int m = 0, nz = 0, zero = 0, real = j->t->syevr != NULL;
  void *a = j->cyc.data, *zz = z->data;
  const int *da = j->cyc.desc, *dz = z->desc, *one = &j->one;
  mt_watchdog_wait_begin(*jobz == 'V' ? EVD[j->k] : EVR[j->k], 1);
  if (*jobz == 'V' && real)
    j->t->syevd(jobz, uplo, &j->n, a, one, one, da, w, zz, one, one, dz, work, &sizes[0],
                iwork, &sizes[2], info, 1, 1);
  else if (*jobz == 'V')
    j->t->heevd(jobz, uplo, &j->n, a, one, one, da, w, zz, one, one, dz, work, &sizes[0],
                rwork, &sizes[1], iwork, &sizes[2], info, 1, 1);
  else if (real)
    j->t->syevr(jobz, "A", uplo, &j->n, a, one, one, da, &bound, &bound, &zero, &zero, &m,
                &nz, w, zz, one, one, dz, work, &sizes[0], iwork, &sizes[2], info, 1, 1, 1);
  else
    j->t->heevr(jobz, "A", uplo, &j->n, a, one, one, da, &bound, &bound, &zero, &zero, &m,
                &nz, w, zz, one, one, dz, work, &sizes[0], rwork, &sizes[1], iwork,
                &sizes[2], info, 1, 1, 1);
  mt_watchdog_wait_end();
}

/* The workspace sizes the eigensolver asks for (work, rwork for the complex types,
 * iwork, in elements), with a margin of a few columns: some releases answer the
 * query short of what they use on grids where a process holds a short block. */
static void eigh_query(job *j, const char *jobz, const char *uplo, void *w,
                       const mt__sl_matrix *z, int sizes[3], int *info) {
  double wq[2] = {0, 0}, rq[2] = {0, 0};
  int iq[2] = {0, 0}, ask[3] = {-1, -1, -1};
  eigh_call(j, jobz, uplo, w, z, wq, rq, iq, ask, info);
  int64_t margin = 4 * (int64_t)j->n + 2 * (int64_t)j->nb * j->nb;
  float single = 0; /* what a complex64 query wrote: memcpy, the buffer is doubles */
  memcpy(&single, rq, sizeof single);
  int64_t real = (int64_t)(j->k == 2 ? (double)single : rq[0]);
  sizes[0] = (int)(mt__sl_query_size(j, wq) + margin);
  sizes[1] = (int)(real + 1 + margin);
  sizes[2] = (int)(iq[0] + 1 + margin);
}

/* Allocates the eigensolver's workspaces (and Z with `vectors`), agreed, then runs
 * it: the eigenvalues into `w`, the eigenvectors into `z`. */
static int eigh_solve(job *j, const char *uplo, int vectors, void *w, mt__sl_matrix *z,
                      int *info, mt_error *err) {
  int sizes[3], rc = MT_OK;
  void *work = NULL, *rwork = NULL, *iwork = NULL;
  const char *jobz = vectors ? "V" : "N";
  if (vectors)
    rc = mt__sl_matrix_init(j->sl, &j->cg, j->n, j->n, j->nb, j->nb, j->itemsize, NULL, z,
                            err);
  rc = mt__sl_agree(&j->g, rc, err);
  if (rc != MT_OK) return rc;
  /* Without vectors Z is never read: A's descriptor stands in for its own. */
  const mt__sl_matrix *zd = vectors ? z : &j->cyc;
  eigh_query(j, jobz, uplo, w, zd, sizes, info);
  size_t real = j->k % 2 == 0 ? sizeof(float) : sizeof(double);
  rc = mt__sl_alloc(j, &work, sizes[0], j->itemsize, err);
  if (rc == MT_OK) rc = mt__sl_alloc(j, &rwork, sizes[1], real, err);
  if (rc == MT_OK) rc = mt__sl_alloc(j, &iwork, sizes[2], sizeof(int), err);
  if (rc == MT_OK) {
    eigh_call(j, jobz, uplo, w, zd, work, rwork, iwork, sizes, info);
    rc = mt__sl_agree_info(&j->g, info, err);
  }
  free(work);
  free(rwork);
  free(iwork);
  return rc;
}

int mt_scalapack_eigh(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                      int type, int64_t n, void *a, int upper, int vectors, void *w,
                      int *info, mt_error *err) {
  job j;
  mt__sl_matrix z = {0};
  /* On the turned grid, as solve: pXsyevd's reduction to tridiagonal form sends
   * less along a process row on 1 x P than on P x 1. */
  int rc = mt__sl_job_open_turned(sl, mesh, row_dim, col_dim, type, n, n, a, &j, err);
  if (rc != MT_OK) return rc;
  rc = eigh_solve(&j, upper ? "U" : "L", vectors, w, &z, info, err);
  if (rc == MT_OK && *info == 0 && vectors)
    rc = mt__sl_cyclic_to_rows(&j, &j.cg, j.n, j.n, &z, a, err);
  mt__sl_matrix_free(&z);
  mt__sl_job_close(&j);
  return rc;
}
