/* Sharding propagation: which placements an operation's inputs need and its output
 * gets, chosen by the cost of the redistributions that reach them.
 *
 * An operation is described once as a dim map: einsum-like labels on every input
 * dim and output dim, and what a label means when the mesh shards it. One engine
 * serves every operation (elementwise with broadcasting, matmul, einsum,
 * reductions, transposes, softmax-like ops, ...). All calls are Local. */
#ifndef MPITENSOR_PROP_H
#define MPITENSOR_PROP_H

#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_PROP_MAX_INPUTS 8
#define MT_PROP_MAX_LABELS 32

/* Combinations of per-mesh-dim candidates priced one by one; above this many the
 * engine chooses mesh dim by mesh dim (see mt_propagate). */
#define MT_PROP_MAX_COMBOS 4096

/* The latency of one message expressed in bytes (what a fast link moves while one
 * message starts) in the reference pricing that caps a decision's bytes
 * (mt_propagate): bytes + MT_PROP_MESSAGE_BYTES * messages, both summed over
 * ranks. */
#define MT_PROP_MESSAGE_BYTES 8192

/* What sharding a label means. KEEP: the label is an output dim, a Shard of it
 * passes through to the output. CONTRACT: summed away (matmul's inner dim); inputs
 * sharded on it give an output Partial(sum). REDUCE: reduced away with `reduce_op`
 * (sum, max, min, ...): inputs sharded on it give an output Partial(reduce_op); a
 * REDUCE label with MT_REDUCE_AVG is always even_only. REPLICATE: may not be
 * sharded (a softmax dim, which stays in the output, a dim a non-linear reduction
 * removes, a dim whose sharding the op cannot honour). */
typedef enum mt_label_kind {
  MT_LABEL_KEEP = 0,
  MT_LABEL_CONTRACT = 1,
  MT_LABEL_REDUCE = 2,
  MT_LABEL_REPLICATE = 3
} mt_label_kind;

/* How an op treats Partial inputs on one mesh dim. NONE: every Partial input is
 * reduced first. LINEAR_ALL: when every input carries the same Partial(sum) or
 * Partial(avg), they may keep it, giving that Partial (add, subtract, negative,
 * sum: P + P -> P). LINEAR_ONE: one input listed in `partial_inputs` that carries
 * Partial(sum|avg) may keep it while every other input is Replicate on that mesh
 * dim, giving that Partial (multiply, matmul, divide's numerator: P * R -> P); with
 * several such inputs, one candidate each. SAME_OP: when every input carries the
 * same Partial(op) for an op in `partial_ops`, they may keep it (maximum keeps
 * P(max), minimum P(min)). ADDITIVE (add and subtract of tensors, torch's
 * additive rules): where an input carries Partial(sum), every input may be
 * Partial(sum), a Replicate one partitioned (it counts once over the group: see
 * mt_decision); where one carries Partial(avg), the inputs carrying it keep it and
 * the others are Replicate (avg(p + r) = avg(p) + r); where input 0 of two carries
 * Partial(max) or Partial(min), it keeps it and input 1 is Replicate (max(p) - r =
 * max(p - r); not r - p, which would flip the order). Each gives that Partial.
 * NEGATE (one input, negative): Partial(sum|avg) stays, Partial(max) becomes
 * Partial(min) and back (-max(p) = min(-p)). MONOTONE (two inputs of an op
 * non-decreasing in both, maximum and minimum): where some input carries
 * Partial(max) or Partial(min), the inputs carrying it keep it and the others are
 * Replicate (max(min(p), r) = min(max(p, r))): all of them when the op is in
 * `partial_ops` (maximum of two P(max)), else the first only; gives that Partial. */
typedef enum mt_partial_rule {
  MT_PARTIAL_NONE = 0,
  MT_PARTIAL_LINEAR_ALL = 1,
  MT_PARTIAL_LINEAR_ONE = 2,
  MT_PARTIAL_SAME_OP = 3,
  MT_PARTIAL_ADDITIVE = 4,
  MT_PARTIAL_NEGATE = 5,
  MT_PARTIAL_MONOTONE = 6
} mt_partial_rule;

/* An operation. Input i has in_ndim[i] dims labelled in_labels[i][0..]; the output
 * has out_ndim dims labelled out_labels[0..]. Labels are small ints in
 * [0, nlabels). A label may appear in several inputs (they must then agree on its
 * size, except an input dim of size 1 that broadcasts: mark it with `in_bcast`;
 * such a dim is Replicate wherever its label is sharded). A label repeated within
 * one input (einsum's "ii") is never sharded. An output label takes its size from
 * the non-broadcast input dims holding it, else 1 if only broadcast dims hold it;
 * a label in `sized_labels` takes label_size[label] instead (broadcast_to's and
 * expand_dims's new dims, which no input holds; inputs holding it must agree).
 * An output dim may be resized (bit d of `out_resized`, size `out_size[d]`): the
 * leftmost dim of a group that reshape merges or splits, labelled like the
 * group's leftmost input dim (size a) but of the group's leftmost output size b.
 * Seen as the group's flat elements, a shard of the label is then a shard of the
 * output dim exactly when its share scales: a rank holding [o, o+n) of the label
 * holds [o', o'+n') of the output dim with o*b == o'*a and n*b == n'*a (both
 * empty, or the same fraction of the group). A Shard of that label passes to the
 * output only on combinations where every rank's share scales so (always when a
 * and b divide evenly by the shards; also some uneven cases, e.g. 5 rows of 2
 * over 3 ranks (2, 2, 1) as 10 elements (4, 4, 2)).
 * `partial_inputs` is a bitmask of the inputs LINEAR_ONE allows to be Partial;
 * `partial_ops` a bitmask of mt_reduce_op values SAME_OP keeps. `even_only` is a
 * bitmask of labels that may be sharded only when every shard has the same size
 * (mean's Partial(avg): uneven shards would weigh the partial means wrongly).
 * `reduce_first[i]` is a bitmask of mt_reduce_op values: a Partial of one of them
 * that input i carries is reduced first, whatever `partial_rule` allows, because
 * the rule's rewrite is not exact in the op's dtypes (mt_dimmap_dtypes fills it).
 * A REDUCE label of max or min needs an element in every shard, unless it is in
 * `empty_identity`: all's and any's reduction of an empty shard is the identity of
 * their bool min and max.
 * Zero-initialise the struct and fill what the op uses. */
typedef struct mt_dimmap {
  int ninputs;
  int nlabels;
  int in_ndim[MT_PROP_MAX_INPUTS];
  int in_labels[MT_PROP_MAX_INPUTS][MT_MAX_NDIM];
  uint32_t in_bcast[MT_PROP_MAX_INPUTS]; /* bit d: input dim d broadcasts (size 1) */
  int out_ndim;
  int out_labels[MT_MAX_NDIM];
  int label_kind[MT_PROP_MAX_LABELS];
  int label_reduce_op[MT_PROP_MAX_LABELS]; /* for MT_LABEL_REDUCE */
  uint32_t even_only;
  int partial_rule;
  uint32_t partial_inputs;
  uint32_t partial_ops;
  uint32_t sized_labels;
  int64_t label_size[MT_PROP_MAX_LABELS]; /* for labels in sized_labels */
  uint32_t out_resized;                   /* bit d: output dim d is out_size[d] long */
  int64_t out_size[MT_MAX_NDIM];
  uint32_t reduce_first[MT_PROP_MAX_INPUTS];
  uint32_t empty_identity; /* REDUCE labels whose empty shard gives the op's identity */
} mt_dimmap;

/* ---- Dim maps of the operation families, built from an op's signature. ---- */

/* How an elementwise op treats Partial inputs, by what it does to a pending sum.
 * NONE: every Partial is reduced first (exp, comparisons, ...). ADD (add, subtract,
 * negative, positive): when every operand is a tensor, the ADDITIVE rule (P + P
 * -> P, P(sum) + R -> P(sum) with R partitioned, P(avg|max|min) + R -> P; one
 * operand: LINEAR_ALL); a scalar operand would be added once per rank, so then
 * Partials are reduced. MUL (multiply): a tensor times scalars stays
 * Partial; of several tensors one Partial factor may stay while the others are
 * Replicate. DIV (true_divide): a Partial numerator (operand 0) over Replicate or
 * a scalar stays; a Partial denominator is reduced. MAX, MIN (maximum, minimum):
 * Partial(max), Partial(min) inputs that all agree stay; of two tensors, the
 * MONOTONE rule. NEG (negative): NEGATE. INCREASING (a unary op non-decreasing on
 * its whole domain: exp, floor, tanh, ...): Partial(max) and Partial(min) stay. */
typedef enum mt_elementwise_kind {
  MT_ELEMENTWISE_NONE = 0,
  MT_ELEMENTWISE_ADD = 1,
  MT_ELEMENTWISE_MUL = 2,
  MT_ELEMENTWISE_DIV = 3,
  MT_ELEMENTWISE_MAX = 4,
  MT_ELEMENTWISE_MIN = 5,
  MT_ELEMENTWISE_NEG = 6,
  MT_ELEMENTWISE_INCREASING = 7,
  MT_ELEMENTWISE_COUNT
} mt_elementwise_kind;

/* Local. The dim map of an elementwise op of `noperands` operands (at most
 * MT_PROP_MAX_INPUTS) of which those in the bitmask `tensors` are tensors (the
 * map's inputs, in operand order; the others are scalars). Input i has ndim[i]
 * dims of sizes shape[i]. NumPy broadcasting: inputs align to the right on the
 * output, whose dims are the labels (all KEEP); a dim of size 1 facing a larger
 * one broadcasts. Shapes that do not broadcast are MT_EINVAL. */
MT_EXPORT int mt_dimmap_elementwise(int kind, int noperands, uint32_t tensors,
                                    const int *ndim, const int64_t (*shape)[MT_MAX_NDIM],
                                    mt_dimmap *out, mt_error *err);

/* Local. The dim map of matmul (a @ b, NumPy's rules) or, with `transpose_b`, of
 * a @ b.T for a 2-D b held as it is (nn.functional.linear's weight). Batch dims
 * broadcast like elementwise inputs, the rows and columns are KEEP and the inner
 * dim CONTRACT (sharded -> Partial(sum)); a Partial(sum|avg) operand passes when
 * the other is Replicate (LINEAR_ONE on both). A 0-d operand, batch dims that do
 * not broadcast, or transpose_b with a b that is not 2-D are MT_EINVAL. */
MT_EXPORT int mt_dimmap_matmul(int a_ndim, const int64_t *a_shape, int b_ndim,
                               const int64_t *b_shape, int transpose_b, mt_dimmap *out,
                               mt_error *err);

/* Local. The dim map of joining `ninputs` tensors (2 to MT_PROP_MAX_INPUTS) along
 * dim `axis` (np.concatenate): the output's dims are the inputs', all KEEP but
 * `axis`, which each input holds as a label of its own that must be whole
 * (REPLICATE) and the output holds as long as theirs together. Joining is
 * linear: torch's ADDITIVE rule keeps Partials. Inputs of other ranks, or of
 * other sizes outside `axis`, or an axis out of range are MT_EINVAL. */
MT_EXPORT int mt_dimmap_join(int ninputs, const int *ndim,
                             const int64_t (*shape)[MT_MAX_NDIM], int axis, mt_dimmap *out,
                             mt_error *err);

/* Local. The dim map of stacking `ninputs` tensors (1 to MT_PROP_MAX_INPUTS) of one
 * shape along a new dim `axis` of the output (np.stack): the inputs' dims are
 * shared KEEP labels, the new one a REPLICATE label as long as the inputs are
 * many. Stacking is linear: torch's ADDITIVE rule keeps Partials. Inputs of
 * other shapes, or an axis outside 0..ndim, are MT_EINVAL. */
MT_EXPORT int mt_dimmap_stack(int ninputs, const int *ndim,
                              const int64_t (*shape)[MT_MAX_NDIM], int axis, mt_dimmap *out,
                              mt_error *err);

/* Local. The dim map of a function of one tensor along the lanes of dim `axis`
 * (np.diff), each lane of which it needs whole: the input's `axis` is REPLICATE,
 * the output's a label of its own, `shorten` shorter (never below 0), the other
 * dims KEEP. Partials are reduced first (a difference of bools is not linear). An
 * axis out of range or a negative `shorten` is MT_EINVAL. */
MT_EXPORT int mt_dimmap_lanes(int ndim, const int64_t *shape, int axis, int64_t shorten,
                              mt_dimmap *out, mt_error *err);

/* What a reduction does when the dims it reduces are sharded. `reduce_op` is the
 * mt_reduce_op the partial results combine with (the reduced labels are REDUCE),
 * or -1 when they do not combine (REPLICATE: argmax, std, ...);
 * `partial_rule` and `partial_ops` treat Partial inputs as in mt_dimmap;
 * `even_only` asks for equal shards of the reduced dims (mean); `logical` marks
 * all and any, whose bool results combine by their min and max whatever the
 * input's dtype, and whose empty block gives their identity. */
typedef struct mt_reduction_rule {
  int reduce_op;
  int partial_rule;
  uint32_t partial_ops;
  int even_only;
  int logical;
} mt_reduction_rule;

/* Local. The dim map of a reduction by `rule` of an ndim-d input over the dims in
 * the bitmask `axes`: kept dims are KEEP; with `keepdims` each reduced dim stays
 * as a new sized REPLICATE label of size 1. Max and min of bool or complex values
 * (`dtype`, an mt_dtype code; not a `logical` rule's) are not combined here, so
 * their reduced dims are REPLICATE and Partials are reduced first. Axes beyond
 * ndim are MT_EINVAL. */
int mt_dimmap_reduction(const mt_reduction_rule *rule, int ndim, uint32_t axes,
                        int keepdims, int dtype, mt_dimmap *out, mt_error *err);

/* The signature of an operation of a registered family: which builder makes its
 * dim map, with what. */
typedef enum mt_op_family {
  MT_OP_ELEMENTWISE = 0, /* `kind`: an mt_elementwise_kind */
  MT_OP_MATMUL = 1,
  MT_OP_REDUCTION = 2, /* `rule` */
  MT_OP_JOIN = 3,      /* np.concatenate: mt_dimmap_join along the one dim of `axes` */
  MT_OP_STACK = 4,     /* np.stack: mt_dimmap_stack along the one dim of `axes` */
  MT_OP_LANES = 5      /* np.diff: mt_dimmap_lanes along the one dim of `axes` */
} mt_op_family;

typedef struct mt_op_sig {
  int family;
  int kind;
  mt_reduction_rule rule;
} mt_op_sig;

/* What one call adds to the shapes: elementwise, the operand count and the bitmask
 * of the tensor operands (the inputs); a reduction, the reduced dims and keepdims;
 * a join, a stack or a lanes op, its one dim in `axes`, and a lanes op how much
 * shorter its output is along that dim (`shorten`). */
typedef struct mt_op_args {
  int noperands;
  uint32_t tensors;
  uint32_t axes;
  int keepdims;
  int64_t shorten;
} mt_op_args;

/* The inputs as they are: global shapes and current placements on one mesh.
 * `out_itemsize` prices the later reduction of a Partial the op creates; 0 means
 * the largest input itemsize. `alias[i]` is j + 1 when input i is the same tensor
 * as an earlier input j (x * x), else 0: a combination that needs both in the
 * same layout moves them once, and is priced once (the caller runs one move for
 * both); such inputs must have the same shape, item size and placements.
 * Bit i of `grad` says input i's gradient is wanted (a training step): where
 * every combination communicates, each is also charged its gradients' way back,
 * as torch's redistribute backward moves them: from the layout input i was moved
 * to (Replicate for its Partials, Partial(sum) where a LINEAR_ONE candidate keeps
 * another input's Partial) into input i's own (Replicate for its Partials, the
 * placement of a Partial's gradient). So exp of a Partial is all-reduced, as in
 * torch, rather than reduce-scattered and gathered again in the backward.
 * `want` (1) says where the output is headed: a backward computing an input's
 * gradient moves it to that input's placements, `want_placements`, next. Every
 * combination is then also charged the move of its output there, so the product
 * is made where the gradient must land when that is cheaper in all; ignored
 * when the output's shape is not known to equal the wanted one (`want_ndim`,
 * `want_shape`). */
typedef struct mt_prop_inputs {
  int ninputs;
  int mesh_ndim;
  int64_t mesh_shape[MT_MAX_MESH_NDIM];
  int ndim[MT_PROP_MAX_INPUTS];
  int64_t shape[MT_PROP_MAX_INPUTS][MT_MAX_NDIM];
  int64_t itemsize[MT_PROP_MAX_INPUTS];
  mt_placement placements[MT_PROP_MAX_INPUTS][MT_MAX_MESH_NDIM];
  int64_t out_itemsize;
  const mt_time_model *model; /* what moves are timed by; NULL: the built-in model */
  int alias[MT_PROP_MAX_INPUTS];
  uint32_t grad;
  int want;
  int want_ndim;
  int64_t want_shape[MT_MAX_NDIM];
  mt_placement want_placements[MT_MAX_MESH_NDIM];
} mt_prop_inputs;

/* The decision: the placements each input must be redistributed to (equal to its
 * current ones where it needs no communication), the output's placements and global
 * shape, and the total cost (bytes over all ranks of the redistributions, then
 * their messages, as mt_plan_bytes and mt_plan_messages count them) of reaching
 * the input placements, and of the gradients' way back where `grad` asked. */
typedef struct mt_prop_result {
  mt_placement in_placements[MT_PROP_MAX_INPUTS][MT_MAX_MESH_NDIM];
  mt_placement out_placements[MT_MAX_MESH_NDIM];
  int out_ndim;
  int64_t out_shape[MT_MAX_NDIM];
  int64_t bytes;
  int64_t messages;
} mt_prop_result;

/* Local. The dim map of an operation of signature `sig` on `in`'s shapes (its
 * mesh and placements are not used), by the builder of its family; `dtype` is the
 * mt_dtype of the first input (reductions; complex values, which have no order,
 * keep no Partial(max|min) through NEG or INCREASING ops). Errors as the builders'; a matmul of
 * other than two tensors or a reduction of other than one is MT_EINVAL. */
int mt_op_dimmap(const mt_op_sig *sig, const mt_op_args *args, const mt_prop_inputs *in,
                 int dtype, mt_dimmap *out, mt_error *err);

/* Local. Whether a pending Partial(op) whose values have mt_dtype `in` may pass
 * through an operation whose local result has mt_dtype `out` and still reduce to
 * the value NumPy gives on the global array. The global value is the reduction
 * in `in`'s own arithmetic (integers wrap, an integer average floors), so a
 * rewrite holds only where that arithmetic commutes with the op:
 *   sum, product: the same dtype; float or complex to a float or complex that
 *     holds its range and precision (up to rounding; a narrower one overflows
 *     where the sum does not); an integer to an integer no wider (wrapping in
 *     the narrower width commutes with the sum). Not a wider integer (the global
 *     value wraps in the input's width first), nor a cast between integers,
 *     floats and bool (truncation and the nonzero test are not linear);
 *   avg: as sum, for floats and complex only (an integer average floors);
 *   max, min: with `arithmetic` (the op negates them or adds to them: NEGATE,
 *     ADDITIVE), only a floating-point result, since integers wrap where float
 *     rounding and overflow keep the order; without (maximum, exp, a move), a
 *     cast that keeps the order: the same dtype, from bool, from an integer or a
 *     float to a float, or to an integer that holds every value of `in`.
 * An unknown dtype (< 0) is exact only when both are the same code. */
MT_EXPORT int mt_partial_exact(int op, int in, int out, int arithmetic);

/* Local. Sets map->reduce_first to the Partials that mt_partial_exact refuses for
 * each input (of mt_dtype in_dtypes[i]) going to a result of mt_dtype `out_dtype`,
 * < 0 when that is not known (each input's own is used). `arithmetic` follows from
 * the map's partial_rule: NEGATE and ADDITIVE compute on Partial(max|min) values.
 * A result that is not floating point also makes REDUCE labels of avg REPLICATE:
 * each shard's integer mean would be rounded before the shards are averaged. */
void mt_dimmap_dtypes(mt_dimmap *map, const int *in_dtypes, int out_dtype);

/* Local. Checks a dim map on its own: 1 to MT_PROP_MAX_INPUTS inputs, label
 * ranges and kinds, every output label KEEP or REPLICATE and at most once, every
 * KEEP label in the output, CONTRACT/REDUCE labels absent from it, every output
 * label held by an input or sized, a resized output dim's label held by an input
 * and not sized, sizes >= 0, bitmasks within range. MT_EINVAL with a
 * sentence otherwise. */
MT_EXPORT int mt_dimmap_check(const mt_dimmap *map, mt_error *err);

/* Local. Chooses placements for `map` applied to `in`.
 *
 * Candidates per mesh dim of size > 1, in this order: all Replicate; for each
 * shardable label in increasing order (not REPLICATE, held by some input on a
 * non-broadcast dim and repeated in none), every input holding it sharded on it
 * and the others Replicate; then the Partial pass-throughs `partial_rule` allows
 * for the inputs' current Partials, in input order (none that keeps a Partial
 * its input's `reduce_first` names). The output of a candidate is Shard(the
 * label's output dim) for KEEP, Partial(sum) for CONTRACT, Partial(reduce_op)
 * for REDUCE, the kept Partial for a pass-through, else Replicate. A mesh dim of
 * size 1 moves no data whatever its labels say, so all its candidates are free;
 * they are ordered so that ties go to the one the most inputs already hold, then
 * to one creating no Partial, then to one whose output is a Shard (a Shard stays
 * a Shard there, as in torch).
 *
 * Candidates are combined over mesh dims (a label sharded by several mesh dims is
 * nested in mesh-dim order); a combination is valid when every REDUCE label with
 * max, min or avg has at least one element per shard (KEEP labels may leave
 * shards empty, as an input already sharded so does, and CONTRACT labels and sum
 * or product REDUCE labels too: an empty shard gives 0 or 1, the identity of the
 * pending Partial), every even_only label divides evenly over its shards and
 * every label kept on a resized output dim scales (above). Each input is priced
 * with mt_plan_create_timed under `in->model` from its current placements (plans
 * that provably cannot change the outcome are skipped); a plan that fails makes
 * the combination invalid. The winner is, in this order: one that needs no
 * communication (among those, the one changing the fewest input placements, then
 * as below); else the fastest under the time model, that is the least predicted
 * time of the plans now (mt_plan_time), then of reducing later the Partials the op
 * creates (CONTRACT, REDUCE: a reduce-scatter of the output per such mesh dim),
 * fewer bytes, fewer messages and the first in enumeration order (mesh dim 0's
 * candidates outermost), among the combinations that move no more bytes than the
 * reference. The reference is, among the combinations that move no more bytes
 * than torch's decision, the lowest bytes + MT_PROP_MESSAGE_BYTES * messages now,
 * then the lower such estimate of the later reductions, fewer bytes, fewer
 * messages, the first. Torch's decision is the combination torch's sharding
 * propagation takes: among those whose candidate on every mesh dim of more than
 * one rank replicates every input or keeps some input's Shard or Partial as it is
 * (torch's strategies follow the inputs' placements), the one whose inputs' moves
 * torch charges least (mt_plan_torch_cost; torch prices neither the gradients'
 * way back nor the output's way out), the first on a tie; its bytes are counted
 * with those, as every combination's are. Bytes are the rule and messages come
 * second: a decision never moves more bytes than torch's, forward and backward,
 * even where fewer collectives would move more, while the time model may pick
 * fewer collectives or rounds within those bytes (S0 @ S0 may move one operand
 * by all-to-all and leave a Partial(sum) rather than gather the other). Every
 * rank computes the same numbers in the same order, so every rank decides the
 * same. Above MT_PROP_MAX_COMBOS combinations the mesh dims are chosen one at a
 * time from the first by the reference order, with later mesh dims held at their
 * first candidate (Replicate, or on a mesh dim of size 1 the one ordered first),
 * and torch's decision replaces that pick where it moves fewer bytes.
 *
 * Shapes that disagree on a label, a broadcast dim whose size is not 1, or inputs
 * that do not fit the map are MT_EINVAL; bad placements fail as in
 * mt_layout_init. `out` is untouched on error. */
int mt_propagate(const mt_dimmap *map, const mt_prop_inputs *in, mt_prop_result *out,
                 mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
