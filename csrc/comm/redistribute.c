/* The plan executor: runs each step of a redistribution plan with one MPI call.
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

#include "comm-private.h"
#include "count-private.h"
#include "exec-private.h"
#include "mpi-types-private.h"
#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/pool.h"
#include "mpitensor/comm/redistribute.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/pack.h"

typedef struct exec_ctx {
  mt_mesh *mesh;
  int64_t coord[MT_MAX_MESH_NDIM];
  int dtype;
  int64_t itemsize;
  int64_t counted; /* the plan's item size, which the counters follow (runs_wide) */
  int nonblocking;
  const mt__compiled *cp; /* the plan's compiled part for this rank */
  mt__compiled *owned;    /* a private one (see mt__compiled_get), freed with ctx */
} exec_ctx;

/* Everything a started step owns until it finishes. */
typedef struct pending {
  MPI_Request req;
  const mt_step *step;
  const mt__step_exec *e;
  const void *in;
  void *out;
  char *staging; /* a copy of the input or output that the step owns */
  float *wide;   /* a float16 average's input and output in float32 (widen) */
  void *narrow;  /* then: the step's own output, which finish narrows `out` into */
  int borrowed;  /* `in` is the caller's source, not a buffer of the plan */
} pending;

struct mt_request {
  exec_ctx ctx;
  const mt_plan *plan; /* one of its owners while the request lives */
  int next;            /* index of the step after the pending one */
  pending p;
  const void *src;
  void *dst;
  char *tmp_in; /* intermediate buffers owned by the request */
  char *tmp_out;
  char **mid; /* alloc_mids' buffers not taken yet, or NULL */
};

static void pending_init(pending *p, const exec_ctx *c, int i, const mt_step *s,
                         const void *in, void *out) {
  memset(p, 0, sizeof *p);
  p->req = MPI_REQUEST_NULL;
  p->step = s;
  p->e = s != NULL ? &c->cp->steps[i] : NULL;
  p->in = in;
  p->out = out;
}

static void pending_free(pending *p) {
  mt_pool_free(p->staging);
  mt_pool_free(p->wide);
  p->staging = NULL, p->wide = NULL;
}

static void box_at(const exec_ctx *c, const mt_layout *l, int m, int64_t k, mt_box *out) {
  mt__box_at(l, c->coord, m, k, out);
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
  box_at(c, &p->step->src, -1, 0, &sb);
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
  for (int64_t k = 0; k < e->group; ++k) box_at(c, &p->step->src, m, k, &blocks[k]);
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
  box_at(c, &s->dst, -1, 0, &t);
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
  box_at(c, &s->dst, -1, 0, &t);
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM];
  for (int64_t k = 0; k < e->group; ++k) {
    mt_box b;
    box_at(c, &s->src, s->mesh_dim, k, &b);
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
  box_at(c, &p->step->src, -1, 0, &sb);
  box_at(c, &p->step->dst, -1, 0, &tb);
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
  box_at(c, &s->src, -1, 0, &sb);
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
  box_at(c, &s->src, -1, 0, &sb);
  int64_t n = mt_box_numel(&sb), isz = c->itemsize;
  const int64_t slice = (int64_t)1 << 30;
  for (int64_t at = 0; rc == MT_OK && at < n; at += slice) {
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
  box_at(c, &s->src, -1, 0, &sb);
  *send = p->in;
  if (leading(&sb, shard_dim(&s->dst, m)) == 1)
    return p->e->round != 0 ? MT_OK : input_now(c, p, send, err);
  p->staging = mt_pool_alloc((size_t)(mt_box_numel(&sb) * c->itemsize));
  if (p->staging == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM], off = 0;
  for (int64_t k = 0; k < p->e->group; ++k) {
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
  box_at(c, &p->step->src, -1, 0, &sb);
  if (c->nonblocking || mt_box_numel(&sb) * c->itemsize < PAIRWISE_MIN_BYTES) return 0;
  mt_box *blocks = malloc((size_t)e->group * sizeof *blocks);
  if (blocks == NULL) {
    *rc = mt_error_set(err, MT_ENOMEM, "out of memory");
    return 1;
  }
  for (int64_t k = 0; k < e->group; ++k) box_at(c, &p->step->dst, m, k, &blocks[k]);
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
    box_at(c, &s->src, -1, 0, &sb);
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
  box_at(c, &s->dst, -1, 0, &tb);
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

static int start_step(const exec_ctx *c, pending *p, mt_error *err) {
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

static int finish_step(const exec_ctx *c, pending *p, mt_error *err) {
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
  pending_free(p);
  return rc;
}

/* ---- running plans --------------------------------------------------------------- */

/* A plan's layouts must be for the mesh's shape, or its boxes and groups would not
 * match the mesh's communicators (and ranks would disagree on message sizes). */
static int check_mesh_shape(const mt_mesh *mesh, const mt_layout *l, mt_error *err) {
  if (l->mesh_ndim != mt_mesh_ndim(mesh)) {
    return mt_error_set(err, MT_EINVAL,
                        "the plan was made for a %d-D mesh, not a %d-D "
                        "one",
                        l->mesh_ndim, mt_mesh_ndim(mesh));
  }
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (l->mesh_shape[m] == mt_mesh_dim_size(mesh, m)) continue;
    return mt_error_set(err, MT_EINVAL,
                        "the plan was made for a mesh of size %lld on "
                        "dim %d, not %lld",
                        (long long)l->mesh_shape[m], m,
                        (long long)mt_mesh_dim_size(mesh, m));
  }
  return MT_OK;
}

/* The dtype and this rank's membership, which every entry point needs. */
static int ctx_base(exec_ctx *c, mt_mesh *mesh, int dtype, mt_error *err) {
  memset(c, 0, sizeof *c);
  c->mesh = mesh, c->dtype = dtype;
  c->itemsize = c->counted = (int64_t)mt_dtype_size(dtype);
  if (c->itemsize == 0)
    return mt_error_set(err, MT_ETYPE, "unknown dtype code %d", dtype);
  if (!mt_mesh_coordinate(mesh, c->coord)) {
    return mt_error_set(err, MT_ESTATE, "this rank is not a member of the mesh");
  }
  return MT_OK;
}

/* Checks what can be checked locally before the first collective, so that bad
 * input fails on every rank instead of leaving some waiting, then finds the
 * plan's compiled part. */
static int ctx_init(exec_ctx *c, mt_mesh *mesh, const mt_plan *plan, int dtype, int nb,
                    mt_error *err) {
  int rc = ctx_base(c, mesh, dtype, err);
  c->nonblocking = nb;
  for (int i = 0; rc == MT_OK && i < mt_plan_nsteps(plan); ++i) {
    const mt_step *s = mt_plan_step(plan, i);
    int reduces = s->kind == MT_STEP_ALLREDUCE || s->kind == MT_STEP_REDUCE_SCATTER ||
                  s->kind == MT_STEP_ALLREDUCE_NODES;
    rc = check_mesh_shape(mesh, &s->src, err);
    if (rc == MT_OK && reduces) rc = mt_partial_check(dtype, partial_op(s), err);
  }
  if (rc != MT_OK) return rc;
  return mt__compiled_get(mesh, plan, c->coord, c->itemsize, &c->cp, &c->owned, err);
}

static void ctx_free(exec_ctx *c) {
  mt__compiled_free(c->owned);
  c->owned = NULL;
}

static char *alloc_box(const exec_ctx *c, const mt_layout *l) {
  mt_box b;
  box_at(c, l, -1, 0, &b);
  return mt_pool_alloc((size_t)(mt_box_numel(&b) * c->itemsize));
}

static int run_one(const exec_ctx *c, int i, const mt_step *s, const void *in,
                   void *out, mt_error *err) {
  pending p;
  pending_init(&p, c, i, s, in, out);
  int rc = start_step(c, &p, err);
  if (rc != MT_OK) {
    pending_free(&p);
    return rc;
  }
  return finish_step(c, &p, err);
}

/* Runs steps [from, nsteps) with blocking calls. `in` is step from's input and
 * `owned` the buffer behind it when it is an intermediate one (freed here). `mid`,
 * when not NULL, holds every step's output buffer allocated beforehand (see
 * alloc_mids; each is freed here once consumed), else they are allocated one step
 * at a time. */
static int run_steps(const exec_ctx *c, const mt_plan *plan, int from, const void *in,
                     char *owned, char **mid, void *dst, mt_error *err) {
  int n = mt_plan_nsteps(plan), rc = MT_OK, i = from;
  for (; i < n && rc == MT_OK; ++i) {
    const mt_step *s = mt_plan_step(plan, i);
    char *out = i == n - 1 ? dst : mid != NULL ? mid[i] : alloc_box(c, &s->dst);
    if (mid != NULL && i < n - 1) mid[i] = NULL;
    if (out == NULL) {
      rc = mt_error_set(err, MT_ENOMEM, "out of memory");
      break;
    }
    rc = run_one(c, i, s, in, out, err);
    mt_pool_free(owned);
    owned = i == n - 1 ? NULL : out;
    in = out;
  }
  for (; mid != NULL && i < n - 1; ++i) {
    mt_pool_free(mid[i]);
    mid[i] = NULL;
  }
  mt_pool_free(owned);
  return rc;
}

/* The output buffers of a plan's intermediate steps, all allocated before the
 * agreement of a large move (agree_before_run), so that a rank that cannot hold
 * one fails every rank alike instead of stopping between two collectives. NULL
 * (nothing allocated) when the move is small or has no intermediate step; else an
 * array of nsteps - 1 buffers, or *failed set (then everything is freed). */
static char **alloc_mids(const exec_ctx *c, const mt_plan *plan, int *failed) {
  int n = mt_plan_nsteps(plan);
  *failed = 0;
  if (n < 2 || c->itemsize == 0) return NULL;
  const mt_layout *to = &mt_plan_step(plan, n - 1)->dst;
  int64_t numel = 1;
  for (int i = 0; i < to->ndim; ++i) numel *= to->shape[i];
  if (numel < MT_AGREE_MIN_BYTES / c->itemsize) return NULL;
  char **mid = calloc((size_t)(n - 1), sizeof *mid);
  for (int i = 0; mid != NULL && i < n - 1; ++i) {
    mid[i] = alloc_box(c, &mt_plan_step(plan, i)->dst);
    if (mid[i] == NULL) {
      for (int k = 0; k < i; ++k) mt_pool_free(mid[k]);
      free(mid);
      mid = NULL;
    }
  }
  *failed = mid == NULL;
  return mid;
}

/* Frees what is left of alloc_mids' buffers (the steps NULL those they take). */
static void free_mids(char **mid, int n) {
  for (int i = 0; mid != NULL && i < n - 1; ++i) mt_pool_free(mid[i]);
  free(mid);
}

/* When agree_before_move agrees: never (a move of local cuts only, which has no
 * collective to leave a rank waiting in, and must not gain one), for a global
 * tensor of at least MT_AGREE_MIN_BYTES (a redistribute: below that the
 * all-reduce would cost a share of its time that is not negligible), or always
 * (an indexing exchange, whose key a rank may compute otherwise than the others:
 * unchecked, a receiver would keep elements nobody sent it). */
enum { AGREE_NEVER, AGREE_LARGE, AGREE_ALWAYS };

/* Before a move (as `when` says), its members agree that each got this far (its
 * checks, its compiled counts, its destination: `dst` NULL for a non-empty box is
 * an allocation that failed) with the same layouts, dtype and `extra` (a
 * fingerprint of the rest of the call, which `args` names, or NULL), so that a
 * rank that cannot allocate (its shard of uneven ones the largest), or that was
 * given other placements or another shape, fails every rank alike instead of
 * leaving the others waiting. Without the agreement: `rc` as it is, and
 * MT_ENOMEM on this rank alone for a missing `dst`. */
static int agree_before_move(const exec_ctx *c, const char *what, const mt_layout *from,
                             const mt_layout *to, uint64_t extra, const char *args,
                             int when, const void *dst, int rc, mt_error *err) {
  if (c->itemsize == 0) return rc;
  mt_box b;
  int64_t numel = 1;
  for (int i = 0; i < to->ndim; ++i) numel *= to->shape[i];
  if (rc == MT_OK && dst == NULL) {
    box_at(c, to, -1, 0, &b);
    if (mt_box_numel(&b) > 0) {
      rc = mt_error_set(err, MT_ENOMEM,
                        "%s: a rank of the mesh could not allocate its shard of %lld "
                        "bytes",
                        what, (long long)mt_box_numel(&b) * (long long)c->itemsize);
    }
  }
  int small = numel < MT_AGREE_MIN_BYTES / c->itemsize;
  if (when == AGREE_NEVER || (when == AGREE_LARGE && small)) return rc;
  mt_error e = {0};
  if (rc != MT_OK && err != NULL) e = *err;
  if (rc == MT_OK) {
    snprintf(e.msg, sizeof e.msg,
             "%s: the ranks of the mesh passed different %s%splacements, global shapes "
             "or dtypes; every rank must make the same call on the same DTensor "
             "(from_local of uneven shards needs shape= and stride=)",
             what, args != NULL ? args : "", args != NULL ? ", " : "");
  }
  uint64_t h = mt__fnv1a(MT__FNV_START, &c->dtype, sizeof c->dtype);
  h = mt__fnv1a(mt__layout_fnv(mt__layout_fnv(h, from), to), &extra, sizeof extra);
  rc = mt_agree(c->mesh, rc, h, &e);
  if (rc != MT_OK && err != NULL) *err = e;
  return rc;
}

/* agree_before_move for a plan: its first source and last target layouts;
 * collective unless every step is a local cut. `mid_failed`: this rank could not
 * allocate an intermediate step's buffer (alloc_mids). */
static int agree_before_run(const exec_ctx *c, const mt_plan *plan, const void *dst,
                            int mid_failed, int rc, mt_error *err) {
  int n = mt_plan_nsteps(plan), communicates = 0;
  for (int i = 0; i < n; ++i) communicates |= mt_plan_step(plan, i)->kind != MT_STEP_CHUNK;
  if (n == 0) return rc;
  if (rc == MT_OK && mid_failed) {
    rc = mt_error_set(err, MT_ENOMEM,
                      "redistribute: a rank of the mesh could not allocate the buffers of "
                      "the plan's intermediate steps");
  }
  return agree_before_move(c, "redistribute", &mt_plan_step(plan, 0)->src,
                           &mt_plan_step(plan, n - 1)->dst, 0, NULL,
                           communicates ? AGREE_LARGE : AGREE_NEVER, dst, rc, err);
}

int mt_redistribute(mt_mesh *mesh, const mt_plan *plan, int dtype, const void *src,
                    void *dst, mt_error *err) {
  exec_ctx c;
  int failed = 0;
  int rc = ctx_init(&c, mesh, plan, dtype, 0, err);
  char **mid = rc == MT_OK ? alloc_mids(&c, plan, &failed) : NULL;
  rc = agree_before_run(&c, plan, dst, failed, rc, err);
  if (rc == MT_OK) rc = run_steps(&c, plan, 0, src, NULL, mid, dst, err);
  free_mids(mid, mt_plan_nsteps(plan));
  ctx_free(&c);
  return rc;
}

/* ---- selection exchange (basic indexing) ---------------------------------------- */

/* The exchange of a selection: every peer's boxes, then its datatypes. */
static int selection_build(const exec_ctx *c, const mt_layout *src,
                           const mt_selection *sel, const mt_layout *dst,
                           mt__exchange *x, mt_error *err) {
  mt__exchange_scratch sc;
  int rc = mt__exchange_scratch_init(c->mesh, c->coord, -1, &sc, err);
  if (rc != MT_OK) return rc;
  rc = mt_selection_exchange_boxes(src, sel, dst, c->coord, sc.n, sc.send, sc.recv, err);
  if (rc == MT_OK) {
    mt_box own, sb, tb;
    box_at(c, src, -1, 0, &own);
    mt_selection_image(sel, &own, &sb);
    box_at(c, dst, -1, 0, &tb);
    rc = mt__exchange_build(&sb, &tb, sc.send, sc.recv, sc.lin, (int)sc.n, sc.me,
                            c->itemsize, NULL, x, err);
  }
  mt__exchange_scratch_free(&sc);
  return rc;
}

int mt_selection_exchange(mt_mesh *mesh, const mt_layout *src, const mt_selection *sel,
                          const mt_layout *dst, int dtype, const void *in, void *out,
                          mt_error *err) {
  exec_ctx c;
  int rc = ctx_base(&c, mesh, dtype, err);
  if (rc == MT_OK) rc = check_mesh_shape(mesh, src, err);
  if (rc == MT_ESTATE) return rc; /* not a member: no agreement to take part in */
  uint64_t picked = mt__fnv1a(MT__FNV_START, &sel->ndim, sizeof sel->ndim);
  picked = mt__fnv1a(picked, sel->start, (size_t)sel->ndim * sizeof *sel->start);
  picked = mt__fnv1a(picked, sel->step, (size_t)sel->ndim * sizeof *sel->step);
  picked = mt__fnv1a(picked, sel->count, (size_t)sel->ndim * sizeof *sel->count);
  rc = agree_before_move(&c, "indexing", src, dst, picked, "keys", AGREE_ALWAYS,
                         out, rc, err);
  if (rc != MT_OK) return rc;
  MPI_Comm comm = MPI_COMM_NULL;
  mt__exchange x = {0};
  rc = selection_build(&c, src, sel, dst, &x, err);
  if (rc == MT_OK) rc = mt_mesh_comm(mesh, &comm, err);
  if (rc == MT_OK) rc = mt__exchange_post(&x, in, out, comm, NULL, err);
  if (rc == MT_OK) mt__count(mesh, MT_COLL_ALL_TO_ALL, x.sent);
  mt__exchange_free(&x);
  return rc;
}

/* ---- asynchronous redistribute ------------------------------------------------- */

static void request_free(mt_request *r) {
  free_mids(r->mid, mt_plan_nsteps(r->plan));
  pending_free(&r->p);
  mt_pool_free(r->tmp_in);
  mt_pool_free(r->tmp_out);
  ctx_free(&r->ctx);
  /* The request was one of the plan's owners (the counts of its steps are read by
   * MPI until they complete); only ownership changes, not the plan. */
  mt_plan_destroy((mt_plan *)r->plan);
  free(r);
}

/* Issues every communicating step here, in program order: the steps before the last
 * communicating one run to completion, the last one is posted nonblocking, and only
 * local steps (chunks) are left for mt_request_wait. A step posted from inside wait
 * would follow the order in which each rank waits, and two requests waited in
 * different orders on different ranks would pair one tensor's messages with the
 * other's. */
static int start_async(mt_request *r, char **mid, mt_error *err) {
  int n = mt_plan_nsteps(r->plan), rc = MT_OK, last = -1;
  for (int i = 0; i < n; ++i) {
    if (mt_plan_step(r->plan, i)->kind != MT_STEP_CHUNK) last = i;
  }
  const void *in = r->src;
  r->mid = mid;
  for (int i = 0; i < n && rc == MT_OK; ++i) {
    const mt_step *s = mt_plan_step(r->plan, i);
    char *out = i == n - 1 ? r->dst : mid != NULL ? mid[i] : alloc_box(&r->ctx, &s->dst);
    if (mid != NULL && i < n - 1) mid[i] = NULL;
    if (out == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
    mt_pool_free(r->tmp_in);
    r->tmp_in = r->tmp_out;
    r->tmp_out = i == n - 1 ? NULL : out;
    pending_init(&r->p, &r->ctx, i, s, in, out);
    r->p.borrowed = in == r->src;
    r->next = i + 1;
    r->ctx.nonblocking = i == last;
    rc = start_step(&r->ctx, &r->p, err);
    if (rc == MT_OK && i == last) return MT_OK;
    if (rc == MT_OK) rc = finish_step(&r->ctx, &r->p, err);
    in = out;
  }
  r->p.step = NULL;
  return rc;
}

int mt_redistribute_start(mt_mesh *mesh, const mt_plan *plan, int dtype,
                          const void *src, void *dst, mt_request **out, mt_error *err) {
  mt_request *r = calloc(1, sizeof *r);
  if (r == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  mt_plan_retain((mt_plan *)plan);
  r->plan = plan, r->src = src, r->dst = dst;
  pending_init(&r->p, NULL, 0, NULL, NULL, NULL);
  int failed = 0;
  int rc = ctx_init(&r->ctx, mesh, plan, dtype, 1, err);
  char **mid = rc == MT_OK ? alloc_mids(&r->ctx, plan, &failed) : NULL;
  rc = agree_before_run(&r->ctx, plan, dst, failed, rc, err);
  if (rc == MT_OK) rc = start_async(r, mid, err);
  else free_mids(mid, mt_plan_nsteps(plan));
  if (rc != MT_OK) {
    request_free(r);
    return rc;
  }
  *out = r;
  /* The started request is waited on by mt_request_wait, through `pending`, which
   * the MPI checker does not follow. */
  return MT_OK; /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
}

int mt_request_test(mt_request *r, int *done, mt_error *err) {
  int flag = 1;
  if (r->p.step != NULL && r->p.req != MPI_REQUEST_NULL) {
    /* The request comes from start_async, which the MPI checker does not follow
     * through `pending`; once complete MPI sets it to MPI_REQUEST_NULL, so the
     * wait's finish_step skips it. */
    MT__MPI_TRY(MPI_Test(&r->p.req, &flag, MPI_STATUS_IGNORE), "MPI_Test"); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
  }
  *done = flag;
  return MT_OK;
}

int mt_request_wait(mt_request *r, mt_error *err) {
  int rc = MT_OK;
  if (r->p.step != NULL) rc = finish_step(&r->ctx, &r->p, err);
  mt_pool_free(r->tmp_in);
  r->tmp_in = NULL;
  if (rc == MT_OK && r->next < mt_plan_nsteps(r->plan)) { /* local steps only */
    r->ctx.nonblocking = 0;
    const void *in = r->tmp_out;
    char *owned = r->tmp_out;
    r->tmp_out = NULL;
    rc = run_steps(&r->ctx, r->plan, r->next, in, owned, r->mid, r->dst, err);
  }
  request_free(r);
  return rc;
}
