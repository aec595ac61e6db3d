/* BLACS process grids over a mesh's members and the descriptors of matrices on
 * them: how a sharded DTensor's local blocks are described to ScaLAPACK. */
#include <limits.h>
#include <stdlib.h>

#include "mpitensor/comm/agree.h"
#include "scalapack-private.h"

/* The grid's communicator: the members sharing their coordinates outside
 * row_dim and col_dim, ranked row-major by (row coordinate, column coordinate). */
static int split(mt_mesh *mesh, int row_dim, int col_dim, mt__sl_grid *g,
                 mt_error *err) {
  int64_t coord[MT_MAX_MESH_NDIM];
  MPI_Comm all;
  int rc = mt_mesh_comm(mesh, &all, err);
  if (rc != MT_OK) return rc;
  if (!mt_mesh_coordinate(mesh, coord))
    return mt_error_set(err, MT_ESTATE, "this rank is not in the mesh");
  int64_t color = 0, row = row_dim >= 0 ? coord[row_dim] : 0;
  int64_t col = col_dim >= 0 ? coord[col_dim] : 0;
  for (int d = 0; d < mt_mesh_ndim(mesh); ++d)
    if (d != row_dim && d != col_dim) color = color * mt_mesh_dim_size(mesh, d) + coord[d];
  g->nprow = row_dim >= 0 ? (int)mt_mesh_dim_size(mesh, row_dim) : 1;
  g->npcol = col_dim >= 0 ? (int)mt_mesh_dim_size(mesh, col_dim) : 1;
  int mpi = MPI_Comm_split(all, (int)color, (int)(row * g->npcol + col), &g->comm);
  return mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Comm_split");
}

int mt__sl_grid_open(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                     mt__sl_grid *g, mt_error *err) {
  int ndim = mt_mesh_ndim(mesh);
  if (row_dim < -1 || row_dim >= ndim || col_dim < -1 || col_dim >= ndim ||
      (row_dim == col_dim && row_dim >= 0))
    return mt_error_set(err, MT_EINVAL,
                        "rows on mesh dim %d and columns on %d: a %d-dim mesh has no such "
                        "grid",
                        row_dim, col_dim, ndim);
  g->comm = MPI_COMM_NULL;
  int rc = split(mesh, row_dim, col_dim, g, err);
  if (rc != MT_OK) return rc;
  g->handle = sl->sys2blacs(g->comm);
  g->ctxt = g->handle;
  sl->gridinit(&g->ctxt, "R", g->nprow, g->npcol);
  int nprow, npcol;
  sl->gridinfo(g->ctxt, &nprow, &npcol, &g->myrow, &g->mycol);
  return MT_OK;
}

void mt__sl_grid_close(const mt_scalapack *sl, mt__sl_grid *g) {
  sl->gridexit(g->ctxt);
  sl->free_handle(g->handle);
  if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
}

/* Whether each of `n` sizes fits Fortran's INTEGER. */
static int fits(const int64_t *sizes, int n) {
  for (int i = 0; i < n; ++i)
    if (sizes[i] < 0 || sizes[i] > INT_MAX) return 0;
  return 1;
}

int mt__sl_matrix_init(const mt_scalapack *sl, const mt__sl_grid *g, int64_t m,
                       int64_t n, int64_t mb, int64_t nb, size_t itemsize, void *data,
                       mt__sl_matrix *out, mt_error *err) {
  int64_t sizes[4] = {m, n, mb, nb};
  if (!fits(sizes, 4))
    return mt_error_set(err, MT_EOVERFLOW, "a %lld x %lld matrix is past ScaLAPACK's sizes",
                        (long long)m, (long long)n);
  int im = (int)m, in = (int)n, imb = (int)mb, inb = (int)nb, zero = 0, info = 0;
  out->local_rows = sl->numroc(&im, &imb, &g->myrow, &zero, &g->nprow);
  out->local_cols = sl->numroc(&in, &inb, &g->mycol, &zero, &g->npcol);
  int64_t lld = out->local_rows > 1 ? out->local_rows : 1;
  if (lld > INT_MAX || (out->local_cols > 0 && lld > INT64_MAX / out->local_cols))
    return mt_error_set(err, MT_EOVERFLOW, "a local block is past ScaLAPACK's sizes");
  int illd = (int)lld;
  sl->descinit(out->desc, &im, &in, &imb, &inb, &zero, &zero, &g->ctxt, &illd, &info);
  if (info != 0)
    return mt_error_set(err, MT_EINVAL, "descinit rejected argument %d", -info);
  out->owned = data == NULL;
  out->data = data;
  if (data == NULL) {
    size_t count = (size_t)(lld * (out->local_cols > 0 ? out->local_cols : 1));
    out->data = calloc(count, itemsize);
    if (out->data == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  return MT_OK;
}

void mt__sl_matrix_free(mt__sl_matrix *mat) {
  if (mat->owned) free(mat->data);
  mat->data = NULL;
  mat->owned = 0;
}

int64_t mt__sl_cyclic_block(const mt__sl_grid *g, int64_t m, int64_t n) {
  int64_t p = g->nprow > g->npcol ? g->nprow : g->npcol, big = m > n ? m : n;
  int64_t nb = (big + p - 1) / p;
  /* Blocks of 64 keep the level-3 BLAS busy while every process gets work. */
  if (nb > 64) nb = 64;
  return nb < 1 ? 1 : nb;
}

int64_t mt__sl_square_block(const mt__sl_grid *g, int64_t m, int64_t n) {
  int64_t mb = (m + g->nprow - 1) / g->nprow, nb = (n + g->npcol - 1) / g->npcol;
  int64_t block = g->npcol == 1 ? mb : g->nprow == 1 ? nb : mb == nb ? mb : 0;
  return block <= MT__SL_IN_PLACE_BLOCK ? block : 0;
}

int mt__sl_agree(const mt__sl_grid *g, int status, mt_error *err) {
  return mt_agree_comm(g->comm, status, NULL, 0, err);
}

int mt__sl_agree_info(const mt__sl_grid *g, int *info, mt_error *err) {
  int mpi = MPI_Allreduce(MPI_IN_PLACE, info, 1, MPI_INT, MPI_MAX, g->comm);
  return mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Allreduce");
}
