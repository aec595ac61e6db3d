/* The predicted seconds of a step, and of a plan, under a time model, and the
 * order of two candidate plans by their predicted times. */
#include <stdint.h>

#include "mpitensor/core/plan.h"
#include "mpitensor/core/timemodel.h"
#include "plan-private.h"

/* The collective each one-mesh-dim step kind runs. */
static int coll_of(int kind) {
  switch (kind) {
    case MT_STEP_ALLGATHER: return MT_TIME_ALLGATHER;
    case MT_STEP_ALLREDUCE: return MT_TIME_ALLREDUCE;
    case MT_STEP_REDUCE_SCATTER: return MT_TIME_REDUCE_SCATTER;
    default: return MT_TIME_ALLTOALL;
  }
}

/* A step's predicted seconds under `model`: its local passes, and its messages.
 * A direct exchange is one linear exchange over the whole mesh, on the network
 * once the mesh spans nodes; a chunk has no message. */
double mt__step_time(const mt_step *st, const mt_time_model *model) {
  int64_t numel = mesh_numel(&st->src);
  double local = mt_time_local(model, st->copy_bytes, st->reduce_bytes);
  if (st->kind == MT_STEP_CHUNK) return local;
  if (st->kind == MT_STEP_DIRECT) {
    int link = mt_time_link(model, numel, numel, 1);
    return local + mt_time_linear(model, st->rank_messages, st->rank_bytes, link);
  }
  int m = st->mesh_dim;
  int64_t group = st->src.mesh_shape[m], stride = 1;
  for (int k = m + 1; k < st->src.mesh_ndim; ++k) stride *= st->src.mesh_shape[k];
  int link = mt_time_link(model, numel, group, stride);
  return local + mt_time_coll(model, coll_of(st->kind), group, st->vector_bytes,
                              st->rank_bytes, link);
}

/* Sets every step's time and the list's total. */
void mt__set_times(mt__steps *list, const mt_time_model *model) {
  list->time = 0.0;
  for (int i = 0; i < list->n; ++i) {
    list->s[i].time = mt__step_time(&list->s[i], model);
    list->time += list->s[i].time;
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
