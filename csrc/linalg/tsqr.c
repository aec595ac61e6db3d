/* TSQR as a butterfly (tsqr.h): the leaf factorization (chunk by chunk), the R factors
 * combined by recursive doubling among the largest power-of-two set of ranks (the
 * others folded in first and sent R last), and Q formed by applying the tree back down.
 *
 * Every rank of a pair computes the same tpqrt of the same two triangles (the lower
 * coordinate's on top), so both keep the combined R and the Householder block that
 * made it; the way down then needs no message: each rank applies the blocks of its
 * own path to the identity and keeps its half. Only a folded rank, which took no
 * part in the butterfly, receives its block of the tree's Q from its partner. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "linalg-private.h"
#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/counters.h"
#include "mpitensor/core/dtype.h"

enum { TAG = 4551, CHUNK_BYTES = 1 << 18, CHUNK_HEIGHT = 8, CHUNK_NB = 16 };

/* One call's state: the tree's shape seen from this rank, and its buffers. */
typedef struct tree {
  mt__lapack_ops ops;
  MPI_Comm comm;
  int me, size, p2, levels;
  int64_t n, nb, es, lwork, sent;
  int64_t chunk, chunks, leaf_nb; /* the leaf's rows per chunk, chunks, block size */
  char *tau, *work, *r, *other, *packed, *v, *t, *c, *below, *leaf_t;
} tree;

/* The node count of this rank's path: its butterfly levels and, last, its fold. */
static int nodes(const tree *s) {
  return s->levels + 1;
}

static void *v_of(const tree *s, int node) {
  return s->v + (size_t)node * (size_t)(s->n * s->n * s->es);
}

static void *t_of(const tree *s, int node) {
  return s->t + (size_t)node * (size_t)(s->nb * s->n * s->es);
}

/* The block factor of the leaf's chunk k (k >= 1). */
static void *leaf_t_of(const tree *s, int64_t k) {
  return s->leaf_t + (size_t)(k - 1) * (size_t)(s->leaf_nb * s->n * s->es);
}

static int64_t triangle(const tree *s) {
  return s->n * (s->n + 1) / 2 * s->es;
}

static void tree_free(tree *s) {
  free(s->tau), free(s->work), free(s->r), free(s->other), free(s->packed);
  free(s->v), free(s->t), free(s->c), free(s->below), free(s->leaf_t);
}

/* The leaf factors its block a chunk of rows at a time, each small enough to stay
 * in cache while it is factored: geqrf of the first, then each next one stacked
 * under R (tpqrt), a flat tree. One geqrf of the whole block would stream it from
 * memory once per reflector of each panel. Chunks are at least a few times as
 * tall as wide, so that the triangle each tpqrt carries adds little work. */
static void chunking(tree *s, int64_t m) {
  int64_t width = s->n * s->es, rows = width > 0 ? CHUNK_BYTES / width : 1;
  if (rows < CHUNK_HEIGHT * s->n) rows = CHUNK_HEIGHT * s->n;
  s->chunk = m < rows ? (m > 1 ? m : 1) : rows;
  s->chunks = (m + s->chunk - 1) / s->chunk;
  if (s->chunks < 1) s->chunks = 1;
  s->leaf_nb = s->n < CHUNK_NB ? s->n : CHUNK_NB;
}

/* The shape of the tree: p2 the largest power of two <= size, levels its log. */
static void tree_shape(tree *s) {
  s->p2 = 1, s->levels = 0;
  while (s->p2 * 2 <= s->size) s->p2 *= 2, s->levels++;
}

static int tree_alloc(tree *s, int64_t m, mt_error *err) {
  chunking(s, m);
  int rc = mt__lapack_lwork(&s->ops, s->chunk, s->n, &s->lwork, err);
  if (rc != MT_OK) return rc;
  size_t es = (size_t)s->es, nn = (size_t)(s->n * s->n) * es;
  size_t work = (size_t)(s->lwork > s->nb * s->n ? s->lwork : s->nb * s->n) * es;
  s->tau = calloc((size_t)s->n + 1, es), s->work = calloc(work + es, 1);
  s->r = calloc(nn + es, 1), s->other = calloc(nn + es, 1);
  s->packed = calloc((size_t)triangle(s) + es, 1);
  s->v = calloc((size_t)nodes(s) * nn + es, 1);
  s->t = calloc((size_t)nodes(s) * (size_t)(s->nb * s->n) * es + es, 1);
  s->c = calloc(nn + es, 1), s->below = calloc(nn + es, 1);
  s->leaf_t = calloc((size_t)((s->chunks - 1) * s->leaf_nb * s->n) * es + es, 1);
  if (!s->tau || !s->work || !s->r || !s->other || !s->packed || !s->v || !s->t ||
      !s->c || !s->below || !s->leaf_t) {
    return mt_error_set(err, MT_ENOMEM, "TSQR: out of memory for n = %lld",
                        (long long)s->n);
  }
  return MT_OK;
}

/* The upper triangle of the n x n column-major `full` into `packed`, column by
 * column, and back (zeros below the diagonal). */
static void pack(const tree *s, const char *full, char *packed) {
  size_t es = (size_t)s->es;
  for (int64_t j = 0; j < s->n; ++j) {
    memcpy(packed, full + (size_t)(j * s->n) * es, (size_t)(j + 1) * es);
    packed += (size_t)(j + 1) * es;
  }
}

static void unpack(const tree *s, const char *packed, char *full) {
  size_t es = (size_t)s->es;
  memset(full, 0, (size_t)(s->n * s->n) * es);
  for (int64_t j = 0; j < s->n; ++j) {
    memcpy(full + (size_t)(j * s->n) * es, packed, (size_t)(j + 1) * es);
    packed += (size_t)(j + 1) * es;
  }
}

/* The checks that need no other rank: sizes, strides, what fits MPI's and an
 * LP64 library's int. */
static int check_local(const tree *s, int64_t m, int64_t lda, int64_t ldr, const void *q,
                       int64_t ldq, mt_error *err) {
  int64_t n = s->n;
  if (n < 0 || m < n) {
    return mt_error_set(err, MT_EINVAL, "TSQR: every block needs at least as many rows "
                        "as columns; this rank has %lld x %lld", (long long)m,
                        (long long)n);
  }
  if (lda < (m > 1 ? m : 1) || ldr < (n > 1 ? n : 1) ||
      (q != NULL && ldq < (m > 1 ? m : 1))) {
    return mt_error_set(err, MT_EINVAL, "TSQR: a leading dimension is shorter than "
                        "its column");
  }
  int64_t limit = s->ops.ilp64 ? INT64_MAX : INT_MAX;
  if (lda > limit || ldq > limit || n * n > INT_MAX / s->es) {
    return mt_error_set(err, MT_EOVERFLOW, "TSQR: %lld x %lld is too large for the "
                        "LAPACK or MPI at hand", (long long)m, (long long)n);
  }
  return MT_OK;
}

/* Chunk k of the leaf (k >= 1) under R, which lies in a's first rows. */
static mt__pentagon chunk_of(const tree *s, int64_t m, void *a, int64_t lda,
                             int64_t k) {
  int64_t start = k * s->chunk, rows = m - start < s->chunk ? m - start : s->chunk;
  return (mt__pentagon){.m = rows, .n = s->n, .l = 0, .nb = s->leaf_nb, .a = a,
                        .b = (char *)a + (size_t)start * (size_t)s->es, .lda = lda,
                        .ldb = lda};
}

/* The leaf: this rank's block factored chunk by chunk (chunking), R its upper
 * triangle. */
static int leaf(tree *s, int64_t m, void *a, int64_t lda, mt_error *err) {
  int rc = mt__geqrf(&s->ops, s->chunk, s->n, a, lda, s->tau, s->work, s->lwork, err);
  for (int64_t k = 1; k < s->chunks && rc == MT_OK; ++k) {
    mt__pentagon p = chunk_of(s, m, a, lda, k);
    rc = mt__tpqrt(&s->ops, &p, leaf_t_of(s, k), s->work, err);
  }
  size_t es = (size_t)s->es;
  memset(s->r, 0, (size_t)(s->n * s->n) * es);
  for (int64_t j = 0; j < s->n; ++j) {
    memcpy(s->r + (size_t)(j * s->n) * es, (char *)a + (size_t)(j * lda) * es,
           (size_t)(j + 1) * es);
  }
  return rc;
}

static int mpi_status(int mrc, const char *what, mt_error *err) {
  return mrc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mrc, what);
}

/* One node: the triangle R over the received one (or under it, when this rank
 * holds the upper coordinate), into R and the node's V and T. */
static int combine(tree *s, int node, int mine_on_top, mt_error *err) {
  size_t nn = (size_t)(s->n * s->n * s->es);
  unpack(s, s->packed, s->other);
  memcpy(v_of(s, node), mine_on_top ? s->other : s->r, nn);
  if (!mine_on_top) memcpy(s->r, s->other, nn);
  mt__pentagon p = {.m = s->n, .n = s->n, .l = s->n, .nb = s->nb, .a = s->r,
                    .b = v_of(s, node), .lda = s->n, .ldb = s->n};
  return mt__tpqrt(&s->ops, &p, t_of(s, node), s->work, err);
}

/* The way up: the fold, the butterfly, R back to the folded ranks. A LAPACK
 * failure (only a wrong argument makes one, and those were checked) does not stop
 * the exchanges, so that no partner is left waiting; its status is returned. */
static int up(tree *s, mt_error *err) {
  int bytes = (int)triangle(s), rc = MT_OK, mrc = MPI_SUCCESS;
  int extra = s->me >= s->p2, folds = s->me + s->p2 < s->size;
  if (extra) {
    pack(s, s->r, s->packed);
    mrc = MT__LA_MPI("MPI_Send",
                     MPI_Send(s->packed, bytes, MPI_BYTE, s->me - s->p2, TAG, s->comm));
    s->sent += bytes;
    if (mrc == MPI_SUCCESS)
      mrc = MT__LA_MPI("MPI_Recv", MPI_Recv(s->packed, bytes, MPI_BYTE, s->me - s->p2,
                                            TAG, s->comm, MPI_STATUS_IGNORE));
    unpack(s, s->packed, s->r);
    return mpi_status(mrc, "MPI_Send/MPI_Recv", err);
  }
  if (folds) {
    mrc = MT__LA_MPI("MPI_Recv", MPI_Recv(s->packed, bytes, MPI_BYTE, s->me + s->p2,
                                          TAG, s->comm, MPI_STATUS_IGNORE));
    if (mrc != MPI_SUCCESS) return mpi_status(mrc, "MPI_Recv", err);
    rc = combine(s, s->levels, 1, err);
  }
  for (int j = 0; j < s->levels; ++j) {
    int partner = s->me ^ (1 << j);
    pack(s, s->r, s->other);
    mrc = MT__LA_MPI("MPI_Sendrecv",
                     MPI_Sendrecv(s->other, bytes, MPI_BYTE, partner, TAG, s->packed,
                                  bytes, MPI_BYTE, partner, TAG, s->comm,
                                  MPI_STATUS_IGNORE));
    if (mrc != MPI_SUCCESS) return mpi_status(mrc, "MPI_Sendrecv", err);
    s->sent += bytes;
    int rc2 = combine(s, j, !(s->me & (1 << j)), err);
    if (rc == MT_OK) rc = rc2;
  }
  if (folds) {
    pack(s, s->r, s->packed);
    mrc = MT__LA_MPI("MPI_Send",
                     MPI_Send(s->packed, bytes, MPI_BYTE, s->me + s->p2, TAG, s->comm));
    s->sent += bytes;
  }
  return rc != MT_OK ? rc : mpi_status(mrc, "MPI_Send", err);
}

/* c = the node's Q applied to [c; 0], keeping the half of this rank's side. */
static int descend(tree *s, int node, int keep_top, mt_error *err) {
  size_t nn = (size_t)(s->n * s->n * s->es);
  memset(s->below, 0, nn);
  mt__pentagon p = {.m = s->n, .n = s->n, .l = s->n, .nb = s->nb, .b = v_of(s, node),
                    .ldb = s->n};
  int rc = mt__tpmqrt(&s->ops, &p, t_of(s, node), s->c, s->n, s->below, s->n, s->work,
                      err);
  if (!keep_top) memcpy(s->c, s->below, nn);
  return rc;
}

static void identity(tree *s) {
  size_t es = (size_t)s->es;
  memset(s->c, 0, (size_t)(s->n * s->n) * es);
  for (int64_t i = 0; i < s->n; ++i) {
    /* 1 in the element's real part, whatever the type. */
    char *e = s->c + (size_t)(i * s->n + i) * es;
    if (s->ops.single) *(float *)(void *)e = 1.0f;
    else *(double *)(void *)e = 1.0;
  }
}

/* The way down: this rank's n x n block of the tree's Q into c. */
static int down(tree *s, mt_error *err) {
  int bytes = (int)(s->n * s->n * s->es), rc = MT_OK, mrc = MPI_SUCCESS;
  if (s->me >= s->p2) {
    mrc = MT__LA_MPI("MPI_Recv", MPI_Recv(s->c, bytes, MPI_BYTE, s->me - s->p2, TAG,
                                          s->comm, MPI_STATUS_IGNORE));
    return mpi_status(mrc, "MPI_Recv", err);
  }
  identity(s);
  for (int j = s->levels - 1; j >= 0; --j) {
    int rc2 = descend(s, j, !(s->me & (1 << j)), err);
    if (rc == MT_OK) rc = rc2;
  }
  if (s->me + s->p2 < s->size) {
    int rc2 = descend(s, s->levels, 1, err);
    if (rc == MT_OK) rc = rc2;
    mrc = MT__LA_MPI("MPI_Send",
                     MPI_Send(s->below, bytes, MPI_BYTE, s->me + s->p2, TAG, s->comm));
    s->sent += bytes;
  }
  return rc != MT_OK ? rc : mpi_status(mrc, "MPI_Send", err);
}

/* This rank's rows of Q: its reflectors applied to [c; 0], the leaf's chunks in
 * the reverse of their order, each chunk's rows of Q made while they are in cache. */
static int rows_of_q(tree *s, int64_t m, void *a, int64_t lda, void *q, int64_t ldq,
                     mt_error *err) {
  size_t es = (size_t)s->es;
  for (int64_t j = 0; j < s->n; ++j) {
    char *col = (char *)q + (size_t)(j * ldq) * es;
    memcpy(col, s->c + (size_t)(j * s->n) * es, (size_t)s->n * es);
  }
  int rc = MT_OK;
  for (int64_t k = s->chunks - 1; k >= 1 && rc == MT_OK; --k) {
    mt__pentagon p = chunk_of(s, m, a, lda, k);
    char *d = (char *)q + (size_t)(k * s->chunk) * es;
    for (int64_t j = 0; j < s->n; ++j)
      memset(d + (size_t)(j * ldq) * es, 0, (size_t)p.m * es);
    rc = mt__tpmqrt(&s->ops, &p, leaf_t_of(s, k), q, ldq, d, ldq, s->work, err);
  }
  for (int64_t j = 0; j < s->n; ++j) {
    char *col = (char *)q + (size_t)(j * ldq) * es;
    memset(col + (size_t)s->n * es, 0, (size_t)(s->chunk - s->n) * es);
  }
  if (rc != MT_OK) return rc;
  return mt__ormqr(&s->ops, s->chunk, s->n, a, lda, s->tau, q, ldq, s->work, s->lwork,
                   err);
}

/* Every member's verdict and the same n, dtype and Q request everywhere. */
static int agree(tree *s, int rc, int dtype, int want_q, mt_error *err) {
  int64_t v[6] = {s->n, -s->n, dtype, -dtype, want_q, -want_q};
  rc = mt_agree_comm(s->comm, rc, v, 6, err);
  if (rc != MT_OK) return rc;
  if (v[0] != -v[1] || v[2] != -v[3] || v[4] != -v[5]) {
    return mt_error_set(err, MT_EINVAL, "TSQR: the ranks passed different column "
                        "counts, element types or requests for Q");
  }
  return MT_OK;
}

static int prepare(tree *s, const mt_mesh *mesh, int dim, const mt_lapack *lapack,
                   int dtype, mt_error *err) {
  if (dim < 0 || dim >= mt_mesh_ndim(mesh)) {
    return mt_error_set(err, MT_EINDEX, "TSQR: mesh dim %d of a %d-D mesh", dim,
                        mt_mesh_ndim(mesh));
  }
  s->comm = mt_mesh_dim_comm(mesh, dim);
  if (s->comm == MPI_COMM_NULL)
    return mt_error_set(err, MT_ESTATE, "TSQR: this rank is not in the mesh");
  int mrc = MPI_Comm_rank(s->comm, &s->me);
  if (mrc == MPI_SUCCESS) mrc = MPI_Comm_size(s->comm, &s->size);
  if (mrc != MPI_SUCCESS) return mt_mpi_error(err, mrc, "MPI_Comm_rank");
  tree_shape(s);
  return lapack == NULL
             ? mt_error_set(err, MT_ENOTSUP, "TSQR: no LAPACK was handed in")
             : mt__lapack_ops_of(lapack, dtype, &s->ops, err);
}

/* The factorization once every rank agreed: leaf, up, R out, and Q when asked. */
static int factor(tree *s, const mt_mesh *mesh, int64_t m, void *a, int64_t lda,
                  void *r, int64_t ldr, void *q, int64_t ldq, mt_error *err) {
  int rc = leaf(s, m, a, lda, err);
  int rc2 = up(s, err);
  if (rc == MT_OK) rc = rc2;
  size_t es = (size_t)s->es;
  for (int64_t j = 0; j < s->n; ++j) {
    memcpy((char *)r + (size_t)(j * ldr) * es, s->r + (size_t)(j * s->n) * es,
           (size_t)s->n * es);
  }
  if (q != NULL) {
    rc2 = down(s, err);
    if (rc == MT_OK) rc = rc2;
    rc2 = rows_of_q(s, m, a, lda, q, ldq, err);
    if (rc == MT_OK) rc = rc2;
  }
  if (s->size > 1) mt_comm_count(mt_mesh_counters(mesh), MT_COLL_ALL_REDUCE, s->sent);
  return rc;
}

int mt_tsqr(const mt_mesh *mesh, int dim, const mt_lapack *lapack, int dtype, int64_t m,
            int64_t n, void *a, int64_t lda, void *r, int64_t ldr, void *q, int64_t ldq,
            mt_error *err) {
  tree s = {.comm = MPI_COMM_NULL, .n = n, .nb = n < 32 ? (n > 1 ? n : 1) : 32};
  int rc = prepare(&s, mesh, dim, lapack, dtype, err);
  if (rc != MT_OK && s.comm == MPI_COMM_NULL) return rc;
  s.es = s.ops.itemsize > 0 ? s.ops.itemsize : 1;
  if (rc == MT_OK) rc = check_local(&s, m, lda, ldr, q, ldq, err);
  if (rc == MT_OK && n > 0) rc = tree_alloc(&s, m, err);
  rc = agree(&s, rc, dtype, q != NULL, err);
  if (rc == MT_OK && n > 0) rc = factor(&s, mesh, m, a, lda, r, ldr, q, ldq, err);
  tree_free(&s);
  return rc;
}
