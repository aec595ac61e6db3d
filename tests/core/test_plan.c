/* Redistribution plans: the collective counts of every 1-D transition, a
 * simulation that executes every plan on labelled elements (boxes, no MPI), plans
 * for simulated meshes of 16,384 ranks, and error paths.
 *
 * `test_plan --quick` (or MT_TEST_QUICK=1) runs fewer random cases, for valgrind.
 * MPITENSOR_TRACE=1 prints planning times. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "boxes.h"
#include "check.h"
#include "rng.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"

static mt_placement R(void) { return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}; }
static mt_placement P(int op) { return (mt_placement){MT_PLACEMENT_PARTIAL, 0, op, 0}; }
static mt_placement S(int dim) { return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0}; }

static int quick = 0;
static int trace = 0;

/* ---- Helpers that share nothing with plan.c but the layout module. ---- */

static mt_layout make(int ndim, const int64_t *shape, int mesh_ndim,
                      const int64_t *mesh, const mt_placement *pl) {
  mt_layout l;
  int rc = mt_layout_init(&l, ndim, shape, mesh_ndim, mesh, pl, NULL);
  CHECK_MSG(rc == MT_OK, "layout init failed: %s", mt_status_name(rc));
  return l;
}

static mt_layout with(const mt_layout *l, const mt_placement *pl) {
  return make(l->ndim, l->shape, l->mesh_ndim, l->mesh_shape, pl);
}

static int64_t ranks_of(const mt_layout *l) {
  int64_t n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) n *= l->mesh_shape[m];
  return n;
}

/* Row-major mesh coordinate of linear rank r. */
static void coord_of(const mt_layout *l, int64_t r, int64_t *coord) {
  for (int m = l->mesh_ndim - 1; m >= 0; --m) {
    coord[m] = r % l->mesh_shape[m];
    r /= l->mesh_shape[m];
  }
}

static mt_box box_of(const mt_layout *l, int64_t r) {
  int64_t coord[MT_MAX_MESH_NDIM];
  mt_box b;
  memset(&b, 0, sizeof b);
  coord_of(l, r, coord);
  if (mt_layout_local_box(l, coord, &b, NULL) != MT_OK) b.ndim = -1;
  return b;
}

static int same_box(const mt_box *a, const mt_box *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->offset[d] != b->offset[d] || a->shape[d] != b->shape[d]) return 0;
  }
  return 1;
}

/* Both hold the same elements (any two empty boxes do). */
static int same_elements(const mt_box *a, const mt_box *b) {
  int64_t na = mt_box_numel(a), nb = mt_box_numel(b);
  if (na == 0 || nb == 0) return na == nb;
  return same_box(a, b);
}

/* `inner` lies inside `outer` (an empty box lies anywhere). */
static int box_within(const mt_box *in, const mt_box *out) {
  if (mt_box_numel(in) == 0) return 1;
  for (int d = 0; d < in->ndim; ++d) {
    if (in->offset[d] < out->offset[d] ||
        in->offset[d] + in->shape[d] > out->offset[d] + out->shape[d])
      return 0;
  }
  return 1;
}

static int placement_eq(const mt_placement *a, const mt_placement *b) {
  if (a->kind != b->kind) return 0;
  if (a->kind == MT_PLACEMENT_SHARD) return a->dim == b->dim;
  if (a->kind == MT_PLACEMENT_PARTIAL) return a->reduce_op == b->reduce_op;
  return 1;
}

/* Equal layouts; with `skip_size1`, mesh dims of size 1 are not compared. */
static int layout_eq(const mt_layout *a, const mt_layout *b, int skip_size1) {
  if (a->ndim != b->ndim || a->mesh_ndim != b->mesh_ndim) return 0;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d]) return 0;
  }
  for (int m = 0; m < a->mesh_ndim; ++m) {
    if (a->mesh_shape[m] != b->mesh_shape[m]) return 0;
    if (skip_size1 && a->mesh_shape[m] == 1) continue;
    if (!placement_eq(&a->placements[m], &b->placements[m])) return 0;
  }
  return 1;
}

/* Sum over ranks of numel(T) - numel(T ∩ S): what any plan of data moves must
 * deliver, and exactly what a gather, all-to-all or direct exchange delivers. */
static int64_t moved(const mt_layout *src, const mt_layout *dst) {
  int64_t total = 0, n = ranks_of(src);
  for (int64_t r = 0; r < n; ++r) {
    mt_box s = box_of(src, r), t = box_of(dst, r), c;
    total += mt_box_numel(&t) - (mt_box_intersect(&s, &t, &c) ? mt_box_numel(&c) : 0);
  }
  return total;
}

static int64_t sum_numel(const mt_layout *l) {
  int64_t total = 0, n = ranks_of(l);
  for (int64_t r = 0; r < n; ++r) {
    mt_box b = box_of(l, r);
    total += mt_box_numel(&b);
  }
  return total;
}

static mt_plan *plan_of(const mt_layout *a, const mt_layout *b, int64_t itemsize) {
  mt_plan *plan = NULL;
  mt_error err = {0, ""};
  int rc = mt_plan_create(a, b, itemsize, &plan, &err);
  CHECK_MSG(rc == MT_OK, "plan failed: %s: %s", mt_status_name(rc), err.msg);
  return rc == MT_OK ? plan : NULL;
}

static int comm_steps(const mt_plan *plan) {
  int n = 0;
  for (int i = 0; i < mt_plan_nsteps(plan); ++i)
    n += mt_plan_step(plan, i)->kind != MT_STEP_CHUNK;
  return n;
}

static int count_kind(const mt_plan *plan, int kind) {
  int n = 0;
  for (int i = 0; i < mt_plan_nsteps(plan); ++i)
    n += mt_plan_step(plan, i)->kind == kind;
  return n;
}

/* ---- torch's chain (torch/distributed/tensor/_redistribute.py), priced. ---- */

/* Bytes of one torch step on mesh dim m, by the cost model plan.h documents. */
static int64_t torch_step_bytes(const mt_layout *a, const mt_layout *b, int m,
                                int64_t itemsize) {
  const mt_placement *p = &a->placements[m], *q = &b->placements[m];
  int64_t g = a->mesh_shape[m];
  if (p->kind != MT_PLACEMENT_PARTIAL) return moved(a, b) * itemsize;
  if (q->kind == MT_PLACEMENT_REPLICATE)
    return sum_numel(a) / g * 2 * (g - 1) * itemsize;
  return (sum_numel(a) - sum_numel(b)) * itemsize;
}

/* Whether the mesh dims before m that shard tensor dim d agree in two layouts. */
static int same_outer_sharding(const mt_placement *a, const mt_placement *b, int m,
                               int d) {
  for (int k = 0; k < m; ++k) {
    int sa = a[k].kind == MT_PLACEMENT_SHARD && a[k].dim == d;
    int sb = b[k].kind == MT_PLACEMENT_SHARD && b[k].dim == d;
    if (sa != sb) return 0;
  }
  return 1;
}

/* torch's greedy transform list: inner mesh dims first, replicating where nested
 * sharding before the mesh dim disagrees, then outer to inner for what is left. */
static int64_t torch_bytes(const mt_layout *src, const mt_layout *dst, int64_t itemsize,
                           int *comm) {
  mt_layout cur = *src;
  int64_t total = 0;
  *comm = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < cur.mesh_ndim; ++i) {
      int m = pass == 0 ? cur.mesh_ndim - 1 - i : i;
      mt_placement to = dst->placements[m];
      if (pass == 0 && to.kind == MT_PLACEMENT_SHARD &&
          !same_outer_sharding(cur.placements, dst->placements, m, to.dim))
        to = R();
      if (placement_eq(&cur.placements[m], &to)) continue;
      mt_layout next = cur;
      next.placements[m] = to;
      total += torch_step_bytes(&cur, &next, m, itemsize);
      *comm += !(cur.placements[m].kind == MT_PLACEMENT_REPLICATE);
      cur = next;
    }
  }
  return total;
}

/* ---- Chain and step invariants shared by every test. ---- */

/* Steps chain exactly from src to dst; each one-mesh-dim step is valid, on a mesh
 * dim of size > 1, and changes nothing else but size-1 labels; totals add up. */
static void check_structure(const mt_plan *plan, const mt_layout *src,
                            const mt_layout *dst) {
  int n = mt_plan_nsteps(plan);
  int64_t bytes = 0, msgs = 0;
  CHECK((n == 0) == layout_eq(src, dst, 1));
  for (int i = 0; i < n; ++i) {
    const mt_step *st = mt_plan_step(plan, i);
    bytes += st->bytes, msgs += st->messages;
    CHECK(layout_eq(&st->src, i == 0 ? src : &mt_plan_step(plan, i - 1)->dst, 0));
    CHECK(!layout_eq(&st->src, &st->dst, 1));
    if (st->kind == MT_STEP_DIRECT) {
      CHECK(st->mesh_dim == -1);
      CHECK(mt_step_valid(&st->src, &st->dst, -1) == 0);
      for (int m = 0; m < src->mesh_ndim; ++m) {
        int partial = st->src.placements[m].kind == MT_PLACEMENT_PARTIAL;
        if (partial && src->mesh_shape[m] > 1)
          CHECK(placement_eq(&st->src.placements[m], &st->dst.placements[m]));
      }
      continue;
    }
    CHECK(st->mesh_dim >= 0 && st->mesh_dim < src->mesh_ndim);
    CHECK(src->mesh_shape[st->mesh_dim] > 1);
    CHECK(mt_step_valid(&st->src, &st->dst, st->mesh_dim) == 1);
  }
  if (n > 0) CHECK(layout_eq(&mt_plan_step(plan, n - 1)->dst, dst, 0));
  CHECK(mt_plan_bytes(plan) == bytes && mt_plan_messages(plan) == msgs);
}

/* ---- (a) The collective counts of every 1-D transition. ---- */

/* Plans a -> b on the frame of `l` and checks its structure. */
static mt_plan *plan_pl(const mt_layout *l, const mt_placement *a,
                        const mt_placement *b, int64_t itemsize) {
  mt_layout src = with(l, a), dst = with(l, b);
  mt_plan *plan = plan_of(&src, &dst, itemsize);
  if (plan != NULL) check_structure(plan, &src, &dst);
  return plan;
}

/* The plan is exactly one step of `kind` on mesh dim 0 (no steps on 1 rank). */
static void expect_one(const mt_layout *l, mt_placement a, mt_placement b, int kind) {
  mt_plan *plan = plan_pl(l, &a, &b, 4);
  if (plan == NULL) return;
  int want = l->mesh_shape[0] == 1 ? 0 : 1;
  CHECK_MSG(mt_plan_nsteps(plan) == want && count_kind(plan, kind) == want,
            "mesh %lld kinds %d->%d: %d steps, first kind %d",
            (long long)l->mesh_shape[0], a.kind, b.kind, mt_plan_nsteps(plan),
            mt_plan_nsteps(plan) > 0 ? mt_plan_step(plan, 0)->kind : -1);
  if (want == 0) CHECK(mt_plan_bytes(plan) == 0 && mt_plan_messages(plan) == 0);
  if (kind == MT_STEP_CHUNK) CHECK(mt_plan_bytes(plan) == 0);
  mt_plan_destroy(plan);
}

static void test_counts_1d(void) {
  static const int64_t shapes[][2] = {{8, 6}, {5, 3}, {2, 7}, {1, 1}, {0, 4}};
  for (int64_t k = 1; k <= 4; ++k) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
      mt_layout l = make(2, shapes[i], 1, &k, (mt_placement[]){R()});
      for (int d = 0; d < 2; ++d) {
        expect_one(&l, S(d), R(), MT_STEP_ALLGATHER);
        expect_one(&l, R(), S(d), MT_STEP_CHUNK);
        expect_one(&l, P(MT_REDUCE_SUM), S(d), MT_STEP_REDUCE_SCATTER);
        expect_one(&l, P(MT_REDUCE_AVG), S(d), MT_STEP_REDUCE_SCATTER);
        mt_placement a = S(d), b = S(1 - d);
        mt_plan *plan = plan_pl(&l, &a, &b, 8);
        int steps = mt_plan_nsteps(plan);
        CHECK(steps == (k == 1 ? 0 : 1));
        CHECK(count_kind(plan, MT_STEP_ALLTOALL) + count_kind(plan, MT_STEP_DIRECT) ==
              steps);
        mt_plan_destroy(plan);
      }
      for (int op = 0; op < MT_REDUCE_COUNT; ++op)
        expect_one(&l, P(op), R(), MT_STEP_ALLREDUCE);
      const mt_placement same[5] = {R(), S(0), S(1), P(MT_REDUCE_SUM),
                                    P(MT_REDUCE_MAX)};
      for (int j = 0; j < 5; ++j) {
        mt_plan *plan = plan_pl(&l, &same[j], &same[j], 2);
        CHECK(mt_plan_nsteps(plan) == 0 && mt_plan_bytes(plan) == 0);
        mt_plan_destroy(plan);
      }
    }
  }
}

/* Three 2-D cases that torch's per-dim steps take, plus every other pair on a (2,2) mesh:
 * never more bytes than torch's chain. */
static void check_2d_case(const mt_layout *l, const mt_placement *a,
                          const mt_placement *b, int max_comm) {
  mt_layout src = with(l, a), dst = with(l, b);
  mt_plan *plan = plan_of(&src, &dst, 8);
  if (plan == NULL) return;
  check_structure(plan, &src, &dst);
  int torch_comm = 0;
  int64_t torch = torch_bytes(&src, &dst, 8, &torch_comm);
  if (max_comm >= 0) CHECK(comm_steps(plan) <= max_comm);
  CHECK_MSG(mt_plan_bytes(plan) <= torch, "shape (%lld,%lld): %lld bytes, torch %lld",
            (long long)l->shape[0], (long long)l->shape[1],
            (long long)mt_plan_bytes(plan), (long long)torch);
  mt_plan_destroy(plan);
}

static void test_counts_2d(void) {
  static const int64_t shapes[][2] = {{8, 8}, {5, 7}, {3, 2}, {16, 3}, {1, 9}};
  const int64_t mesh[2] = {2, 2};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
    mt_layout l = make(2, shapes[i], 2, mesh, (mt_placement[]){R(), R()});
    check_2d_case(&l, (mt_placement[]){S(0), S(1)}, (mt_placement[]){S(0), S(0)}, 1);
    check_2d_case(&l, (mt_placement[]){S(0), S(1)}, (mt_placement[]){S(1), S(0)}, 2);
    check_2d_case(&l, (mt_placement[]){S(0), S(0)}, (mt_placement[]){S(1), S(1)}, 2);
    const mt_placement all[3] = {R(), S(0), S(1)};
    for (int j = 0; j < 9; ++j) {
      for (int k = 0; k < 9; ++k) {
        mt_placement a[2] = {all[j / 3], all[j % 3]}, b[2] = {all[k / 3], all[k % 3]};
        check_2d_case(&l, a, b, -1);
      }
    }
  }
  /* A transpose of two sharded dims: one direct exchange moves a quarter of torch's bytes. */
  mt_layout l = make(2, (const int64_t[]){8, 8}, 2, mesh, (mt_placement[]){S(0), S(1)});
  mt_layout d = with(&l, (mt_placement[]){S(1), S(0)});
  mt_plan *plan = plan_of(&l, &d, 8);
  int torch_comm = 0;
  CHECK(torch_bytes(&l, &d, 8, &torch_comm) == 1024 && torch_comm == 2);
  CHECK(mt_plan_nsteps(plan) == 1 && mt_plan_step(plan, 0)->kind == MT_STEP_DIRECT);
  CHECK(mt_plan_bytes(plan) == 256 && mt_plan_messages(plan) == 2);
  mt_plan_destroy(plan);
}

/* Partial sources on a (2,2) mesh: one reduction per Partial mesh dim that goes
 * away, and never more bytes than torch. */
static void test_partial_2d(void) {
  const int64_t mesh[2] = {2, 2};
  mt_layout l = make(2, (const int64_t[]){8, 6}, 2, mesh, (mt_placement[]){R(), R()});
  const mt_placement src[4] = {P(MT_REDUCE_SUM), R(), S(0), S(1)};
  const mt_placement dst[3] = {R(), S(0), S(1)};
  for (int i = 0; i < 16; ++i) {
    mt_placement a[2] = {src[i / 4], src[i % 4]};
    if (a[0].kind != MT_PLACEMENT_PARTIAL && a[1].kind != MT_PLACEMENT_PARTIAL)
      continue;
    for (int j = 0; j < 9; ++j) {
      mt_placement b[2] = {dst[j / 3], dst[j % 3]};
      mt_layout s = with(&l, a), t = with(&l, b);
      mt_plan *plan = plan_of(&s, &t, 4);
      if (plan == NULL) continue;
      check_structure(plan, &s, &t);
      int partials =
          (a[0].kind == MT_PLACEMENT_PARTIAL) + (a[1].kind == MT_PLACEMENT_PARTIAL);
      CHECK(count_kind(plan, MT_STEP_ALLREDUCE) +
                count_kind(plan, MT_STEP_REDUCE_SCATTER) ==
            partials);
      int torch_comm = 0;
      int64_t tb = torch_bytes(&s, &t, 4, &torch_comm);
      CHECK_MSG(mt_plan_bytes(plan) <= tb,
                "[%d.%d,%d.%d]->[%d.%d,%d.%d]: %lld vs torch %lld", a[0].kind, a[0].dim,
                a[1].kind, a[1].dim, b[0].kind, b[0].dim, b[1].kind, b[1].dim,
                (long long)mt_plan_bytes(plan), (long long)tb);
      mt_plan_destroy(plan);
    }
  }
  /* [P, P] -> [S0, S1]: two reduce-scatters, the outer mesh dim first. */
  mt_layout s = with(&l, (mt_placement[]){P(MT_REDUCE_SUM), P(MT_REDUCE_SUM)});
  mt_layout t = with(&l, (mt_placement[]){S(0), S(1)});
  mt_plan *plan = plan_of(&s, &t, 4);
  CHECK(mt_plan_nsteps(plan) == 2 && count_kind(plan, MT_STEP_REDUCE_SCATTER) == 2);
  CHECK(mt_plan_step(plan, 0)->mesh_dim == 0 && mt_plan_step(plan, 1)->mesh_dim == 1);
  mt_plan_destroy(plan);
  /* [P, P] -> [S0, S0]: two nested reduce-scatters, as torch. */
  t = with(&l, (mt_placement[]){S(0), S(0)});
  plan = plan_of(&s, &t, 4);
  CHECK(mt_plan_nsteps(plan) == 2 && count_kind(plan, MT_STEP_REDUCE_SCATTER) == 2);
  mt_plan_destroy(plan);
  /* [P, P] -> [S0, R]: reduce-scatter first, so the all-reduce carries half the data
   * (torch's order); all-reducing first would move the whole buffer twice. */
  t = with(&l, (mt_placement[]){S(0), R()});
  plan = plan_of(&s, &t, 4);
  CHECK(mt_plan_nsteps(plan) == 2);
  CHECK(mt_plan_step(plan, 0)->kind == MT_STEP_REDUCE_SCATTER &&
        mt_plan_step(plan, 1)->kind == MT_STEP_ALLREDUCE);
  int torch_comm = 0;
  CHECK(mt_plan_bytes(plan) <= torch_bytes(&s, &t, 4, &torch_comm));
  mt_plan_destroy(plan);
}

/* A mesh dim of size 1 never costs a step: the plan is the one of the other dim. */
static void test_size1(void) {
  const int64_t meshes[2][2] = {{4, 1}, {1, 4}};
  const mt_placement all[5] = {R(), S(0), S(1), P(MT_REDUCE_SUM), P(MT_REDUCE_MAX)};
  for (int mi = 0; mi < 2; ++mi) {
    int big = meshes[mi][0] == 4 ? 0 : 1;
    mt_layout l =
        make(2, (const int64_t[]){9, 5}, 2, meshes[mi], (mt_placement[]){R(), R()});
    mt_layout l1 = make(2, l.shape, 1, &meshes[mi][big], (mt_placement[]){R()});
    for (int i = 0; i < 25 * 10; ++i) {
      mt_placement a[2], b[2];
      a[big] = all[i % 5], a[1 - big] = all[i / 5 % 5];
      /* Targets: R, S0, S1 on each dim, or the source's Partial on the size-1 dim. */
      int j = i / 25;
      b[big] = all[j % 3], b[1 - big] = j < 9 ? all[j / 3] : a[1 - big];
      if (j == 9 && a[1 - big].kind != MT_PLACEMENT_PARTIAL) continue;
      mt_plan *plan = plan_pl(&l, a, b, 4);
      mt_plan *ref = plan_pl(&l1, &a[big], &b[big], 4);
      CHECK(mt_plan_nsteps(plan) == mt_plan_nsteps(ref));
      CHECK(mt_plan_bytes(plan) == mt_plan_bytes(ref));
      CHECK(mt_plan_messages(plan) == mt_plan_messages(ref));
      for (int s = 0; s < mt_plan_nsteps(plan) && s < mt_plan_nsteps(ref); ++s) {
        CHECK(mt_plan_step(plan, s)->kind == mt_plan_step(ref, s)->kind);
        CHECK(mt_plan_step(plan, s)->mesh_dim != 1 - big);
      }
      mt_plan_destroy(plan);
      mt_plan_destroy(ref);
    }
  }
}

/* torch's cost of a collective (allgather_cost and its kin in
 * torch/distributed/tensor/_collective_utils.py) on a CPU mesh, where every mesh
 * dim of several ranks counts as between hosts: `bytes` per rank, g ranks. */
static double torch_us(double bytes, int64_t g, int64_t hops) {
  return 6.6 + 2.7 * (double)hops +
         bytes / (1024.0 * 1024.0 * 1024.0) * (double)hops / (double)g / (87.7 * 0.22) * 1e6;
}

static double torch_cost_of(const mt_layout *l, const mt_placement *a,
                            const mt_placement *b, int64_t itemsize) {
  mt_layout src = with(l, a), dst = with(l, b);
  double us = -1.0;
  mt_error err = {0, ""};
  int rc = mt_plan_torch_cost(&src, &dst, itemsize, &us, &err);
  CHECK_MSG(rc == MT_OK, "torch cost: %s", err.msg);
  return us;
}

static int near(double a, double b) { return a - b < 1e-9 * b && b - a < 1e-9 * b; }

/* What torch's ranking charges a redistribution (mt_plan_torch_cost), step by step
 * in torch's order: one rank's bytes (the global bytes over the shards) grow with
 * an all-gather and shrink with a reduce-scatter or a cut; an all-to-all is a
 * microsecond dearer than an all-gather of the shard, so that torch prefers
 * gathering small tensors and moving the shard of large ones; cutting and
 * replicated sources cost nothing; a mesh dim of one rank is no step. */
static void test_torch_cost(void) {
  const int64_t m4[1] = {4}, m22[2] = {2, 2}, m41[2] = {4, 1};
  mt_layout l = make(2, (const int64_t[]){8, 8}, 1, m4, (mt_placement[]){R()});
  double shard = 8 * 8 * 8 / 4.0; /* one rank's bytes of a Shard(0), float64 */
  CHECK(near(torch_cost_of(&l, (mt_placement[]){S(0)}, (mt_placement[]){R()}, 8),
             torch_us(4 * shard, 4, 3)));
  CHECK(near(torch_cost_of(&l, (mt_placement[]){S(0)}, (mt_placement[]){S(1)}, 8),
             torch_us(shard, 4, 3) + 1.0));
  CHECK(near(torch_cost_of(&l, (mt_placement[]){P(MT_REDUCE_SUM)}, (mt_placement[]){R()}, 8),
             torch_us(4 * shard, 4, 6)));
  CHECK(near(torch_cost_of(&l, (mt_placement[]){P(MT_REDUCE_SUM)}, (mt_placement[]){S(0)}, 8),
             torch_us(4 * shard, 4, 3)));
  CHECK(torch_cost_of(&l, (mt_placement[]){R()}, (mt_placement[]){S(1)}, 8) == 0.0);
  CHECK(torch_cost_of(&l, (mt_placement[]){S(0)}, (mt_placement[]){S(0)}, 8) == 0.0);
  /* Small: the all-gather wins; large: the all-to-all. */
  mt_layout big = make(2, (const int64_t[]){4096, 4096}, 1, m4, (mt_placement[]){R()});
  CHECK(torch_cost_of(&l, (mt_placement[]){S(0)}, (mt_placement[]){S(1)}, 8) >
        torch_cost_of(&l, (mt_placement[]){S(0)}, (mt_placement[]){R()}, 8));
  CHECK(torch_cost_of(&big, (mt_placement[]){S(0)}, (mt_placement[]){S(1)}, 8) <
        torch_cost_of(&big, (mt_placement[]){S(0)}, (mt_placement[]){R()}, 8));
  /* (2, 2): the inner mesh dim first, each gather doubling what a rank holds; a
   * Partial over mesh dim 0 reduce-scattered after the inner cut halved it. */
  mt_layout q = make(2, (const int64_t[]){8, 8}, 2, m22, (mt_placement[]){R(), R()});
  CHECK(near(torch_cost_of(&q, (mt_placement[]){S(0), S(1)}, (mt_placement[]){R(), R()}, 8),
             torch_us(128 * 2, 2, 1) + torch_us(128 * 4, 2, 1)));
  CHECK(near(torch_cost_of(&q, (mt_placement[]){P(MT_REDUCE_SUM), R()},
                           (mt_placement[]){S(0), S(1)}, 8),
             torch_us(256, 2, 1)));
  mt_layout one = make(2, (const int64_t[]){8, 8}, 2, m41, (mt_placement[]){R(), R()});
  CHECK(near(torch_cost_of(&one, (mt_placement[]){S(0), S(1)}, (mt_placement[]){R(), R()}, 8),
             torch_us(512, 4, 3)));
  /* A Partial is never made by a redistribution. */
  mt_layout src = with(&l, (mt_placement[]){S(0)});
  mt_layout dst = with(&l, (mt_placement[]){P(MT_REDUCE_SUM)});
  double us = 0.0;
  CHECK(mt_plan_torch_cost(&src, &dst, 8, &us, NULL) == MT_ESTATE);
  CHECK(mt_plan_torch_cost(&src, &src, 8, NULL, NULL) == MT_EINVAL);
}

/* ---- (b) Simulation: execute every plan on labelled elements. ---- */

#define SIM_RANKS 64
#define SIM_NUMEL 729

typedef struct sim_rank {
  mt_box box;
  int64_t data[SIM_NUMEL];
  int hits[SIM_NUMEL];
} sim_rank;

static sim_rank sim_a[SIM_RANKS], sim_b[SIM_RANKS];
static mt_box sim_send[SIM_RANKS][SIM_RANKS], sim_recv[SIM_RANKS][SIM_RANKS];

typedef struct sim_stats {
  long cases, steps, direct, alltoall;
} sim_stats;

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint64_t rnd(void) { return next_u64(&rng_state); }

static int rnd_int(int n) { return (int)(rnd() % (uint64_t)n); }

/* Global row-major index of element i (row-major) of `box`, and its place in
 * `other` (which must hold it). */
static void locate(const mt_layout *l, const mt_box *box, int64_t i,
                   const mt_box *other, int64_t *flat, int64_t *pos) {
  int64_t idx[MT_MAX_NDIM];
  for (int d = box->ndim - 1; d >= 0; --d) {
    idx[d] = box->offset[d] + i % box->shape[d];
    i /= box->shape[d];
  }
  *flat = 0, *pos = 0;
  for (int d = 0; d < box->ndim; ++d) {
    *flat = *flat * l->shape[d] + idx[d];
    *pos = *pos * other->shape[d] + idx[d] - other->offset[d];
  }
}

static int64_t label(int64_t flat) { return 3 * flat + 1; }

/* Rank q's share of element `flat` of a Partial(sum) over Q ranks: noise for
 * q > 0, and the label minus the noise for q = 0. */
static int64_t share(int64_t flat, int64_t q, int64_t nq) {
  if (q > 0)
    return (int64_t)(((uint64_t)flat * 2654435761u + (uint64_t)q * 40503u) % 997);
  int64_t v = label(flat);
  for (int64_t k = 1; k < nq; ++k) v -= share(flat, k, nq);
  return v;
}

/* The index of `coord` over the mesh dims where `l` is Partial, and their count. */
static int64_t partial_index(const mt_layout *l, const int64_t *coord, int64_t *count) {
  int64_t q = 0, n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (l->placements[m].kind != MT_PLACEMENT_PARTIAL) continue;
    q = q * l->mesh_shape[m] + coord[m];
    n *= l->mesh_shape[m];
  }
  *count = n;
  return q;
}

/* What rank `coord` must hold at `flat` after the plan: the label, or where dst
 * keeps Partial dims, the sum of the source shares over the dims reduced. */
static int64_t expected(const mt_layout *src, const mt_layout *dst,
                        const int64_t *coord, int64_t flat) {
  int64_t nq, kept = 0;
  partial_index(src, coord, &nq);
  for (int m = 0; m < dst->mesh_ndim; ++m)
    kept += dst->placements[m].kind == MT_PLACEMENT_PARTIAL;
  if (kept == 0) return label(flat);
  int64_t sum = 0, pc[MT_MAX_MESH_NDIM];
  for (int64_t r = 0; r < ranks_of(src); ++r) {
    coord_of(src, r, pc);
    int match = 1;
    for (int m = 0; m < src->mesh_ndim; ++m) {
      int is_p = src->placements[m].kind == MT_PLACEMENT_PARTIAL;
      if (!is_p && pc[m] != 0) match = 0;
      if (dst->placements[m].kind == MT_PLACEMENT_PARTIAL && pc[m] != coord[m])
        match = 0;
    }
    int64_t unused;
    if (match) sum += share(flat, partial_index(src, pc, &unused), nq);
  }
  return sum;
}

static void sim_init(const mt_layout *src, sim_rank *ranks) {
  for (int64_t r = 0; r < ranks_of(src); ++r) {
    int64_t coord[MT_MAX_MESH_NDIM], nq, flat, pos;
    coord_of(src, r, coord);
    int64_t q = partial_index(src, coord, &nq);
    ranks[r].box = box_of(src, r);
    for (int64_t i = 0; i < mt_box_numel(&ranks[r].box); ++i) {
      locate(src, &ranks[r].box, i, &ranks[r].box, &flat, &pos);
      ranks[r].data[pos] = share(flat, q, nq);
    }
  }
}

/* Every rank's exchange for step `st`; send and recv must mirror each other. */
static void sim_exchange(const mt_step *st, int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    int64_t coord[MT_MAX_MESH_NDIM];
    coord_of(&st->src, r, coord);
    int rc = mt_exchange_boxes(&st->src, &st->dst, st->mesh_dim, coord, n, sim_send[r],
                               sim_recv[r], NULL);
    CHECK(rc == MT_OK);
  }
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t p = 0; p < n; ++p) {
      CHECK(same_elements(&sim_send[r][p], &sim_recv[p][r]));
      CHECK(sim_send[r][p].ndim == st->src.ndim);
    }
  }
}

/* Rank r's new data: every element of its target box from the recv boxes, summed
 * for reductions; returns the elements received from other ranks. */
static int64_t sim_receive(const mt_step *st, const sim_rank *now, sim_rank *next,
                           int64_t r, int64_t n, int64_t *messages) {
  mt_box t = box_of(&st->dst, r);
  int64_t got = 0, numel = mt_box_numel(&t), flat, pos, from;
  next[r].box = t;
  memset(next[r].data, 0, (size_t)numel * sizeof next[r].data[0]);
  memset(next[r].hits, 0, (size_t)numel * sizeof next[r].hits[0]);
  for (int64_t p = 0; p < n; ++p) {
    const mt_box *b = &sim_recv[r][p];
    int64_t k = mt_box_numel(b);
    if (k == 0) continue;
    CHECK(box_within(b, &t) && box_within(b, &now[p].box));
    if (p != r) got += k, ++*messages;
    for (int64_t i = 0; i < k; ++i) {
      locate(&st->dst, b, i, &t, &flat, &pos);
      locate(&st->dst, b, i, &now[p].box, &flat, &from);
      next[r].data[pos] += now[p].data[from];
      ++next[r].hits[pos];
    }
  }
  int want = st->kind == MT_STEP_ALLREDUCE || st->kind == MT_STEP_REDUCE_SCATTER
                 ? (int)st->src.mesh_shape[st->mesh_dim]
                 : 1;
  for (int64_t i = 0; i < numel; ++i) CHECK(next[r].hits[i] == want);
  return got;
}

/* What the time model prices a step by, from every rank's boxes: the most bytes
 * one rank receives (a reduce-scatter: what its box sheds; an all-reduce: its
 * vector), the vector of a collective (rank 0's box, the largest) and the most
 * messages one rank receives (a direct exchange: peers with a non-empty part). */
static void check_rank_costs(const mt_step *st, int64_t n, int64_t itemsize) {
  if (st->kind == MT_STEP_CHUNK) return;
  int64_t most = 0, busiest = 0;
  for (int64_t r = 0; r < n; ++r) {
    mt_box s = box_of(&st->src, r), t = box_of(&st->dst, r), c;
    int64_t v = st->kind == MT_STEP_REDUCE_SCATTER
                    ? mt_box_numel(&s) - mt_box_numel(&t)
                    : mt_box_numel(&t) - (mt_box_intersect(&s, &t, &c) ? mt_box_numel(&c) : 0);
    most = v > most ? v : most;
    int64_t peers = 0;
    for (int64_t p = 0; p < n; ++p) peers += p != r && mt_box_numel(&sim_recv[r][p]) > 0;
    busiest = peers > busiest ? peers : busiest;
  }
  if (st->kind == MT_STEP_DIRECT) {
    CHECK_MSG(st->rank_messages == busiest, "direct: %lld messages at most, counted %lld",
              (long long)st->rank_messages, (long long)busiest);
    CHECK(st->rank_bytes == most * itemsize);
    return;
  }
  mt_box v = box_of(st->kind == MT_STEP_ALLGATHER ? &st->dst : &st->src, 0);
  CHECK(st->vector_bytes == mt_box_numel(&v) * itemsize);
  CHECK(st->rank_messages == st->src.mesh_shape[st->mesh_dim] - 1);
  if (st->kind == MT_STEP_ALLREDUCE)
    CHECK(st->rank_bytes == st->vector_bytes);
  else
    CHECK_MSG(st->rank_bytes == most * itemsize, "kind %d: %lld bytes at most, counted %lld",
              st->kind, (long long)st->rank_bytes, (long long)(most * itemsize));
}

/* Whether `part` is one run of the C-contiguous array of `whole`: no extent
 * above one before the last dim it does not span. */
static int contiguous_in(const mt_box *part, const mt_box *whole) {
  int last = -1;
  for (int d = 0; d < part->ndim; ++d) last = part->shape[d] < whole->shape[d] ? d : last;
  for (int d = 0; d < last; ++d) {
    if (part->shape[d] > 1) return 0;
  }
  return 1;
}

/* Whether some extent of `b` before dim d is not 1 (blocks cut along d are
 * strided). */
static int strided_along(const mt_box *b, int d) {
  for (int i = 0; i < d; ++i) {
    if (b->shape[i] != 1) return 1;
  }
  return 0;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Sides of the exchange (sending, receiving) on which some part, the kept one
 * included, is not contiguous in its rank's box. */
static int packed_sides(const mt_step *st, int64_t n) {
  int send = 0, recv = 0;
  for (int64_t r = 0; r < n; ++r) {
    mt_box s = box_of(&st->src, r), t = box_of(&st->dst, r);
    for (int64_t p = 0; p < n; ++p) {
      send |= mt_box_numel(&sim_send[r][p]) > 0 && !contiguous_in(&sim_send[r][p], &s);
      recv |= mt_box_numel(&sim_recv[r][p]) > 0 && !contiguous_in(&sim_recv[r][p], &t);
    }
  }
  return send + recv;
}

/* The local passes of a step (plan.h) from every rank's boxes and exchange: the
 * most one rank copies and reduces, as the executor runs the step kind. */
static void check_local(const mt_step *st, int64_t n, int64_t isz) {
  int64_t copy = 0, reduce = 0, keep = 0, target = 0, lack = 0, m = st->mesh_dim;
  int64_t g = m >= 0 ? st->src.mesh_shape[m] : 1;
  for (int64_t r = 0; r < n; ++r) {
    mt_box s = box_of(&st->src, r), t = box_of(&st->dst, r), c;
    int64_t ns = mt_box_numel(&s) * isz, nt = mt_box_numel(&t) * isz;
    int64_t kept = mt_box_intersect(&s, &t, &c) ? mt_box_numel(&c) * isz : 0;
    keep = max64(keep, kept), target = max64(target, nt), lack = max64(lack, nt - kept);
    if (st->kind == MT_STEP_CHUNK) copy = max64(copy, nt);
    if (st->kind == MT_STEP_ALLGATHER && strided_along(&t, st->src.placements[m].dim))
      copy = max64(copy, nt);
    if (st->kind == MT_STEP_ALLREDUCE) reduce = max64(reduce, ns - ns / g);
    if (st->kind == MT_STEP_REDUCE_SCATTER) {
      reduce = max64(reduce, nt * (g - 1));
      if (strided_along(&s, st->dst.placements[m].dim)) copy = max64(copy, ns);
    }
  }
  if (st->kind == MT_STEP_ALLTOALL || st->kind == MT_STEP_DIRECT) {
    int sides = packed_sides(st, n);
    copy = sides == 0 ? keep : sides == 1 ? target : target + lack;
  }
  CHECK_MSG(st->copy_bytes == copy && st->reduce_bytes == reduce,
            "kind %d: copies %lld and reduces %lld bytes, expected %lld and %lld",
            st->kind, (long long)st->copy_bytes, (long long)st->reduce_bytes,
            (long long)copy, (long long)reduce);
}

/* Runs one step on all ranks and checks its byte and message counts. */
static void sim_step(const mt_step *st, const sim_rank *now, sim_rank *next,
                     int64_t itemsize) {
  int64_t n = ranks_of(&st->src), got = 0, messages = 0;
  for (int64_t r = 0; r < n; ++r) {
    mt_box s = box_of(&st->src, r);
    CHECK(same_box(&s, &now[r].box));
  }
  sim_exchange(st, n);
  check_rank_costs(st, n, itemsize);
  check_local(st, n, itemsize);
  for (int64_t r = 0; r < n; ++r) got += sim_receive(st, now, next, r, n, &messages);
  int64_t g = st->mesh_dim >= 0 ? st->src.mesh_shape[st->mesh_dim] : 0;
  if (st->kind == MT_STEP_ALLREDUCE)
    CHECK(st->bytes == sum_numel(&st->src) * itemsize * 2 * (g - 1) / g);
  else
    CHECK_MSG(st->bytes == got * itemsize, "kind %d: %lld bytes, received %lld",
              st->kind, (long long)st->bytes, (long long)(got * itemsize));
  if (st->kind == MT_STEP_DIRECT)
    CHECK(st->messages == messages);
  else if (st->kind == MT_STEP_CHUNK)
    CHECK(st->messages == 0 && messages == 0);
  else
    CHECK(st->messages == n * (g - 1));
}

/* Each rank holds exactly its dst box, with the right values. */
static void sim_verify(const mt_layout *src, const mt_layout *dst,
                       const sim_rank *now) {
  for (int64_t r = 0; r < ranks_of(dst); ++r) {
    int64_t coord[MT_MAX_MESH_NDIM], flat, pos;
    coord_of(dst, r, coord);
    mt_box t = box_of(dst, r);
    CHECK(same_box(&t, &now[r].box));
    int ok = 1;
    for (int64_t i = 0; i < mt_box_numel(&t); ++i) {
      locate(dst, &t, i, &t, &flat, &pos);
      ok &= now[r].data[pos] == expected(src, dst, coord, flat);
    }
    CHECK_MSG(ok, "rank %lld holds wrong values", (long long)r);
  }
}

static mt_placement random_placement(int ndim, int partial) {
  int k = rnd_int(ndim + 1 + partial);
  if (k < ndim) return S(k);
  return k == ndim ? R() : P(MT_REDUCE_SUM);
}

/* A random (shape, mesh, src, dst) with dst Partial only where src has it. */
static void random_case(mt_layout *src, mt_layout *dst, int64_t *itemsize) {
  int ndim = 1 + rnd_int(3), mesh_ndim = 1 + rnd_int(3);
  int64_t shape[3], mesh[3];
  mt_placement a[3], b[3];
  for (int d = 0; d < ndim; ++d) shape[d] = rnd_int(10);
  for (int m = 0; m < mesh_ndim; ++m) {
    mesh[m] = 1 + rnd_int(4);
    a[m] = random_placement(ndim, 1);
    b[m] = random_placement(ndim, 0);
    if (a[m].kind == MT_PLACEMENT_PARTIAL && rnd_int(3) == 0) b[m] = a[m];
  }
  *src = make(ndim, shape, mesh_ndim, mesh, a);
  *dst = make(ndim, shape, mesh_ndim, mesh, b);
  *itemsize = (int64_t)1 << rnd_int(4);
}

static void sim_case(sim_stats *stats) {
  mt_layout src, dst;
  int64_t itemsize;
  random_case(&src, &dst, &itemsize);
  mt_plan *plan = plan_of(&src, &dst, itemsize);
  if (plan == NULL) return;
  check_structure(plan, &src, &dst);
  int has_partial = 0, comm = 0;
  for (int m = 0; m < src.mesh_ndim; ++m)
    has_partial |= src.placements[m].kind == MT_PLACEMENT_PARTIAL;
  /* Without reductions the plan moves exactly what must move, unless the time
   * model chose per-mesh-dim collectives (fewer rounds) over the direct exchange.
   * Never more bytes than torch's chain, reductions or not. */
  if (!has_partial)
    CHECK(mt_plan_bytes(plan) == moved(&src, &dst) * itemsize ||
          count_kind(plan, MT_STEP_DIRECT) == 0);
  int64_t torch = torch_bytes(&src, &dst, itemsize, &comm);
  CHECK_MSG(mt_plan_bytes(plan) <= torch, "%lld bytes, torch %lld",
            (long long)mt_plan_bytes(plan), (long long)torch);
  sim_rank *now = sim_a, *next = sim_b;
  sim_init(&src, now);
  for (int i = 0; i < mt_plan_nsteps(plan); ++i) {
    const mt_step *st = mt_plan_step(plan, i);
    sim_step(st, now, next, itemsize);
    sim_rank *tmp = now;
    now = next, next = tmp;
    stats->direct += st->kind == MT_STEP_DIRECT;
    stats->alltoall += st->kind == MT_STEP_ALLTOALL;
  }
  stats->steps += mt_plan_nsteps(plan);
  ++stats->cases;
  sim_verify(&src, &dst, now);
  mt_plan_destroy(plan);
}

static void test_simulation(void) {
  sim_stats stats = {0, 0, 0, 0};
  int cases = quick ? 300 : 20000;
  for (int i = 0; i < cases; ++i) sim_case(&stats);
  CHECK(stats.cases == cases && stats.direct > 0 && stats.alltoall > 0);
  if (trace)
    printf("simulation: %ld plans, %ld steps (%ld direct, %ld all-to-all)\n",
           stats.cases, stats.steps, stats.direct, stats.alltoall);
}

/* A few hand-picked layouts through the simulator, 0-d and 3-d meshes included. */
static void sim_fixed(int ndim, const int64_t *shape, int mesh_ndim,
                      const int64_t *mesh, const mt_placement *a,
                      const mt_placement *b) {
  mt_layout src = make(ndim, shape, mesh_ndim, mesh, a);
  mt_layout dst = make(ndim, shape, mesh_ndim, mesh, b);
  mt_plan *plan = plan_of(&src, &dst, 4);
  if (plan == NULL) return;
  check_structure(plan, &src, &dst);
  sim_rank *now = sim_a, *next = sim_b;
  sim_init(&src, now);
  for (int i = 0; i < mt_plan_nsteps(plan); ++i) {
    sim_step(mt_plan_step(plan, i), now, next, 4);
    sim_rank *tmp = now;
    now = next, next = tmp;
  }
  sim_verify(&src, &dst, now);
  mt_plan_destroy(plan);
}

static void test_simulation_fixed(void) {
  const int64_t m4[1] = {4}, m221[3] = {2, 2, 1}, m222[3] = {2, 2, 2};
  const int64_t sh[3] = {7, 5, 3};
  sim_fixed(0, NULL, 1, m4, (mt_placement[]){P(MT_REDUCE_SUM)}, (mt_placement[]){R()});
  sim_fixed(3, sh, 3, m221, (mt_placement[]){S(0), S(1), P(MT_REDUCE_SUM)},
            (mt_placement[]){S(1), S(0), R()});
  sim_fixed(3, sh, 3, m222, (mt_placement[]){S(0), S(0), S(0)},
            (mt_placement[]){S(2), S(1), S(0)});
  sim_fixed(3, sh, 3, m222,
            (mt_placement[]){P(MT_REDUCE_SUM), P(MT_REDUCE_SUM), P(MT_REDUCE_SUM)},
            (mt_placement[]){S(0), P(MT_REDUCE_SUM), S(0)});
  sim_fixed(3, sh, 3, m222, (mt_placement[]){R(), S(2), S(0)},
            (mt_placement[]){S(0), S(0), R()});
}

/* ---- (c) Meshes of 16,384 ranks. ---- */

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

typedef struct span {
  int64_t off, len;
} span;

static int cmp_span(const void *a, const void *b) {
  const span *x = a, *y = b;
  if (x->off != y->off) return (x->off > y->off) - (x->off < y->off);
  return (x->len > y->len) - (x->len < y->len);
}

static int cmp_box(const void *a, const void *b) {
  const mt_box *x = a, *y = b;
  for (int d = 0; d < x->ndim; ++d) {
    if (x->offset[d] != y->offset[d]) return (x->offset[d] > y->offset[d]) ? 1 : -1;
  }
  return 0;
}

/* Sorts the extents of `boxes` along dim d and counts the distinct ones, which
 * must cut [region.offset, region.end) into consecutive pieces. */
static int64_t cuts_of(const mt_box *boxes, int64_t n, const mt_box *region, int d,
                       span *tmp, int *ok) {
  for (int64_t i = 0; i < n; ++i)
    tmp[i] = (span){boxes[i].offset[d], boxes[i].shape[d]};
  qsort(tmp, (size_t)n, sizeof *tmp, cmp_span);
  int64_t distinct = 0, at = region->offset[d];
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0 && cmp_span(&tmp[i], &tmp[i - 1]) == 0) continue;
    *ok &= tmp[i].off == at;
    at = tmp[i].off + tmp[i].len;
    ++distinct;
  }
  *ok &= n == 0 || at == region->offset[d] + region->shape[d];
  return distinct;
}

/* Whether the non-empty boxes among boxes[0..n) tile `region` exactly once: their
 * extents cut every dim into consecutive pieces, and there is one distinct box per
 * cell of that grid. Reorders `boxes`. */
static int tiles(mt_box *boxes, int64_t n, const mt_box *region) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (mt_box_numel(&boxes[i]) > 0) boxes[k++] = boxes[i];
  }
  if (mt_box_numel(region) == 0) return k == 0;
  span *tmp = malloc((size_t)(k + 1) * sizeof *tmp);
  int ok = tmp != NULL;
  int64_t cells = 1;
  for (int64_t i = 0; ok && i < k; ++i) ok &= box_within(&boxes[i], region);
  for (int d = 0; ok && d < region->ndim; ++d)
    cells *= cuts_of(boxes, k, region, d, tmp, &ok);
  free(tmp);
  qsort(boxes, (size_t)k, sizeof *boxes, cmp_box);
  for (int64_t i = 1; ok && i < k; ++i) ok &= cmp_box(&boxes[i], &boxes[i - 1]) != 0;
  return ok && cells == k;
}

/* The tiling checker catches gaps, overlaps and missing grid cells. */
static void test_tiles_checker(void) {
  const mt_box region = box2(0, 10, 0, 4);
  mt_box good[5] = {box2(0, 5, 0, 2), box2(0, 5, 2, 2), box2(5, 5, 0, 2),
                    box2(5, 5, 2, 2), box2(10, 0, 4, 0)};
  CHECK(tiles(good, 5, &region));
  mt_box gap[2] = {box2(0, 5, 0, 4), box2(6, 4, 0, 4)};
  CHECK(!tiles(gap, 2, &region));
  mt_box overlap[2] = {box2(0, 6, 0, 4), box2(5, 5, 0, 4)};
  CHECK(!tiles(overlap, 2, &region));
  mt_box twice[3] = {box2(0, 5, 0, 4), box2(0, 5, 0, 4), box2(5, 5, 0, 4)};
  CHECK(!tiles(twice, 3, &region));
  mt_box missing[3] = {box2(0, 5, 0, 2), box2(0, 5, 2, 2), box2(5, 5, 0, 2)};
  CHECK(!tiles(missing, 3, &region));
}

/* Every replica group of `l` (ranks agreeing on the mesh dims that do not shard)
 * tiles the tensor exactly once. */
static void check_tiling(const mt_layout *l, mt_box *boxes, int64_t *keys) {
  int64_t n = ranks_of(l), coord[MT_MAX_MESH_NDIM];
  mt_box whole;
  memset(&whole, 0, sizeof whole);
  whole.ndim = l->ndim;
  for (int d = 0; d < l->ndim; ++d) whole.shape[d] = l->shape[d];
  for (int64_t r = 0; r < n; ++r) {
    coord_of(l, r, coord);
    int64_t key = 0;
    for (int m = 0; m < l->mesh_ndim; ++m)
      if (l->placements[m].kind != MT_PLACEMENT_SHARD)
        key = key * l->mesh_shape[m] + coord[m];
    keys[r] = key * n + r;
  }
  qsort(keys, (size_t)n, sizeof *keys, cmp_i64);
  int ok = 1;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    while (j < n && keys[j] / n == keys[i] / n)
      boxes[j - i] = box_of(l, keys[j] % n), ++j;
    ok &= tiles(boxes, j - i, &whole);
    i = j;
  }
  CHECK(ok);
}

/* For a few ranks, the recv boxes of a data-moving step tile the rank's target box
 * and the send boxes lie in its source box. */
static void check_exchange_sample(const mt_step *st, mt_box *send, mt_box *recv) {
  int64_t n = ranks_of(&st->src);
  const int64_t ranks[3] = {0, n / 2 + 7 < n ? n / 2 + 7 : 0, n - 1};
  for (int i = 0; i < 3; ++i) {
    int64_t coord[MT_MAX_MESH_NDIM];
    coord_of(&st->src, ranks[i], coord);
    CHECK(mt_exchange_boxes(&st->src, &st->dst, st->mesh_dim, coord, n, send, recv,
                            NULL) == MT_OK);
    mt_box s = box_of(&st->src, ranks[i]), t = box_of(&st->dst, ranks[i]);
    int ok = 1;
    for (int64_t p = 0; p < n; ++p) ok &= box_within(&send[p], &s);
    CHECK(ok);
    CHECK(tiles(recv, n, &t));
  }
}

static double now_s(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double worst_plan_s = 0;

/* Under valgrind or a sanitizer everything runs tens of times slower; the run
 * says by how much (MT_TEST_SLOWDOWN), so the bound still catches a blow-up. */
static double slowdown(void) {
  const char *s = getenv("MT_TEST_SLOWDOWN");
  double f = s != NULL ? atof(s) : 1.0;
  return f >= 1.0 ? f : 1.0;
}

static void big_case(const mt_layout *frame, const mt_placement *a,
                     const mt_placement *b, mt_box *boxes, mt_box *more,
                     int64_t *keys) {
  mt_layout src = with(frame, a), dst = with(frame, b);
  double t0 = now_s();
  mt_plan *plan = plan_of(&src, &dst, 4);
  double dt = now_s() - t0;
  if (plan == NULL) return;
  worst_plan_s = dt > worst_plan_s ? dt : worst_plan_s;
  CHECK_MSG(dt < 1.0 * slowdown(), "planning took %.3f s", dt);
  check_structure(plan, &src, &dst);
  check_tiling(&src, boxes, keys);
  for (int i = 0; i < mt_plan_nsteps(plan); ++i) {
    const mt_step *st = mt_plan_step(plan, i);
    check_tiling(&st->dst, boxes, keys);
    if (st->kind == MT_STEP_DIRECT || st->kind == MT_STEP_ALLTOALL ||
        st->kind == MT_STEP_ALLGATHER) {
      CHECK(st->bytes == moved(&st->src, &st->dst) * 4);
      check_exchange_sample(st, boxes, more);
    }
  }
  if (trace)
    printf("16k-rank plan (%d mesh dims): %d steps, %lld bytes, %.2f ms\n",
           frame->mesh_ndim, mt_plan_nsteps(plan), (long long)mt_plan_bytes(plan),
           dt * 1e3);
  mt_plan_destroy(plan);
}

static void test_16k(void) {
  const int64_t n = 16384, shape[2] = {16384 * 3 + 5, 7};
  mt_box *boxes = malloc((size_t)n * sizeof *boxes),
         *more = malloc((size_t)n * sizeof *more);
  int64_t *keys = malloc((size_t)n * sizeof *keys);
  CHECK(boxes != NULL && more != NULL && keys != NULL);
  if (boxes == NULL || more == NULL || keys == NULL) return;
  const int64_t m2[2] = {128, 128}, m3[3] = {32, 32, 16};
  mt_layout f1 = make(2, shape, 1, &n, (mt_placement[]){R()});
  mt_layout f2 = make(2, shape, 2, m2, (mt_placement[]){R(), R()});
  mt_layout f3 = make(2, shape, 3, m3, (mt_placement[]){R(), R(), R()});
  const mt_placement p = P(MT_REDUCE_SUM);
  big_case(&f2, (mt_placement[]){S(0), S(1)}, (mt_placement[]){S(1), S(0)}, boxes, more,
           keys);
  big_case(&f2, (mt_placement[]){S(0), S(0)}, (mt_placement[]){S(1), S(1)}, boxes, more,
           keys);
  big_case(&f2, (mt_placement[]){S(0), S(1)}, (mt_placement[]){S(0), S(0)}, boxes, more,
           keys);
  big_case(&f2, (mt_placement[]){S(0), S(0)}, (mt_placement[]){R(), R()}, boxes, more,
           keys);
  big_case(&f2, (mt_placement[]){p, S(0)}, (mt_placement[]){S(0), S(1)}, boxes, more,
           keys);
  big_case(&f2, (mt_placement[]){R(), R()}, (mt_placement[]){S(0), S(0)}, boxes, more,
           keys);
  big_case(&f1, (mt_placement[]){S(0)}, (mt_placement[]){S(1)}, boxes, more, keys);
  big_case(&f1, (mt_placement[]){S(0)}, (mt_placement[]){R()}, boxes, more, keys);
  big_case(&f1, (mt_placement[]){p}, (mt_placement[]){S(0)}, boxes, more, keys);
  big_case(&f3, (mt_placement[]){S(0), S(1), S(0)}, (mt_placement[]){S(1), S(0), R()},
           boxes, more, keys);
  big_case(&f3, (mt_placement[]){S(0), S(0), S(0)}, (mt_placement[]){S(1), R(), S(0)},
           boxes, more, keys);
  free(boxes);
  free(more);
  free(keys);
  if (trace) printf("16k-rank planning: worst %.2f ms\n", worst_plan_s * 1e3);
}

/* ---- (d) Errors and edges. ---- */

/* mt_plan_create fails with `want`, says something, and leaves `out` alone. */
static void expect_plan_error(const mt_layout *a, const mt_layout *b, int64_t itemsize,
                              int want, const char *needle) {
  mt_plan *plan = (mt_plan *)&plan;
  mt_error err = {0, ""};
  int rc = mt_plan_create(a, b, itemsize, &plan, &err);
  CHECK_MSG(rc == want, "got %s, want %s (%s)", mt_status_name(rc),
            mt_status_name(want), err.msg);
  CHECK(err.code == want && err.msg[0] != '\0');
  CHECK(plan == (mt_plan *)&plan);
  CHECK_MSG(needle == NULL || strstr(err.msg, needle) != NULL, "message: %s", err.msg);
  CHECK(mt_plan_create(a, b, itemsize, &plan, NULL) == want);
}

static void test_plan_errors(void) {
  const int64_t mesh[2] = {2, 2}, shape[2] = {8, 6}, other[2] = {8, 5}, m3[2] = {2, 3};
  mt_layout l = make(2, shape, 2, mesh, (mt_placement[]){S(0), R()});
  mt_layout part = with(&l, (mt_placement[]){P(MT_REDUCE_SUM), R()});
  mt_layout pmax = with(&l, (mt_placement[]){P(MT_REDUCE_MAX), R()});
  mt_layout sp = with(&l, (mt_placement[]){R(), P(MT_REDUCE_SUM)});
  /* Creating a Partial is refused as mt_plan_check refuses it. */
  expect_plan_error(&l, &part, 4, MT_ESTATE,
                    "Can not redistribute from S(0) to P(sum) on mesh dim 0: "
                    "redistributing to Partial is for internal use only!");
  expect_plan_error(&part, &pmax, 4, MT_ESTATE, "P(sum) to P(max)");
  expect_plan_error(&l, &sp, 4, MT_ESTATE, "R to P(sum) on mesh dim 1");
  mt_layout l1 = make(2, shape, 2, (const int64_t[]){4, 1}, (mt_placement[]){R(), R()});
  mt_layout l1p = with(&l1, (mt_placement[]){R(), P(MT_REDUCE_SUM)});
  expect_plan_error(&l1, &l1p, 4, MT_ESTATE, "mesh dim 1");
  mt_layout l_other = make(2, other, 2, mesh, (mt_placement[]){R(), R()});
  mt_layout l_mesh = make(2, shape, 2, m3, (mt_placement[]){R(), R()});
  mt_layout l_1d = make(2, shape, 1, mesh, (mt_placement[]){R()});
  mt_layout l_3d =
      make(3, (const int64_t[]){8, 6, 1}, 2, mesh, (mt_placement[]){R(), R()});
  expect_plan_error(&l, &l_other, 4, MT_EINVAL, "Tensor dim 1");
  expect_plan_error(&l, &l_mesh, 4, MT_EINVAL, "Mesh dim 1");
  expect_plan_error(&l, &l_1d, 4, MT_EINVAL, "mesh");
  expect_plan_error(&l, &l_3d, 4, MT_EINVAL, "tensor dims");
  expect_plan_error(&l, &l, 0, MT_EINVAL, "item size");
  mt_layout bad = l;
  bad.placements[1] = S(4);
  expect_plan_error(&bad, &l, 4, MT_EINDEX, "The source layout is invalid");
  expect_plan_error(&l, &bad, 4, MT_EINDEX, "The target layout is invalid");
  mt_plan *plan = NULL;
  CHECK(mt_plan_create(NULL, &l, 4, &plan, NULL) == MT_EINVAL);
  CHECK(mt_plan_create(&l, NULL, 4, &plan, NULL) == MT_EINVAL);
  CHECK(mt_plan_create(&l, &l, 4, NULL, NULL) == MT_EINVAL);
}

static void test_plan_limits(void) {
  /* More bytes than int64 can count. */
  const int64_t huge = INT64_C(1) << 62, four = 4;
  mt_layout h = make(1, &huge, 1, &four, (mt_placement[]){S(0)});
  mt_layout hr = with(&h, (mt_placement[]){R()});
  expect_plan_error(&h, &hr, 1, MT_EOVERFLOW, "int64");
  /* An empty tensor moves nothing, however large its other dims' product: the
   * fuzzer's (0, 3e18, 3e18) and (2^31 + 1, 3e18, 0) were refused as overflows. */
  const int64_t empty[3] = {0, INT64_C(3074457345618258602), INT64_C(3074457345618258602)};
  const int64_t last_empty[3] = {INT64_C(2147483649), INT64_C(3074457345618258602), 0};
  const int64_t mesh48 = 48, mesh46 = 46;
  mt_layout e = make(3, empty, 1, &mesh48, (mt_placement[]){R()});
  mt_layout es = with(&e, (mt_placement[]){S(0)});
  mt_layout p = make(3, last_empty, 1, &mesh46, (mt_placement[]){P(MT_REDUCE_SUM)});
  mt_layout pr = with(&p, (mt_placement[]){R()});
  const mt_layout *pairs[2][2] = {{&e, &es}, {&p, &pr}};
  for (int i = 0; i < 2; ++i) {
    mt_plan *plan = NULL;
    CHECK(mt_plan_create(pairs[i][0], pairs[i][1], 1, &plan, NULL) == MT_OK);
    CHECK(mt_plan_bytes(plan) == 0);
    mt_plan_destroy(plan);
  }
  /* A candidate whose bytes pass int64 drops out where torch's order fits: the
   * fuzzer's gather-first candidate for [S(0), P] -> [R, R] of 2^32 + 3 items of
   * 1 MiB on 30 x 30 had failed the whole plan. */
  const int64_t big = (INT64_C(1) << 32) + 3, m30[2] = {30, 30};
  mt_layout sp = make(1, &big, 2, m30, (mt_placement[]){S(0), P(MT_REDUCE_SUM)});
  mt_layout rr = with(&sp, (mt_placement[]){R(), R()});
  mt_plan *fits = NULL;
  CHECK(mt_plan_create(&sp, &rr, INT64_C(1) << 20, &fits, NULL) == MT_OK);
  CHECK(mt_plan_bytes(fits) > 0);
  mt_plan_destroy(fits);
  /* Where torch's steps together pass int64 a plan within int64 still beats them:
   * the fuzzer's [P, P, P, S(0)] -> [S(0), R, P, R] of 2^31 + 1 items of 1 MiB on
   * 3 x 62 x 5 x 2 had been refused because torch's total could not be counted. */
  const int64_t half = (INT64_C(1) << 31) + 1, m4[4] = {3, 62, 5, 2};
  mt_layout ppps = make(1, &half, 4, m4,
                        (mt_placement[]){P(MT_REDUCE_SUM), P(MT_REDUCE_SUM),
                                         P(MT_REDUCE_SUM), S(0)});
  mt_layout srpr = with(&ppps, (mt_placement[]){S(0), R(), P(MT_REDUCE_SUM), R()});
  mt_plan *beyond = NULL;
  CHECK(mt_plan_create(&ppps, &srpr, INT64_C(1) << 20, &beyond, NULL) == MT_OK);
  CHECK(mt_plan_bytes(beyond) > 0);
  mt_plan_destroy(beyond);
  /* Torch cuts before it reduces where no staged order does: [S(3), P, R] ->
   * [S(0), S(1), S(2)] on 2 x 2 x 2 cuts dim 2, reduce-scatters half the data and
   * swaps dims; every other candidate moved more and the plan had been refused. */
  const int64_t s4[4] = {8, 6, 4, 10}, m222[3] = {2, 2, 2};
  mt_layout spr = make(4, s4, 3, m222, (mt_placement[]){S(3), P(MT_REDUCE_SUM), R()});
  mt_layout sss = with(&spr, (mt_placement[]){S(0), S(1), S(2)});
  mt_plan *cut_first = NULL;
  CHECK(mt_plan_create(&spr, &sss, 8, &cut_first, NULL) == MT_OK);
  int64_t torch_bytes = 0, torch_net = 0;
  CHECK(mt_plan_torch_bytes(&spr, &sss, 8, NULL, &torch_bytes, &torch_net, NULL) == MT_OK);
  CHECK(mt_plan_bytes(cut_first) <= torch_bytes);
  mt_plan_destroy(cut_first);
  /* A mesh no MPI job can have. */
  const int64_t wide[2] = {INT64_C(1) << 20, INT64_C(1) << 20};
  mt_layout w = make(1, &four, 2, wide, (mt_placement[]){R(), R()});
  expect_plan_error(&w, &w, 1, MT_EINVAL, "ranks");
}

static void test_accessors(void) {
  CHECK(mt_plan_nsteps(NULL) == 0 && mt_plan_step(NULL, 0) == NULL);
  CHECK(mt_plan_bytes(NULL) == 0 && mt_plan_messages(NULL) == 0);
  mt_plan_destroy(NULL);
  const int64_t k = 3, n = 10;
  mt_layout a = make(1, &n, 1, &k, (mt_placement[]){S(0)});
  mt_layout b = with(&a, (mt_placement[]){R()});
  mt_plan *plan = plan_of(&a, &b, 2);
  CHECK(mt_plan_nsteps(plan) == 1 && mt_plan_step(plan, 1) == NULL);
  CHECK(mt_plan_step(plan, -1) == NULL);
  /* 10 on 3: chunks of 4, 4, 2; each rank receives the other two. */
  const mt_step *st = mt_plan_step(plan, 0);
  CHECK(st != NULL && st->bytes == (6 + 6 + 8) * 2 && st->messages == 6);
  CHECK(st->mesh_dim == 0 && mt_plan_bytes(plan) == 40 && mt_plan_messages(plan) == 6);
  mt_plan_destroy(plan);
  /* All-reduce: 2 (G - 1) / G of the buffer per rank, a ring. */
  mt_layout p = with(&a, (mt_placement[]){P(MT_REDUCE_SUM)});
  plan = plan_of(&p, &b, 8);
  CHECK(mt_plan_bytes(plan) == 3 * 10 * 8 * 4 / 3 && mt_plan_messages(plan) == 6);
  mt_plan_destroy(plan);
  /* Reduce-scatter: each rank receives its chunk from the two others. */
  plan = plan_of(&p, &a, 8);
  CHECK(mt_plan_bytes(plan) == (30 - 10) * 8 && mt_plan_messages(plan) == 6);
  mt_plan_destroy(plan);
}

/* What the owners' destructor saw: how often it ran, and on what. */
static int freed_count;
static void *freed_data;

static void count_free(void *data) {
  ++freed_count;
  freed_data = data;
}

/* Owners and the compiled part: the last owner frees the plan and calls the
 * destructor of the first compiled part, once; a second one is refused. */
static void test_owners(void) {
  const int64_t k = 2, n = 6;
  mt_layout a = make(1, &n, 1, &k, (mt_placement[]){S(0)});
  mt_layout b = with(&a, (mt_placement[]){R()});
  mt_plan *plan = plan_of(&a, &b, 4);
  static int first, second;
  CHECK(mt_plan_compiled(plan) == NULL);
  CHECK(mt_plan_set_compiled(plan, &first, count_free) == 1);
  CHECK(mt_plan_set_compiled(plan, &second, count_free) == 0);
  CHECK(mt_plan_compiled(plan) == &first);
  mt_plan_retain(plan);
  mt_plan_retain(plan);
  mt_plan_destroy(plan);
  mt_plan_destroy(plan);
  CHECK(freed_count == 0 && mt_plan_nsteps(plan) == 1);
  mt_plan_destroy(plan);
  CHECK(freed_count == 1 && freed_data == &first);
  /* Without a compiled part, destroying calls no destructor. */
  plan = plan_of(&a, &b, 4);
  mt_plan_destroy(plan);
  CHECK(freed_count == 1);
}

static void test_step_valid(void) {
  const int64_t mesh[2] = {2, 2}, mesh21[2] = {2, 1}, shape[2] = {8, 6};
  mt_layout l = make(2, shape, 2, mesh, (mt_placement[]){R(), R()});
  mt_layout l21 = make(2, shape, 2, mesh21, (mt_placement[]){R(), R()});
#define VALID(frame, a0, a1, b0, b1, m)                               \
  mt_step_valid((mt_layout[]){with(frame, (mt_placement[]){a0, a1})}, \
                (mt_layout[]){with(frame, (mt_placement[]){b0, b1})}, m)
  mt_placement ps = P(MT_REDUCE_SUM), pm = P(MT_REDUCE_MAX);
  CHECK(VALID(&l, S(0), R(), R(), R(), 0) == 1);
  CHECK(VALID(&l, S(0), S(0), R(), S(0), 0) == 0);  /* dim 0 cut again later */
  CHECK(VALID(&l, S(0), S(0), S(0), R(), 1) == 1);  /* the outer cut is shared */
  CHECK(VALID(&l, S(0), S(1), S(1), S(1), 0) == 0); /* S(1) cut again later */
  CHECK(VALID(&l, S(0), S(1), S(0), S(0), 1) == 1);
  CHECK(VALID(&l, R(), S(0), S(0), S(0), 0) == 0);
  CHECK(VALID(&l, R(), S(1), S(0), S(1), 0) == 1);
  CHECK(VALID(&l, ps, S(0), R(), S(0), 0) == 1);
  CHECK(VALID(&l, ps, S(0), S(0), S(0), 0) == 0);
  CHECK(VALID(&l, ps, S(0), S(1), S(0), 0) == 1);
  CHECK(VALID(&l, S(0), R(), ps, R(), 0) == 0);
  CHECK(VALID(&l, R(), R(), ps, R(), 0) == 0);
  CHECK(VALID(&l, ps, R(), pm, R(), 0) == 0);
  CHECK(VALID(&l, S(0), R(), S(0), R(), 0) == 0);
  CHECK(VALID(&l, S(0), S(1), R(), R(), 0) == 0); /* two mesh dims change */
  CHECK(VALID(&l, S(0), R(), R(), R(), -1) == 0);
  CHECK(VALID(&l, S(0), R(), R(), R(), 2) == 0);
  /* A later mesh dim of size 1 cuts nothing. */
  CHECK(VALID(&l21, S(0), S(0), R(), S(0), 0) == 1);
#undef VALID
  CHECK(mt_step_valid(NULL, &l, 0) == 0 && mt_step_valid(&l, NULL, 0) == 0);
}

static void test_exchange_errors(void) {
  const int64_t mesh[2] = {2, 2}, shape[2] = {8, 6};
  mt_layout a = make(2, shape, 2, mesh, (mt_placement[]){S(0), S(1)});
  mt_layout b = with(&a, (mt_placement[]){S(1), S(0)});
  mt_box send[4], recv[4];
  mt_error err = {0, ""};
  const int64_t c[2] = {1, 0}, far[2] = {2, 0};
  CHECK(mt_exchange_boxes(&a, &b, -1, c, 4, send, recv, &err) == MT_OK);
  CHECK(mt_exchange_boxes(&a, &b, -1, c, 3, send, recv, &err) == MT_EINVAL);
  CHECK(strstr(err.msg, "npeers") != NULL);
  CHECK(mt_exchange_boxes(&a, &b, 2, c, 4, send, recv, &err) == MT_EINDEX);
  CHECK(mt_exchange_boxes(&a, &b, -2, c, 4, send, recv, NULL) == MT_EINDEX);
  CHECK(mt_exchange_boxes(&a, &b, -1, far, 4, send, recv, NULL) == MT_EINDEX);
  CHECK(mt_exchange_boxes(NULL, &b, -1, c, 4, send, recv, NULL) == MT_EINVAL);
  CHECK(mt_exchange_boxes(&a, &b, -1, NULL, 4, send, recv, NULL) == MT_EINVAL);
  CHECK(mt_exchange_boxes(&a, &b, -1, c, 4, NULL, recv, NULL) == MT_EINVAL);
  mt_layout other =
      make(2, (const int64_t[]){8, 7}, 2, mesh, (mt_placement[]){R(), R()});
  CHECK(mt_exchange_boxes(&a, &other, -1, c, 4, send, recv, NULL) == MT_EINVAL);
  /* Rank (1, 0) of [S0, S1] -> [S1, S0] on 8 x 6: it holds rows 4-7, cols 0-2 and
   * needs rows 0-3, cols 3-5, all from rank (0, 1). */
  CHECK(mt_exchange_boxes(&a, &b, -1, c, 4, send, recv, NULL) == MT_OK);
  CHECK(mt_box_numel(&recv[1]) == 12 && recv[1].offset[0] == 0 &&
        recv[1].offset[1] == 3);
  CHECK(mt_box_numel(&recv[0]) + mt_box_numel(&recv[2]) + mt_box_numel(&recv[3]) == 0);
  CHECK(mt_box_numel(&send[1]) == 12 && send[1].offset[0] == 4 &&
        send[1].offset[1] == 0);
  /* A 0-d tensor: fine within one group, no empty box for ranks outside it. */
  mt_layout z = make(0, NULL, 2, mesh, (mt_placement[]){P(MT_REDUCE_SUM), R()});
  mt_layout zr = make(0, NULL, 2, mesh, (mt_placement[]){R(), R()});
  CHECK(mt_exchange_boxes(&z, &zr, 0, c, 4, send, recv, &err) == MT_ENOTSUP);
  mt_layout z1 = make(0, NULL, 1, &mesh[0], (mt_placement[]){P(MT_REDUCE_SUM)});
  mt_layout z1r = make(0, NULL, 1, &mesh[0], (mt_placement[]){R()});
  CHECK(mt_exchange_boxes(&z1, &z1r, 0, c, 2, send, recv, NULL) == MT_OK);
  CHECK(mt_box_numel(&recv[0]) == 1 && mt_box_numel(&recv[1]) == 1);
}

int main(int argc, char **argv) {
  const char *q = getenv("MT_TEST_QUICK");
  quick = (argc > 1 && strcmp(argv[1], "--quick") == 0) || (q != NULL && q[0] == '1');
  trace = getenv("MPITENSOR_TRACE") != NULL;
  test_counts_1d();
  test_counts_2d();
  test_partial_2d();
  test_size1();
  test_torch_cost();
  test_simulation_fixed();
  test_simulation();
  test_tiles_checker();
  test_16k();
  test_plan_errors();
  test_plan_limits();
  test_accessors();
  test_owners();
  test_step_valid();
  test_exchange_errors();
  return mt_test_exit("test_plan");
}
