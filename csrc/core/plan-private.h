/* The redistribution planner's shared pieces, private to the core: the list of
 * steps a plan is built in, the leaf lengths its costs come from, and the
 * functions its files call across. Calls go one way: plan_create.c ->
 * plan_search.c -> plan_phases.c -> torch_order.c -> step_cost.c, step_local.c,
 * step_time.c -> step_nodes.c -> walk.c, walk_nodes.c, leaves.c, step_kind.c ->
 * plan_check.c and plan.c. */
#ifndef MPITENSOR_PLAN_PRIVATE_H
#define MPITENSOR_PLAN_PRIVATE_H

#include <assert.h>
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"

/* Steps and their totals: a plan's, and each candidate's while planning. */
typedef struct mt__steps {
  int n;
  int64_t bytes;
  int64_t messages;
  int64_t net;  /* bytes between nodes, as mt__set_times last counted them */
  double time;
  mt_step s[MT__MAX_STEPS];
} mt__steps;

/* ---- arithmetic ---------------------------------------------------------------- */

/* a + b for non-negative operands; 0 when the sum does not fit. */
static inline int add_ok(int64_t a, int64_t b, int64_t *out) {
  if (a > INT64_MAX - b) return 0;
  *out = a + b;
  return 1;
}

/* a * b for non-negative operands; 0 when the product does not fit. */
static inline int mul_ok(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > INT64_MAX / a) return 0;
  *out = a * b;
  return 1;
}

static inline int overflow(mt_error *err) {
  return mt__fail(err, MT_EOVERFLOW,
                  "The byte or message count of this redistribution does not fit in "
                  "int64");
}

/* ---- layouts ------------------------------------------------------------------- */

/* Whether a and b (same frame) agree on every mesh dim except `m` (-1: none)
 * and those of size 1. */
static inline int differ_only_on(const mt_layout *a, const mt_layout *b, int m) {
  for (int k = 0; k < a->mesh_ndim; ++k) {
    if (k == m || a->mesh_shape[k] == 1) continue;
    if (!placement_eq(&a->placements[k], &b->placements[k])) return 0;
  }
  return 1;
}

/* The number of ranks; the layouts were checked against MT__MAX_MESH_NUMEL. */
static inline int64_t mesh_numel(const mt_layout *l) {
  int64_t n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) n *= l->mesh_shape[m];
  return n;
}

/* Row-major positions between neighbours along mesh dim `m`: the product of the
 * later dims' sizes. */
static inline int64_t dim_stride(const mt_layout *l, int m) {
  int64_t s = 1;
  for (int k = m + 1; k < l->mesh_ndim; ++k) s *= l->mesh_shape[k];
  return s;
}

/* Whether the model places the mesh on more than one node. */
static inline int spans_nodes(const mt_time_model *model, const mt_layout *l) {
  return model != NULL && model->ranks_per_node >= 1 &&
         model->ranks_per_node < mesh_numel(l);
}

/* The box of a rank of a layout the planner has already validated. */
static inline void local_box(const mt_layout *l, const int64_t *coord, mt_box *out) {
  int rc = mt_layout_local_box(l, coord, out, NULL);
  assert(rc == MT_OK);
  (void)rc;
}

/* Whether `l` has no element. Pricing multiplies dims, and an empty tensor's other
 * dims may have a product beyond int64: it moves nothing, so the pricing answers
 * 0 for it before multiplying. */
static inline int is_empty(const mt_layout *l) {
  for (int d = 0; d < l->ndim; ++d) {
    if (l->shape[d] == 0) return 1;
  }
  return 0;
}

/* ---- checks (plan_check.c) ----------------------------------------------------- */

/* Validates one layout into a clean copy; the message names which layout. */
int mt__check_layout(const mt_layout *l, const char *what, mt_layout *out,
                     mt_error *err);

/* Planning and exchanges visit every rank; refuses meshes no MPI job can have. */
int mt__check_mesh_size(const mt_layout *l, mt_error *err);

/* Validates src and dst into clean copies of one tensor on one mesh. */
int mt__check_pair(const mt_layout *src, const mt_layout *dst, mt_layout *a,
                   mt_layout *b, mt_error *err);

/* Redistribution never creates a pending reduction: MT_ESTATE, as mt_plan_check
 * refuses it, where a Partial target lacks the same Partial in the source. */
int mt__check_partials(const mt_layout *a, const mt_layout *b, mt_error *err);

/* ---- step kinds (step_kind.c) -------------------------------------------------- */

/* The collective that turns placement `a` into `b` on one mesh dim, or -1. */
int mt__step_kind(const mt_placement *a, const mt_placement *b);

/* Whether changing `a` into `b` on mesh dim `m` of `src` is one valid collective:
 * every tensor dim it cuts or joins is not cut again by a later mesh dim. */
int mt__step_kind_valid(const mt_layout *src, int m, const mt_placement *a,
                        const mt_placement *b);

/* ---- leaves (leaves.c) --------------------------------------------------------- */

/* Distinct leaf lengths of one tensor dim with how many leaves have each. A
 * length chunked over G gives at most two non-zero lengths (the full chunk and a
 * remainder), so each mesh dim at most doubles them: a mesh of MT_MAX_MESH_NDIM
 * dims has at most 2^MT_MAX_MESH_NDIM non-zero ones, and zero. */
#define MT__HIST_MAX ((1 << MT_MAX_MESH_NDIM) + 1)

typedef struct mt__hist {
  int n;
  int64_t len[MT__HIST_MAX];
  int64_t count[MT__HIST_MAX];
} mt__hist;

/* The leaf lengths of tensor dim `d` under `l`, as mt_chunk cuts them. */
void mt__leaf_hist(const mt_layout *l, int d, mt__hist *out);

/* The longest leaf. */
int64_t mt__hist_max(const mt__hist *h);

/* Leaves of tensor dim `d` under `l` into off/len, empty ones included, in
 * row-major order over the mesh dims that shard it; their count. */
int64_t mt__fill_leaves(const mt_layout *l, int d, int64_t *off, int64_t *len);

/* How many leaves tensor dim `d` has under `l`: the product of the mesh dims that
 * shard it. */
int64_t mt__leaf_total(const mt_layout *l, int d);

/* ---- what a move delivers across nodes (walk_nodes.c) ------------------------- */

/* A direct exchange on nodes of `per_node` consecutive mesh positions: the
 * elements ranks receive from other nodes (summed into `net`, the most one node
 * receives into `node_most`) and the most messages one rank receives from other
 * nodes and from its own. `walked` is 0, the rest 0 too, where the walk was not
 * made: one node, one rank per node, or a mesh too large to visit node by node. */
typedef struct mt__node_walk {
  int walked;
  int64_t net;
  int64_t node_most;
  int64_t net_msgs;
  int64_t shm_msgs;
} mt__node_walk;

int mt__walk_nodes(const mt_layout *src, const mt_layout *dst, int64_t per_node,
                   mt__node_walk *out, mt_error *err);

/* ---- what a move delivers (walk.c) --------------------------------------------- */

/* Over every rank of a move from `src` to `dst` changing any mesh dims: the
 * elements of its target box it does not hold (summed into *moved, the most into
 * *most_moved, the ranks lacking any into *lacking) and the peers whose source box
 * meets its target box (summed into *msgs, the most into *most_msgs). The
 * pointers `lacking` and `msgs` with `most_msgs` may be NULL: not wanted. */
int mt__walk(const mt_layout *src, const mt_layout *dst, int64_t *moved,
             int64_t *most_moved, int64_t *lacking, int64_t *msgs, int64_t *most_msgs,
             mt_error *err);

/* ---- a step's cost (step_cost.c, step_local.c, step_time.c) -------------------- */

/* Sum over ranks of numel(box); 0 when it does not fit. */
int mt__sum_numel(const mt_layout *l, int64_t *out);

/* Elements a ring all-reduce of mesh dim `m` of `src` moves, summed over ranks;
 * 0 when they do not fit. */
int mt__reduced_elements(const mt_layout *src, int m, int64_t *out);

/* Elements moved from `src` to `dst`, which differ on mesh dim `m` only, neither
 * Partial there, summed into *out and the most one rank receives into *most. */
int mt__moved_elements(const mt_layout *src, const mt_layout *dst, int m, int64_t *out,
                       int64_t *most, mt_error *err);

/* Fills a step's bytes, messages and what the time model prices it by, from its
 * kind and layouts. */
int mt__price_step(mt_step *st, int64_t itemsize, mt_error *err);

/* Fills a priced step's copy_bytes and reduce_bytes. */
int mt__price_local(mt_step *st, int64_t itemsize, mt_error *err);

/* A step's predicted seconds under `model`. */
double mt__step_time(const mt_step *st, const mt_time_model *model);

/* Sets every step's time, and its bytes between nodes under `model`'s node layout
 * where they were counted for another, and the list's totals. */
void mt__set_times(mt__steps *list, const mt_time_model *model);

/* ---- a step across nodes (step_nodes.c) ---------------------------------------- */

/* The collective of the time model (mt_time_kind) that a step kind runs. */
int mt__coll_of(int kind);

/* Bytes of the one-mesh-dim collective `kind` on mesh dim `m` of `src` that cross
 * between nodes under `model`: its `bytes` (summed over ranks) times the share
 * mt_time_net_share gives for its group and `vector` bytes. */
int64_t mt__coll_net_bytes(int kind, const mt_layout *src, int m, int64_t bytes,
                           int64_t vector, const mt_time_model *model);

/* Fills a priced step's bytes and messages between nodes under `model`'s node
 * layout (net_bytes, node_bytes, rank_net_messages, rank_shm_messages) and
 * node_layout. A direct exchange too large to walk node by node, or whose walk
 * cannot allocate, is counted as if everything crossed between nodes. */
void mt__price_nodes(mt_step *st, const mt_time_model *model);

/* Members per node of the groups along mesh dim `m` of `l` under `model`. */
int64_t mt__members_per_node(const mt_layout *l, int m, const mt_time_model *model);

/* -1 when `a` is predicted faster than `b`, 1 when slower, 0 when they tie. */
int mt__time_order(const mt__steps *a, const mt__steps *b);

/* ---- building (plan_phases.c, torch_order.c, plan_search.c) -------------------- */

/* The last direct exchange priced in one planning: the candidates of a plan
 * often price the same one (an order planned for time and again bytes first),
 * and its walk is the dearest part of planning. */
typedef struct mt__direct_memo {
  int have;
  const mt_time_model *nodes; /* whose node layout its steps are counted under */
  mt_step step;
} mt__direct_memo;

/* Appends the one-mesh-dim step that sets placement `to` on mesh dim `m` of `cur`
 * (a valid one), and advances `cur`. */
int mt__step_to(mt__steps *list, mt_layout *cur, int m, mt_placement to,
                int64_t itemsize, mt_error *err);

/* Appends the reductions of every Partial that `dst` does not keep, and advances
 * `cur` past them; `model` (NULL: none) chooses how an all-reduce whose groups
 * span nodes runs. */
int mt__reduce_phase(mt__steps *list, mt_layout *cur, const mt_layout *dst,
                     int64_t itemsize, const mt_time_model *model, mt_error *err);

/* The orders of a per-mesh-dim chain: the inner mesh dims first, then the cuts;
 * the outer mesh dims first, then the cuts; torch's own steps (torch_order.c),
 * cuts among them. */
enum { MT__INNER_FIRST, MT__OUTER_FIRST, MT__TORCH_STEPS };

/* Whether mesh dims before `m` shard tensor dim `d` alike in `a` and `b`: where
 * they do not, torch's order replicates mesh dim `m` before cutting `d` again. */
int mt__same_outer_sharding(const mt_layout *a, const mt_layout *b, int m, int d);

/* Appends a per-mesh-dim chain from `cur` to `dst` in `order`; `*found` is 0 when
 * some step would not be valid. */
int mt__chain_phase(mt__steps *list, mt_layout cur, const mt_layout *dst,
                    int64_t itemsize, int order, int *found, mt_error *err);

/* Appends the Shard/Replicate changes from `cur` to `dst`: the cheaper of the
 * chain and one direct exchange. */
int mt__reshard_phase(mt__steps *list, const mt_layout *cur, const mt_layout *dst,
                      int64_t itemsize, const mt_time_model *model,
                      mt__direct_memo *memo, mt_error *err);

/* How many steps of `list` send messages (all but chunks). */
int mt__communicating_steps(const mt__steps *list);

/* Bytes that torch's order moves from `src` to `dst`, priced as plan steps are,
 * into *out, and those between nodes under `model` into *net. */
int mt__torch_order_bytes(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                          const mt_time_model *model, int64_t *out, int64_t *net,
                          mt_error *err);

/* What torch's ranking of strategies charges the move from normalised `src` to
 * `dst` (torch's redistribute_cost), in microseconds; HUGE_VAL for a step torch
 * refuses. */
double mt__torch_order_cost(const mt_layout *src, const mt_layout *dst,
                            int64_t itemsize);

/* The fastest candidate from normalised `src` to `dst` into `list`, among those
 * that move no more bytes than torch's order. */
int mt__best_candidate(mt__steps *list, const mt_layout *src, const mt_layout *dst,
                       int64_t itemsize, const mt_time_model *model, mt_error *err);

#endif
