/* Torch's order of steps for a redistribution: what it moves, the byte limits no
 * plan may exceed, so that mpitensor never moves more than torch for the same
 * redistribution, in all and between nodes; and what torch's ranking of
 * strategies charges for it, which tells the propagation engine the decision
 * torch would take (prop_torch.c). */
#include <math.h>
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "plan-private.h"

int mt__same_outer_sharding(const mt_layout *a, const mt_layout *b, int m, int d) {
  for (int k = 0; k < m; ++k) {
    if (is_shard(&a->placements[k], d) != is_shard(&b->placements[k], d)) return 0;
  }
  return 1;
}

/* The next step of torch's order from `cur` towards `dst`
 * (torch/distributed/tensor/_redistribute.py): inner mesh dims first, each to its
 * target, or to Replicate where the mesh dims before it shard that tensor dim
 * differently in the two layouts; then outer to inner for what is left. *pos
 * counts the 2 * mesh_ndim places visited (start it at 0); the step's mesh dim
 * goes into *m and its target into *to. 0 once no step is left. */
static int next_torch_step(const mt_layout *cur, const mt_layout *dst, int *pos, int *m,
                           mt_placement *to) {
  int n = cur->mesh_ndim;
  for (; *pos < 2 * n; ++*pos) {
    int first = *pos < n;
    *m = first ? n - 1 - *pos : *pos - n;
    *to = dst->placements[*m];
    if (first && to->kind == MT_PLACEMENT_SHARD &&
        !mt__same_outer_sharding(cur, dst, *m, to->dim))
      *to = replicate();
    if (!placement_eq(&cur->placements[*m], to)) {
      ++*pos;
      return 1;
    }
  }
  return 0;
}

/* The bytes between nodes of torch's step on mesh dim `m` from `cur` to `next`,
 * moving `bytes` in all: as a plan's collective of that kind is counted, by the
 * vector of the rank at coordinate 0 (the largest). */
static int64_t step_net(const mt_layout *cur, const mt_layout *next, int m,
                        int64_t bytes, int64_t itemsize, const mt_time_model *model) {
  int kind = mt__step_kind(&cur->placements[m], &next->placements[m]);
  int64_t coord[MT_MAX_MESH_NDIM] = {0};
  mt_box b;
  local_box(kind == MT_STEP_ALLGATHER ? next : cur, coord, &b);
  /* One rank's box in bytes, the message size the model prices by; a box too large
   * to count in bytes is priced as the largest message. */
  int64_t vector;
  if (!mul_ok(mt_box_numel(&b), itemsize, &vector)) vector = INT64_MAX;
  return mt__coll_net_bytes(kind, cur, m, bytes, vector, model);
}

/* The elements torch's step on mesh dim `m` from `cur` to `next` receives, summed
 * over ranks. */
static int step_elements(const mt_layout *cur, const mt_layout *next, int m,
                         int64_t *elems, mt_error *err) {
  int64_t most = 0, before, after;
  const mt_placement *to = &next->placements[m];
  if (cur->placements[m].kind != MT_PLACEMENT_PARTIAL)
    return mt__moved_elements(cur, next, m, elems, &most, err);
  if (to->kind == MT_PLACEMENT_REPLICATE) {
    if (!mt__reduced_elements(cur, m, elems)) return overflow(err);
    return MT_OK;
  }
  /* A reduce-scatter receives what the ranks' boxes shrink by. */
  if (!mt__sum_numel(cur, &before) || !mt__sum_numel(next, &after)) return overflow(err);
  *elems = before - after;
  return MT_OK;
}

/* Bytes that torch's order moves from `src` to `dst`, priced as plan steps are. */
int mt__torch_order_bytes(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                          const mt_time_model *model, int64_t *out, int64_t *net,
                          mt_error *err) {
  mt_layout cur = *src;
  mt_placement to;
  int pos = 0, m;
  int64_t total = 0, across = 0;
  while (next_torch_step(&cur, dst, &pos, &m, &to)) {
    mt_layout next = cur;
    next.placements[m] = to;
    int64_t elems = 0, bytes;
    int rc = step_elements(&cur, &next, m, &elems, err);
    if (rc != MT_OK) return rc;
    if (!mul_ok(elems, itemsize, &bytes) || !add_ok(total, bytes, &total))
      return overflow(err);
    across += step_net(&cur, &next, m, bytes, itemsize, model); /* below total */
    cur = next;
  }
  *out = total;
  *net = across;
  return MT_OK;
}

/* Torch's model of a collective (allgather_cost, allreduce_cost and
 * reduce_scatter_cost in torch/distributed/tensor/_collective_utils.py): a base
 * latency, one link latency per hop, and `gb` gigabytes per rank over `g` ranks
 * and `hops` hops at the link's bandwidth, in microseconds. Torch's topology
 * (MeshTopoInfo.build_from_mesh) counts the devices of a host, and a CPU host
 * counts one, so every mesh dim of more than one rank is priced as between hosts:
 * its intra-host bandwidth (87.7 GB/s) times 0.22 and an ethernet latency. */
static double torch_collective(double gb, int64_t g, int64_t hops) {
  const double base_us = 6.6, latency_us = 2.7, gb_per_s = 87.7 * 0.22;
  return base_us + (double)hops * latency_us +
         gb * (double)hops / (double)g / gb_per_s * 1e6;
}

/* What torch charges for changing one mesh dim of `g` ranks from `a` to `b`
 * (_compute_placement_transition_cost), with `*gb` the gigabytes a rank holds,
 * updated as the step grows or cuts them. An all-to-all costs an all-gather of
 * the shard plus a microsecond, torch's penalty that favours the all-gather;
 * cutting costs nothing; a Partial is never made from a Shard or another Partial
 * (infinite). */
static double torch_step(const mt_placement *a, const mt_placement *b, int64_t g,
                         double *gb) {
  if (placement_eq(a, b)) return 0.0;
  if (b->kind == MT_PLACEMENT_PARTIAL) return a->kind == MT_PLACEMENT_REPLICATE ? 0.0 : HUGE_VAL;
  if (a->kind == MT_PLACEMENT_SHARD && b->kind == MT_PLACEMENT_REPLICATE) {
    *gb *= (double)g;
    return torch_collective(*gb, g, g - 1);
  }
  if (a->kind == MT_PLACEMENT_SHARD) return torch_collective(*gb, g, g - 1) + 1.0;
  if (a->kind == MT_PLACEMENT_PARTIAL && b->kind == MT_PLACEMENT_REPLICATE)
    return torch_collective(*gb, g, 2 * (g - 1));
  double cost = a->kind == MT_PLACEMENT_PARTIAL ? torch_collective(*gb, g, g - 1) : 0.0;
  *gb /= (double)g; /* a reduce-scatter or a cut */
  return cost;
}

/* What torch's ranking of strategies charges the move from `src` to `dst` of
 * elements of `itemsize` bytes (redistribute_cost): its steps in its order, each
 * priced by torch_step from what one rank holds, the global bytes over the
 * number of shards. Nothing from a layout replicated everywhere. */
double mt__torch_order_cost(const mt_layout *src, const mt_layout *dst,
                            int64_t itemsize) {
  mt_layout cur = *src;
  mt_placement to;
  int pos = 0, m;
  double gb = (double)itemsize / (1024.0 * 1024.0 * 1024.0), cost = 0.0;
  for (int d = 0; d < src->ndim; ++d) gb *= (double)src->shape[d];
  for (int k = 0; k < src->mesh_ndim; ++k)
    if (src->placements[k].kind == MT_PLACEMENT_SHARD) gb /= (double)src->mesh_shape[k];
  while (next_torch_step(&cur, dst, &pos, &m, &to)) {
    cost += torch_step(&cur.placements[m], &to, src->mesh_shape[m], &gb);
    cur.placements[m] = to;
  }
  return cost;
}
