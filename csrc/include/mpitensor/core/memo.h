/* The decision memo: what an operation did with inputs of given layouts, so that
 * the next call with the same layouts runs without deciding or planning again.
 *
 * A key is the operation (an id its caller chose), its static arguments folded
 * into one word, and per operand the layout id of a tensor (layout_table.h) or
 * the kind of a scalar. A decision is the plan each input runs first (or none),
 * the output's placements and global shape, and, once known, the output's layout
 * id. Plans are held by the memo (mt_plan_retain) for as long as their decision
 * stays. The memo is bounded twice, in decisions and in the plans they hold, and
 * evicts by CLOCK past either bound.
 *
 * All calls are Local; a memo is not thread-safe (its owner serialises calls). */
#ifndef MPITENSOR_MEMO_H
#define MPITENSOR_MEMO_H

#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/layout_table.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_MEMO_MAX_OPERANDS MT_PROP_MAX_INPUTS

/* `operand[i]` is the layout id (> 0) of a tensor operand, or minus the caller's
 * kind (>= 0) of a scalar operand, whose type can change the result. Bit i of
 * `grad` says a gradient is wanted for operand i: a training step's decision also
 * prices the gradient's way back (mt_prop_inputs.grad), so it may differ. */
typedef struct mt_memo_key {
  int64_t op;
  int64_t aux;
  int noperands;
  uint32_t grad;
  int64_t want; /* the layout the output is headed to (mt_prop_inputs.want), 0: none */
  int64_t operand[MT_MEMO_MAX_OPERANDS];
} mt_memo_key;

/* `plan[i]` moves tensor input i (operand order, scalars skipped) to the layout
 * the op needs; NULL when it is used as it is. `partition[i]` is a bitmask of mesh
 * dims on which the op needs Replicate input i as Partial(sum) (torch's
 * Replicate -> Partial(sum) of P(sum) + R): after its plan, a rank whose
 * coordinate is not 0 on one of them uses zeros instead, so the value counts once
 * when the output is reduced (torch divides it by the group size on every rank;
 * zeros keep integers and floats exact). Partitioning into Partial(avg|max|min)
 * changes nothing and is not marked. out_ndim is -1 while the output's shape is
 * unknown (a user rule's output, learnt after its first run); out_id 0 while the
 * output's layout id is unknown. */
typedef struct mt_decision {
  int ninputs;
  int nplans; /* of plan[], those not NULL: set by the memo when it stores one */
  mt_plan *plan[MT_PROP_MAX_INPUTS];
  uint32_t partition[MT_PROP_MAX_INPUTS];
  uint32_t partitioned; /* the union of partition[]: set by the memo when it stores one */
  int mesh_ndim;
  mt_placement out_placements[MT_MAX_MESH_NDIM];
  int out_ndim;
  int64_t out_shape[MT_MAX_NDIM];
  int64_t out_id;
  int64_t out_slot;
} mt_decision;

typedef struct mt_memo_stats {
  int64_t hits;
  int64_t misses;
  int64_t decisions; /* held now */
  int64_t plans;     /* held now */
  int64_t decision_limit;
  int64_t plan_limit;
} mt_memo_stats;

typedef struct mt_memo mt_memo;

/* Local. A memo of at most `decisions` decisions holding at most `plans` plans
 * (both >= 1). */
int mt_memo_create(int64_t decisions, int64_t plans, mt_memo **out, mt_error *err);

/* Local. Frees the memo and drops its plans; accepts NULL. */
void mt_memo_destroy(mt_memo *memo);

/* Local. The decision of `key`, or NULL; counts a hit or a miss. The decision may
 * be updated in place (out_id, out_slot, out shape); valid until the next insert. */
mt_decision *mt_memo_find(mt_memo *memo, const mt_memo_key *key);

/* Local. As mt_memo_find, without counting. */
mt_decision *mt_memo_peek(mt_memo *memo, const mt_memo_key *key);

/* Local. Stores a copy of `decision` for `key`, replacing any, and retains its
 * plans. Evicts decisions (CLOCK) while the memo is full or the plans would pass
 * their bound; a decision holding more plans than the bound is still stored once
 * the memo is empty. Returns the stored copy, or NULL (MT_EINVAL, MT_ENOMEM). */
mt_decision *mt_memo_insert(mt_memo *memo, const mt_memo_key *key,
                            const mt_decision *decision, mt_error *err);

/* Local. A miss, decided and stored: `map` propagated over `in` (the inputs' shapes,
 * placements and item sizes on the memo's mesh; `dtypes` their mt_dtype codes),
 * each input's move checked (mt_plan_check) and planned, and the decision stored
 * under `key` (*out, valid until the next insert). An input whose move changes
 * only mesh dims of size 1 needs no plan. Errors of mt_propagate, mt_plan_check,
 * mt_plan_create; nothing is stored then. */
int mt_memo_decide(mt_memo *memo, const mt_memo_key *key, const mt_dimmap *map,
                   const mt_prop_inputs *in, const int *dtypes, mt_decision **out,
                   mt_error *err);

/* Local. The tensor of layout key `key` as the next input of `in` (its dims,
 * shape, item size and placements; in->mesh_ndim and mesh_shape are the
 * caller's), which holds fewer than MT_PROP_MAX_INPUTS. */
void mt_prop_inputs_add(mt_prop_inputs *in, const mt_layout_key *key);

/* Local. Where the output is headed (in->want): to the gradient of the tensor of
 * layout key `key`, which lives at its placements with Replicate for its
 * Partials. */
void mt_prop_inputs_want(mt_prop_inputs *in, const mt_layout_key *key);

/* Local. As mt_memo_decide for a decision its caller made (a user's sharding
 * rule): each input goes to `targets[i]`, the output is `outcome`'s. */
int mt_memo_decide_targets(mt_memo *memo, const mt_memo_key *key,
                           const mt_prop_inputs *in, const int *dtypes,
                           const mt_placement (*targets)[MT_MAX_MESH_NDIM],
                           const mt_decision *outcome, mt_decision **out, mt_error *err);

/* Local. A redistribution decided and stored under `key`: the tensor of layout
 * `src` (on a mesh of `mesh_shape`, src->mesh_ndim dims) goes to the placements
 * `dst`; its output keeps the shape. Refused before any plan, as mt_plan_check
 * refuses: a redistribute never creates a Partial, nor reduces one its dtype
 * (mt_dtype `dtype`) has no reduction for.
 *
 *   rc = mt_memo_decide_move(memo, &key, &src, MT_DTYPE_FLOAT64, mesh_shape, to,
 *                            &dec, &err);
 */
int mt_memo_decide_move(mt_memo *memo, const mt_memo_key *key, const mt_layout_key *src,
                        int dtype, const int64_t *mesh_shape, const mt_placement *dst,
                        mt_decision **out, mt_error *err);

/* Local. The time model the plans of new decisions are ranked by (the default
 * until set; its mesh's, for a mesh's memo). Setting it validates it
 * (mt_time_model_check, MT_EINVAL changing nothing) and drops every decision.
 *
 *   rc = mt_memo_set_time_model(memo, mt_mesh_time_model(mesh), &err);
 */
int mt_memo_set_time_model(mt_memo *memo, const mt_time_model *model, mt_error *err);
const mt_time_model *mt_memo_time_model(const mt_memo *memo);

/* Local. Drops every decision; the counts of hits and misses stay. */
void mt_memo_clear(mt_memo *memo);

/* Local. Empties the memo and sets both bounds (>= 1). */
int mt_memo_set_limits(mt_memo *memo, int64_t decisions, int64_t plans, mt_error *err);

/* Local. The counts and bounds. */
MT_EXPORT void mt_memo_stats_get(const mt_memo *memo, mt_memo_stats *out);

/* Local. The layout key of the decision's output (dec->out_ndim >= 0): its
 * placements and shape, contiguous strides, elements of `dtype` (a layout key's
 * dtype) of `itemsize` bytes. */
void mt_decision_out_key(const mt_decision *dec, int dtype, int64_t itemsize,
                         mt_layout_key *out);

/* Local. The bytes the decision's plans move, over all ranks (mt_plan_bytes). */
int64_t mt_decision_bytes(const mt_decision *dec);

/* Local. Whether inputs t and k (k < t, one tensor given twice: mt_prop_inputs
 * .alias) end in the same placements, so that one move serves both. */
int mt_decision_same_move(const mt_decision *dec, int t, int k);

/* Local. Whether input t is zeros at mesh coordinate `coord`: a coordinate other
 * than 0 on a mesh dim it is partitioned over (partition[t]). */
int mt_decision_zeroed(const mt_decision *dec, int t, const int64_t *coord);

/* Local. The box of the output at mesh coordinate `coord` of a mesh of
 * `mesh_shape` (dec->mesh_ndim dims); NULL `coord` (a rank outside the mesh)
 * gives a box of ones, one per output dim. Errors of mt_layout_local_box.
 *
 *   rc = mt_decision_out_box(dec, mesh_shape, coord, &box, &err);
 */
int mt_decision_out_box(const mt_decision *dec, const int64_t *mesh_shape,
                        const int64_t *coord, mt_box *out, mt_error *err);

/* Local. A copy of the decision that owns its plans (one more owner of each), for
 * a run during which the memo may drop the decision; mt_decision_drop gives them
 * back.
 *
 *   mt_decision copy;
 *   mt_decision_hold(mt_memo_find(memo, &key), &copy);
 *   ...  // collectives, callbacks that may change the memo
 *   mt_decision_drop(&copy);
 */
void mt_decision_hold(const mt_decision *dec, mt_decision *copy);
void mt_decision_drop(mt_decision *copy);

/* Local. Whether a recorded node keeps input t as its plan moved it rather than as
 * given, so that the backward finds it where the forward used it instead of
 * moving it again: the plan reduced a Partial (the value the forward already
 * reduced is reused, never reduced twice) or moved shards between dims, and
 * gathered nothing, so the copy holds no more than the input's local array. A
 * plan that gathers keeps the input as given: the gathered copy would outgrow the
 * shard the caller holds; a chunk alone is free to take again. Decided from the
 * plan's layouts alone, so every rank keeps the same. An input without a plan, or
 * partitioned into zeros, is kept as given. */
int mt_decision_keeps_moved(const mt_decision *dec, int t);

/* Local. The layout key of input t (`given`) as its plan leaves it: the plan's
 * last placements, contiguous strides, the rest unchanged (`given` itself when
 * it has no plan with steps). */
void mt_decision_moved_key(const mt_decision *dec, int t, const mt_layout_key *given,
                           mt_layout_key *out);

#ifdef __cplusplus
}
#endif
#endif
