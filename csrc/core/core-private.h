/* Helpers shared by the core's translation units; not part of the public API. */
#ifndef MPITENSOR_CORE_PRIVATE_H
#define MPITENSOR_CORE_PRIVATE_H

#include <stddef.h>
#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"

/* The core's short name for mt_error_set: `return mt__fail(err, MT_EINVAL, ...);`. */
#define mt__fail mt_error_set

/* Planning, exchanges and the count of what ranks lack may visit every rank, and
 * MPI numbers ranks with an int, so a larger mesh cannot exist and would only make
 * planning run for hours. */
#define MT__MAX_MESH_NUMEL ((int64_t)INT32_MAX)

/* ---- plans: the handle the planner fills (plan.c) ----------------------------- */

/* A chain may gather and cut again on every mesh dim (2 steps each), before and
 * after one reduction per mesh dim: no plan has more steps. */
#define MT__MAX_STEPS (5 * MT_MAX_MESH_NDIM)

struct mt_plan;
struct mt_step;

/* A plan with one owner holding a copy of `n` (<= MT__MAX_STEPS) steps, whose
 * byte and message totals the planner has checked to fit in int64. */
int mt__plan_new(const struct mt_step *steps, int n, struct mt_plan **out,
                 mt_error *err);

/* ---- bitmasks: the label, input and dim sets of a dim map --------------------- */

/* Bit i of a bitmask. */
static inline int bit(uint32_t mask, int i) {
  return (int)((mask >> i) & 1u);
}

/* The mask of bits 0 .. n-1, for range checks of bitmasks. */
static inline uint32_t low_bits(int n) {
  return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

/* ---- placements: the one definition of each rule (plan*.c, prop*.c, ...) ----- */

static inline mt_placement replicate(void) {
  mt_placement p = {MT_PLACEMENT_REPLICATE, 0, 0, 0};
  return p;
}

static inline mt_placement shard(int d) {
  mt_placement p = {MT_PLACEMENT_SHARD, d, 0, 0};
  return p;
}

static inline mt_placement partial(int op) {
  mt_placement p = {MT_PLACEMENT_PARTIAL, 0, op, 0};
  return p;
}

/* Placements compare on the fields their kind uses, so a Replicate with a stray
 * `dim` still equals Replicate. */
static inline int placement_eq(const mt_placement *a, const mt_placement *b) {
  if (a->kind != b->kind) return 0;
  if (a->kind == MT_PLACEMENT_SHARD) return a->dim == b->dim;
  if (a->kind == MT_PLACEMENT_STRIDED)
    return a->dim == b->dim && a->split_factor == b->split_factor;
  if (a->kind == MT_PLACEMENT_PARTIAL) return a->reduce_op == b->reduce_op;
  return 1;
}

static inline int is_shard(const mt_placement *p, int d) {
  return p->kind == MT_PLACEMENT_SHARD && p->dim == d;
}

/* Whether moving `from` to `to` would create a pending reduction, which only
 * from_local and operators may do: a Partial target needs the same Partial. */
static inline int creates_partial(const mt_placement *from, const mt_placement *to) {
  return to->kind == MT_PLACEMENT_PARTIAL && !placement_eq(from, to);
}

/* Over every rank of validated layouts `have` and `need` of one tensor on one mesh
 * (Partial mesh dims cut nothing): the elements of its `need` box it does not hold
 * in its `have` box, summed into *sum, the most one rank lacks into *most and the
 * ranks lacking any into *ranks. Visits the coordinates of the mesh dims that
 * shard something only. MT_ENOMEM, or MT_EOVERFLOW when the sum does not fit
 * (walk.c). */
int mt__lack(const mt_layout *have, const mt_layout *need, int64_t *sum, int64_t *most,
             int64_t *ranks, mt_error *err);

/* The seconds `model` predicts for the plan of a move from `src` to `dst`
 * (validated, of `itemsize` elements) that only cuts Replicate mesh dims: its
 * chunks' copies, priced as the planner prices them, without planning
 * (step_local.c). */
double mt__cuts_time(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                     const mt_time_model *model);

/* mt_layout_init, and when `strided` is 1 also STRIDED placements (layout.c). */
int mt__layout_init(mt_layout *out, int ndim, const int64_t *shape, int mesh_ndim,
                    const int64_t *mesh_shape, const mt_placement *placements,
                    int strided, mt_error *err);

/* torch's name of a reduce op ("sum"), or "?" (placement.c). */
const char *mt__reduce_name(int op);

/* A placement as torch prints it, for error messages: its repr ("Shard(dim=0)",
 * "Replicate()", "Partial(sum)"), or with `brief` its str ("S(0)", "R",
 * "P(sum)"). Returns `buf` (placement.c). */
const char *mt__placement_text(const mt_placement *p, int brief, char *buf, size_t len);

/* Copies `n` runs of `run` bytes, the i-th from s + i*ss to d + i*ds, into a
 * destination array of `dst_bytes` bytes in all, which decides whether the
 * stores bypass the cache (copy.c). */
void mt__copy_runs(char *d, const char *s, int64_t n, int64_t ds, int64_t ss,
                   int64_t run, int64_t dst_bytes);

/* One run by mt__copy_runs's streaming loop (memcpy off x86-64), fenced,
 * whatever the CPU's vendor and size: the tests reach the loop where the library
 * would not pick it (copy.c). Only on CPUs with AVX2. */
void mt__copy_run_stream(char *d, const char *s, int64_t n);

#endif
