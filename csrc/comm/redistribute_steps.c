/* The plan executor's steps: each step of a redistribution plan runs with one MPI
 * call (redistribute.c runs the plans).
 *
 * Every step has a start and a finish. Blocking execution calls the blocking MPI
 * collective in start and has nothing to wait for; asynchronous execution calls
 * the nonblocking one and waits before finish. Finish does the local work that
 * follows the collective: unpacking a staging buffer, dividing an average (and
 * narrowing a float16 one, reduced in float32). What a step needs besides its
 * buffers (counts, displacements, datatypes) comes from the plan's compiled part
 * (compiled.c), built on the plan's first execution. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "count-private.h"
#include "mpi-types-private.h"
#include "mpitensor/comm/pool.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/pack.h"
#include "redistribute-private.h"

void mt__pending_init(pending *p, const exec_ctx *c, int i, const mt_step *s,
                         const void *in, void *out) {
  memset(p, 0, sizeof *p);
  p->req = MPI_REQUEST_NULL;
  p->step = s;
  p->e = s != NULL ? &c->cp->steps[i] : NULL;
  p->in = in;
  p->out = out;
}

void mt__pending_free(pending *p) {
  mt_pool_free(p->staging);
  mt_pool_free(p->wide);
  p->staging = NULL, p->wide = NULL;
}

static int64_t leading(const mt_box *b, int d) {
  int64_t n = 1;
  for (int i = 0; i < d; ++i) n *= b->shape[i];
  return n;
}

static int shard_dim(const mt_layout *l, int m) { return l->placements[m].dim; }

/* A call posted nonblocking on the caller's source would read it until the wait,
 * and the caller may write to it in between: such a call must read nothing of it
 * after it returns, so that the result is the one of the values at the call. */
static int posted_on_source(const exec_ctx *c, const pending *p) {
  return c->nonblocking && p->borrowed;
}

/* What the step's call reads as its input: for a call posted on the caller's
 * source, a copy taken now (in the step's staging); else the input itself. */
static int input_now(const exec_ctx *c, pending *p, const void **send, mt_error *err) {
  *send = p->in;
  mt_box sb;
  mt__exec_box(c, &p->step->src, -1, 0, &sb);
  int64_t n = mt_box_numel(&sb) * c->itemsize;
  if (!posted_on_source(c, p) || n == 0) return MT_OK;
  p->staging = mt_pool_alloc((size_t)n);
  if (p->staging == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  mt_copy_bytes(p->staging, p->in, n);
  *send = p->staging;
  return MT_OK;
}

/* The global tensor's bytes: the same on every rank, so a choice made by it is. */
static int64_t step_bytes(const exec_ctx *c, const mt_layout *l) {
  int64_t n = c->itemsize;
  for (int i = 0; i < l->ndim; ++i) n *= l->shape[i];
  return n;
}

static MPI_Comm dim_comm(const exec_ctx *c, int m) { return mt_mesh_dim_comm(c->mesh, m); }

/* ---- all-gather: Shard(d) -> Replicate on one mesh dim ------------------------ */

/* Large blocking steps (256 KiB and more in all) that cannot be one MPI call
 * straight between the caller's buffers run by pairwise exchanges in chunks
 * (pairwise.c): an all-gather along an inner dim places each chunk as it arrives
 * instead of gathering everything into staging and placing it in a second pass,
 * a reduce-scatter spares the two passes and the input-sized temporary of Open
 * MPI's ring. Below, MPI's recursive doubling and halving take fewer rounds; from
 * there the time model prices a ring, whose messages and bytes the pairwise
 * exchanges match. Every member of the group sees the same sizes, so all choose
 * alike. */
#define PAIRWISE_MIN_BYTES ((int64_t)256 << 10)

/* An all-gather along an inner dim by pairwise exchanges, when it is large and
 * blocking: 1 when done (or failed, *rc set), 0 when MPI's call should run. */
static int gather_pairwise(const exec_ctx *c, pending *p, const mt_box *t, int *rc,
                           mt_error *err) {
  const mt__step_exec *e = p->e;
  int m = p->step->mesh_dim;
  if (c->nonblocking || mt_box_numel(t) * c->itemsize < PAIRWISE_MIN_BYTES) return 0;
  mt_box *blocks = malloc((size_t)e->group * sizeof *blocks);
  if (blocks == NULL) {
    *rc = mt_error_set(err, MT_ENOMEM, "out of memory");
    return 1;
  }
  for (int64_t k = 0; k < e->group; ++k) mt__exec_box(c, &p->step->src, m, k, &blocks[k]);
  int fits = mt__pairwise_fits(blocks, e->group, c->itemsize);
  if (fits) {
    *rc = mt__allgather_pairwise(p->in, p->out, t, blocks, e->group, c->coord[m],
                                 c->itemsize, dim_comm(c, m), err);
  }
  free(blocks);
  return fits;
}

/* What a gather into `recv` sends. Posted on the caller's source, it runs in
 * place: this rank's block goes to its place in `recv` now, the copy MPI would
 * make of it anyway (Open MPI's sends it from there in place or not), and MPI
 * reads nothing of the source after the call. */
static const void *gather_send(const exec_ctx *c, const pending *p, void *recv) {
  const mt__step_exec *e = p->e;
  int64_t me = c->coord[p->step->mesh_dim];
  if (!posted_on_source(c, p)) return p->in;
  mt_copy_bytes((char *)recv + e->ints[e->group + me] * e->unit_bytes, p->in,
                e->ints[me] * e->unit_bytes);
  return MPI_IN_PLACE;
}

/* Blocks are consecutive slabs of the gathered box when every dim before d has
 * extent 1; else they are placed chunk by chunk (gather_pairwise) or arrive in a
 * staging buffer and are placed in finish. */
static int start_allgather(const exec_ctx *c, pending *p, mt_error *err) {
  const mt_step *s = p->step;
  const mt__step_exec *e = p->e;
  int m = s->mesh_dim;
  mt_box t;
  mt__exec_box(c, &s->dst, -1, 0, &t);
  void *recv = p->out;
  int inner = leading(&t, shard_dim(&s->src, m)) != 1, rc = MT_OK;
  if (inner && gather_pairwise(c, p, &t, &rc, err)) {
    if (rc == MT_OK) {
      mt__count(c->mesh, MT_COLL_ALL_GATHER,
                (int64_t)e->ints[c->coord[m]] * e->unit_bytes * (e->group - 1));
    }
    return rc;
  }
  if (inner) {
    p->staging = mt_pool_alloc((size_t)(mt_box_numel(&t) * c->itemsize));
    if (p->staging == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
    recv = p->staging;
  }
  int64_t g = e->group;
  int mine = e->ints[c->coord[m]];
  /* Even blocks take the plain call: Open MPI chooses its algorithm for
   * MPI_Allgatherv by other thresholds than for MPI_Allgather (at 4 members and
   * large blocks, a neighbour exchange instead of recursive doubling), and the
   * plain call's choice is the one a raw MPI_Allgather gets. */
  if (c->nonblocking && e->even) {
    MT__MPI_TRY(MPI_Iallgather(gather_send(c, p, recv), mine, e->unit, recv, mine,
                               e->unit, dim_comm(c, m), &p->req),
                "MPI_Iallgather");
  } else if (c->nonblocking) {
    MT__MPI_TRY(MPI_Iallgatherv(gather_send(c, p, recv), mine, e->unit, recv, e->ints,
                                e->ints + g, e->unit, dim_comm(c, m), &p->req),
                "MPI_Iallgatherv");
  } else if (e->even) {
    MT__MPI_TRY(MPI_Allgather(p->in, mine, e->unit, recv, mine, e->unit, dim_comm(c, m)),
                "MPI_Allgather");
  } else {
    MT__MPI_TRY(MPI_Allgatherv(p->in, mine, e->unit, recv, e->ints, e->ints + g,
                               e->unit, dim_comm(c, m)),
                "MPI_Allgatherv");
  }
  mt__count(c->mesh, MT_COLL_ALL_GATHER, (int64_t)mine * e->unit_bytes * (g - 1));
  return MT_OK;
}

/* Blocks gathered along an inner dim arrive one after another; each goes to its
 * place in the output box. */
static void finish_allgather(const exec_ctx *c, pending *p) {
  if (p->staging == NULL) return;
  const mt_step *s = p->step;
  const mt__step_exec *e = p->e;
  mt_box t;
  mt__exec_box(c, &s->dst, -1, 0, &t);
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM];
  for (int64_t k = 0; k < e->group; ++k) {
    mt_box b;
    mt__exec_box(c, &s->src, s->mesh_dim, k, &b);
    for (int i = 0; i < t.ndim; ++i) at[i] = b.offset[i] - t.offset[i];
    if (mt_box_numel(&b) == 0) continue;
    mt_copy_box(p->staging + e->ints[e->group + k] * e->unit_bytes, b.shape, zero,
                p->out, t.shape, at, &b, c->itemsize);
  }
}

/* ---- all-to-all and direct exchange: one MPI_Alltoallw with subarray types ---- */

static int start_exchange(const exec_ctx *c, pending *p, mt_error *err) {
  int m = p->step->mesh_dim;
  MPI_Comm comm = m >= 0 ? dim_comm(c, m) : MPI_COMM_NULL;
  int rc = m >= 0 ? MT_OK : mt_mesh_comm(c->mesh, &comm, err);
  int done = 0;
  const void *in = p->in;
  if (rc == MT_OK && !c->nonblocking) {
    done = mt__exchange_direct(c->mesh, &p->e->x, step_bytes(c, &p->step->src), p->in,
                               p->out, comm, err);
    if (done < 0) rc = MT_EMPI;
  }
  if (rc == MT_OK && !done) rc = input_now(c, p, &in, err);
  if (rc == MT_OK && !done) {
    rc = mt__exchange_post(&p->e->x, in, p->out, comm, c->nonblocking ? &p->req : NULL,
                           err);
  }
  if (rc == MT_OK) mt__count(c->mesh, MT_COLL_ALL_TO_ALL, p->e->x.sent);
  return rc;
}

/* ---- chunk: Replicate -> Shard(d), a local copy ------------------------------ */

static int run_chunk(const exec_ctx *c, pending *p) {
  mt_box sb, tb;
  mt__exec_box(c, &p->step->src, -1, 0, &sb);
  mt__exec_box(c, &p->step->dst, -1, 0, &tb);
  if (mt_box_numel(&tb) == 0) return MT_OK;
  int64_t from[MT_MAX_NDIM], zero[MT_MAX_NDIM] = {0};
  for (int i = 0; i < tb.ndim; ++i) from[i] = tb.offset[i] - sb.offset[i];
  mt_copy_box(p->in, sb.shape, from, p->out, tb.shape, zero, &tb, c->itemsize);
  return MT_OK;
}

/* ---- all-reduce and reduce-scatter: Partial(op) -> Replicate / Shard(d) ------ */

static int partial_op(const mt_step *s) { return s->src.placements[s->mesh_dim].reduce_op; }

/* Whether the step averages float16 partials: it runs in float32, as NumPy's
 * mean adds float16, so that the sum cannot overflow where the average does not
 * and the average is rounded to float16 once. Its values on the wire are wider
 * than the plan's, which the counters follow, as the cost model does. */
static int runs_wide(const exec_ctx *c, const pending *p) {
  return c->dtype == MT_DTYPE_FLOAT16 && partial_op(p->step) == MT_REDUCE_AVG;
}

/* For runs_wide: the step reads its input widened into a buffer it owns (nothing
 * of the caller's source is read later) and writes a float32 output beside it,
 * which finish_reduce narrows into the step's own. */
static int widen(const exec_ctx *c, pending *p, mt_error *err) {
  mt_box sb, tb;
  mt__exec_box(c, &p->step->src, -1, 0, &sb);
  mt__exec_box(c, &p->step->dst, -1, 0, &tb);
  int64_t n = mt_box_numel(&sb), m = mt_box_numel(&tb);
  /* One float more, so that a step of empty boxes owns a buffer too. */
  p->wide = mt_pool_alloc((size_t)(n + m + 1) * sizeof(float));
  if (p->wide == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  const uint16_t *in = p->in;
  for (int64_t i = 0; i < n; ++i) p->wide[i] = mt_half_to_float(in[i]);
  p->narrow = p->out;
  p->in = p->wide, p->out = p->wide + n, p->borrowed = 0;
  return MT_OK;
}

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
  mt__exec_box(c, &s->src, -1, 0, &sb);
  int64_t n = mt_box_numel(&sb);
  if (n > INT_MAX) {
    rc = allreduce_rounds(c, p, n, type, op, dim_comm(c, m), err);
  } else if (c->nonblocking) {
    /* A copy, not in place on the output (the same copy): MPI may choose another
     * algorithm for an all-reduce in place. */
    const void *send = NULL;
    rc = input_now(c, p, &send, err);
    if (rc != MT_OK) return rc;
    MT__MPI_TRY(MPI_Iallreduce(send, p->out, (int)n, type, op, dim_comm(c, m), &p->req),
                "MPI_Iallreduce");
  } else {
    MT__MPI_TRY(MPI_Allreduce(p->in, p->out, (int)n, type, op, dim_comm(c, m)),
                "MPI_Allreduce");
  }
  if (rc == MT_OK) {
    mt__count(c->mesh, MT_COLL_ALL_REDUCE,
              ring_share(c, m, n * c->counted, p->e->group));
  }
  return rc;
}

/* ---- all-reduce within nodes first: Partial(op) -> Replicate, in three parts --- */

/* One slice of `n` elements at `in` and `out` (n / run rounded up per member,
 * the last members' parts shorter, in `ints`: counts then displacements): the
 * run's members reduce-scatter it, each all-reduces its part with the members as
 * far apart in the other runs, and the run gathers the parts again. */
static int reduce_slice(const char *in, char *out, int64_t n, int64_t isz, int64_t run,
                        int64_t me, int *ints, MPI_Datatype type, MPI_Op op,
                        MPI_Comm inside, MPI_Comm across, mt_error *err) {
  int64_t part = n / run + (n % run != 0), off = 0;
  for (int64_t k = 0; k < run; ++k) {
    int64_t len = n - off < part ? n - off : part;
    ints[k] = (int)len, ints[run + k] = (int)off, off += len;
  }
  char *mine = out + (int64_t)ints[run + me] * isz;
  MT__MPI_TRY(MPI_Reduce_scatter(in, mine, ints, type, op, inside), "MPI_Reduce_scatter");
  MT__MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, mine, ints[me], type, op, across),
              "MPI_Allreduce");
  MT__MPI_TRY(MPI_Allgatherv(MPI_IN_PLACE, 0, type, out, ints, ints + run, type, inside),
              "MPI_Allgatherv");
  return MT_OK;
}

/* An ALLREDUCE_NODES step, blocking also under async_op (its three calls follow
 * one another). Slices of at most 2^30 elements keep every count an int. Counted
 * as the one all-reduce it replaces, whose bytes the plan gives it. */
static int start_allreduce_nodes(const exec_ctx *c, pending *p, mt_error *err) {
  const mt_step *s = p->step;
  int m = s->mesh_dim;
  int64_t run = s->node_group, me = c->coord[m] % run;
  MPI_Datatype type;
  MPI_Op op;
  MPI_Comm inside = MPI_COMM_NULL, across = MPI_COMM_NULL;
  int rc = mt__reduce_type(c->dtype, partial_op(s), &type, &op, err);
  if (rc == MT_OK) rc = mt_mesh_node_comms(c->mesh, m, run, &inside, &across, err);
  int *ints = rc == MT_OK ? malloc(2 * (size_t)run * sizeof *ints) : NULL;
  if (rc == MT_OK && ints == NULL) rc = mt_error_set(err, MT_ENOMEM, "out of memory");
  mt_box sb;
  mt__exec_box(c, &s->src, -1, 0, &sb);
  int64_t n = mt_box_numel(&sb), isz = c->itemsize;
  const int64_t slice = (int64_t)1 << 30;
  for (int64_t at = 0; rc == MT_OK && ints != NULL && at < n; at += slice) {
    rc = reduce_slice((const char *)p->in + at * isz, (char *)p->out + at * isz,
                      n - at < slice ? n - at : slice, isz, run, me, ints, type, op,
                      inside, across, err);
  }
  free(ints);
  if (rc == MT_OK) {
    mt__count(c->mesh, MT_COLL_ALL_REDUCE,
              ring_share(c, m, n * c->counted, p->e->group));
  }
  return rc;
}

/* Each member's part of the reduced box, consecutive in member order: the input
 * itself when the parts are slabs (input_now's, unless it goes in rounds, which
 * are blocking calls), else a packed staging copy. */
static int scatter_input(const exec_ctx *c, pending *p, const void **send, mt_error *err) {
  const mt_step *s = p->step;
  int m = s->mesh_dim;
  mt_box sb;
  mt__exec_box(c, &s->src, -1, 0, &sb);
  *send = p->in;
  if (leading(&sb, shard_dim(&s->dst, m)) == 1)
    return p->e->round != 0 ? MT_OK : input_now(c, p, send, err);
  p->staging = mt_pool_alloc((size_t)(mt_box_numel(&sb) * c->itemsize));
  if (p->staging == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM], off = 0;
  for (int64_t k = 0; k < p->e->group; ++k) {
    mt_box b;
    mt__exec_box(c, &s->dst, m, k, &b);
    if (mt_box_numel(&b) == 0) continue;
    for (int i = 0; i < b.ndim; ++i) at[i] = b.offset[i] - sb.offset[i];
    mt_copy_box(p->in, sb.shape, at, p->staging + off, b.shape, zero, &b, c->itemsize);
    off += mt_box_numel(&b) * c->itemsize;
  }
  *send = p->staging;
  return MT_OK;
}

/* Round `at` of a reduce-scatter in rounds: elements [at, at + round) of every
 * member's block of `send` (counts[k] elements each, one after another), packed
 * member after member into `pack`; ints[k] is how many of member k's it holds. */
static void pack_round(const int64_t *counts, int64_t g, int64_t at, int64_t round,
                       int64_t isz, const char *send, char *pack, int *ints) {
  int64_t start = 0, pos = 0;
  for (int64_t k = 0; k < g; ++k) {
    int64_t left = counts[k] - at, n = left < 0 ? 0 : (left < round ? left : round);
    mt_copy_bytes(pack + pos * isz, send + (start + at) * isz, n * isz);
    ints[k] = (int)n, pos += n, start += counts[k];
  }
}

/* A reduce-scatter whose counts total more than an int runs in rounds of blocking
 * calls: round r carries elements [r R, (r + 1) R) of every member's block (R =
 * e->round), packed one member after another, and lands at r R in this rank's
 * output. */
static int reduce_scatter_rounds(const exec_ctx *c, pending *p, const char *send,
                                 MPI_Datatype type, MPI_Op op, mt_error *err) {
  const int64_t isz = c->itemsize, g = p->e->group, round = p->e->round;
  const int64_t *counts = p->e->counts;
  int64_t most = 0;
  for (int64_t k = 0; k < g; ++k) most = counts[k] > most ? counts[k] : most;
  char *pack = mt_pool_alloc((size_t)(g * round * isz));
  int *ints = malloc((size_t)g * sizeof *ints);
  if (pack == NULL || ints == NULL) {
    free(ints);
    mt_pool_free(pack);
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  int rc = MT_OK;
  for (int64_t at = 0; rc == MT_OK && at < most; at += round) {
    pack_round(counts, g, at, round, isz, send, pack, ints);
    int mpi = MT__BLOCKING("MPI_Reduce_scatter",
                           MPI_Reduce_scatter(pack, (char *)p->out + at * isz, ints, type,
                                              op, dim_comm(c, p->step->mesh_dim)));
    if (mpi != MPI_SUCCESS) rc = mt_mpi_error(err, mpi, "MPI_Reduce_scatter");
  }
  free(ints);
  mt_pool_free(pack);
  return rc;
}

/* A reduce-scatter by pairwise exchanges, when it is large and blocking: 1 when
 * done (or failed, *rc set), 0 when MPI's call should run. */
static int scatter_pairwise(const exec_ctx *c, pending *p, int *rc, mt_error *err) {
  const mt__step_exec *e = p->e;
  int m = p->step->mesh_dim;
  mt_box sb;
  mt__exec_box(c, &p->step->src, -1, 0, &sb);
  if (c->nonblocking || mt_box_numel(&sb) * c->itemsize < PAIRWISE_MIN_BYTES) return 0;
  mt_box *blocks = malloc((size_t)e->group * sizeof *blocks);
  if (blocks == NULL) {
    *rc = mt_error_set(err, MT_ENOMEM, "out of memory");
    return 1;
  }
  for (int64_t k = 0; k < e->group; ++k) mt__exec_box(c, &p->step->dst, m, k, &blocks[k]);
  int fits = mt__pairwise_fits(blocks, e->group, c->itemsize);
  if (fits) {
    *rc = mt__reduce_scatter_pairwise(p->in, p->out, &sb, blocks, e->group, c->coord[m],
                                      c->dtype, partial_op(p->step), c->itemsize,
                                      dim_comm(c, m), err);
  }
  free(blocks);
  return fits;
}

/* The MPI call of a reduce-scatter of the packed blocks in `send`. */
static int reduce_scatter_mpi(const exec_ctx *c, pending *p, const void *send,
                              MPI_Datatype type, MPI_Op op, mt_error *err) {
  const mt__step_exec *e = p->e;
  MPI_Comm comm = dim_comm(c, p->step->mesh_dim);
  if (e->round != 0) return reduce_scatter_rounds(c, p, send, type, op, err);
  int mpi;
  if (c->nonblocking) {
    mpi = MPI_Ireduce_scatter(send, p->out, e->ints, type, op, comm, &p->req);
    return mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Ireduce_scatter");
  }
  mpi = MT__BLOCKING("MPI_Reduce_scatter",
                     MPI_Reduce_scatter(send, p->out, e->ints, type, op, comm));
  return mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Reduce_scatter");
}

static int start_reduce_scatter(const exec_ctx *c, pending *p, mt_error *err) {
  const mt_step *s = p->step;
  const mt__step_exec *e = p->e;
  int m = s->mesh_dim;
  MPI_Datatype type;
  MPI_Op op;
  const void *send = NULL;
  int rc = mt__reduce_type(c->dtype, partial_op(s), &type, &op, err);
  int done = rc == MT_OK && scatter_pairwise(c, p, &rc, err);
  if (rc == MT_OK && !done) rc = scatter_input(c, p, &send, err);
  if (rc == MT_OK && !done) rc = reduce_scatter_mpi(c, p, send, type, op, err);
  if (rc == MT_OK) {
    mt_box sb;
    mt__exec_box(c, &s->src, -1, 0, &sb);
    int64_t kept = e->counts[c->coord[m]];
    mt__count(c->mesh, MT_COLL_REDUCE_SCATTER,
              (mt_box_numel(&sb) - kept) * c->counted);
  }
  return rc;
}

static int finish_reduce(const exec_ctx *c, pending *p, mt_error *err) {
  const mt_step *s = p->step;
  if (partial_op(s) != MT_REDUCE_AVG) return MT_OK;
  mt_box tb;
  mt__exec_box(c, &s->dst, -1, 0, &tb);
  int64_t n = mt_box_numel(&tb);
  if (p->wide == NULL) return mt_divide(p->out, n, c->dtype, p->e->group, err);
  const float *sum = p->out, g = (float)p->e->group;
  uint16_t *out = p->narrow;
  for (int64_t i = 0; i < n; ++i) out[i] = mt_float_to_half(sum[i] / g);
  return MT_OK;
}

/* ---- dispatch ------------------------------------------------------------------ */

/* A step that reduces a Partial: all-reduce, reduce-scatter, all-reduce by nodes;
 * a float16 average as a float32 one (runs_wide). */
static int start_reduce(const exec_ctx *c, pending *p, mt_error *err) {
  exec_ctx wide = *c;
  if (runs_wide(c, p)) {
    int rc = widen(c, p, err);
    if (rc != MT_OK) return rc;
    wide.dtype = MT_DTYPE_FLOAT32, wide.itemsize = (int64_t)sizeof(float);
  }
  switch (p->step->kind) {
    case MT_STEP_ALLREDUCE: return start_allreduce(&wide, p, err);
    case MT_STEP_REDUCE_SCATTER: return start_reduce_scatter(&wide, p, err);
    default: return start_allreduce_nodes(&wide, p, err);
  }
}

/* A nonblocking step's request is waited on by mt__step_finish, through `pending`,
 * which the MPI checker does not follow across files. */
/* NOLINTBEGIN(clang-analyzer-optin.mpi.MPI-Checker) */
int mt__step_start(const exec_ctx *c, pending *p, mt_error *err) {
  switch (p->step->kind) {
    case MT_STEP_ALLGATHER: return start_allgather(c, p, err);
    case MT_STEP_ALLTOALL:
    case MT_STEP_DIRECT: return start_exchange(c, p, err);
    case MT_STEP_CHUNK: return run_chunk(c, p);
    case MT_STEP_ALLREDUCE:
    case MT_STEP_REDUCE_SCATTER:
    case MT_STEP_ALLREDUCE_NODES: return start_reduce(c, p, err);
    default:
      return mt_error_set(err, MT_EINVAL, "unknown plan step kind %d", p->step->kind);
  }
}
/* NOLINTEND(clang-analyzer-optin.mpi.MPI-Checker) */

int mt__step_finish(const exec_ctx *c, pending *p, mt_error *err) {
  int rc = MT_OK;
  if (p->req != MPI_REQUEST_NULL) {
    /* The request comes from the start_* call of the same step, which the MPI
     * checker does not follow through `pending`. */
    int mpi_rc = MT__BLOCKING("MPI_Wait", MPI_Wait(&p->req, MPI_STATUS_IGNORE)); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
    if (mpi_rc != MPI_SUCCESS) rc = mt_mpi_error(err, mpi_rc, "MPI_Wait");
  }
  if (rc == MT_OK && p->step->kind == MT_STEP_ALLGATHER) finish_allgather(c, p);
  if (rc == MT_OK && (p->step->kind == MT_STEP_ALLREDUCE ||
                      p->step->kind == MT_STEP_ALLREDUCE_NODES ||
                      p->step->kind == MT_STEP_REDUCE_SCATTER)) {
    rc = finish_reduce(c, p, err);
  }
  mt__pending_free(p);
  return rc;
}
