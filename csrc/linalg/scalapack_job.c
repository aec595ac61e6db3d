/* What every ScaLAPACK driver does around its routine: the checks every rank makes
 * alone, the grid and the square-block copy of the caller's blocks, and workspaces
 * allocated with the grid's agreement. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mpitensor/core/layout.h"
#include "scalapack-private.h"

/* Checks what every rank can check alone: the same verdict everywhere, before any
 * communication. */
static int check(const mt_scalapack *sl, int type, int64_t m, int64_t n, mt_error *err) {
  if (sl == NULL)
    return mt_error_set(err, MT_ENOTSUP, "ScaLAPACK is not loaded");
  if (mt__sl_type_index(type) < 0)
    return mt_error_set(err, MT_ETYPE, "ScaLAPACK has no element type '%c'", type);
  if (m < 1 || n < 1)
    return mt_error_set(err, MT_EINVAL,
                        "the matrix is %lld x %lld; ScaLAPACK wants both sizes >= 1",
                        (long long)m, (long long)n);
  return MT_OK;
}

/* The grid of the cyclic copy: the caller's, or with `turn` a P x 1 grid's
 * transpose when the copy is not the caller's block itself. The same verdict on
 * every member: the grid's shape and the sizes decide it. */
static int cyclic_grid(mt__sl_job *j, mt_mesh *mesh, int row_dim, int turn, int64_t m,
                       int64_t n, mt_error *err) {
  j->cg = j->g;
  if (!turn || j->g.npcol != 1 || j->g.nprow < 2 || mt__sl_square_block(&j->g, m, n) > 0)
    return MT_OK;
  int rc = mt__sl_grid_open(j->sl, mesh, -1, row_dim, &j->cg, err);
  j->turned = rc == MT_OK;
  if (rc != MT_OK) {
    j->cg = j->g;
    return rc;
  }
  /* Caching cg may have dropped g, the oldest grid of a full cache: opened again,
   * g is made anew in the next oldest's place, never cg's. */
  return j->g.cached ? mt__sl_grid_open(j->sl, mesh, row_dim, -1, &j->g, err) : MT_OK;
}

/* The copy the routine runs on, agreed on: in the caller's own blocks when they
 * are square, so that no rank sends anything. */
static int describe(mt__sl_job *j, int64_t m, int64_t n, mt_error *err) {
  int64_t square = mt__sl_square_block(&j->g, m, n);
  int64_t nb = square > 0 ? square : mt__sl_cyclic_block(&j->cg, m, n);
  j->nb = (int)nb;
  int rc =
      mt__sl_matrix_init(j->sl, &j->cg, m, n, nb, nb, j->itemsize, NULL, &j->cyc, err);
  return mt__sl_agree(&j->g, rc, err);
}

/* The head of every mt__sl_job_open*: the local checks, the job's type and the
 * caller's grid g. */
static int job_begin(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                     int type, int64_t m, int64_t n, mt__sl_job *j, mt_error *err) {
  int rc = check(sl, type, m, n, err);
  if (rc != MT_OK) return rc;
  memset(j, 0, sizeof *j);
  j->sl = sl, j->k = mt__sl_type_index(type), j->t = &sl->typed[j->k];
  j->itemsize = mt__sl_itemsize[j->k], j->one = 1;
  return mt__sl_grid_open(sl, mesh, row_dim, col_dim, &j->g, err);
}

/* The tail of every mt__sl_job_open*, its grids open: the copy described and
 * filled from `a` (with its transpose when `flip`), or the job closed. */
static int job_fill(mt__sl_job *j, int64_t m, int64_t n, const void *a, int flip,
                    mt_error *err) {
  int rc = describe(j, m, n, err);
  if (rc == MT_OK)
    rc = flip ? mt__sl_rows_to_cyclic_flipped(j, &j->cg, m, n, a, &j->cyc, err)
              : mt__sl_rows_to_cyclic(j, &j->cg, m, n, a, &j->cyc, err);
  if (rc != MT_OK) {
    mt__sl_job_close(j);
    return rc;
  }
  j->m = (int)m, j->n = (int)n;
  return MT_OK;
}

/* mt__sl_job_open, the copy on a turned grid with `turn`. */
static int job_open(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                    int type, int64_t m, int64_t n, const void *a, int turn,
                    mt__sl_job *j, mt_error *err) {
  int rc = job_begin(sl, mesh, row_dim, col_dim, type, m, n, j, err);
  if (rc != MT_OK) return rc;
  rc = cyclic_grid(j, mesh, row_dim, turn, m, n, err);
  if (rc != MT_OK) {
    if (j->turned) mt__sl_grid_close(sl, &j->cg);
    mt__sl_grid_close(sl, &j->g);
    return rc;
  }
  return job_fill(j, m, n, a, 0, err);
}

int mt__sl_job_open(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                    int type, int64_t m, int64_t n, const void *a, mt__sl_job *j,
                    mt_error *err) {
  return job_open(sl, mesh, row_dim, col_dim, type, m, n, a, 0, j, err);
}

int mt__sl_job_open_turned(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                           int col_dim, int type, int64_t m, int64_t n, const void *a,
                           mt__sl_job *j, mt_error *err) {
  return job_open(sl, mesh, row_dim, col_dim, type, m, n, a, 1, j, err);
}

/* Whether blocks of nb dealt round np processes give each exactly the rows of
 * its torch.chunk block of n. */
static int deals_chunks(const mt_scalapack *sl, int n, int nb, int np) {
  int zero = 0;
  for (int p = 0; p < np; ++p) {
    int64_t rows = 0, at = 0;
    mt_chunk(n, np, p, &rows, &at);
    if (sl->numroc(&n, &nb, &p, &zero, &np) != rows) return 0;
  }
  return 1;
}

/* The block of a relabelled copy on the turned grid of j: the one nearest the
 * block-cyclic copies' own that deals each process its caller's rows, else 0.
 * The block of ceil(n/P) always does, but balances an LU only when small. */
static int64_t relabel_block(const mt__sl_job *j, int64_t n) {
  if (j->t->lgetrf == NULL || n > INT_MAX) return 0;
  int np = j->cg.npcol, want = (int)mt__sl_cyclic_block(&j->cg, n, n);
  for (int d = 0; d <= want / 2; ++d)
    for (int s = -1; s <= 1; s += 2) {
      int nb = want + s * d;
      if ((d > 0 || s < 0) && deals_chunks(j->sl, (int)n, nb, np)) return nb;
    }
  int64_t block = (n + np - 1) / np;
  return block <= MT__SL_LOCAL_BLOCK ? block : 0;
}

/* The tail of a relabelled mt__sl_job_open_flipped: the caller's rows, columns of
 * A^T column-major already, are this process's columns of the copy as they lie. */
static int relabelled_fill(mt__sl_job *j, int64_t n, int64_t nb, const void *a,
                           mt_error *err) {
  j->nb = (int)nb;
  int rc = mt__sl_matrix_init(j->sl, &j->cg, n, n, nb, nb, j->itemsize, NULL, &j->cyc,
                              err);
  rc = mt__sl_agree(&j->g, rc, err);
  if (rc != MT_OK) {
    mt__sl_job_close(j);
    return rc;
  }
  memcpy(j->cyc.data, a, (size_t)(n * j->cyc.local_cols) * j->itemsize);
  j->m = (int)n, j->n = (int)n, j->relabelled = 1;
  return MT_OK;
}

int mt__sl_job_open_flipped(const mt_scalapack *sl, mt_mesh *mesh, int row_dim,
                            int col_dim, int type, int64_t n, const void *a,
                            int relabel, mt__sl_job *j, mt_error *err) {
  if (row_dim >= 0 && col_dim >= 0)
    return mt_error_set(err, MT_EINVAL, "a flipped copy wants one row or column of "
                                        "processes");
  int rc = job_begin(sl, mesh, row_dim, col_dim, type, n, n, j, err);
  if (rc != MT_OK) return rc;
  rc = mt__sl_grid_open(sl, mesh, col_dim, row_dim, &j->cg, err);
  j->turned = rc == MT_OK;
  /* Caching cg may have dropped g (see cyclic_grid). */
  if (rc == MT_OK && j->g.cached)
    rc = mt__sl_grid_open(sl, mesh, row_dim, col_dim, &j->g, err);
  if (rc != MT_OK) {
    mt__sl_job_close(j);
    return rc;
  }
  int64_t nb = relabel ? relabel_block(j, n) : 0;
  if (nb > 0) return relabelled_fill(j, n, nb, a, err);
  /* The caller's blocks turned are square ones of the turned grid. */
  return job_fill(j, n, n, a, 1, err);
}

void mt__sl_job_close(mt__sl_job *j) {
  mt__sl_matrix_free(&j->cyc);
  if (j->turned) mt__sl_grid_close(j->sl, &j->cg);
  mt__sl_grid_close(j->sl, &j->g);
}

int mt__sl_alloc(mt__sl_job *j, void **out, int64_t count, size_t size, mt_error *err) {
  *out = count <= INT32_MAX ? malloc((size_t)(count > 1 ? count : 1) * size) : NULL;
  int rc = *out != NULL ? MT_OK : mt_error_set(err, MT_ENOMEM, "out of memory");
  return mt__sl_agree(&j->g, rc, err);
}

int mt__sl_query_size(const mt__sl_job *j, const void *work) {
  double v = j->k % 2 == 0 ? (double)*(const float *)work : *(const double *)work;
  return (int)v + 1;
}
