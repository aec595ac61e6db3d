/* The predicted seconds of a step, and of a plan, under a time model, and the
 * order of two candidate plans by their predicted times. */
#include <stdint.h>

#include "mpitensor/core/plan.h"
#include "mpitensor/core/timemodel.h"
#include "plan-private.h"

/* A direct exchange is one linear exchange over the whole mesh: its peers on
 * the rank's node over shared memory, the others over the network, whose bytes
 * from all of a node's ranks pass the node's one link. */
static double direct_time(const mt_step *st, const mt_time_model *model) {
  int64_t numel = mesh_numel(&st->src);
  if (mt_time_link(model, numel, numel, 1) == MT_LINK_SHM)
    return mt_time_linear(model, st->rank_messages, st->rank_bytes, MT_LINK_SHM);
  mt_step counted;
  if (st->node_layout != model->ranks_per_node) { /* counted for another layout */
    counted = *st;
    mt__price_nodes(&counted, model);
    st = &counted;
  }
  const double *a = model->alpha, *b = model->beta;
  double shm = (double)st->rank_bytes * b[MT_LINK_SHM];
  double net = (double)st->node_bytes * b[MT_LINK_NET];
  return model->call + (double)st->rank_shm_messages * a[MT_LINK_SHM] +
         (double)st->rank_net_messages * a[MT_LINK_NET] + (shm > net ? shm : net);
}

/* A collective over the `group` members of each run of `stride` positions,
 * priced by how many of them share a node. */
static double coll_time(const mt_time_model *model, int coll, int64_t numel,
                        int64_t group, int64_t stride, int64_t vector, int64_t received) {
  int64_t local = mt_time_members_per_node(model, numel, group, stride);
  return mt_time_coll_nodes(model, coll, group, local, vector, received);
}

/* ALLREDUCE_NODES: a reduce-scatter and an all-gather among the l members of
 * each run on a node, and an all-reduce of one part in l among the members l
 * apart. */
static double nodes_time(const mt_step *st, const mt_time_model *model) {
  int m = st->mesh_dim;
  int64_t numel = mesh_numel(&st->src), s = dim_stride(&st->src, m);
  int64_t l = st->node_group, g = st->src.mesh_shape[m], v = st->vector_bytes;
  int64_t others = v - v / l;
  return coll_time(model, MT_TIME_REDUCE_SCATTER, numel, l, s, v, others) +
         coll_time(model, MT_TIME_ALLREDUCE, numel, g / l, s * l, v / l, 0) +
         coll_time(model, MT_TIME_ALLGATHER, numel, l, s, v, others);
}

/* A step's predicted seconds under `model`: its local passes, and its messages.
 * A chunk has no message. */
double mt__step_time(const mt_step *st, const mt_time_model *model) {
  double local = mt_time_local(model, st->copy_bytes, st->reduce_bytes);
  if (st->kind == MT_STEP_CHUNK) return local;
  if (st->kind == MT_STEP_DIRECT) return local + direct_time(st, model);
  if (st->kind == MT_STEP_ALLREDUCE_NODES) return local + nodes_time(st, model);
  int m = st->mesh_dim;
  return local + coll_time(model, mt__coll_of(st->kind), mesh_numel(&st->src),
                           st->src.mesh_shape[m], dim_stride(&st->src, m),
                           st->vector_bytes, st->rank_bytes);
}

/* Sets every step's time and the list's totals; a step's bytes between nodes
 * are counted again where they were counted for another node layout. */
void mt__set_times(mt__steps *list, const mt_time_model *model) {
  list->time = 0.0;
  list->net = 0;
  for (int i = 0; i < list->n; ++i) {
    mt_step *st = &list->s[i];
    if (st->node_layout != model->ranks_per_node) mt__price_nodes(st, model);
    st->time = mt__step_time(st, model);
    list->time += st->time;
    list->net += st->net_bytes; /* each below its step's bytes, whose sum fits */
  }
}

/* -1 when `a` is predicted faster than `b`, 1 when slower, 0 when they tie within
 * a part in a million (the same collectives, priced alike). */
int mt__time_order(const mt__steps *a, const mt__steps *b) {
  double tol = 1e-6 * (a->time > b->time ? a->time : b->time);
  if (a->time < b->time - tol) return -1;
  if (a->time > b->time + tol) return 1;
  return 0;
}

double mt_plan_predict(const mt_plan *plan, const mt_time_model *model) {
  double t = 0.0;
  for (int i = 0; i < mt_plan_nsteps(plan); ++i)
    t += mt__step_time(mt_plan_step(plan, i), model);
  return t;
}
