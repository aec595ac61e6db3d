/* distribute_tensor: from a whole tensor on the mesh's first rank to every rank's
 * box. Shard dims are scattered first, among the ranks that hold the source's
 * replica, then Replicate dims are broadcast, so no rank receives data it does not
 * keep and no byte is scattered twice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm-private.h"
#include "count-private.h"
#include "mpi-types-private.h"
#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/distribute.h"
#include "mpitensor/comm/pool.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/pack.h"

typedef struct dist_ctx {
  mt_mesh *mesh;
  int64_t coord[MT_MAX_MESH_NDIM];
  int64_t itemsize;
  int64_t src; /* the source's coordinate on every mesh dim */
  int dtype;
} dist_ctx;

static void my_box(const dist_ctx *c, const mt_layout *l, int m, int64_t k, mt_box *out) {
  mt__box_at(l, c->coord, m, k, out);
}

/* True when this rank's coordinate is the source's on every mesh dim in
 * [from, ndim) that `want_shard` selects (shard dims, or non-shard dims). */
static int zero_after(const dist_ctx *c, const mt_layout *l, int from, int want_shard) {
  for (int m = from; m < l->mesh_ndim; ++m) {
    int is_shard = l->placements[m].kind == MT_PLACEMENT_SHARD;
    if (is_shard == want_shard && c->coord[m] != c->src) return 0;
  }
  return 1;
}

/* Root side of one scatter: each member's box of `to`, consecutive in member order,
 * from the root's box of `from`; packed into `*staging` unless they are slabs. */
static int scatter_send(const dist_ctx *c, const mt_layout *from, const mt_layout *to,
                        int m, const void *in, const int64_t *counts, const char **send,
                        char **staging, mt_error *err) {
  mt_box fb;
  my_box(c, from, -1, 0, &fb);
  int64_t lead = 1, g = mt_mesh_dim_size(c->mesh, m), off = 0;
  for (int i = 0; i < to->placements[m].dim; ++i) lead *= fb.shape[i];
  *send = in;
  if (lead == 1) return MT_OK;
  *staging = mt_pool_alloc((size_t)(mt_box_numel(&fb) * c->itemsize));
  if (*staging == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM];
  for (int64_t k = 0; k < g; ++k) {
    mt_box b;
    my_box(c, to, m, k, &b);
    if (counts[k] == 0) continue;
    for (int i = 0; i < b.ndim; ++i) at[i] = b.offset[i] - fb.offset[i];
    mt_copy_box(in, fb.shape, at, *staging + off, b.shape, zero, &b, c->itemsize);
    off += counts[k];
  }
  *send = *staging;
  return MT_OK;
}

/* Bytes and byte offsets of every member's block, in member order. */
static void scatter_bytes(const dist_ctx *c, const mt_layout *to, int m, int64_t *bytes) {
  int64_t g = mt_mesh_dim_size(c->mesh, m), off = 0;
  for (int64_t k = 0; k < g; ++k) {
    mt_box b;
    my_box(c, to, m, k, &b);
    bytes[k] = mt_box_numel(&b) * c->itemsize;
    bytes[g + k] = off;
    off += bytes[k];
  }
}

/* MPI_Scatterv from the source's coordinate along `m`, in the largest unit that
 * keeps every count an int; counts one scatter with the bytes the root sent. */
static int scatterv(const dist_ctx *c, int m, const char *send, const int64_t *bytes,
                    void *out, mt_error *err) {
  int64_t g = mt_mesh_dim_size(c->mesh, m), unit = 1, sent = 0;
  MPI_Datatype type;
  int *ints = calloc((size_t)(2 * g), sizeof *ints);
  if (ints == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  int rc = mt__byte_unit(bytes, 2 * g, &type, &unit, err);
  for (int64_t i = 0; rc == MT_OK && i < 2 * g; ++i) ints[i] = (int)(bytes[i] / unit);
  if (rc == MT_OK) {
    int mpi = MT__BLOCKING("MPI_Scatterv",
                           MPI_Scatterv(send, ints, ints + g, type, out, ints[c->coord[m]],
                                        type, (int)c->src, mt_mesh_dim_comm(c->mesh, m)));
    if (mpi != MPI_SUCCESS) rc = mt_mpi_error(err, mpi, "MPI_Scatterv");
    if (type != MPI_BYTE) MPI_Type_free(&type);
  }
  for (int64_t k = 0; rc == MT_OK && c->coord[m] == c->src && k < g; ++k)
    sent += k == c->src ? 0 : bytes[k];
  if (rc == MT_OK) mt__count(c->mesh, MT_COLL_SCATTER, sent);
  free(ints);
  return rc;
}

static int scatter_step(const dist_ctx *c, const mt_layout *from, const mt_layout *to,
                        int m, const void *in, void *out, mt_error *err) {
  int64_t g = mt_mesh_dim_size(c->mesh, m);
  int64_t *bytes = calloc((size_t)(2 * g), sizeof *bytes);
  char *staging = NULL;
  const char *send = NULL;
  if (bytes == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  scatter_bytes(c, to, m, bytes);
  int rc = MT_OK;
  if (g == 1) {
    /* One rank: nothing to cut, nothing to send. An empty box may come with NULL
     * buffers, which mt_copy_bytes never touches for 0 bytes. */
    mt_copy_bytes(out, in, bytes[0]);
  } else {
    if (c->coord[m] == c->src)
      rc = scatter_send(c, from, to, m, in, bytes, &send, &staging, err);
    if (rc == MT_OK) rc = scatterv(c, m, send, bytes, out, err);
  }
  mt_pool_free(staging);
  free(bytes);
  return rc;
}

/* Phase 1: scatter along each Shard mesh dim in order. Before the step on mesh dim
 * m the data lies in the layout where dims < m that shard are applied and all
 * others replicate; only ranks at coordinate 0 on the later shard dims and on all
 * non-shard dims hold it. Returns the buffer with this rank's final box: `local`,
 * or `full` when nothing is sharded. */
static int scatter_phase(const dist_ctx *c, const mt_layout *layout, const void *full,
                         void *local, mt_error *err) {
  mt_layout cur = *layout;
  for (int m = 0; m < cur.mesh_ndim; ++m) cur.placements[m].kind = MT_PLACEMENT_REPLICATE;
  int last = -1;
  for (int m = 0; m < layout->mesh_ndim; ++m) {
    if (layout->placements[m].kind == MT_PLACEMENT_SHARD) last = m;
  }
  const void *in = full;
  char *owned = NULL;
  int rc = MT_OK;
  for (int m = 0; m <= last && rc == MT_OK; ++m) {
    if (layout->placements[m].kind != MT_PLACEMENT_SHARD) continue;
    mt_layout next = cur;
    next.placements[m] = layout->placements[m];
    if (zero_after(c, layout, m + 1, 1) && zero_after(c, layout, 0, 0)) {
      mt_box b;
      my_box(c, &next, -1, 0, &b);
      size_t bytes = (size_t)(mt_box_numel(&b) * c->itemsize);
      char *out = m == last ? local : mt_pool_alloc(bytes);
      if (out == NULL && bytes > 0) rc = mt_error_set(err, MT_ENOMEM, "out of memory");
      if (rc == MT_OK) rc = scatter_step(c, &cur, &next, m, in, out, err);
      mt_pool_free(owned);
      owned = m == last ? NULL : out;
      in = out;
    }
    cur = next;
  }
  mt_pool_free(owned);
  if (rc == MT_OK && last < 0) {
    mt_box b;
    my_box(c, layout, -1, 0, &b);
    mt_copy_bytes(local, full, mt_box_numel(&b) * c->itemsize);
  }
  return rc;
}

/* The bytes of 1 in `dtype`, in native byte order (no endianness assumed). */
static void one_of(int dtype, unsigned char *out) {
  const uint16_t half = 0x3C00, bf16 = 0x3F80;
  const float f[2] = {1.0f, 0.0f};
  const double d[2] = {1.0, 0.0};
  const uint8_t i8 = 1;
  const uint16_t i16 = 1;
  const uint32_t i32 = 1;
  const uint64_t i64 = 1;
  size_t n = mt_dtype_size(dtype);
  const void *src = n == 1 ? (const void *)&i8
                  : n == 2 ? (const void *)&i16
                  : n == 4 ? (const void *)&i32
                           : (const void *)&i64;
  if (dtype == MT_DTYPE_FLOAT16) src = &half;
  if (dtype == MT_DTYPE_BFLOAT16) src = &bf16;
  if (dtype == MT_DTYPE_FLOAT32 || dtype == MT_DTYPE_COMPLEX64) src = f;
  if (dtype == MT_DTYPE_FLOAT64 || dtype == MT_DTYPE_COMPLEX128) src = d;
  memcpy(out, src, n);
}

static void fill_one(void *buf, int64_t n, int dtype) {
  unsigned char one[16];
  size_t size = mt_dtype_size(dtype);
  one_of(dtype, one);
  for (int64_t i = 0; i < n; ++i) memcpy((char *)buf + (size_t)i * size, one, size);
}

/* Phase 2: every non-shard mesh dim in order: broadcast from the source's
 * coordinate, except that a Partial(sum|product) dim gives the other coordinates
 * the identity. */
static int spread_phase(const dist_ctx *c, const mt_layout *layout, void *local,
                        mt_error *err) {
  mt_box b;
  my_box(c, layout, -1, 0, &b);
  int64_t n = mt_box_numel(&b);
  int rc = MT_OK;
  for (int m = 0; m < layout->mesh_ndim && rc == MT_OK; ++m) {
    mt_placement p = layout->placements[m];
    if (p.kind == MT_PLACEMENT_SHARD || !zero_after(c, layout, m + 1, 0)) continue;
    int identity = p.kind == MT_PLACEMENT_PARTIAL &&
                   (p.reduce_op == MT_REDUCE_SUM || p.reduce_op == MT_REDUCE_PRODUCT);
    if (!identity) {
      rc = mt_mesh_bcast_from(c->mesh, m, c->src, local, n * c->itemsize, err);
    } else if (c->coord[m] != c->src && p.reduce_op == MT_REDUCE_SUM) {
      memset(local, 0, (size_t)(n * c->itemsize));
    } else if (c->coord[m] != c->src) {
      fill_one(local, n, c->dtype);
    }
  }
  return rc;
}

/* Every member passed the same global shape, dtype, placements and source, and could
 * allocate its box (`local` not NULL): else each would cut the source by its own
 * shape and the scatter would pair counts that differ (garbage on one rank,
 * MPI_ERR_TRUNCATE on another), or one rank would leave the others waiting. */
static int agree_on_source(const dist_ctx *c, const mt_layout *l, const void *local,
                           mt_error *err) {
  mt_box b;
  my_box(c, l, -1, 0, &b);
  int64_t bytes = mt_box_numel(&b) * c->itemsize;
  mt_error e = {0};
  int rc = MT_OK;
  if (local == NULL && bytes > 0) {
    rc = mt_error_set(&e, MT_ENOMEM,
                      "distribute_tensor: a rank of the mesh could not allocate its "
                      "shard of %lld bytes",
                      (long long)bytes);
  } else {
    int n = snprintf(e.msg, sizeof e.msg,
                     "distribute_tensor: the ranks of the mesh passed arrays of "
                     "different shapes or dtypes, or different placements (the first "
                     "rank's: shape (");
    for (int i = 0; i < l->ndim && n > 0 && (size_t)n < sizeof e.msg; ++i) {
      n += snprintf(e.msg + n, sizeof e.msg - (size_t)n, "%s%lld", i ? ", " : "",
                    (long long)l->shape[i]);
    }
    if (n > 0 && (size_t)n < sizeof e.msg) {
      snprintf(e.msg + n, sizeof e.msg - (size_t)n,
               "), %lld-byte elements), or a different src_data_rank; every rank "
               "must pass the same global tensor",
               (long long)c->itemsize);
    }
  }
  uint64_t h = mt__layout_fnv(mt__fnv1a(MT__FNV_START, &c->dtype, sizeof c->dtype), l);
  h = mt__fnv1a(h, &c->src, sizeof c->src);
  rc = mt_agree(c->mesh, rc, h, &e);
  if (rc != MT_OK && err != NULL) *err = e;
  return rc;
}

int mt_distribute(mt_mesh *mesh, const mt_layout *layout, int dtype, const void *full,
                  void *local, mt_error *err) {
  return mt_distribute_from(mesh, layout, dtype, 0, full, local, err);
}

int mt_distribute_from(mt_mesh *mesh, const mt_layout *layout, int dtype, int64_t src,
                       const void *full, void *local, mt_error *err) {
  dist_ctx c = {.mesh = mesh, .dtype = dtype, .src = src};
  c.itemsize = (int64_t)mt_dtype_size(dtype);
  if (c.itemsize == 0)
    return mt_error_set(err, MT_ETYPE, "unknown dtype code %d", dtype);
  if (layout->mesh_ndim != mt_mesh_ndim(mesh)) {
    return mt_error_set(err, MT_EINVAL, "a %d-D layout on a %d-D mesh",
                        layout->mesh_ndim, mt_mesh_ndim(mesh));
  }
  for (int m = 0; m < layout->mesh_ndim; ++m) {
    if (layout->mesh_shape[m] != mt_mesh_dim_size(mesh, m)) {
      return mt_error_set(err, MT_EINVAL,
                          "the layout's mesh shape differs from the mesh's");
    }
    if (src < 0 || src >= layout->mesh_shape[m]) {
      return mt_error_set(err, MT_EINDEX,
                          "src_data_rank %lld is not a coordinate of mesh dim %d "
                          "(size %lld)", (long long)src, m,
                          (long long)layout->mesh_shape[m]);
    }
  }
  if (!mt_mesh_coordinate(mesh, c.coord)) {
    return mt_error_set(err, MT_ESTATE, "this rank is not a member of the mesh");
  }
  int rc = agree_on_source(&c, layout, local, err);
  if (rc == MT_OK) rc = scatter_phase(&c, layout, full, local, err);
  return rc == MT_OK ? spread_phase(&c, layout, local, err) : rc;
}
