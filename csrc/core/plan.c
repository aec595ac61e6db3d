/* A plan as data (plan.h): its steps with their totals, a count of owners, and
 * the per-process part an executor compiled from it on its first run. Which steps
 * a plan holds is the planner's question (plan_create.c). */
#include "mpitensor/core/plan.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "core-private.h"
#include "mpitensor/core/status.h"

/* The steps and their totals, and what owns the plan: a count of owners, and the
 * per-process compiled part an executor attached on first use (set once, then
 * only read). */
struct mt_plan {
  int n;
  int64_t bytes;
  int64_t messages;
  int64_t net_bytes;
  double time;
  mt_step s[MT__MAX_STEPS];
  atomic_int owners;
  _Atomic(void *) compiled;
  void (*compiled_free)(void *);
};

int mt__plan_new(const mt_step *steps, int n, mt_plan **out, mt_error *err) {
  assert(n >= 0 && n <= MT__MAX_STEPS);
  mt_plan *plan = calloc(1, sizeof *plan);
  if (plan == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory allocating a plan");
  /* The planner has checked that these sums fit. */
  for (int i = 0; i < n; ++i) {
    plan->s[i] = steps[i];
    plan->bytes += steps[i].bytes;
    plan->messages += steps[i].messages;
    plan->net_bytes += steps[i].net_bytes;
    plan->time += steps[i].time;
  }
  plan->n = n;
  atomic_init(&plan->owners, 1);
  atomic_init(&plan->compiled, NULL);
  *out = plan;
  return MT_OK;
}

void mt_plan_retain(mt_plan *plan) {
  if (plan != NULL) atomic_fetch_add_explicit(&plan->owners, 1, memory_order_relaxed);
}

void mt_plan_destroy(mt_plan *plan) {
  if (plan == NULL) return;
  /* The last owner sees every other owner's writes (acq_rel), the compiled part's
   * destructor included. */
  if (atomic_fetch_sub_explicit(&plan->owners, 1, memory_order_acq_rel) != 1) return;
  void *compiled = atomic_load_explicit(&plan->compiled, memory_order_acquire);
  if (compiled != NULL && plan->compiled_free != NULL) plan->compiled_free(compiled);
  free(plan);
}

void *mt_plan_compiled(const mt_plan *plan) {
  return atomic_load_explicit(&((mt_plan *)plan)->compiled, memory_order_acquire);
}

int mt_plan_set_compiled(mt_plan *plan, void *data, void (*free_fn)(void *)) {
  void *none = NULL;
  if (!atomic_compare_exchange_strong_explicit(
          &plan->compiled, &none, data, memory_order_acq_rel, memory_order_acquire)) {
    return 0;
  }
  plan->compiled_free = free_fn;
  return 1;
}

int mt_plan_nsteps(const mt_plan *plan) { return plan == NULL ? 0 : plan->n; }

const mt_step *mt_plan_step(const mt_plan *plan, int i) {
  if (plan == NULL || i < 0 || i >= plan->n) return NULL;
  return &plan->s[i];
}

double mt_plan_time(const mt_plan *plan) {
  return plan == NULL ? 0.0 : plan->time;
}

int64_t mt_plan_bytes(const mt_plan *plan) {
  return plan == NULL ? 0 : plan->bytes;
}

int64_t mt_plan_messages(const mt_plan *plan) {
  return plan == NULL ? 0 : plan->messages;
}

int64_t mt_plan_net_bytes(const mt_plan *plan) {
  return plan == NULL ? 0 : plan->net_bytes;
}
