/* A plan compiled for one rank: for every step, what the executor would otherwise
 * rebuild on every call (the counts and displacements of the v-collectives, the
 * boxes of an exchange and one subarray datatype per peer, O(group) of each). It is
 * built on the plan's first execution and attached to the plan, which frees it
 * with itself (plan.h), as mpi4py-fft's Transfer owns its datatypes.
 *
 * What it holds depends on the rank's coordinate and the item size, so a plan
 * keeps the first compiled part it is given; a run with another coordinate or item
 * size (the same plan on another mesh) compiles a private one for that run. The
 * executor takes `const mt_plan *`, as running a plan does not change what it
 * means; attaching the compiled part is a cache fill, so the const is cast away
 * here, and only here, for mt_plan_set_compiled. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm-private.h"
#include "direct-private.h"
#include "exec-private.h"
#include "mpi-types-private.h"

/* ---- per step ------------------------------------------------------------------ */

/* All-gather: counts and displacements in bytes of each member's block in the
 * gathered box, in the largest unit that keeps them ints. */
static int compile_gather(const mt_step *s, const int64_t *coord, int64_t isz,
                          mt__step_exec *e, mt_error *err) {
  int64_t g = e->group, off = 0;
  int64_t *bytes = calloc((size_t)(2 * g), sizeof *bytes);
  e->ints = malloc((size_t)(2 * g) * sizeof *e->ints);
  if (bytes == NULL || e->ints == NULL) {
    free(bytes);
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  for (int64_t k = 0; k < g; ++k) {
    mt_box b;
    mt__box_at(&s->src, coord, s->mesh_dim, k, &b);
    bytes[k] = mt_box_numel(&b) * isz;
    bytes[g + k] = off;
    off += bytes[k];
  }
  int rc = mt__byte_unit(bytes, 2 * g, &e->unit, &e->unit_bytes, err);
  for (int64_t i = 0; rc == MT_OK && i < 2 * g; ++i) {
    e->ints[i] = (int)(bytes[i] / e->unit_bytes);
  }
  e->even = 1;
  for (int64_t k = 1; k < g; ++k) e->even &= bytes[k] == bytes[0];
  free(bytes);
  return rc;
}

int64_t mt_reduce_scatter_round(const int64_t *counts, int64_t group, int64_t itemsize,
                                int64_t limit) {
  int64_t total = 0, most = 0;
  for (int64_t k = 0; k < group; ++k) {
    total += counts[k];
    most = counts[k] > most ? counts[k] : most;
  }
  if (total <= limit) return 0;
  /* 256 MiB of each member's block per round keeps the packed round small; the
   * round's total (group times that) must itself be a count MPI takes. */
  int64_t round = ((int64_t)1 << 28) / itemsize;
  if (round > limit / group) round = limit / group;
  if (round > most) round = most;
  return round > 0 ? round : 1;
}

/* Reduce-scatter: each member's element count, and the round size when the counts'
 * total exceeds an int (MPI's counts are ints, and the library sums them into one). */
static int compile_scatter(const mt_step *s, const int64_t *coord, int64_t isz,
                           mt__step_exec *e, mt_error *err) {
  e->ints = malloc((size_t)e->group * sizeof *e->ints);
  e->counts = malloc((size_t)e->group * sizeof *e->counts);
  if (e->ints == NULL || e->counts == NULL) {
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  for (int64_t k = 0; k < e->group; ++k) {
    mt_box b;
    mt__box_at(&s->dst, coord, s->mesh_dim, k, &b);
    e->counts[k] = mt_box_numel(&b);
  }
  e->round = mt_reduce_scatter_round(e->counts, e->group, isz, INT_MAX);
  for (int64_t k = 0; k < e->group; ++k) {
    e->ints[k] = (int)(e->round != 0 ? 0 : e->counts[k]);
  }
  return MT_OK;
}

/* The box in layout `l` of each of the g peers along mesh dim m (m < 0: every
 * member of the mesh, in mesh order), for direct copies between their arrays. */
static void peer_boxes(const mt_mesh *mesh, const mt_layout *l, const int64_t *coord,
                       int m, int64_t g, mt_box *out) {
  int nd = mt_mesh_ndim(mesh);
  for (int64_t q = 0; q < g; ++q) {
    int64_t at[MT_MAX_MESH_NDIM], rest = q;
    memcpy(at, coord, (size_t)nd * sizeof *at);
    for (int d = nd - 1; m < 0 && d >= 0; --d) {
      at[d] = rest % mt_mesh_dim_size(mesh, d);
      rest /= mt_mesh_dim_size(mesh, d);
    }
    mt__box_at(l, at, m, q, &out[q]);
  }
}

/* All-to-all or direct: every peer's boxes, then the exchange's datatypes. */
static int compile_exchange(const mt_mesh *mesh, const mt_step *s, const int64_t *coord,
                            int64_t isz, mt__step_exec *e, mt_error *err) {
  mt__exchange_scratch sc;
  int rc = mt__exchange_scratch_init(mesh, coord, s->mesh_dim, &sc, err);
  if (rc != MT_OK) return rc;
  rc = mt_exchange_boxes(&s->src, &s->dst, s->mesh_dim, coord, sc.n, sc.send, sc.recv,
                         err);
  /* The peers' boxes only where direct copies may run: a plan over a large mesh
   * would otherwise hold O(group) boxes it never reads. */
  int direct = mt_mesh_direct_read(mesh) && e->group <= MT__DIRECT_MAX_GROUP;
  mt_box *peers = rc == MT_OK && direct ? malloc(2 * (size_t)e->group * sizeof *peers) : NULL;
  if (rc == MT_OK && direct && peers == NULL)
    rc = mt_error_set(err, MT_ENOMEM, "out of memory");
  if (rc == MT_OK) {
    if (direct) {
      peer_boxes(mesh, &s->src, coord, s->mesh_dim, e->group, peers);
      peer_boxes(mesh, &s->dst, coord, s->mesh_dim, e->group, peers + e->group);
    }
    mt_box sb, tb;
    mt__box_at(&s->src, coord, -1, 0, &sb);
    mt__box_at(&s->dst, coord, -1, 0, &tb);
    rc = mt__exchange_build(&sb, &tb, sc.send, sc.recv, sc.lin, (int)e->group, sc.me,
                            isz, peers, &e->x, err);
  }
  free(peers);
  mt__exchange_scratch_free(&sc);
  return rc;
}

static int compile_step(const mt_mesh *mesh, const mt_step *s, const int64_t *coord,
                        int64_t isz, mt__step_exec *e, mt_error *err) {
  e->unit = MPI_BYTE, e->unit_bytes = 1;
  e->group = s->mesh_dim >= 0 ? mt_mesh_dim_size(mesh, s->mesh_dim) : 1;
  for (int d = 0; s->mesh_dim < 0 && d < mt_mesh_ndim(mesh); ++d) {
    e->group *= mt_mesh_dim_size(mesh, d);
  }
  switch (s->kind) {
    case MT_STEP_ALLGATHER:
      return compile_gather(s, coord, isz, e, err);
    case MT_STEP_REDUCE_SCATTER:
      return compile_scatter(s, coord, isz, e, err);
    case MT_STEP_ALLTOALL:
    case MT_STEP_DIRECT:
      return compile_exchange(mesh, s, coord, isz, e, err);
    default:
      return MT_OK;
  }
}

/* ---- the whole plan ------------------------------------------------------------- */

void mt__compiled_free(void *compiled) {
  mt__compiled *c = compiled;
  if (c == NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (int i = 0; c->steps != NULL && i < c->nsteps; ++i) {
    mt__step_exec *e = &c->steps[i];
    if (e->unit != MPI_BYTE && !finalized) MPI_Type_free(&e->unit);
    free(e->ints);
    free(e->counts);
    mt__exchange_free(&e->x);
  }
  free(c->steps);
  free(c);
}

static int compile(const mt_mesh *mesh, const mt_plan *plan, const int64_t *coord,
                   int64_t itemsize, mt__compiled **out, mt_error *err) {
  mt__compiled *c = calloc(1, sizeof *c);
  int n = mt_plan_nsteps(plan);
  if (c != NULL) c->steps = calloc(n > 0 ? (size_t)n : 1, sizeof *c->steps);
  if (c == NULL || c->steps == NULL) {
    free(c);
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  c->mesh_ndim = mt_mesh_ndim(mesh), c->itemsize = itemsize, c->nsteps = n;
  memcpy(c->coord, coord, (size_t)c->mesh_ndim * sizeof *coord);
  int rc = MT_OK;
  for (int i = 0; i < n && rc == MT_OK; ++i) {
    rc = compile_step(mesh, mt_plan_step(plan, i), coord, itemsize, &c->steps[i], err);
  }
  if (rc != MT_OK) {
    mt__compiled_free(c);
    return rc;
  }
  *out = c;
  return MT_OK;
}

static int fits(const mt__compiled *c, const mt_mesh *mesh, const int64_t *coord,
                int64_t itemsize) {
  if (c == NULL || c->itemsize != itemsize || c->mesh_ndim != mt_mesh_ndim(mesh))
    return 0;
  return memcmp(c->coord, coord, (size_t)c->mesh_ndim * sizeof *coord) == 0;
}

int mt__compiled_get(const mt_mesh *mesh, const mt_plan *plan, const int64_t *coord,
                     int64_t itemsize, const mt__compiled **out, mt__compiled **owned,
                     mt_error *err) {
  *owned = NULL;
  const mt__compiled *held = mt_plan_compiled(plan);
  if (fits(held, mesh, coord, itemsize)) {
    *out = held;
    return MT_OK;
  }
  mt__compiled *c = NULL;
  int rc = compile(mesh, plan, coord, itemsize, &c, err);
  if (rc != MT_OK) return rc;
  if (held != NULL || !mt_plan_set_compiled((mt_plan *)plan, c, mt__compiled_free)) {
    *owned = c;
  }
  *out = c;
  return MT_OK;
}
