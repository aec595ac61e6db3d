/* Sharding propagation (prop.h, mt_propagate): one engine for every op described
 * as a dim map. It lists candidate placements per mesh dim (prop_candidates.c),
 * combines them over the mesh, prices each combination with the redistribution
 * planner (prop_price.c, prop_score.c) and keeps the cheapest (prop_search.c);
 * prop.h gives the rules and the order of preference. Pricing is the expensive
 * part (mt_plan_create_timed allocates, and a direct exchange's price walks the
 * ranks), so it is done as little as possible.
 *
 * Allocation: one block of candidates, one memo and one list of bounds per call,
 * plus the plans priced, each freed at once. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"
#include "prop-private.h"

/* The placements of the winning combination, and what its moves cost. */
static void fill_result(const mt__engine *e, const int *choice, const mt__score *s,
                        mt_prop_result *out) {
  memset(out, 0, sizeof *out);
  for (int m = 0; m < e->mesh_ndim; ++m) {
    const mt__cand *c = &e->dims[m].c[choice[m]];
    for (int i = 0; i < e->ninputs; ++i) out->in_placements[i][m] = c->in[i];
    out->out_placements[m] = c->out;
  }
  out->out_ndim = e->map->out_ndim;
  for (int d = 0; d < out->out_ndim; ++d) out->out_shape[d] = e->out_shape[d];
  out->bytes = s->bytes;
  out->messages = s->messages;
}

/* Loads and checks the inputs, then builds every mesh dim's candidates. */
static int prepare(mt__engine *e, mt_error *err) {
  int rc = mt__prop_load(e, err);
  if (rc != MT_OK) return rc;
  assert(e->mesh_ndim >= 1 && e->mesh_ndim <= MT_MAX_MESH_NDIM);
  e->dims = malloc((size_t)e->mesh_ndim * sizeof *e->dims);
  if (e->dims == NULL)
    return mt__fail(err, MT_ENOMEM, "Out of memory choosing placements");
  for (int m = 0; m < e->mesh_ndim; ++m) mt__prop_build_dim(e, m, &e->dims[m]);
  return MT_OK;
}

int mt_propagate(const mt_dimmap *map, const mt_prop_inputs *in, mt_prop_result *out,
                 mt_error *err) {
  if (map == NULL || in == NULL || out == NULL)
    return mt__fail(err, MT_EINVAL, "The dim map, inputs and result are required");
  int rc = mt_dimmap_check(map, err);
  if (rc != MT_OK) return rc;
  mt__engine e;
  memset(&e, 0, sizeof e);
  e.map = map, e.in = in;
  mt_time_model fallback = mt_time_model_default();
  e.model = in->model != NULL ? in->model : &fallback;
  rc = mt_time_model_check(e.model, err);
  if (rc != MT_OK) return rc;
  int best[MT_MAX_MESH_NDIM] = {0};
  mt__score best_s;
  memset(&best_s, 0, sizeof best_s);
  rc = prepare(&e, err);
  if (rc == MT_OK) rc = mt__prop_search(&e, best, &best_s, err);
  if (rc == MT_OK) fill_result(&e, best, &best_s, out);
  free(e.memo_block);
  free(e.dims);
  return rc;
}
