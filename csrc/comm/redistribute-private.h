/* The plan executor's two halves (redistribute_steps.c runs one step of a plan with
 * one MPI call; redistribute.c runs plans, agreeing first; selection_exchange.c
 * runs basic indexing's exchange with the same context and agreement). */
#ifndef MPITENSOR_REDISTRIBUTE_PRIVATE_H
#define MPITENSOR_REDISTRIBUTE_PRIVATE_H

#include <mpi.h>
#include <stdint.h>

#include "comm-private.h"
#include "exec-private.h"
#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"

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

/* This rank's box of `l`, or its block k along mesh dim m (mt__box_at). */
static inline void mt__exec_box(const exec_ctx *c, const mt_layout *l, int m, int64_t k,
                                mt_box *out) {
  mt__box_at(l, c->coord, m, k, out);
}

/* ---- one step (redistribute_steps.c) ------------------------------------------- */

/* Local. Step i (`s`, NULL for none) of the context's plan, from `in` to `out`,
 * not started. */
void mt__pending_init(pending *p, const exec_ctx *c, int i, const mt_step *s,
                      const void *in, void *out);

/* Local. Frees the buffers a step owns (the step's staging and widened copies). */
void mt__pending_free(pending *p);

/* Collective on the step's group. Starts the step: its MPI call, blocking or
 * nonblocking as the context says (a local cut runs whole here). */
int mt__step_start(const exec_ctx *c, pending *p, mt_error *err);

/* Collective on the step's group. Waits for a started step and does the local work
 * that follows its call; frees what the step owns. */
int mt__step_finish(const exec_ctx *c, pending *p, mt_error *err);

/* ---- running (redistribute.c) -------------------------------------------------- */

/* When mt__agree_before_move agrees: never (a move of local cuts only, which has no
 * collective to leave a rank waiting in, and must not gain one), for a global
 * tensor of at least MT_AGREE_MIN_BYTES (a redistribute: below that the
 * all-reduce would cost a share of its time that is not negligible), or always
 * (an indexing exchange, whose key a rank may compute otherwise than the others:
 * unchecked, a receiver would keep elements nobody sent it). */
enum { MT__AGREE_NEVER, MT__AGREE_LARGE, MT__AGREE_ALWAYS };

/* Local. The context's dtype and this rank's membership (MT_ESTATE outside the
 * mesh), which every entry point needs. */
int mt__ctx_base(exec_ctx *c, mt_mesh *mesh, int dtype, mt_error *err);

/* Local. A layout must be for the mesh's shape, or its boxes and groups would not
 * match the mesh's communicators (and ranks would disagree on message sizes). */
int mt__check_mesh_shape(const mt_mesh *mesh, const mt_layout *l, mt_error *err);

/* Collective on the mesh when `when` says so. Before a move, its members agree
 * that each got this far (its checks, its compiled counts, its destination: `dst`
 * NULL for a non-empty box is an allocation that failed) with the same layouts,
 * dtype and `extra` (a fingerprint of the rest of the call, which `args` names, or
 * NULL), so that a rank that cannot allocate (its shard of uneven ones the
 * largest), or that was given other placements or another shape, fails every rank
 * alike instead of leaving the others waiting. Without the agreement: `rc` as it
 * is, and MT_ENOMEM on this rank alone for a missing `dst`. */
int mt__agree_before_move(const exec_ctx *c, const char *what, const mt_layout *from,
                          const mt_layout *to, uint64_t extra, const char *args,
                          int when, const void *dst, int rc, mt_error *err);

#endif
