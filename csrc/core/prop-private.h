/* The propagation engine's shared pieces, private to the core: its state during
 * one mt_propagate call, the candidates of each mesh dim, what is known of each
 * layout an input may need, and the functions its files call across. Calls go one
 * way: propagate.c -> prop_search.c -> prop_score.c -> prop_price.c and
 * prop_candidates.c; prop_search.c -> prop_torch.c -> prop_score.c;
 * propagate.c -> prop_inputs.c -> prop.c. */
#ifndef MPITENSOR_PROP_PRIVATE_H
#define MPITENSOR_PROP_PRIVATE_H

#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"

/* All Replicate, one per shardable label, one per input for LINEAR_ONE. */
#define MT__PROP_MAX_CANDS (1 + MT_PROP_MAX_LABELS + MT_PROP_MAX_INPUTS)

enum { MT__CAND_REPLICATE, MT__CAND_LABEL, MT__CAND_PARTIAL };

/* One candidate on one mesh dim: what each input needs there and what the
 * output gets. `creates` marks an output Partial the op makes (CONTRACT, REDUCE),
 * which must be reduced some day; a kept Partial was already pending. */
typedef struct mt__cand {
  int kind;
  int label;
  int creates;
  mt_placement out;
  mt_placement in[MT_PROP_MAX_INPUTS];
  int variant[MT_PROP_MAX_INPUTS];
} mt__cand;

/* The candidates of one mesh dim, and each input's distinct needed placements
 * among them (its variants), which number the layouts the memo holds. */
typedef struct mt__dim_cands {
  int n;
  int nvariants[MT_PROP_MAX_INPUTS];
  mt_placement variants[MT_PROP_MAX_INPUTS][MT__PROP_MAX_CANDS];
  mt__cand c[MT__PROP_MAX_CANDS];
} mt__dim_cands;

/* What is known of one layout an input may need. COMM: it communicates, not yet
 * planned, with a lower bound of its cost. DONE: planned (or free). INVALID: the
 * planner refused it. */
enum { MT__PRICE_UNKNOWN = 0, MT__PRICE_COMM, MT__PRICE_DONE, MT__PRICE_INVALID };

typedef struct mt__price {
  int state;
  int64_t bytes;
  int64_t messages;
  double time;
  int64_t lb_bytes;
  int64_t lb_messages;
  double lb_time;
} mt__price;

/* A combination's standing: communicates at all, then (among those that do not)
 * how many input placements on mesh dims of size > 1 it changes, the cost of the
 * redistributions it needs now, the estimated cost of reducing later the Partials
 * it creates, then the bytes and messages moved now. The later reduction only
 * breaks ties: the rule is to move no more than torch's decision for this op, and
 * torch prices its strategies by what they move now. */
typedef struct mt__score {
  int comm;
  int changes;
  int64_t cost;
  int64_t later;
  int64_t bytes;
  int64_t messages;
  double time;
  double later_time;  /* the later reductions' messages and bytes on the wire */
  double later_local; /* and their local pass, which reducing now pays in `time` */
} mt__score;

/* One mt_propagate call: the op, its inputs as checked, every label's size and
 * role, the candidates of every mesh dim, and the memo of needed layouts' prices. */
typedef struct mt__engine {
  const mt_dimmap *map;
  const mt_prop_inputs *in;
  int ninputs;
  int mesh_ndim;
  int64_t mesh_numel;
  int64_t out_itemsize;
  mt_layout cur[MT_PROP_MAX_INPUTS];
  int64_t size[MT_PROP_MAX_LABELS];
  int out_pos[MT_PROP_MAX_LABELS];
  int dim_of[MT_PROP_MAX_INPUTS][MT_PROP_MAX_LABELS]; /* -1: absent or broadcast */
  int shardable[MT_PROP_MAX_LABELS];
  int64_t out_shape[MT_MAX_NDIM];
  int64_t out_numel;
  mt__dim_cands *dims;
  mt__price *memo[MT_PROP_MAX_INPUTS]; /* NULL: not memoised (greedy search) */
  int64_t stride[MT_PROP_MAX_INPUTS][MT_MAX_MESH_NDIM];
  mt__price *memo_block;
  const mt_time_model *model; /* what plans and candidates are timed by */
  int plan_rc; /* the first planning failure, reported if nothing is valid */
  mt_error plan_err;
} mt__engine;

/* ---- arithmetic ---------------------------------------------------------------- */

/* Costs saturate: a sum too large for int64 is simply the worst cost. */
static inline int64_t sat_add(int64_t a, int64_t b) {
  return a > INT64_MAX - b ? INT64_MAX : a + b;
}

static inline int64_t sat_mul(int64_t a, int64_t b) {
  return a != 0 && b > INT64_MAX / a ? INT64_MAX : a * b;
}

/* ---- the inputs (prop_inputs.c) ------------------------------------------------ */

/* Checks every input against the dim map into e->cur, sizes every label and the
 * output, and marks which labels a candidate may shard. */
int mt__prop_load(mt__engine *e, mt_error *err);

/* ---- candidates (prop_candidates.c) -------------------------------------------- */

/* Whether label l may be cut into `shards` chunks. */
int mt__prop_fits(const mt__engine *e, int l, int64_t shards);

/* The candidates of mesh dim m. */
void mt__prop_build_dim(const mt__engine *e, int m, mt__dim_cands *dc);

/* ---- prices (prop_price.c) ----------------------------------------------------- */

/* The layout input i must be moved to under `choice` (a Replicate input that a
 * candidate partitions stays Replicate: partitioning is local). */
void mt__prop_needed_layout(const mt__engine *e, int i, const int *choice,
                            mt_layout *out);

/* The price of input i's needed layout under `choice`, from the memo when there
 * is one. With `full` a communicating layout is planned, else only marked. */
int mt__prop_input_price(mt__engine *e, int i, const int *choice, int full,
                         mt__price *out, mt_error *err);

/* Whether input i is the same tensor as an earlier input that `choice` moves to
 * the same layout: one move serves both, so it is priced once. */
int mt__prop_moved_with_alias(const mt__engine *e, int i, const int *choice);

/* What the gradients of the inputs that want them (mt_prop_inputs.grad) cost on
 * their way back under `choice`, as torch's redistribute backward moves them. */
int mt__prop_grads_back(const mt__engine *e, const int *choice, mt__price *out,
                        mt_error *err);

/* What moving the output to where it is headed (mt_prop_inputs.want) costs under
 * `choice`: *comm says whether that move communicates; with `full` it is planned
 * into `out`, else only flagged. Nothing when no output is wanted. */
int mt__prop_way_out(const mt__engine *e, const int *choice, int full, mt__price *out,
                     int *comm, mt_error *err);

/* ---- scores (prop_score.c) ----------------------------------------------------- */

/* Whether the candidates of `choice` may go together (shard counts, even splits,
 * resized dims). */
int mt__prop_combo_valid(const mt__engine *e, const int *choice);

/* The cost of moving `bytes` in `messages`. */
int64_t mt__prop_cost(int64_t bytes, int64_t messages);

/* Scores one combination into `s`; `*valid` is 0 when it is not allowed or a
 * plan fails. Without `full` a communicating combination is only flagged. */
int mt__prop_score(mt__engine *e, const int *choice, int full, mt__score *s, int *valid,
                   mt_error *err);

/* Whether `a` beats `b` by cost; on a tie the earlier one (b) stays. */
int mt__prop_better(const mt__score *a, const mt__score *b);

/* What a combination is timed by: its moves now and the local pass of every
 * reduction its output leaves pending. */
double mt__prop_now_time(const mt__score *s);

/* Whether `a` is faster than `b` under the engine's model. */
int mt__prop_faster(const mt__score *a, const mt__score *b);

/* ---- torch's decision (prop_torch.c) ------------------------------------------- */

/* Whether torch's sharding propagation would take one of the combinations for
 * the same op and placements; if so, that one into `choice`. */
int mt__prop_torch_pick(const mt__engine *e, int *choice);

/* ---- the search (prop_search.c) ------------------------------------------------ */

/* Finds the winning combination into `best` and its score into `best_s`. */
int mt__prop_search(mt__engine *e, int *best, mt__score *best_s, mt_error *err);

#endif
