/* BLACS process grids over a mesh's members and the descriptors of matrices on
 * them: how a sharded DTensor's local blocks are described to ScaLAPACK. */
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/pool.h"
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

/* Makes the grid: the split, its BLACS handle and context. */
static int grid_make(const mt_scalapack *sl, mt_mesh *mesh, int row_dim, int col_dim,
                     mt__sl_grid *g, mt_error *err) {
  g->comm = MPI_COMM_NULL;
  g->cached = 0;
  int rc = split(mesh, row_dim, col_dim, g, err);
  if (rc != MT_OK) return rc;
  g->handle = sl->sys2blacs(g->comm);
  g->ctxt = g->handle;
  mt_watchdog_wait_begin("BLACS's Cblacs_gridinit", 1);
  sl->gridinit(&g->ctxt, "R", g->nprow, g->npcol);
  mt_watchdog_wait_end();
  int nprow, npcol;
  sl->gridinfo(g->ctxt, &nprow, &npcol, &g->myrow, &g->mycol);
  return MT_OK;
}

static void grid_free(const mt_scalapack *sl, mt__sl_grid *g) {
  mt_watchdog_wait_begin("BLACS's Cblacs_gridexit", 1);
  sl->gridexit(g->ctxt);
  mt_watchdog_wait_end();
  sl->free_handle(g->handle);
  if (g->comm != MPI_COMM_NULL) MPI_Comm_free(&g->comm);
}

/* The grids one mesh keeps: few, since a program uses one or two layouts of its
 * matrices per mesh. */
#define CACHED_GRIDS 4

typedef struct cached {
  int ndim, row_dim, col_dim;
  int64_t shape[MT_MAX_MESH_NDIM];
  mt__sl_grid g;
} cached;

typedef struct cache {
  mt_scalapack *sl;
  int count, oldest;
  cached grids[CACHED_GRIDS];
} cache;

struct mt__sl_life {
  atomic_int caches; /* caches alive on some communicator */
  atomic_int closed; /* mt_scalapack_close was called */
  atomic_flag freed; /* set by whoever frees the table */
  /* the table's own freeing (scalapack_table.c), handed in so that the files
   * call each other one way only */
  void (*free_table)(mt_scalapack *sl);
};

/* Frees the table once it is closed and no cache is left, exactly once. */
static void release_table(mt_scalapack *sl) {
  mt__sl_life *life = sl->life;
  if (atomic_load(&life->closed) && atomic_load(&life->caches) == 0 &&
      !atomic_flag_test_and_set(&life->freed))
    life->free_table(sl);
}

/* MPI's delete callback of the cache attribute: the communicator is being freed. */
static int cache_delete(MPI_Comm comm, int keyval, void *value, void *extra) {
  (void)comm, (void)keyval, (void)extra;
  cache *c = value;
  mt_scalapack *sl = c->sl;
  for (int i = 0; i < c->count; ++i) grid_free(sl, &c->grids[i].g);
  free(c);
  atomic_fetch_sub(&sl->life->caches, 1);
  release_table(sl);
  return MPI_SUCCESS;
}

int mt__sl_caches_open(mt_scalapack *sl, void (*free_table)(mt_scalapack *sl),
                       mt_error *err) {
  sl->life = calloc(1, sizeof *sl->life);
  if (sl->life == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  sl->life->free_table = free_table;
  atomic_flag_clear(&sl->life->freed);
  int init = 0;
  MPI_Initialized(&init);
  if (!init) return MT_OK;
  int mpi = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, cache_delete, &sl->keyval, NULL);
  return mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Comm_create_keyval");
}

int mt__sl_caches_close(mt_scalapack *sl) {
  if (sl->life == NULL) return 1;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (sl->keyval != MPI_KEYVAL_INVALID && !finalized) MPI_Comm_free_keyval(&sl->keyval);
  atomic_store(&sl->life->closed, 1);
  return atomic_load(&sl->life->caches) == 0 &&
         !atomic_flag_test_and_set(&sl->life->freed);
}

/* The mesh communicator's cache, attached on first use (agreed over the mesh:
 * every member attaches one or none). */
static int cache_of(const mt_scalapack *sl, MPI_Comm all, cache **out, mt_error *err) {
  int found = 0;
  int mpi = MPI_Comm_get_attr(all, sl->keyval, out, &found);
  if (mpi != MPI_SUCCESS) return mt_mpi_error(err, mpi, "MPI_Comm_get_attr");
  if (found) return MT_OK;
  cache *c = calloc(1, sizeof *c);
  int rc = c != NULL ? MT_OK : mt_error_set(err, MT_ENOMEM, "out of memory");
  rc = mt_agree_comm(all, rc, NULL, 0, err);
  if (rc != MT_OK || c == NULL) {
    free(c);
    return rc != MT_OK ? rc : MT_ENOMEM;
  }
  c->sl = (mt_scalapack *)sl; /* the callback releases the table: not const there */
  mpi = MPI_Comm_set_attr(all, sl->keyval, c);
  if (mpi != MPI_SUCCESS) {
    free(c);
    return mt_mpi_error(err, mpi, "MPI_Comm_set_attr");
  }
  atomic_fetch_add(&sl->life->caches, 1);
  *out = c;
  return MT_OK;
}

/* Whether `e` is the grid of those dims on a mesh of that shape. */
static int same_grid(const cached *e, mt_mesh *mesh, int row_dim, int col_dim) {
  if (e->ndim != mt_mesh_ndim(mesh) || e->row_dim != row_dim || e->col_dim != col_dim)
    return 0;
  for (int d = 0; d < e->ndim; ++d)
    if (e->shape[d] != mt_mesh_dim_size(mesh, d)) return 0;
  return 1;
}

/* A new grid into the cache, in the oldest grid's place when it is full. */
static int cache_add(cache *c, mt_mesh *mesh, int row_dim, int col_dim, mt__sl_grid *g,
                     mt_error *err) {
  int slot = c->count < CACHED_GRIDS ? c->count : c->oldest;
  cached *e = &c->grids[slot];
  if (c->count == CACHED_GRIDS) {
    grid_free(c->sl, &e->g);
    c->oldest = (c->oldest + 1) % CACHED_GRIDS;
  } else {
    c->count++;
  }
  int rc = grid_make(c->sl, mesh, row_dim, col_dim, &e->g, err);
  if (rc != MT_OK) {
    /* The slot is empty now: move the last grid into it. */
    c->grids[slot] = c->grids[--c->count];
    c->oldest = 0;
    return rc;
  }
  e->ndim = mt_mesh_ndim(mesh), e->row_dim = row_dim, e->col_dim = col_dim;
  for (int d = 0; d < e->ndim; ++d) e->shape[d] = mt_mesh_dim_size(mesh, d);
  e->g.cached = 1;
  *g = e->g;
  return MT_OK;
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
  if (sl->keyval == MPI_KEYVAL_INVALID) return grid_make(sl, mesh, row_dim, col_dim, g, err);
  MPI_Comm all;
  cache *c = NULL;
  int rc = mt_mesh_comm(mesh, &all, err);
  if (rc == MT_OK) rc = cache_of(sl, all, &c, err);
  if (rc != MT_OK) return rc;
  for (int i = 0; i < c->count; ++i)
    if (same_grid(&c->grids[i], mesh, row_dim, col_dim)) {
      *g = c->grids[i].g;
      return MT_OK;
    }
  return cache_add(c, mesh, row_dim, col_dim, g, err);
}

void mt__sl_grid_close(const mt_scalapack *sl, mt__sl_grid *g) {
  if (!g->cached) grid_free(sl, g);
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
    /* From the block pool, as the executor's buffers: a matrix of the size the
     * last call used is handed out again instead of being faulted in anew, and
     * a large one lies on huge pages. */
    size_t count = (size_t)(lld * (out->local_cols > 0 ? out->local_cols : 1));
    out->data = mt_pool_calloc(count, itemsize);
    if (out->data == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  return MT_OK;
}

void mt__sl_matrix_free(mt__sl_matrix *mat) {
  if (mat->owned) mt_pool_free(mat->data);
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
  return block <= MT__SL_LOCAL_BLOCK ? block : 0;
}

int mt__sl_agree(const mt__sl_grid *g, int status, mt_error *err) {
  return mt_agree_comm(g->comm, status, NULL, 0, err);
}

int mt__sl_agree_info(const mt__sl_grid *g, int *info, mt_error *err) {
  int mpi = MT__LA_MPI("MPI_Allreduce",
                       MPI_Allreduce(MPI_IN_PLACE, info, 1, MPI_INT, MPI_MAX, g->comm));
  return mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Allreduce");
}

int mt_scalapack_cached_grids(const mt_scalapack *sl, mt_mesh *mesh) {
  MPI_Comm all;
  cache *c = NULL;
  int found = 0;
  mt_error err = {0};
  if (sl == NULL || sl->keyval == MPI_KEYVAL_INVALID ||
      mt_mesh_comm(mesh, &all, &err) != MT_OK)
    return 0;
  if (MPI_Comm_get_attr(all, sl->keyval, &c, &found) != MPI_SUCCESS || !found) return 0;
  return c->count;
}

int mt_scalapack_cached_meshes(const mt_scalapack *sl) {
  return sl != NULL && sl->life != NULL ? atomic_load(&sl->life->caches) : 0;
}
