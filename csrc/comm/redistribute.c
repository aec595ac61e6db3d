/* The plan executor: runs each step of a redistribution plan with one MPI call.
 *
 * Every step has a start and a finish. Blocking execution calls the blocking MPI
 * collective in start and has nothing to wait for; asynchronous execution calls
 * the nonblocking one and waits before finish. Finish does the local work that
 * follows the collective: unpacking a staging buffer, dividing an average. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm-private.h"
#include "mpi-types-private.h"
#include "mpitensor/dtype.h"
#include "mpitensor/pack.h"
#include "mpitensor/pool.h"

typedef struct exec_ctx {
  mt_mesh *mesh;
  int64_t coord[MT_MAX_MESH_NDIM];
  int dtype;
  int64_t itemsize;
  int nonblocking;
} exec_ctx;

/* Everything a started step owns until it finishes. */
typedef struct pending {
  MPI_Request req;
  const mt_step *step;
  const void *in;
  void *out;
  char *staging;
  int *ints;            /* counts and displacements of v/w collectives */
  MPI_Datatype *types;  /* subarray types of an all-to-all-w */
  int ntypes;
  MPI_Datatype unit;    /* element of a v-collective's counts (MPI_BYTE or bigger) */
  int64_t unit_bytes;
  int64_t group;        /* group size, for averages */
} pending;

struct mt_request {
  exec_ctx ctx;
  const mt_plan *plan;
  int next;        /* index of the step after the pending one */
  pending p;
  const void *src;
  void *dst;
  char *tmp_in;    /* intermediate buffers owned by the request */
  char *tmp_out;
};

static void pending_init(pending *p, const mt_step *s, const void *in, void *out) {
  memset(p, 0, sizeof *p);
  p->req = MPI_REQUEST_NULL;
  p->unit = MPI_BYTE;
  p->unit_bytes = 1;
  p->step = s;
  p->in = in;
  p->out = out;
}

static void pending_free(pending *p) {
  for (int i = 0; i < p->ntypes; ++i) {
    if (p->types[i] != MPI_BYTE) MPI_Type_free(&p->types[i]);
  }
  free(p->types);
  if (p->unit != MPI_BYTE) MPI_Type_free(&p->unit);
  p->unit = MPI_BYTE;
  free(p->ints);
  mt_pool_free(p->staging);
  p->types = NULL, p->ints = NULL, p->staging = NULL, p->ntypes = 0;
}

static void box_at(const exec_ctx *c, const mt_layout *l, int m, int64_t k, mt_box *out) {
  mt__box_at(l, c->coord, m, k, out);
}

static int64_t leading(const mt_box *b, int d) {
  int64_t n = 1;
  for (int i = 0; i < d; ++i) n *= b->shape[i];
  return n;
}

static int fits_int(int64_t v, mt_error *err) {
  if (v <= INT_MAX) return 1;
  mt__fail(err, MT_EOVERFLOW, "a message of %lld units exceeds MPI's int count; "
           "such sizes are not supported by this step yet", (long long)v);
  return 0;
}

static int shard_dim(const mt_layout *l, int m) { return l->placements[m].dim; }

static MPI_Comm dim_comm(const exec_ctx *c, int m) { return mt_mesh_dim_comm(c->mesh, m); }

/* ---- all-gather: Shard(d) -> Replicate on one mesh dim ------------------------ */

/* Counts and displacements in bytes of each member's block in the gathered box;
 * blocks are consecutive slabs when every dim before d has extent 1. */
static int gather_layout(const exec_ctx *c, const mt_step *s, pending *p, mt_error *err) {
  int m = s->mesh_dim;
  int64_t g = mt_mesh_dim_size(c->mesh, m), off = 0;
  int64_t *bytes = calloc((size_t)(2 * g), sizeof *bytes);
  p->ints = malloc((size_t)(2 * g) * sizeof *p->ints);
  if (bytes == NULL || p->ints == NULL) {
    free(bytes);
    return mt__fail(err, MT_ENOMEM, "out of memory");
  }
  for (int64_t k = 0; k < g; ++k) {
    mt_box b;
    box_at(c, &s->src, m, k, &b);
    bytes[k] = mt_box_numel(&b) * c->itemsize;
    bytes[g + k] = off;
    off += bytes[k];
  }
  int rc = mt__byte_unit(bytes, 2 * g, &p->unit, &p->unit_bytes, err);
  for (int64_t i = 0; rc == MT_OK && i < 2 * g; ++i) p->ints[i] = (int)(bytes[i] / p->unit_bytes);
  free(bytes);
  p->group = g;
  return rc;
}

static int start_allgather(const exec_ctx *c, pending *p, mt_error *err) {
  const mt_step *s = p->step;
  int m = s->mesh_dim, rc = gather_layout(c, s, p, err);
  if (rc != MT_OK) return rc;
  mt_box t;
  box_at(c, &s->dst, -1, 0, &t);
  void *recv = p->out;
  if (leading(&t, shard_dim(&s->src, m)) != 1) {
    p->staging = mt_pool_alloc((size_t)(mt_box_numel(&t) * c->itemsize));
    if (p->staging == NULL) return mt__fail(err, MT_ENOMEM, "out of memory");
    recv = p->staging;
  }
  int64_t g = p->group;
  int mine = p->ints[c->coord[m]];
  if (c->nonblocking) {
    MT__MPI_TRY(MPI_Iallgatherv(p->in, mine, p->unit, recv, p->ints, p->ints + g,
                                p->unit, dim_comm(c, m), &p->req), "MPI_Iallgatherv");
  } else {
    MT__MPI_TRY(MPI_Allgatherv(p->in, mine, p->unit, recv, p->ints, p->ints + g,
                               p->unit, dim_comm(c, m)), "MPI_Allgatherv");
  }
  mt__count(MT_COLL_ALL_GATHER, (int64_t)mine * p->unit_bytes * (g - 1));
  return MT_OK;
}

/* Blocks gathered along an inner dim arrive one after another; each goes to its
 * place in the output box. */
static int finish_allgather(const exec_ctx *c, pending *p, mt_error *err) {
  (void)err;
  if (p->staging == NULL) return MT_OK;
  const mt_step *s = p->step;
  mt_box t;
  box_at(c, &s->dst, -1, 0, &t);
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM];
  for (int64_t k = 0; k < p->group; ++k) {
    mt_box b;
    box_at(c, &s->src, s->mesh_dim, k, &b);
    for (int i = 0; i < t.ndim; ++i) at[i] = b.offset[i] - t.offset[i];
    if (mt_box_numel(&b) == 0) continue;
    mt_copy_box(p->staging + p->ints[p->group + k] * p->unit_bytes, b.shape, zero, p->out,
                t.shape, at, &b, c->itemsize);
  }
  return MT_OK;
}

/* ---- all-to-all and direct exchange: one MPI_Alltoallw with subarray types ---- */

/* A datatype that picks `part` out of the C-contiguous array holding `whole`. */
static int subarray(const mt_box *whole, const mt_box *part, MPI_Datatype elem,
                    MPI_Datatype *out, mt_error *err) {
  int sizes[MT_MAX_NDIM], sub[MT_MAX_NDIM], starts[MT_MAX_NDIM];
  for (int i = 0; i < whole->ndim; ++i) {
    if (!fits_int(whole->shape[i], err)) return MT_EOVERFLOW;
    sizes[i] = (int)whole->shape[i];
    sub[i] = (int)part->shape[i];
    starts[i] = (int)(part->offset[i] - whole->offset[i]);
  }
  if (whole->ndim == 0) {
    MT__MPI_TRY(MPI_Type_dup(elem, out), "MPI_Type_dup");
  } else {
    MT__MPI_TRY(MPI_Type_create_subarray(whole->ndim, sizes, sub, starts, MPI_ORDER_C,
                                         elem, out), "MPI_Type_create_subarray");
  }
  MT__MPI_TRY(MPI_Type_commit(out), "MPI_Type_commit");
  return MT_OK;
}

/* The group of this rank's g peers: along mesh dim m, or the whole mesh when m < 0
 * (g being the size of that dim or of the mesh). Peer q of the comm is mesh
 * position lin[q]; every one of the g is written. */
static int exchange_comm(const exec_ctx *c, int m, int64_t g, MPI_Comm *comm,
                         int64_t *lin, int *me, mt_error *err) {
  int nd = mt_mesh_ndim(c->mesh);
  for (int64_t q = 0; q < g; ++q) {
    int64_t l = 0;
    for (int d = 0; d < nd; ++d) {
      int64_t x = m < 0 ? 0 : (d == m ? q : c->coord[d]);
      l = l * mt_mesh_dim_size(c->mesh, d) + x;
    }
    lin[q] = m < 0 ? q : l;
  }
  *me = m >= 0 ? (int)c->coord[m] : 0;
  if (m >= 0) {
    *comm = dim_comm(c, m);
    return MT_OK;
  }
  for (int d = 0; d < nd; ++d) *me = *me * (int)mt_mesh_dim_size(c->mesh, d) + (int)c->coord[d];
  return mt__mesh_flat_comm(c->mesh, comm, err);
}

static int64_t mesh_numel(const mt_mesh *mesh) {
  int64_t n = 1;
  for (int d = 0; d < mt_mesh_ndim(mesh); ++d) n *= mt_mesh_dim_size(mesh, d);
  return n;
}

/* Builds counts (1 or 0), zero displacements and subarray types for every peer,
 * and copies the part this rank keeps. Returns the bytes sent to other ranks. */
static int exchange_types(const exec_ctx *c, pending *p, const mt_box *sb,
                          const mt_box *tb, const mt_box *send, const mt_box *recv,
                          const int64_t *lin, int g, int me, int64_t *sent,
                          mt_error *err) {
  MPI_Datatype elem;
  MT__MPI_TRY(MPI_Type_contiguous((int)c->itemsize, MPI_BYTE, &elem), "MPI_Type_contiguous");
  int rc = MT_OK;
  *sent = 0;
  for (int q = 0; q < g && rc == MT_OK; ++q) {
    const mt_box *out = &send[lin[q]], *in = &recv[lin[q]];
    int has_out = q != me && mt_box_numel(out) > 0, has_in = q != me && mt_box_numel(in) > 0;
    p->ints[q] = has_out, p->ints[2 * g + q] = has_in;
    if (has_out) rc = subarray(sb, out, elem, &p->types[q], err);
    if (rc == MT_OK && has_in) rc = subarray(tb, in, elem, &p->types[g + q], err);
    if (has_out) *sent += mt_box_numel(out) * c->itemsize;
  }
  MPI_Type_free(&elem);
  const mt_box *keep = &recv[lin[me]];
  if (rc == MT_OK && mt_box_numel(keep) > 0) {
    int64_t from[MT_MAX_NDIM], to[MT_MAX_NDIM];
    for (int i = 0; i < keep->ndim; ++i) {
      from[i] = keep->offset[i] - sb->offset[i];
      to[i] = keep->offset[i] - tb->offset[i];
    }
    mt_copy_box(p->in, sb->shape, from, p->out, tb->shape, to, keep, c->itemsize);
  }
  return rc;
}

static int alloc_exchange(pending *p, int g, mt_error *err) {
  p->ints = calloc(4 * (size_t)g, sizeof *p->ints);
  p->types = malloc(2 * (size_t)g * sizeof(MPI_Datatype));
  if (p->ints == NULL || p->types == NULL) return mt__fail(err, MT_ENOMEM, "out of memory");
  p->ntypes = 2 * g;
  for (int i = 0; i < 2 * g; ++i) p->types[i] = MPI_BYTE;
  return MT_OK;
}

static int post_alltoallw(const exec_ctx *c, pending *p, MPI_Comm comm, int g,
                          mt_error *err) {
  int *scounts = p->ints, *sdispls = p->ints + g, *rcounts = p->ints + 2 * (size_t)g;
  int *rdispls = p->ints + 3 * (size_t)g;
  MPI_Datatype *stypes = p->types, *rtypes = p->types + g;
  if (c->nonblocking) {
    MT__MPI_TRY(MPI_Ialltoallw(p->in, scounts, sdispls, stypes, p->out, rcounts, rdispls,
                               rtypes, comm, &p->req), "MPI_Ialltoallw");
  } else {
    MT__MPI_TRY(MPI_Alltoallw(p->in, scounts, sdispls, stypes, p->out, rcounts, rdispls,
                              rtypes, comm), "MPI_Alltoallw");
  }
  return MT_OK;
}

static int start_exchange(const exec_ctx *c, pending *p, mt_error *err) {
  int64_t n = mesh_numel(c->mesh), sent = 0;
  mt_box *boxes = malloc((size_t)(2 * n) * sizeof *boxes);
  int64_t *lin = malloc((size_t)n * sizeof *lin);
  if (boxes == NULL || lin == NULL) {
    free(boxes);
    free(lin);
    return mt__fail(err, MT_ENOMEM, "out of memory");
  }
  MPI_Comm comm = MPI_COMM_NULL;
  int me = 0, m = p->step->mesh_dim;
  int g = (int)(m >= 0 ? mt_mesh_dim_size(c->mesh, m) : n);
  int rc = exchange_comm(c, m, g, &comm, lin, &me, err);
  if (rc == MT_OK) rc = mt_exchange_boxes(&p->step->src, &p->step->dst, m, c->coord, n,
                                          boxes, boxes + n, err);
  mt_box sb, tb;
  box_at(c, &p->step->src, -1, 0, &sb);
  box_at(c, &p->step->dst, -1, 0, &tb);
  if (rc == MT_OK) rc = alloc_exchange(p, g, err);
  if (rc == MT_OK)
    rc = exchange_types(c, p, &sb, &tb, boxes, boxes + n, lin, g, me, &sent, err);
  if (rc == MT_OK) rc = post_alltoallw(c, p, comm, g, err);
  if (rc == MT_OK) mt__count(MT_COLL_ALL_TO_ALL, sent);
  free(boxes);
  free(lin);
  return rc;
}

/* ---- chunk: Replicate -> Shard(d), a local copy ------------------------------ */

static int run_chunk(const exec_ctx *c, pending *p) {
  mt_box sb, tb;
  box_at(c, &p->step->src, -1, 0, &sb);
  box_at(c, &p->step->dst, -1, 0, &tb);
  if (mt_box_numel(&tb) == 0) return MT_OK;
  int64_t from[MT_MAX_NDIM], zero[MT_MAX_NDIM] = {0};
  for (int i = 0; i < tb.ndim; ++i) from[i] = tb.offset[i] - sb.offset[i];
  mt_copy_box(p->in, sb.shape, from, p->out, tb.shape, zero, &tb, c->itemsize);
  return MT_OK;
}

/* ---- all-reduce and reduce-scatter: Partial(op) -> Replicate / Shard(d) ------ */

static int partial_op(const mt_step *s) { return s->src.placements[s->mesh_dim].reduce_op; }

/* This rank's share of the ring model's 2 (G - 1) buffers for its group of G: each
 * rank receives 2 (G - 1) / G of the buffer; the remainder of that division goes to
 * the lowest coordinates, so the group's counts sum to the plan's step bytes. */
static int64_t ring_share(const exec_ctx *c, int m, int64_t nbytes, int64_t group) {
  int64_t total = 2 * (group - 1) * nbytes;
  return total / group + (c->coord[m] < total % group);
}

/* Counts above INT_MAX elements are reduced in rounds of blocking calls (also
 * under async_op: a round needs the previous one's buffers free). */
static int allreduce_rounds(const exec_ctx *c, pending *p, int64_t n, MPI_Datatype type,
                            MPI_Op op, MPI_Comm comm, mt_error *err) {
  const int64_t round = (int64_t)1 << 30;
  for (int64_t at = 0; at < n; at += round) {
    int64_t k = n - at < round ? n - at : round;
    const char *in = (const char *)p->in + at * c->itemsize;
    char *out = (char *)p->out + at * c->itemsize;
    MT__MPI_TRY(MPI_Allreduce(in, out, (int)k, type, op, comm), "MPI_Allreduce");
  }
  return MT_OK;
}

static int start_allreduce(const exec_ctx *c, pending *p, mt_error *err) {
  const mt_step *s = p->step;
  int m = s->mesh_dim;
  MPI_Datatype type;
  MPI_Op op;
  int rc = mt__reduce_type(c->dtype, partial_op(s), &type, &op, err);
  if (rc != MT_OK) return rc;
  mt_box sb;
  box_at(c, &s->src, -1, 0, &sb);
  int64_t n = mt_box_numel(&sb);
  p->group = mt_mesh_dim_size(c->mesh, m);
  if (n > INT_MAX) {
    rc = allreduce_rounds(c, p, n, type, op, dim_comm(c, m), err);
  } else if (c->nonblocking) {
    MT__MPI_TRY(MPI_Iallreduce(p->in, p->out, (int)n, type, op, dim_comm(c, m), &p->req),
                "MPI_Iallreduce");
  } else {
    MT__MPI_TRY(MPI_Allreduce(p->in, p->out, (int)n, type, op, dim_comm(c, m)),
                "MPI_Allreduce");
  }
  if (rc == MT_OK) mt__count(MT_COLL_ALL_REDUCE, ring_share(c, m, n * c->itemsize, p->group));
  return rc;
}

/* Each member's part of the reduced box, consecutive in member order: the input
 * itself when the parts are slabs, else a packed staging copy. */
static int scatter_input(const exec_ctx *c, pending *p, const void **send, mt_error *err) {
  const mt_step *s = p->step;
  int m = s->mesh_dim;
  mt_box sb;
  box_at(c, &s->src, -1, 0, &sb);
  *send = p->in;
  if (leading(&sb, shard_dim(&s->dst, m)) == 1) return MT_OK;
  p->staging = mt_pool_alloc((size_t)(mt_box_numel(&sb) * c->itemsize));
  if (p->staging == NULL) return mt__fail(err, MT_ENOMEM, "out of memory");
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM], off = 0;
  for (int64_t k = 0; k < p->group; ++k) {
    mt_box b;
    box_at(c, &s->dst, m, k, &b);
    if (mt_box_numel(&b) == 0) continue;
    for (int i = 0; i < b.ndim; ++i) at[i] = b.offset[i] - sb.offset[i];
    mt_copy_box(p->in, sb.shape, at, p->staging + off, b.shape, zero, &b, c->itemsize);
    off += mt_box_numel(&b) * c->itemsize;
  }
  *send = p->staging;
  return MT_OK;
}

/* Each member's element count; *big is set when one exceeds an int. */
static int scatter_counts(const exec_ctx *c, pending *p, int64_t *counts, int *big,
                          mt_error *err) {
  p->ints = malloc((size_t)p->group * sizeof *p->ints);
  if (p->ints == NULL) return mt__fail(err, MT_ENOMEM, "out of memory");
  *big = 0;
  for (int64_t k = 0; k < p->group; ++k) {
    mt_box b;
    box_at(c, &p->step->dst, p->step->mesh_dim, k, &b);
    counts[k] = mt_box_numel(&b);
    *big |= counts[k] > INT_MAX;
    p->ints[k] = (int)(counts[k] > INT_MAX ? 0 : counts[k]);
  }
  return MT_OK;
}

/* Blocks above INT_MAX elements are reduce-scattered in rounds of blocking calls:
 * round r carries elements [r R, (r + 1) R) of every member's block, packed one
 * member after another (256 MiB of each, so the packed round stays small), and
 * lands at r R in this rank's output. */
static int reduce_scatter_rounds(const exec_ctx *c, pending *p, const char *send,
                                 const int64_t *counts, MPI_Datatype type, MPI_Op op,
                                 mt_error *err) {
  const int64_t isz = c->itemsize, g = p->group, round = ((int64_t)1 << 28) / isz;
  int64_t most = 0;
  for (int64_t k = 0; k < g; ++k) most = counts[k] > most ? counts[k] : most;
  char *pack = mt_pool_alloc((size_t)(g * round * isz));
  if (pack == NULL) return mt__fail(err, MT_ENOMEM, "out of memory");
  int rc = MT_OK;
  for (int64_t at = 0; rc == MT_OK && at < most; at += round) {
    int64_t start = 0, pos = 0;
    for (int64_t k = 0; k < g; ++k) {
      int64_t n = counts[k] - at < 0 ? 0 : (counts[k] - at < round ? counts[k] - at : round);
      memcpy(pack + pos * isz, send + (start + at) * isz, (size_t)(n * isz));
      p->ints[k] = (int)n, pos += n, start += counts[k];
    }
    int mpi = MPI_Reduce_scatter(pack, (char *)p->out + at * isz, p->ints, type, op,
                                 dim_comm(c, p->step->mesh_dim));
    if (mpi != MPI_SUCCESS) rc = mt__mpi_fail(err, mpi, "MPI_Reduce_scatter");
  }
  mt_pool_free(pack);
  return rc;
}

static int start_reduce_scatter(const exec_ctx *c, pending *p, mt_error *err) {
  const mt_step *s = p->step;
  int m = s->mesh_dim, big = 0;
  MPI_Datatype type;
  MPI_Op op;
  const void *send = NULL;
  p->group = mt_mesh_dim_size(c->mesh, m);
  int64_t *counts = malloc((size_t)p->group * sizeof *counts);
  if (counts == NULL) return mt__fail(err, MT_ENOMEM, "out of memory");
  int rc = mt__reduce_type(c->dtype, partial_op(s), &type, &op, err);
  if (rc == MT_OK) rc = scatter_counts(c, p, counts, &big, err);
  if (rc == MT_OK) rc = scatter_input(c, p, &send, err);
  if (rc == MT_OK && big) {
    rc = reduce_scatter_rounds(c, p, send, counts, type, op, err);
  } else if (rc == MT_OK && c->nonblocking) {
    int mpi = MPI_Ireduce_scatter(send, p->out, p->ints, type, op, dim_comm(c, m), &p->req);
    if (mpi != MPI_SUCCESS) rc = mt__mpi_fail(err, mpi, "MPI_Ireduce_scatter");
  } else if (rc == MT_OK) {
    int mpi = MPI_Reduce_scatter(send, p->out, p->ints, type, op, dim_comm(c, m));
    if (mpi != MPI_SUCCESS) rc = mt__mpi_fail(err, mpi, "MPI_Reduce_scatter");
  }
  if (rc == MT_OK) {
    mt_box sb;
    box_at(c, &s->src, -1, 0, &sb);
    mt__count(MT_COLL_REDUCE_SCATTER, (mt_box_numel(&sb) - counts[c->coord[m]]) * c->itemsize);
  }
  free(counts);
  return rc;
}

static int finish_reduce(const exec_ctx *c, pending *p, mt_error *err) {
  const mt_step *s = p->step;
  if (partial_op(s) != MT_REDUCE_AVG) return MT_OK;
  mt_box tb;
  box_at(c, &s->dst, -1, 0, &tb);
  return mt_divide(p->out, mt_box_numel(&tb), c->dtype, p->group, err);
}

/* ---- dispatch ------------------------------------------------------------------ */

static int start_step(const exec_ctx *c, pending *p, mt_error *err) {
  switch (p->step->kind) {
    case MT_STEP_ALLGATHER: return start_allgather(c, p, err);
    case MT_STEP_ALLTOALL:
    case MT_STEP_DIRECT: return start_exchange(c, p, err);
    case MT_STEP_CHUNK: return run_chunk(c, p);
    case MT_STEP_ALLREDUCE: return start_allreduce(c, p, err);
    case MT_STEP_REDUCE_SCATTER: return start_reduce_scatter(c, p, err);
    default: return mt__fail(err, MT_EINVAL, "unknown plan step kind %d", p->step->kind);
  }
}

static int finish_step(const exec_ctx *c, pending *p, mt_error *err) {
  int rc = MT_OK;
  if (p->req != MPI_REQUEST_NULL) {
    /* The request comes from the start_* call of the same step, which the MPI
     * checker does not follow through `pending`. */
    int mpi_rc = MPI_Wait(&p->req, MPI_STATUS_IGNORE); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
    if (mpi_rc != MPI_SUCCESS) rc = mt__mpi_fail(err, mpi_rc, "MPI_Wait");
  }
  if (rc == MT_OK && p->step->kind == MT_STEP_ALLGATHER) rc = finish_allgather(c, p, err);
  if (rc == MT_OK && (p->step->kind == MT_STEP_ALLREDUCE ||
                      p->step->kind == MT_STEP_REDUCE_SCATTER)) {
    rc = finish_reduce(c, p, err);
  }
  pending_free(p);
  return rc;
}

/* ---- running plans --------------------------------------------------------------- */

/* A plan's layouts must be for the mesh's shape, or its boxes and groups would not
 * match the mesh's communicators (and ranks would disagree on message sizes). */
static int check_mesh_shape(const mt_mesh *mesh, const mt_layout *l, mt_error *err) {
  if (l->mesh_ndim != mt_mesh_ndim(mesh)) {
    return mt__fail(err, MT_EINVAL, "the plan was made for a %d-D mesh, not a %d-D one",
                    l->mesh_ndim, mt_mesh_ndim(mesh));
  }
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (l->mesh_shape[m] == mt_mesh_dim_size(mesh, m)) continue;
    return mt__fail(err, MT_EINVAL, "the plan was made for a mesh of size %lld on dim "
                    "%d, not %lld", (long long)l->mesh_shape[m], m,
                    (long long)mt_mesh_dim_size(mesh, m));
  }
  return MT_OK;
}

/* Checks what can be checked locally before the first collective, so that bad
 * input fails on every rank instead of leaving some waiting. */
static int ctx_init(exec_ctx *c, mt_mesh *mesh, const mt_plan *plan, int dtype, int nb,
                    mt_error *err) {
  memset(c, 0, sizeof *c);
  c->mesh = mesh, c->dtype = dtype, c->nonblocking = nb;
  c->itemsize = (int64_t)mt_dtype_size(dtype);
  if (c->itemsize == 0) return mt__fail(err, MT_ETYPE, "unknown dtype code %d", dtype);
  if (!mt_mesh_coordinate(mesh, c->coord)) {
    return mt__fail(err, MT_ESTATE, "this rank is not a member of the mesh");
  }
  for (int i = 0; i < mt_plan_nsteps(plan); ++i) {
    const mt_step *s = mt_plan_step(plan, i);
    int reduces = s->kind == MT_STEP_ALLREDUCE || s->kind == MT_STEP_REDUCE_SCATTER;
    int rc = check_mesh_shape(mesh, &s->src, err);
    if (rc == MT_OK && reduces) rc = mt__reduce_check(dtype, partial_op(s), err);
    if (rc != MT_OK) return rc;
  }
  return MT_OK;
}

static char *alloc_box(const exec_ctx *c, const mt_layout *l) {
  mt_box b;
  box_at(c, l, -1, 0, &b);
  return mt_pool_alloc((size_t)(mt_box_numel(&b) * c->itemsize));
}

static int run_one(const exec_ctx *c, const mt_step *s, const void *in, void *out,
                   mt_error *err) {
  pending p;
  pending_init(&p, s, in, out);
  int rc = start_step(c, &p, err);
  if (rc != MT_OK) {
    pending_free(&p);
    return rc;
  }
  return finish_step(c, &p, err);
}

/* Runs steps [from, nsteps) with blocking calls. `in` is step from's input and
 * `owned` the buffer behind it when it is an intermediate one (freed here). */
static int run_steps(const exec_ctx *c, const mt_plan *plan, int from, const void *in,
                     char *owned, void *dst, mt_error *err) {
  int n = mt_plan_nsteps(plan), rc = MT_OK;
  for (int i = from; i < n && rc == MT_OK; ++i) {
    const mt_step *s = mt_plan_step(plan, i);
    char *out = i == n - 1 ? dst : alloc_box(c, &s->dst);
    if (out == NULL) {
      rc = mt__fail(err, MT_ENOMEM, "out of memory");
      break;
    }
    rc = run_one(c, s, in, out, err);
    mt_pool_free(owned);
    owned = i == n - 1 ? NULL : out;
    in = out;
  }
  mt_pool_free(owned);
  return rc;
}

int mt_redistribute(mt_mesh *mesh, const mt_plan *plan, int dtype, const void *src,
                    void *dst, mt_error *err) {
  exec_ctx c;
  int rc = ctx_init(&c, mesh, plan, dtype, 0, err);
  if (rc != MT_OK) return rc;
  return run_steps(&c, plan, 0, src, NULL, dst, err);
}

/* ---- selection exchange (basic indexing) ---------------------------------------- */

/* Everything mt_selection_exchange checks before its collective, so that bad
 * input fails on every rank. */
static int selection_ctx(exec_ctx *c, mt_mesh *mesh, const mt_layout *src, int dtype,
                         mt_error *err) {
  memset(c, 0, sizeof *c);
  c->mesh = mesh, c->dtype = dtype;
  c->itemsize = (int64_t)mt_dtype_size(dtype);
  if (c->itemsize == 0) return mt__fail(err, MT_ETYPE, "unknown dtype code %d", dtype);
  if (!mt_mesh_coordinate(mesh, c->coord))
    return mt__fail(err, MT_ESTATE, "this rank is not a member of the mesh");
  return check_mesh_shape(mesh, src, err);
}

int mt_selection_exchange(mt_mesh *mesh, const mt_layout *src, const mt_selection *sel,
                          const mt_layout *dst, int dtype, const void *in, void *out,
                          mt_error *err) {
  exec_ctx c;
  int rc = selection_ctx(&c, mesh, src, dtype, err);
  if (rc != MT_OK) return rc;
  int64_t n = mesh_numel(mesh), sent = 0;
  mt_box *boxes = malloc((size_t)(2 * n) * sizeof *boxes);
  int64_t *lin = malloc((size_t)n * sizeof *lin);
  if (boxes == NULL || lin == NULL) {
    free(boxes);
    free(lin);
    return mt__fail(err, MT_ENOMEM, "out of memory");
  }
  MPI_Comm comm = MPI_COMM_NULL;
  int me = 0;
  rc = mt_selection_exchange_boxes(src, sel, dst, c.coord, n, boxes, boxes + n, err);
  if (rc == MT_OK) rc = exchange_comm(&c, -1, n, &comm, lin, &me, err);
  pending p;
  pending_init(&p, NULL, in, out);
  mt_box sb, tb;
  if (rc == MT_OK) {
    box_at(&c, src, -1, 0, &tb);
    mt_selection_image(sel, &tb, &sb);
    box_at(&c, dst, -1, 0, &tb);
    rc = alloc_exchange(&p, (int)n, err);
  }
  if (rc == MT_OK)
    rc = exchange_types(&c, &p, &sb, &tb, boxes, boxes + n, lin, (int)n, me, &sent, err);
  if (rc == MT_OK) rc = post_alltoallw(&c, &p, comm, (int)n, err);
  if (rc == MT_OK) mt__count(MT_COLL_ALL_TO_ALL, sent);
  pending_free(&p);
  free(boxes);
  free(lin);
  return rc;
}

/* ---- asynchronous redistribute ------------------------------------------------- */

static void request_free(mt_request *r) {
  pending_free(&r->p);
  mt_pool_free(r->tmp_in);
  mt_pool_free(r->tmp_out);
  free(r);
}

/* Runs local steps at once and posts the first communicating step nonblocking. */
static int start_async(mt_request *r, mt_error *err) {
  int n = mt_plan_nsteps(r->plan), rc = MT_OK;
  const void *in = r->src;
  for (int i = 0; i < n && rc == MT_OK; ++i) {
    const mt_step *s = mt_plan_step(r->plan, i);
    char *out = i == n - 1 ? r->dst : alloc_box(&r->ctx, &s->dst);
    if (out == NULL) return mt__fail(err, MT_ENOMEM, "out of memory");
    mt_pool_free(r->tmp_in);
    r->tmp_in = r->tmp_out;
    r->tmp_out = i == n - 1 ? NULL : out;
    pending_init(&r->p, s, in, out);
    r->next = i + 1;
    rc = start_step(&r->ctx, &r->p, err);
    if (rc == MT_OK && s->kind != MT_STEP_CHUNK) return MT_OK;
    in = out;
  }
  r->p.step = NULL;
  return rc;
}

int mt_redistribute_start(mt_mesh *mesh, const mt_plan *plan, int dtype,
                          const void *src, void *dst, mt_request **out, mt_error *err) {
  mt_request *r = calloc(1, sizeof *r);
  if (r == NULL) return mt__fail(err, MT_ENOMEM, "out of memory");
  r->plan = plan, r->src = src, r->dst = dst;
  pending_init(&r->p, NULL, NULL, NULL);
  int rc = ctx_init(&r->ctx, mesh, plan, dtype, 1, err);
  if (rc == MT_OK) rc = start_async(r, err);
  if (rc != MT_OK) {
    request_free(r);
    return rc;
  }
  *out = r;
  return MT_OK;
}

int mt_request_wait(mt_request *r, mt_error *err) {
  int rc = MT_OK;
  if (r->p.step != NULL) rc = finish_step(&r->ctx, &r->p, err);
  mt_pool_free(r->tmp_in);
  r->tmp_in = NULL;
  if (rc == MT_OK && r->next < mt_plan_nsteps(r->plan)) {
    r->ctx.nonblocking = 0;
    const void *in = r->tmp_out;
    char *owned = r->tmp_out;
    r->tmp_out = NULL;
    rc = run_steps(&r->ctx, r->plan, r->next, in, owned, r->dst, err);
  }
  request_free(r);
  return rc;
}
