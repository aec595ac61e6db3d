/* What a step moves between nodes, under a time model's node layout.
 *
 * A collective's messages follow the algorithm the time model prices it by, so
 * what crosses between nodes is the share mt_time_net_share gives of what its
 * ranks receive: a ring over a mesh dim whose groups keep runs of members on one
 * node crosses once per run. A direct exchange's cross where a rank's peer is on
 * another node, counted rank by rank (walk_nodes.c). An ALLREDUCE_NODES step
 * crosses only in its all-reduce between nodes, on each member's part. */
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/timemodel.h"
#include "plan-private.h"

int mt__coll_of(int kind) {
  switch (kind) {
    case MT_STEP_ALLGATHER: return MT_TIME_ALLGATHER;
    case MT_STEP_ALLREDUCE:
    case MT_STEP_ALLREDUCE_NODES: return MT_TIME_ALLREDUCE;
    case MT_STEP_REDUCE_SCATTER: return MT_TIME_REDUCE_SCATTER;
    default: return MT_TIME_ALLTOALL;
  }
}

int64_t mt__members_per_node(const mt_layout *l, int m, const mt_time_model *model) {
  return mt_time_members_per_node(model, mesh_numel(l), l->mesh_shape[m], dim_stride(l, m));
}

/* `bytes` times `share` (in [0, 1]), rounded down. */
static int64_t scaled(int64_t bytes, double share) {
  double v = (double)bytes * share;
  return v >= (double)bytes ? bytes : (int64_t)v;
}

int64_t mt__coll_net_bytes(int kind, const mt_layout *src, int m, int64_t bytes,
                           int64_t vector, const mt_time_model *model) {
  if (kind == MT_STEP_CHUNK || bytes == 0) return 0;
  int64_t group = src->mesh_shape[m];
  double share = mt_time_net_share(mt__coll_of(kind), group,
                                   mt__members_per_node(src, m, model), vector);
  return scaled(bytes, share);
}

/* An ALLREDUCE_NODES step's all-reduce between nodes: groups of G / l members
 * whose positions are l strides apart, each member reducing its part of the
 * vector (a 1 / l share). Of the ring model's 2 (G - 1) / G of each vector it
 * receives 2 (G / l - 1) / G; the rest stays on the node. */
static int64_t across_net_bytes(const mt_step *st, const mt_time_model *model) {
  int m = st->mesh_dim;
  int64_t g = st->src.mesh_shape[m], l = st->node_group, across = g / l, total = 0;
  if (!mt__sum_numel(&st->src, &total)) return st->bytes;
  int64_t stride = dim_stride(&st->src, m) * l;
  int64_t local = mt_time_members_per_node(model, mesh_numel(&st->src), across, stride);
  double share = mt_time_net_share(MT_TIME_ALLREDUCE, across, local, st->vector_bytes / l);
  /* Below the step's bytes, total / g * 2 (g - 1) elements: it fits. */
  return scaled(total / g * 2 * (across - 1) * st->itemsize, share);
}

/* A direct exchange: walked node by node where the mesh spans several nodes of
 * several ranks; with one node nothing crosses, with one rank per node all. */
static void direct_nodes(mt_step *st, int64_t per_node) {
  int64_t numel = mesh_numel(&st->src);
  st->net_bytes = st->node_bytes = st->rank_net_messages = st->rank_shm_messages = 0;
  if (per_node == 0 || per_node >= numel) {
    st->rank_shm_messages = st->rank_messages;
    return;
  }
  mt__node_walk w = {0};
  if (per_node > 1 && mt__walk_nodes(&st->src, &st->dst, per_node, &w, NULL) == MT_OK &&
      w.walked) {
    /* Below the step's bytes and a rank's messages: they fit. */
    st->net_bytes = w.net * st->itemsize;
    st->node_bytes = w.node_most * st->itemsize;
    st->rank_net_messages = w.net_msgs;
    st->rank_shm_messages = w.shm_msgs;
    return;
  }
  /* Everything crosses: one rank per node, or a walk not made (then each rank of
   * a node is taken to receive as much as the busiest). */
  st->net_bytes = st->bytes;
  st->node_bytes = st->rank_bytes <= st->bytes / per_node ? st->rank_bytes * per_node
                                                          : st->bytes;
  st->rank_net_messages = st->rank_messages;
}

void mt__price_nodes(mt_step *st, const mt_time_model *model) {
  st->node_layout = model->ranks_per_node;
  if (st->kind == MT_STEP_DIRECT) {
    direct_nodes(st, model->ranks_per_node);
    return;
  }
  st->node_bytes = st->rank_net_messages = st->rank_shm_messages = 0;
  if (st->kind == MT_STEP_ALLREDUCE_NODES) {
    st->net_bytes = st->bytes == 0 ? 0 : across_net_bytes(st, model);
    return;
  }
  st->net_bytes = mt__coll_net_bytes(st->kind, &st->src, st->mesh_dim, st->bytes,
                                     st->vector_bytes, model);
}
