/* The ScaLAPACK drivers of rectangular matrices: QR (pXgeqrf, then pXorgqr or
 * pXungqr for Q; or pXgeqrf's reflectors themselves) and the SVD (pXgesvd, its U
 * completed by the QR of U where a complete basis is asked for). Each runs on the square-block copy of the
 * caller's block and writes its factors into blocks the caller laid out as
 * torch.chunk's, rows over the grid's rows and columns over its columns. */
#include <stdlib.h>
#include <string.h>

#include "scalapack-private.h"

/* The routines' names, for the watchdog's report. */
static const char *const GEQRF[4] = MT__SL_NAMES(psgeqrf, pdgeqrf, pcgeqrf, pzgeqrf);
static const char *const ORGQR[4] = MT__SL_NAMES(psorgqr, pdorgqr, pcungqr, pzungqr);
static const char *const GESVD[4] = MT__SL_NAMES(psgesvd, pdgesvd, pcgesvd, pzgesvd);

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int min_int(int a, int b) { return a < b ? a : b; }

/* The leading m x n part of the cyclic `src` into the caller's blocks at `out`
 * (torch.chunk's, row-major). */
static int out_rows(mt__sl_job *j, const mt__sl_matrix *src, int64_t m, int64_t n,
                    void *out, mt_error *err) {
  return mt__sl_cyclic_to_rows(j, &j->g, m, n, src, out, err);
}

/* The routine's INFO agreed over the grid; a negative one (a rejected argument) is
 * a bug of ours, said as such. */
static int agreed_info(mt__sl_job *j, const char *routine, int *info, mt_error *err) {
  int rc = mt__sl_agree_info(&j->g, info, err);
  if (rc == MT_OK && *info < 0)
    rc = mt_error_set(err, MT_EINVAL, "%s rejected argument %d", routine, -*info);
  return rc;
}

/* pXgeqrf on the first `n` columns of `mat` (m x n, the job's blocks): the
 * reflectors below its diagonal, R on and above, the reflectors' scalars in `tau`. */
static int geqrf_on(mt__sl_job *j, mt__sl_matrix *mat, int n, void *tau, mt_error *err) {
  double wq[2] = {0, 0};
  int minus = -1, info = 0, lwork;
  void *work = NULL;
  mt_watchdog_wait_begin(GEQRF[j->k], 1);
  j->t->geqrf(&j->m, &n, mat->data, &j->one, &j->one, mat->desc, tau, wq, &minus, &info);
  mt_watchdog_wait_end();
  lwork = mt__sl_query_size(j, wq);
  int rc = mt__sl_alloc(j, &work, lwork, j->itemsize, err);
  if (rc == MT_OK) {
    mt_watchdog_wait_begin(GEQRF[j->k], 1);
    j->t->geqrf(&j->m, &n, mat->data, &j->one, &j->one, mat->desc, tau, work, &lwork,
                &info);
    mt_watchdog_wait_end();
    rc = agreed_info(j, "pXgeqrf", &info, err);
  }
  free(work);
  return rc;
}

/* The leading columns of the cyclic `src` into those of `dst`, a wider matrix on
 * the same grid in the same blocks: their local blocks match column for column. */
static void widen(const mt__sl_matrix *src, mt__sl_matrix *dst, size_t itemsize) {
  memcpy(dst->data, src->data, (size_t)(src->desc[8] * src->local_cols) * itemsize);
}

/* pXgeqrf on the cyclic copy. */
static int qr_factor(mt__sl_job *j, void *tau, mt_error *err) {
  return geqrf_on(j, &j->cyc, j->n, tau, err);
}

/* Zeroes the entries of this rank's block (row-major) of an m x n matrix that lie
 * below the global diagonal. */
static void zero_below_diagonal(const mt__sl_job *j, int64_t m, int64_t n, void *data) {
  int64_t mb = ceil_div(m, j->g.nprow), nb = ceil_div(n, j->g.npcol);
  int64_t row0 = j->g.myrow * mb, col0 = j->g.mycol * nb;
  int64_t rows = m - row0 < mb ? m - row0 : mb, cols = n - col0 < nb ? n - col0 : nb;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols && col0 + c < row0 + i; ++c)
      memset((char *)data + (size_t)(i * cols + c) * j->itemsize, 0, j->itemsize);
}

/* R: the first `rrows` rows of the factored copy, upper triangle, into the
 * caller's block at `r`. */
static int r_out(mt__sl_job *j, int64_t rrows, void *r, mt_error *err) {
  int rc = out_rows(j, &j->cyc, rrows, j->n, r, err);
  if (rc == MT_OK) zero_below_diagonal(j, rrows, j->n, r);
  return rc;
}

/* pXorgqr (pXungqr) on `src`, whose first `k` columns hold the reflectors: the
 * first `cols` columns of Q replace them. */
static int q_form(mt__sl_job *j, mt__sl_matrix *src, int cols, int k, const void *tau,
                  mt_error *err) {
  double wq[2] = {0, 0};
  int minus = -1, info = 0, lwork;
  void *work = NULL;
  mt_watchdog_wait_begin(ORGQR[j->k], 1);
  j->t->orgqr(&j->m, &cols, &k, src->data, &j->one, &j->one, src->desc, tau, wq, &minus,
              &info);
  mt_watchdog_wait_end();
  lwork = mt__sl_query_size(j, wq);
  int rc = mt__sl_alloc(j, &work, lwork, j->itemsize, err);
  if (rc == MT_OK) {
    mt_watchdog_wait_begin(ORGQR[j->k], 1);
    j->t->orgqr(&j->m, &cols, &k, src->data, &j->one, &j->one, src->desc, tau, work,
                &lwork, &info);
    mt_watchdog_wait_end();
    rc = agreed_info(j, "pXorgqr", &info, err);
  }
  free(work);
  return rc;
}

/* Q's first `qcols` columns into the caller's block at `q`: formed in the
 * factored copy itself, or, with more columns than A has, in a wider copy the
 * reflectors go to first (same blocks, so `tau` still fits it). */
static int q_out(mt__sl_job *j, const void *tau, int64_t qcols, void *q, mt_error *err) {
  mt__sl_matrix wide = {0}, *src = &j->cyc;
  int cols = (int)qcols, rc = MT_OK;
  if (cols > j->n) {
    rc = mt__sl_matrix_init(j->sl, &j->g, j->m, qcols, j->nb, j->nb, j->itemsize, NULL,
                            &wide, err);
    src = &wide;
  }
  rc = mt__sl_agree(&j->g, rc, err);
  if (rc == MT_OK && src == &wide)
    widen(&j->cyc, &wide, j->itemsize);
  if (rc == MT_OK) rc = q_form(j, src, cols, min_int(j->m, j->n), tau, err);
  if (rc == MT_OK) rc = out_rows(j, src, j->m, qcols, q, err);
  mt__sl_matrix_free(&wide);
  return rc;
}

int mt_scalapack_qr(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                    int type, int64_t m, int64_t n, const void *a, int64_t rrows,
                    void *r, int64_t qcols, void *q, mt_error *err) {
  mt__sl_job j;
  void *tau = NULL;
  int64_t k = m < n ? m : n;
  if (rrows < k || rrows > m || (q != NULL && (qcols < k || qcols > m)))
    return mt_error_set(err, MT_EINVAL, "a QR of a %lld x %lld matrix has no %lld-row R "
                        "or %lld-column Q", (long long)m, (long long)n, (long long)rrows,
                        (long long)qcols);
  int rc = mt__sl_job_open(sl, mesh, row_dim, col_dim, type, m, n, a, &j, err);
  if (rc != MT_OK) return rc;
  rc = mt__sl_alloc(&j, &tau, (m > n ? m : n) + j.nb, j.itemsize, err);
  if (rc == MT_OK) rc = qr_factor(&j, tau, err);
  if (rc == MT_OK) rc = r_out(&j, rrows, r, err);
  if (rc == MT_OK && q != NULL) rc = q_out(&j, tau, qcols, q, err);
  free(tau);
  mt__sl_job_close(&j);
  return rc;
}

/* The `k` scalars of the reflectors, from the cyclic copy's `tau` (each process
 * column holds those of its columns, alike on its process rows) into `out` on
 * every member: process row 0 places its own, and a sum over the grid fills in
 * the rest. */
static int tau_out(mt__sl_job *j, const void *tau, int k, void *out, mt_error *err) {
  size_t real = j->k % 2 == 0 ? sizeof(float) : sizeof(double);
  int parts = (int)(j->itemsize / real);
  memset(out, 0, (size_t)k * j->itemsize);
  if (j->g.myrow == 0) {
    int nb = j->nb, zero = 0;
    int local = j->sl->numroc(&k, &nb, &j->g.mycol, &zero, &j->g.npcol);
    for (int jj = 0; jj < local; ++jj) {
      int64_t global = (int64_t)(jj / nb) * nb * j->g.npcol + (int64_t)j->g.mycol * nb +
                       jj % nb;
      memcpy((char *)out + (size_t)global * j->itemsize,
             (const char *)tau + (size_t)jj * j->itemsize, j->itemsize);
    }
  }
  int mpi = MT__LA_MPI("MPI_Allreduce",
                       MPI_Allreduce(MPI_IN_PLACE, out, k * parts,
                                     real == sizeof(float) ? MPI_FLOAT : MPI_DOUBLE,
                                     MPI_SUM, j->g.comm));
  return mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Allreduce");
}

int mt_scalapack_geqrf(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                       int type, int64_t m, int64_t n, void *a, void *tau,
                       mt_error *err) {
  mt__sl_job j;
  void *local_tau = NULL;
  int rc = mt__sl_job_open(sl, mesh, row_dim, col_dim, type, m, n, a, &j, err);
  if (rc != MT_OK) return rc;
  rc = mt__sl_alloc(&j, &local_tau, (m > n ? m : n) + j.nb, j.itemsize, err);
  if (rc == MT_OK) rc = qr_factor(&j, local_tau, err);
  if (rc == MT_OK) rc = out_rows(&j, &j.cyc, m, n, a, err);
  if (rc == MT_OK) rc = tau_out(&j, local_tau, min_int(j.m, j.n), tau, err);
  free(local_tau);
  mt__sl_job_close(&j);
  return rc;
}

/* One call's singular vectors: U (m x k) and Vh (k x n), each in a square-block
 * copy, and the caller's blocks they go to (U's of `ucols` columns), or absent. */
typedef struct vectors {
  mt__sl_matrix ucyc, vcyc;
  void *u, *vt;
  int want_u, want_v, ucols;
} vectors;

static int vectors_open(mt__sl_job *j, void *u, int64_t ucols, void *vt, vectors *v,
                        mt_error *err) {
  int k = min_int(j->m, j->n), rc = MT_OK;
  memset(v, 0, sizeof *v);
  v->want_u = u != NULL, v->want_v = vt != NULL, v->ucols = (int)ucols;
  v->u = u, v->vt = vt;
  if (v->want_u)
    rc = mt__sl_matrix_init(j->sl, &j->g, j->m, k, j->nb, j->nb, j->itemsize, NULL,
                            &v->ucyc, err);
  if (rc == MT_OK && v->want_v)
    rc = mt__sl_matrix_init(j->sl, &j->g, k, j->n, j->nb, j->nb, j->itemsize, NULL,
                            &v->vcyc, err);
  return mt__sl_agree(&j->g, rc, err);
}

static void vectors_close(vectors *v) {
  mt__sl_matrix_free(&v->ucyc);
  mt__sl_matrix_free(&v->vcyc);
}

/* pXgesvd on the cyclic copy with workspaces of `lwork` (-1 asks) and, for the
 * complex types, `rwork`. A matrix not asked for is described by A's descriptor,
 * which the routine checks but never writes through. */
static void svd_call(mt__sl_job *j, vectors *v, void *s, void *work, int lwork,
                     void *rwork, int *info) {
  mt__sl_matrix *u = v->want_u ? &v->ucyc : &j->cyc, *vt = v->want_v ? &v->vcyc : &j->cyc;
  const char *jobu = v->want_u ? "V" : "N", *jobvt = v->want_v ? "V" : "N";
  mt_watchdog_wait_begin(GESVD[j->k], 1);
  if (j->t->gesvd != NULL)
    j->t->gesvd(jobu, jobvt, &j->m, &j->n, j->cyc.data, &j->one, &j->one, j->cyc.desc, s,
                u->data, &j->one, &j->one, u->desc, vt->data, &j->one, &j->one, vt->desc,
                work, &lwork, info, 1, 1);
  else
    j->t->cgesvd(jobu, jobvt, &j->m, &j->n, j->cyc.data, &j->one, &j->one, j->cyc.desc,
                 s, u->data, &j->one, &j->one, u->desc, vt->data, &j->one, &j->one,
                 vt->desc, work, &lwork, rwork, info, 1, 1);
  mt_watchdog_wait_end();
}

/* Queries, allocates (agreed) and runs pXgesvd. The query's answer gets a margin
 * of a few blocks: some releases answer short on grids with short last blocks. */
static int svd_run(mt__sl_job *j, vectors *v, void *s, int *info, mt_error *err) {
  double wq[2] = {0, 0}, rq[2] = {0, 0};
  void *work = NULL, *rwork = NULL;
  svd_call(j, v, s, wq, -1, rq, info);
  int64_t big = j->m > j->n ? j->m : j->n;
  int64_t lwork = mt__sl_query_size(j, wq) + 4 * big + 2 * (int64_t)j->nb * j->nb;
  size_t real = j->k % 2 == 0 ? sizeof(float) : sizeof(double);
  int rc = lwork <= INT32_MAX ? MT_OK : mt_error_set(err, MT_EOVERFLOW, "workspace");
  if (rc == MT_OK) rc = mt__sl_alloc(j, &work, lwork, j->itemsize, err);
  if (rc == MT_OK) rc = mt__sl_alloc(j, &rwork, 1 + 4 * big + lwork, real, err);
  if (rc == MT_OK) {
    svd_call(j, v, s, work, (int)lwork, rwork, info);
    rc = agreed_info(j, "pXgesvd", info, err);
  }
  free(work);
  free(rwork);
  return rc;
}

/* U's `ucols` columns into the caller's block: the k = min(m, n) singular vectors
 * and, past them, an orthonormal basis of their complement, the columns past k of
 * the complete Q of U's own QR (pXgeqrf, then pXorgqr with `ucols` columns, in a
 * wider copy whose first k columns then take U back exactly). */
static int u_out(mt__sl_job *j, vectors *v, mt_error *err) {
  int k = min_int(j->m, j->n), cols = v->ucols;
  mt__sl_matrix wide = {0}, *src = &v->ucyc;
  void *tau = NULL;
  int rc = MT_OK;
  if (cols > k) {
    rc = mt__sl_matrix_init(j->sl, &j->g, j->m, cols, j->nb, j->nb, j->itemsize, NULL,
                            &wide, err);
    rc = mt__sl_agree(&j->g, rc, err);
    if (rc == MT_OK) rc = mt__sl_alloc(j, &tau, (int64_t)cols + j->nb, j->itemsize, err);
    if (rc == MT_OK) {
      widen(&v->ucyc, &wide, j->itemsize);
      rc = geqrf_on(j, &wide, k, tau, err);
    }
    if (rc == MT_OK) rc = q_form(j, &wide, cols, k, tau, err);
    if (rc == MT_OK)
      widen(&v->ucyc, &wide, j->itemsize);
    src = &wide;
  }
  if (rc == MT_OK) rc = out_rows(j, src, j->m, cols, v->u, err);
  free(tau);
  mt__sl_matrix_free(&wide);
  return rc;
}

int mt_scalapack_svd(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                     int type, int64_t m, int64_t n, const void *a, void *s, void *u,
                     int64_t ucols, void *vt, int *info, mt_error *err) {
  mt__sl_job j;
  vectors v;
  int64_t k = m < n ? m : n;
  if (u != NULL && (ucols < k || ucols > m))
    return mt_error_set(err, MT_EINVAL, "an SVD of a %lld x %lld matrix has no %lld-column "
                        "U", (long long)m, (long long)n, (long long)ucols);
  int rc = mt__sl_job_open(sl, mesh, row_dim, col_dim, type, m, n, a, &j, err);
  if (rc != MT_OK) return rc;
  rc = vectors_open(&j, u, ucols, vt, &v, err);
  if (rc == MT_OK) rc = svd_run(&j, &v, s, info, err);
  if (rc == MT_OK && *info == 0 && v.want_u) rc = u_out(&j, &v, err);
  if (rc == MT_OK && *info == 0 && v.want_v)
    rc = out_rows(&j, &v.vcyc, min_int(j.m, j.n), j.n, v.vt, err);
  vectors_close(&v);
  mt__sl_job_close(&j);
  return rc;
}
