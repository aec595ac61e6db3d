/* Redistribution plans: how to move a tensor from one layout to another.
 *
 * A plan is pure data, built without MPI: a list of steps, each one collective on
 * one mesh dim or one direct exchange over the mesh, with byte and message counts
 * summed over all ranks. The same plan drives the MPI executor, the communication
 * counters and the cost model, so they cannot disagree. All calls are Local. */
#ifndef MPITENSOR_PLAN_H
#define MPITENSOR_PLAN_H

#include <stdint.h>

#include "mpitensor/layout.h"
#include "mpitensor/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_step_kind {
  MT_STEP_ALLGATHER = 0,      /* Shard(d) -> Replicate on one mesh dim */
  MT_STEP_ALLTOALL = 1,       /* Shard(d) -> Shard(e) on one mesh dim */
  MT_STEP_CHUNK = 2,          /* Replicate -> Shard(d) on one mesh dim: no communication */
  MT_STEP_ALLREDUCE = 3,      /* Partial(op) -> Replicate on one mesh dim */
  MT_STEP_REDUCE_SCATTER = 4, /* Partial(op) -> Shard(d) on one mesh dim */
  MT_STEP_DIRECT = 5          /* Shard/Replicate changes on any mesh dims: one exchange */
} mt_step_kind;

/* One step. `src` and `dst` are the layouts before and after it; they differ only
 * on `mesh_dim` (-1 for DIRECT, where any non-Partial mesh dims may change and
 * Partial ones stay as they are). `bytes` counts the bytes that ranks receive from
 * other ranks, summed over all ranks of the mesh; `messages` the point-to-point
 * messages of the cost model (G-1 per rank for a collective over a group of G). */
typedef struct mt_step {
  int kind;
  int mesh_dim;
  mt_layout src;
  mt_layout dst;
  int64_t bytes;
  int64_t messages;
} mt_step;

typedef struct mt_plan mt_plan;

/* Local. Plans the move from `src` to `dst` (same global shape and mesh shape) for
 * elements of `itemsize` bytes. Rules:
 * - Partial(op) on a mesh dim may only stay as it is or become Replicate or Shard;
 *   a dst Partial where src does not have the same Partial on that dim is MT_EINVAL.
 * - Partial dims are reduced first (from the last mesh dim to the first): to
 *   Shard(d) by reduce-scatter where that is valid on that mesh dim, else by
 *   all-reduce to Replicate (and cut later).
 * - The remaining Shard/Replicate changes are priced two ways, as a chain of
 *   per-mesh-dim steps (all-gather, all-to-all, chunk) where a valid chain exists,
 *   and as one DIRECT exchange in which every element reaches each rank that needs
 *   it at most once; the one with fewer bytes wins, then fewer messages, then the
 *   chain (whose collectives MPI optimises).
 * - A mesh dim of size 1 never costs a step with communication.
 * An empty plan (zero steps) means the layouts hold the same data on every rank. */
int mt_plan_create(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                   mt_plan **out, mt_error *err);

/* Local. One more owner of `plan` (atomic: owners may live on other threads). */
void mt_plan_retain(mt_plan *plan);

/* Local. Drops one owner; the last one frees the plan. Accepts NULL. */
void mt_plan_destroy(mt_plan *plan);

/* Local. Refuses, from the layouts and the element type alone (so on every rank
 * alike, before any communication), what a redistribution from `src` to `dst`
 * (same mesh) cannot do: create a Partial, that is a Partial target that `src`
 * does not hold on that mesh dim (MT_ESTATE, as torch's RuntimeError), or reduce a
 * Partial with an op the element type lacks: max or min of complex values, avg of
 * bool or integer values (MT_ETYPE). A mesh dim of size 1, where nothing is
 * reduced, is checked like a larger one. `dtype` is an mt_dtype code. */
int mt_plan_check(const mt_layout *src, const mt_layout *dst, int dtype, mt_error *err);

/* Local. Number of steps, and step i (0 <= i < nsteps). */
int mt_plan_nsteps(const mt_plan *plan);
const mt_step *mt_plan_step(const mt_plan *plan, int i);

/* Local. Totals over all steps: bytes received from other ranks and messages,
 * summed over all ranks. */
int64_t mt_plan_bytes(const mt_plan *plan);
int64_t mt_plan_messages(const mt_plan *plan);

/* Local. True when a step on one mesh dim that changes `src` into `dst` (which
 * differ only on `mesh_dim`) is one valid collective: the tensor dims it touches
 * are not sharded by any later mesh dim, so the group's boxes are consecutive
 * chunks of one parent box. */
int mt_step_valid(const mt_layout *src, const mt_layout *dst, int mesh_dim);

/* Local. The exchange of a step for the rank at `coord`. Peers are the ranks that
 * share `coord` on every mesh dim except, where `mesh_dim` is -1, the mesh dims that
 * `src` shards, or else `mesh_dim` itself; they are indexed by row-major mesh
 * position, so `send` and `recv` hold one box per mesh rank (npeers = mesh numel).
 * send[i] is the global box this rank sends to rank i, recv[i] the one it receives
 * from rank i; a box with no element means no message (the entry for this rank is
 * the part it keeps). Each element of this rank's dst box is received exactly once;
 * each element of its src box is sent to each peer at most once. */
int mt_exchange_boxes(const mt_layout *src, const mt_layout *dst, int mesh_dim,
                      const int64_t *coord, int64_t npeers, mt_box *send, mt_box *recv,
                      mt_error *err);

/* Local. The exchange that moves a selection (basic indexing) of a tensor laid out
 * by `src` into layout `dst` of the selection's output (dst's shape is the
 * selection's counts, its mesh is src's). Each rank starts with the image of its
 * src box (mt_selection_image) and ends with its dst box. Only selected elements
 * move, each at most once to each rank that needs it. Peers, send and recv are as
 * for a direct exchange in mt_exchange_boxes (boxes in the output's coordinates):
 * ranks differing on the mesh dims src shards, and equal elsewhere. So a Partial
 * mesh dim must stay the same Partial, and a mesh dim src replicates can be
 * anything but Partial in dst. At least one tensor dim. */
int mt_selection_exchange_boxes(const mt_layout *src, const mt_selection *sel,
                                const mt_layout *dst, const int64_t *coord,
                                int64_t npeers, mt_box *send, mt_box *recv,
                                mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
