/* Redistribution plans: how to move a tensor from one layout to another.
 *
 * A plan is pure data, built without MPI: a list of steps, each one collective on
 * one mesh dim or one direct exchange over the mesh, with byte and message counts
 * summed over all ranks. The same plan drives the MPI executor, the communication
 * counters and the cost model, so they cannot disagree. A plan has owners (a
 * reference count) and holds what an executor compiled from it on its first run,
 * which dies with it. All calls are Local. */
#ifndef MPITENSOR_PLAN_H
#define MPITENSOR_PLAN_H

#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_step_kind {
  MT_STEP_ALLGATHER = 0,      /* Shard(d) -> Replicate on one mesh dim */
  MT_STEP_ALLTOALL = 1,       /* Shard(d) -> Shard(e) on one mesh dim */
  MT_STEP_CHUNK = 2,          /* Replicate -> Shard(d) on one mesh dim: no communication */
  MT_STEP_ALLREDUCE = 3,      /* Partial(op) -> Replicate on one mesh dim */
  MT_STEP_REDUCE_SCATTER = 4, /* Partial(op) -> Shard(d) on one mesh dim */
  MT_STEP_DIRECT = 5,         /* Shard/Replicate changes on any mesh dims: one exchange */
  MT_STEP_ALLREDUCE_NODES = 6 /* Partial(op) -> Replicate on one mesh dim whose groups
                                 span nodes: reduce-scatter among the members on each
                                 node, all-reduce of the parts across the nodes,
                                 all-gather on each node again */
} mt_step_kind;

/* One step of elements of `itemsize` bytes. `src` and `dst` are the layouts
 * before and after it; they differ only
 * on `mesh_dim` (-1 for DIRECT, where any non-Partial mesh dims may change and
 * Partial ones stay as they are). `bytes` counts the bytes that ranks receive from
 * other ranks, summed over all ranks of the mesh; `messages` the point-to-point
 * messages (G-1 per rank for a collective over a group of G). For the time
 * model: `rank_bytes`, the most bytes one rank receives (an all-reduce: its
 * vector); `vector_bytes`, a collective's vector as mt_time_kind says, by which
 * MPI picks its algorithm; `rank_messages`, the most messages one rank
 * receives. The local passes, for the rank that makes the most: `copy_bytes`
 * it copies (a chunk's kept box; an all-gather along an inner dim placing its
 * whole output; a reduce-scatter packing an input whose blocks are not slabs;
 * an exchange, all-to-all or direct, its kept part when every part is contiguous
 * in its box, else its whole target box, kept or packed by MPI, and what it
 * lacks once more when both the sending and the receiving side are strided),
 * and `reduce_bytes` it reduces ((G - 1) / G of an all-reduce's vector, G - 1
 * blocks of a reduce-scatter).
 * Between nodes, under the node layout of the model the plan was made under
 * (`node_layout`, its ranks_per_node): `net_bytes`, the bytes ranks receive
 * from ranks of other nodes, summed over all ranks, as the time model's
 * algorithms send them (a ring crosses once per run of a group's members on a
 * node); for a direct exchange also `node_bytes`, the most one node receives
 * from the others, and `rank_net_messages` and `rank_shm_messages`, the most
 * messages one rank receives from other nodes and from its own. `node_group`: an
 * ALLREDUCE_NODES step's members per node, the size of the groups it
 * reduce-scatters and all-gathers in (its mesh dim's size divided by it: the
 * all-reduce's).
 * `time` is the step's predicted seconds under the plan's model. */
typedef struct mt_step {
  int kind;
  int mesh_dim;
  mt_layout src;
  mt_layout dst;
  int64_t itemsize;
  int64_t bytes;
  int64_t messages;
  int64_t rank_bytes;
  int64_t vector_bytes;
  int64_t rank_messages;
  int64_t copy_bytes;
  int64_t reduce_bytes;
  int64_t net_bytes;
  int64_t node_bytes;
  int64_t rank_net_messages;
  int64_t rank_shm_messages;
  int64_t node_layout;
  int64_t node_group;
  double time;
} mt_step;

typedef struct mt_plan mt_plan;

/* Local. Plans the move from `src` to `dst` (same global shape and mesh shape) for
 * elements of `itemsize` bytes. Rules:
 * - Partial(op) on a mesh dim may only stay as it is or become Replicate or Shard;
 *   a dst Partial where src does not have the same Partial on that dim is
 *   MT_ESTATE, as mt_plan_check says.
 * - Partial dims are reduced first (from the last mesh dim to the first): to
 *   Shard(d) by reduce-scatter where that is valid on that mesh dim, else by
 *   all-reduce to Replicate (and cut later).
 * - The remaining Shard/Replicate changes are priced two ways, as a chain of
 *   per-mesh-dim steps (all-gather, all-to-all, chunk) where a valid chain exists,
 *   and as one DIRECT exchange in which every element reaches each rank that needs
 *   it at most once. A chain of one collective moving the same bytes wins; else
 *   the one the time model (timemodel.h) predicts faster; where they tie (within
 *   a part in a million), fewer bytes win, then fewer messages, then the chain
 *   (whose collectives MPI optimises).
 * - Several orders of reductions and shard changes are priced, and the fastest
 *   wins among those that move no more bytes than torch's order, in all and
 *   between nodes (net_bytes; where no candidate does the latter, torch's steps
 *   not being valid collectives here, the fastest within torch's bytes in all).
 * - Where the model places the mesh on several nodes, more candidates are priced:
 *   chains that take the outer mesh dims first (gathering across nodes while the
 *   dims inside them still cut the data), torch's own steps, reductions of the
 *   Partials that span nodes after the mesh dims inside a node have cut the
 *   data (chunk or reduce-scatter, then gathered again), and all-reduces split
 *   into a reduce-scatter within each node, an all-reduce of the parts across
 *   nodes and an all-gather (ALLREDUCE_NODES).
 * - A mesh dim of size 1 never costs a step with communication.
 * An empty plan (zero steps) means the layouts hold the same data on every rank.
 * mt_plan_create uses mt_time_model_default() (one node). */
int mt_plan_create(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                   mt_plan **out, mt_error *err);

/* Local. mt_plan_create under `model` (NULL: the default), which must pass
 * mt_time_model_check.
 *
 *   mt_time_model m = mt_time_model_default();
 *   m.ranks_per_node = 64;
 *   rc = mt_plan_create_timed(&src, &dst, 4, &m, &plan, &err);
 */
MT_EXPORT int mt_plan_create_timed(const mt_layout *src, const mt_layout *dst,
                                   int64_t itemsize, const mt_time_model *model,
                                   mt_plan **out, mt_error *err);

/* Local. The plan of torch's own per-mesh-dim steps for the same move (the order
 * mt_plan_torch_bytes prices: no plan mt_plan_create_timed makes moves more),
 * each a collective on one mesh dim, priced under `model` (NULL: the default):
 * what mpitensor's plans are measured against. MT_ENOTSUP where a step of that
 * order is no valid collective here (a tensor dim it cuts or joins is cut again
 * by a later mesh dim, which torch pads its own way); other errors as
 * mt_plan_create_timed.
 *
 *   rc = mt_plan_create_torch(&src, &dst, 4, &m, &torch, &err);
 *   if (rc == MT_OK) printf("%g s\n", mt_plan_time(torch));
 */
MT_EXPORT int mt_plan_create_torch(const mt_layout *src, const mt_layout *dst,
                                   int64_t itemsize, const mt_time_model *model,
                                   mt_plan **out, mt_error *err);

/* Local. What a redistribution from `src` to `dst` of `dtype` elements refuses,
 * checked from the arguments alone (only the layouts' mesh_ndim and placements
 * are read), so that every rank refuses alike before any communication. A
 * Partial is never created (MT_ESTATE, torch's RuntimeError: a Partial target
 * needs the same Partial in the source), and every Partial that the move reduces
 * must have a reduction for the dtype (mt_partial_check). A mesh dim of size 1,
 * which needs no reduction, refuses the same as a larger one.
 *
 *   if (mt_plan_check(&src, &dst, MT_DTYPE_INT32, &err) != MT_OK) return err.code;
 */
MT_EXPORT int mt_plan_check(const mt_layout *src, const mt_layout *dst, int dtype,
                            mt_error *err);

/* Local. Whether a Partial(op) of `dtype` values can be reduced: MT_ETYPE for
 * complex max/min (no order), for an average of bools or integers (it is not of
 * their dtype) and for an unknown dtype, MT_EINVAL for an unknown op. */
int mt_partial_check(int dtype, int op, mt_error *err);

/* Local. One more owner of `plan`: each owner calls mt_plan_destroy once. The
 * count is atomic, so owners in different threads may drop the plan.
 *
 *   mt_plan_retain(plan);   // e.g. a request in flight keeps it alive
 *   ...
 *   mt_plan_destroy(plan);  // the last owner frees it
 */
MT_EXPORT void mt_plan_retain(mt_plan *plan);

/* Local. Drops one owner of `plan`; the last one frees the plan and its compiled
 * part (through the destructor given to mt_plan_set_compiled). Accepts NULL. */
MT_EXPORT void mt_plan_destroy(mt_plan *plan);

/* Local. The per-process form of the plan that an executor compiled from it (the
 * comm library: counts, displacements and MPI datatypes of its steps), or NULL
 * before its first execution. Opaque to the core. */
void *mt_plan_compiled(const mt_plan *plan);

/* Local. Gives the plan its compiled part, freed with `free_fn` when the plan is
 * freed. Returns 1 when the plan took it; 0, taking nothing, when the plan already
 * has one (another thread compiled it first), so the caller frees its own. A plan
 * keeps the first compiled part for its whole life: readers need no lock. */
int mt_plan_set_compiled(mt_plan *plan, void *data, void (*free_fn)(void *));

/* Local. Number of steps, and step i (0 <= i < nsteps). */
MT_EXPORT int mt_plan_nsteps(const mt_plan *plan);
MT_EXPORT const mt_step *mt_plan_step(const mt_plan *plan, int i);

/* Local. Totals over all steps: bytes received from other ranks and messages,
 * summed over all ranks. */
MT_EXPORT int64_t mt_plan_bytes(const mt_plan *plan);
MT_EXPORT int64_t mt_plan_messages(const mt_plan *plan);

/* Local. Bytes received from ranks of other nodes, summed over all steps and
 * ranks, under the node layout of the model the plan was made under (0 on one
 * node). */
MT_EXPORT int64_t mt_plan_net_bytes(const mt_plan *plan);

/* Local. What torch's per-mesh-dim steps (torch/distributed/tensor/_redistribute.py)
 * move from `src` to `dst` for elements of `itemsize` bytes, priced as plan steps
 * are under `model` (NULL: the default): the bytes received summed over all ranks
 * into *bytes and those received from other nodes into *net_bytes. No plan
 * mt_plan_create_timed makes under the same model moves more of either. Errors
 * as mt_plan_create_timed.
 *
 *   int64_t b, net;
 *   rc = mt_plan_torch_bytes(&src, &dst, 4, &m, &b, &net, &err);
 */
MT_EXPORT int mt_plan_torch_bytes(const mt_layout *src, const mt_layout *dst,
                                  int64_t itemsize, const mt_time_model *model,
                                  int64_t *bytes, int64_t *net_bytes, mt_error *err);

/* Local. What torch's sharding propagation charges the move from `src` to `dst`
 * of elements of `itemsize` bytes when it ranks its strategies
 * (redistribute_cost in torch/distributed/tensor/_collective_utils.py), in its
 * microseconds, into *us: torch's steps in the order mt_plan_torch_bytes prices,
 * each a latency per collective and hop plus its bytes at torch's bandwidth of a
 * CPU mesh, an all-to-all a microsecond dearer than an all-gather of the shard;
 * HUGE_VAL for a step torch refuses. It says which of several moves torch takes,
 * not how long any takes. Errors as mt_plan_create_timed.
 *
 *   double us;
 *   rc = mt_plan_torch_cost(&src, &dst, 4, &us, &err);
 */
int mt_plan_torch_cost(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                       double *us, mt_error *err);

/* Local. The plan's predicted seconds: the sum of its steps' `time`. */
MT_EXPORT double mt_plan_time(const mt_plan *plan);

/* Local. The seconds `model` predicts for the plan's steps (as if it had been
 * planned under it), to compare plans chosen under other models.
 *
 *   double t = mt_plan_predict(plan, &calibrated);
 */
MT_EXPORT double mt_plan_predict(const mt_plan *plan, const mt_time_model *model);

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
