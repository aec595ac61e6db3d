/* Running redistribution plans: the context of a run (its dtype, this rank's
 * place, the plan's compiled part), the agreement before a move, and the blocking
 * and asynchronous runs of a plan's steps (each step's MPI call is in
 * redistribute_steps.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/pool.h"
#include "mpitensor/comm/redistribute.h"
#include "mpitensor/core/dtype.h"
#include "redistribute-private.h"

struct mt_request {
  exec_ctx ctx;
  const mt_plan *plan; /* one of its owners while the request lives */
  int next;            /* index of the step after the pending one */
  pending p;
  const void *src;
  void *dst;
  char *tmp_in; /* intermediate buffers owned by the request */
  char *tmp_out;
  char **mid; /* alloc_mids' buffers not taken yet, or NULL */
};

int mt__check_mesh_shape(const mt_mesh *mesh, const mt_layout *l, mt_error *err) {
  if (l->mesh_ndim != mt_mesh_ndim(mesh)) {
    return mt_error_set(err, MT_EINVAL,
                        "the plan was made for a %d-D mesh, not a %d-D "
                        "one",
                        l->mesh_ndim, mt_mesh_ndim(mesh));
  }
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (l->mesh_shape[m] == mt_mesh_dim_size(mesh, m)) continue;
    return mt_error_set(err, MT_EINVAL,
                        "the plan was made for a mesh of size %lld on "
                        "dim %d, not %lld",
                        (long long)l->mesh_shape[m], m,
                        (long long)mt_mesh_dim_size(mesh, m));
  }
  return MT_OK;
}

int mt__ctx_base(exec_ctx *c, mt_mesh *mesh, int dtype, mt_error *err) {
  memset(c, 0, sizeof *c);
  c->mesh = mesh, c->dtype = dtype;
  c->itemsize = c->counted = (int64_t)mt_dtype_size(dtype);
  if (c->itemsize == 0)
    return mt_error_set(err, MT_ETYPE, "unknown dtype code %d", dtype);
  if (!mt_mesh_coordinate(mesh, c->coord)) {
    return mt_error_set(err, MT_ESTATE, "this rank is not a member of the mesh");
  }
  return MT_OK;
}

/* Checks what can be checked locally before the first collective, so that bad
 * input fails on every rank instead of leaving some waiting, then finds the
 * plan's compiled part. */
static int ctx_init(exec_ctx *c, mt_mesh *mesh, const mt_plan *plan, int dtype, int nb,
                    mt_error *err) {
  int rc = mt__ctx_base(c, mesh, dtype, err);
  c->nonblocking = nb;
  for (int i = 0; rc == MT_OK && i < mt_plan_nsteps(plan); ++i) {
    const mt_step *s = mt_plan_step(plan, i);
    int reduces = s->kind == MT_STEP_ALLREDUCE || s->kind == MT_STEP_REDUCE_SCATTER ||
                  s->kind == MT_STEP_ALLREDUCE_NODES;
    rc = mt__check_mesh_shape(mesh, &s->src, err);
    if (rc == MT_OK && reduces) rc = mt_partial_check(dtype, s->src.placements[s->mesh_dim].reduce_op, err);
  }
  if (rc != MT_OK) return rc;
  return mt__compiled_get(mesh, plan, c->coord, c->itemsize, &c->cp, &c->owned, err);
}

static void ctx_free(exec_ctx *c) {
  mt__compiled_free(c->owned);
  c->owned = NULL;
}

static char *alloc_box(const exec_ctx *c, const mt_layout *l) {
  mt_box b;
  mt__exec_box(c, l, -1, 0, &b);
  return mt_pool_alloc((size_t)(mt_box_numel(&b) * c->itemsize));
}

static int run_one(const exec_ctx *c, int i, const mt_step *s, const void *in,
                   void *out, mt_error *err) {
  pending p;
  mt__pending_init(&p, c, i, s, in, out);
  int rc = mt__step_start(c, &p, err);
  if (rc != MT_OK) {
    mt__pending_free(&p);
    return rc;
  }
  return mt__step_finish(c, &p, err);
}

/* Runs steps [from, nsteps) with blocking calls. `in` is step from's input and
 * `owned` the buffer behind it when it is an intermediate one (freed here). `mid`,
 * when not NULL, holds every step's output buffer allocated beforehand (see
 * alloc_mids; each is freed here once consumed), else they are allocated one step
 * at a time. */
static int run_steps(const exec_ctx *c, const mt_plan *plan, int from, const void *in,
                     char *owned, char **mid, void *dst, mt_error *err) {
  int n = mt_plan_nsteps(plan), rc = MT_OK, i = from;
  for (; i < n && rc == MT_OK; ++i) {
    const mt_step *s = mt_plan_step(plan, i);
    char *out = i == n - 1 ? dst : mid != NULL ? mid[i] : alloc_box(c, &s->dst);
    if (mid != NULL && i < n - 1) mid[i] = NULL;
    if (out == NULL) {
      rc = mt_error_set(err, MT_ENOMEM, "out of memory");
      break;
    }
    rc = run_one(c, i, s, in, out, err);
    mt_pool_free(owned);
    owned = i == n - 1 ? NULL : out;
    in = out;
  }
  for (; mid != NULL && i < n - 1; ++i) {
    mt_pool_free(mid[i]);
    mid[i] = NULL;
  }
  mt_pool_free(owned);
  return rc;
}

/* The output buffers of a plan's intermediate steps, all allocated before the
 * agreement of a large move (agree_before_run), so that a rank that cannot hold
 * one fails every rank alike instead of stopping between two collectives. NULL
 * (nothing allocated) when the move is small or has no intermediate step; else an
 * array of nsteps - 1 buffers, or *failed set (then everything is freed). */
static char **alloc_mids(const exec_ctx *c, const mt_plan *plan, int *failed) {
  int n = mt_plan_nsteps(plan);
  *failed = 0;
  if (n < 2 || c->itemsize == 0) return NULL;
  const mt_layout *to = &mt_plan_step(plan, n - 1)->dst;
  int64_t numel = 1;
  for (int i = 0; i < to->ndim; ++i) numel *= to->shape[i];
  if (numel < MT_AGREE_MIN_BYTES / c->itemsize) return NULL;
  char **mid = calloc((size_t)(n - 1), sizeof *mid);
  for (int i = 0; mid != NULL && i < n - 1; ++i) {
    mid[i] = alloc_box(c, &mt_plan_step(plan, i)->dst);
    if (mid[i] == NULL) {
      for (int k = 0; k < i; ++k) mt_pool_free(mid[k]);
      free(mid);
      mid = NULL;
    }
  }
  *failed = mid == NULL;
  return mid;
}

/* Frees what is left of alloc_mids' buffers (the steps NULL those they take). */
static void free_mids(char **mid, int n) {
  for (int i = 0; mid != NULL && i < n - 1; ++i) mt_pool_free(mid[i]);
  free(mid);
}

/* See redistribute-private.h. */
int mt__agree_before_move(const exec_ctx *c, const char *what, const mt_layout *from,
                             const mt_layout *to, uint64_t extra, const char *args,
                             int when, const void *dst, int rc, mt_error *err) {
  if (c->itemsize == 0) return rc;
  mt_box b;
  int64_t numel = 1;
  for (int i = 0; i < to->ndim; ++i) numel *= to->shape[i];
  if (rc == MT_OK && dst == NULL) {
    mt__exec_box(c, to, -1, 0, &b);
    if (mt_box_numel(&b) > 0) {
      rc = mt_error_set(err, MT_ENOMEM,
                        "%s: a rank of the mesh could not allocate its shard of %lld "
                        "bytes",
                        what, (long long)mt_box_numel(&b) * (long long)c->itemsize);
    }
  }
  int small = numel < MT_AGREE_MIN_BYTES / c->itemsize;
  if (when == MT__AGREE_NEVER || (when == MT__AGREE_LARGE && small)) return rc;
  mt_error e = {0};
  if (rc != MT_OK && err != NULL) e = *err;
  if (rc == MT_OK) {
    snprintf(e.msg, sizeof e.msg,
             "%s: the ranks of the mesh passed different %s%splacements, global shapes "
             "or dtypes; every rank must make the same call on the same DTensor "
             "(from_local of uneven shards needs shape= and stride=)",
             what, args != NULL ? args : "", args != NULL ? ", " : "");
  }
  uint64_t h = mt__fnv1a(MT__FNV_START, &c->dtype, sizeof c->dtype);
  h = mt__fnv1a(mt__layout_fnv(mt__layout_fnv(h, from), to), &extra, sizeof extra);
  rc = mt_agree(c->mesh, rc, h, &e);
  if (rc != MT_OK && err != NULL) *err = e;
  return rc;
}

/* mt__agree_before_move for a plan: its first source and last target layouts;
 * collective unless every step is a local cut. `mid_failed`: this rank could not
 * allocate an intermediate step's buffer (alloc_mids). */
static int agree_before_run(const exec_ctx *c, const mt_plan *plan, const void *dst,
                            int mid_failed, int rc, mt_error *err) {
  int n = mt_plan_nsteps(plan), communicates = 0;
  for (int i = 0; i < n; ++i) communicates |= mt_plan_step(plan, i)->kind != MT_STEP_CHUNK;
  if (n == 0) return rc;
  if (rc == MT_OK && mid_failed) {
    rc = mt_error_set(err, MT_ENOMEM,
                      "redistribute: a rank of the mesh could not allocate the buffers of "
                      "the plan's intermediate steps");
  }
  return mt__agree_before_move(c, "redistribute", &mt_plan_step(plan, 0)->src,
                           &mt_plan_step(plan, n - 1)->dst, 0, NULL,
                           communicates ? MT__AGREE_LARGE : MT__AGREE_NEVER, dst, rc, err);
}

int mt_redistribute(mt_mesh *mesh, const mt_plan *plan, int dtype, const void *src,
                    void *dst, mt_error *err) {
  exec_ctx c;
  int failed = 0;
  int rc = ctx_init(&c, mesh, plan, dtype, 0, err);
  char **mid = rc == MT_OK ? alloc_mids(&c, plan, &failed) : NULL;
  rc = agree_before_run(&c, plan, dst, failed, rc, err);
  if (rc == MT_OK) rc = run_steps(&c, plan, 0, src, NULL, mid, dst, err);
  free_mids(mid, mt_plan_nsteps(plan));
  ctx_free(&c);
  return rc;
}
/* ---- asynchronous redistribute ------------------------------------------------- */

static void request_free(mt_request *r) {
  free_mids(r->mid, mt_plan_nsteps(r->plan));
  mt__pending_free(&r->p);
  mt_pool_free(r->tmp_in);
  mt_pool_free(r->tmp_out);
  ctx_free(&r->ctx);
  /* The request was one of the plan's owners (the counts of its steps are read by
   * MPI until they complete); only ownership changes, not the plan. */
  mt_plan_destroy((mt_plan *)r->plan);
  free(r);
}

/* Issues every communicating step here, in program order: the steps before the last
 * communicating one run to completion, the last one is posted nonblocking, and only
 * local steps (chunks) are left for mt_request_wait. A step posted from inside wait
 * would follow the order in which each rank waits, and two requests waited in
 * different orders on different ranks would pair one tensor's messages with the
 * other's. */
static int start_async(mt_request *r, char **mid, mt_error *err) {
  int n = mt_plan_nsteps(r->plan), rc = MT_OK, last = -1;
  for (int i = 0; i < n; ++i) {
    if (mt_plan_step(r->plan, i)->kind != MT_STEP_CHUNK) last = i;
  }
  const void *in = r->src;
  r->mid = mid;
  for (int i = 0; i < n && rc == MT_OK; ++i) {
    const mt_step *s = mt_plan_step(r->plan, i);
    char *out = i == n - 1 ? r->dst : mid != NULL ? mid[i] : alloc_box(&r->ctx, &s->dst);
    if (mid != NULL && i < n - 1) mid[i] = NULL;
    if (out == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
    mt_pool_free(r->tmp_in);
    r->tmp_in = r->tmp_out;
    r->tmp_out = i == n - 1 ? NULL : out;
    mt__pending_init(&r->p, &r->ctx, i, s, in, out);
    r->p.borrowed = in == r->src;
    r->next = i + 1;
    r->ctx.nonblocking = i == last;
    rc = mt__step_start(&r->ctx, &r->p, err);
    if (rc == MT_OK && i == last) return MT_OK;
    if (rc == MT_OK) rc = mt__step_finish(&r->ctx, &r->p, err);
    in = out;
  }
  r->p.step = NULL;
  return rc;
}

int mt_redistribute_start(mt_mesh *mesh, const mt_plan *plan, int dtype,
                          const void *src, void *dst, mt_request **out, mt_error *err) {
  mt_request *r = calloc(1, sizeof *r);
  if (r == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  mt_plan_retain((mt_plan *)plan);
  r->plan = plan, r->src = src, r->dst = dst;
  mt__pending_init(&r->p, NULL, 0, NULL, NULL, NULL);
  int failed = 0;
  int rc = ctx_init(&r->ctx, mesh, plan, dtype, 1, err);
  char **mid = rc == MT_OK ? alloc_mids(&r->ctx, plan, &failed) : NULL;
  rc = agree_before_run(&r->ctx, plan, dst, failed, rc, err);
  if (rc == MT_OK) rc = start_async(r, mid, err);
  else free_mids(mid, mt_plan_nsteps(plan));
  if (rc != MT_OK) {
    request_free(r);
    return rc;
  }
  *out = r;
  /* The started request is waited on by mt_request_wait, through `pending`, which
   * the MPI checker does not follow. */
  return MT_OK; /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
}

int mt_request_test(mt_request *r, int *done, mt_error *err) {
  int flag = 1;
  if (r->p.step != NULL && r->p.req != MPI_REQUEST_NULL) {
    /* The request comes from start_async, which the MPI checker does not follow
     * through `pending`; once complete MPI sets it to MPI_REQUEST_NULL, so the
     * wait's finish_step skips it. */
    MT__MPI_TRY(MPI_Test(&r->p.req, &flag, MPI_STATUS_IGNORE), "MPI_Test"); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
  }
  *done = flag;
  return MT_OK;
}

int mt_request_wait(mt_request *r, mt_error *err) {
  int rc = MT_OK;
  if (r->p.step != NULL) rc = mt__step_finish(&r->ctx, &r->p, err);
  mt_pool_free(r->tmp_in);
  r->tmp_in = NULL;
  if (rc == MT_OK && r->next < mt_plan_nsteps(r->plan)) { /* local steps only */
    r->ctx.nonblocking = 0;
    const void *in = r->tmp_out;
    char *owned = r->tmp_out;
    r->tmp_out = NULL;
    rc = run_steps(&r->ctx, r->plan, r->next, in, owned, r->mid, r->dst, err);
  }
  request_free(r);
  return rc;
}
