/* One exchange of boxes among a group of ranks as a single MPI_Alltoallw whose
 * datatypes pick each peer's part straight out of the C-contiguous local arrays,
 * so nothing is packed by hand. Used by the all-to-all and direct steps of plans
 * (compiled once per plan, compiled.c) and by the selection exchange (per call). */
#include <limits.h>
#include <stdlib.h>

#include "comm-private.h"
#include "direct-private.h"
#include "exec-private.h"
#include "mpitensor/core/pack.h"

/* The mesh position (lin) of each of this rank's `g` peers along mesh dim `m`
 * (m < 0: the whole mesh, in mesh order), and this rank's index among them. */
static void exchange_peers(const mt_mesh *mesh, const int64_t *coord, int m,
                           int64_t *lin, int *me) {
  int nd = mt_mesh_ndim(mesh);
  int64_t g = m >= 0 ? mt_mesh_dim_size(mesh, m) : 1;
  for (int d = 0; m < 0 && d < nd; ++d) g *= mt_mesh_dim_size(mesh, d);
  for (int64_t q = 0; q < g; ++q) {
    int64_t l = 0;
    for (int d = 0; m >= 0 && d < nd; ++d) {
      l = l * mt_mesh_dim_size(mesh, d) + (d == m ? q : coord[d]);
    }
    lin[q] = m < 0 ? q : l;
  }
  int64_t mine = m >= 0 ? coord[m] : 0;
  for (int d = 0; m < 0 && d < nd; ++d)
    mine = mine * mt_mesh_dim_size(mesh, d) + coord[d];
  *me = (int)mine;
}

int mt__exchange_scratch_init(const mt_mesh *mesh, const int64_t *coord, int m,
                              mt__exchange_scratch *sc, mt_error *err) {
  int64_t n = 1;
  for (int d = 0; d < mt_mesh_ndim(mesh); ++d) n *= mt_mesh_dim_size(mesh, d);
  mt_box *boxes = malloc((size_t)(2 * n) * sizeof *boxes);
  int64_t *lin = malloc((size_t)n * sizeof *lin);
  if (boxes == NULL || lin == NULL) {
    free(boxes);
    free(lin);
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  sc->n = n, sc->send = boxes, sc->recv = boxes + n, sc->lin = lin;
  exchange_peers(mesh, coord, m, lin, &sc->me);
  return MT_OK;
}

void mt__exchange_scratch_free(mt__exchange_scratch *sc) {
  free(sc->send);
  free(sc->lin);
}

/* A datatype that picks `part` out of the C-contiguous array holding `whole`. */
static int subarray(const mt_box *whole, const mt_box *part, MPI_Datatype elem,
                    MPI_Datatype *out, mt_error *err) {
  int sizes[MT_MAX_NDIM], sub[MT_MAX_NDIM], starts[MT_MAX_NDIM];
  for (int i = 0; i < whole->ndim; ++i) {
    if (whole->shape[i] > INT_MAX) {
      return mt_error_set(err, MT_EOVERFLOW,
                          "a message of %lld units exceeds MPI's int "
                          "count; such sizes are not supported by this step yet",
                          (long long)whole->shape[i]);
    }
    sizes[i] = (int)whole->shape[i];
    sub[i] = (int)part->shape[i];
    starts[i] = (int)(part->offset[i] - whole->offset[i]);
  }
  if (whole->ndim == 0) {
    MT__MPI_TRY(MPI_Type_dup(elem, out), "MPI_Type_dup");
  } else {
    MT__MPI_TRY(MPI_Type_create_subarray(whole->ndim, sizes, sub, starts, MPI_ORDER_C,
                                         elem, out),
                "MPI_Type_create_subarray");
  }
  MT__MPI_TRY(MPI_Type_commit(out), "MPI_Type_commit");
  return MT_OK;
}

static int alloc_exchange(mt__exchange *x, int g, mt_error *err) {
  x->g = g;
  x->ints = calloc(4 * (size_t)g, sizeof *x->ints);
  x->types = malloc(2 * (size_t)g * sizeof(MPI_Datatype));
  for (int i = 0; x->types != NULL && i < 2 * g; ++i) x->types[i] = MPI_BYTE;
  if (x->ints == NULL || x->types == NULL) {
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  return MT_OK;
}

/* Counts (1 or 0) and a subarray type for every peer with a message. */
static int peer_types(mt__exchange *x, const mt_box *send, const mt_box *recv,
                      const int64_t *lin, int me, mt_error *err) {
  MPI_Datatype elem;
  MT__MPI_TRY(MPI_Type_contiguous((int)x->itemsize, MPI_BYTE, &elem),
              "MPI_Type_contiguous");
  int rc = MT_OK, g = x->g;
  for (int q = 0; q < g && rc == MT_OK; ++q) {
    const mt_box *out = &send[lin[q]], *in = &recv[lin[q]];
    int has_out = q != me && mt_box_numel(out) > 0;
    int has_in = q != me && mt_box_numel(in) > 0;
    x->ints[q] = has_out, x->ints[2 * g + q] = has_in;
    if (has_out) rc = subarray(&x->sb, out, elem, &x->types[q], err);
    if (rc == MT_OK && has_in) rc = subarray(&x->tb, in, elem, &x->types[g + q], err);
    if (has_out) x->sent += mt_box_numel(out) * x->itemsize;
  }
  MPI_Type_free(&elem);
  return rc;
}

int mt__exchange_build(const mt_box *sb, const mt_box *tb, const mt_box *send,
                       const mt_box *recv, const int64_t *lin, int g, int me,
                       int64_t itemsize, const mt_box *peers, mt__exchange *x,
                       mt_error *err) {
  x->sb = *sb, x->tb = *tb, x->keep = recv[lin[me]];
  x->itemsize = itemsize, x->sent = 0;
  x->direct = NULL;
  int rc = alloc_exchange(x, g, err);
  if (rc == MT_OK && peers != NULL) {
    x->direct = malloc(4 * (size_t)g * sizeof *x->direct);
    if (x->direct == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
    for (int q = 0; q < g; ++q) {
      x->direct[q] = recv[lin[q]], x->direct[g + q] = peers[q];
      x->direct[2 * g + q] = send[lin[q]], x->direct[3 * g + q] = peers[g + q];
    }
  }
  return rc == MT_OK ? peer_types(x, send, recv, lin, me, err) : rc;
}

static void copy_keep(const mt__exchange *x, const void *in, void *out) {
  if (mt_box_numel(&x->keep) == 0) return;
  int64_t from[MT_MAX_NDIM], to[MT_MAX_NDIM];
  for (int i = 0; i < x->keep.ndim; ++i) {
    from[i] = x->keep.offset[i] - x->sb.offset[i];
    to[i] = x->keep.offset[i] - x->tb.offset[i];
  }
  mt_copy_box(in, x->sb.shape, from, out, x->tb.shape, to, &x->keep, x->itemsize);
}

int mt__exchange_direct(const mt_mesh *mesh, const mt__exchange *x, int64_t step_bytes,
                        const void *in, void *out, MPI_Comm comm, mt_error *err) {
  /* Every member sees the same mesh, step and group, so all decide alike. */
  if (x->direct == NULL || !mt_mesh_direct_read(mesh) ||
      step_bytes < MT__DIRECT_MIN_BYTES * x->g) {
    return 0;
  }
  int me = 0;
  MPI_Comm_rank(comm, &me);
  int64_t g = x->g;
  mt__direct_parts d = {x->direct, x->direct + g, x->direct + 2 * g, x->direct + 3 * g,
                        &x->sb, &x->tb};
  int done = mt__direct_step(comm, x->g, me, in, out, &d, x->itemsize, err);
  /* After the others' parts, so that a step sent through MPI copies it once. */
  if (done == 1) copy_keep(x, in, out);
  return done;
}

int mt__exchange_post(const mt__exchange *x, const void *in, void *out, MPI_Comm comm,
                      MPI_Request *req, mt_error *err) {
  copy_keep(x, in, out);
  int64_t g = x->g;
  const int *sc = x->ints, *sd = x->ints + g, *rc = x->ints + 2 * g, *rd = x->ints + 3 * g;
  const MPI_Datatype *st = x->types, *rt = x->types + g;
  if (req != NULL) {
    MT__MPI_TRY(MPI_Ialltoallw(in, sc, sd, st, out, rc, rd, rt, comm, req),
                "MPI_Ialltoallw");
  } else {
    MT__MPI_TRY(MPI_Alltoallw(in, sc, sd, st, out, rc, rd, rt, comm), "MPI_Alltoallw");
  }
  return MT_OK;
}

void mt__exchange_free(mt__exchange *x) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (int i = 0; x->types != NULL && !finalized && i < 2 * x->g; ++i) {
    if (x->types[i] != MPI_BYTE) MPI_Type_free(&x->types[i]);
  }
  free(x->types);
  free(x->ints);
  free(x->direct);
  x->types = NULL, x->ints = NULL, x->direct = NULL, x->g = 0;
}
