/* The engine's inputs: each one's layout checked against the dim map, every
 * label's size agreed between the inputs that hold it, the output's shape, and
 * which labels a candidate may shard. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"
#include "prop-private.h"

/* Validates input i into e->cur[i]; the message names the input. */
static int load_input(mt__engine *e, int i, mt_error *err) {
  const mt_prop_inputs *in = e->in;
  if (in->ndim[i] != e->map->in_ndim[i])
    return mt__fail(err, MT_EINVAL, "Input %d has %d dims but the dim map labels %d", i,
                    in->ndim[i], e->map->in_ndim[i]);
  if (in->itemsize[i] < 1)
    return mt__fail(err, MT_EINVAL,
                    "Input %d has item size %" PRId64 "; it must be >= 1", i,
                    in->itemsize[i]);
  int rc = mt_layout_init(&e->cur[i], in->ndim[i], in->shape[i], in->mesh_ndim,
                          in->mesh_shape, in->placements[i], err);
  if (rc == MT_OK || err == NULL) return rc;
  char msg[MT_ERROR_LEN];
  memcpy(msg, err->msg, sizeof msg);
  msg[MT_ERROR_LEN - 1] = '\0';
  return mt__fail(err, rc, "Input %d: %s", i, msg);
}

/* Input i's alias, if any, is an earlier input of the same layout and item size. */
static int check_alias(const mt__engine *e, int i, mt_error *err) {
  int j = e->in->alias[i] - 1;
  if (j < 0) return MT_OK;
  const mt_layout *a = &e->cur[i], *b = &e->cur[j];
  int same = j < i && a->ndim == b->ndim && e->in->itemsize[i] == e->in->itemsize[j] &&
             memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape) == 0;
  for (int m = 0; same && m < a->mesh_ndim; ++m)
    same = placement_eq(&a->placements[m], &b->placements[m]);
  if (!same)
    return mt__fail(err, MT_EINVAL, "Input %d is given as the same tensor as input %d, "
                    "but their layouts differ", i, j);
  return MT_OK;
}

static int load_inputs(mt__engine *e, mt_error *err) {
  const mt_prop_inputs *in = e->in;
  if (in->ninputs != e->map->ninputs)
    return mt__fail(err, MT_EINVAL, "%d inputs were given to an op of %d inputs",
                    in->ninputs, e->map->ninputs);
  if (in->out_itemsize < 0)
    return mt__fail(err, MT_EINVAL, "The output item size is %" PRId64,
                    in->out_itemsize);
  e->ninputs = in->ninputs;
  e->out_itemsize = in->out_itemsize;
  for (int i = 0; i < e->ninputs; ++i) {
    int rc = load_input(e, i, err);
    if (rc == MT_OK) rc = check_alias(e, i, err);
    if (rc != MT_OK) return rc;
    if (in->itemsize[i] > e->out_itemsize && in->out_itemsize == 0)
      e->out_itemsize = in->itemsize[i];
  }
  e->mesh_ndim = in->mesh_ndim;
  e->mesh_numel = 1;
  for (int m = 0; m < e->mesh_ndim; ++m) {
    e->mesh_numel *= in->mesh_shape[m];
    if (e->mesh_numel > MT__MAX_MESH_NUMEL)
      return mt__fail(err, MT_EINVAL, "The mesh has more than %" PRId64 " ranks",
                      MT__MAX_MESH_NUMEL);
  }
  return MT_OK;
}

/* Records input i dim d as holding label l (of size `n`), or fails when an
 * earlier holder disagrees. `from` remembers the first holder for the message. */
static int hold_label(mt__engine *e, int i, int d, int (*from)[2], mt_error *err) {
  int l = e->map->in_labels[i][d];
  int64_t n = e->in->shape[i][d];
  if (bit(e->map->in_bcast[i], d)) {
    if (n == 1) return MT_OK;
    return mt__fail(err, MT_EINVAL,
                    "Input %d dim %d broadcasts, so its size must be 1, not %" PRId64,
                    i, d, n);
  }
  e->dim_of[i][l] = e->dim_of[i][l] == -1 ? d : -2; /* -2: repeated */
  if (e->size[l] < 0) {
    e->size[l] = n;
    from[l][0] = i, from[l][1] = d;
  } else if (e->size[l] != n) {
    if (from[l][0] < 0)
      return mt__fail(err, MT_EINVAL,
                      "Input %d dim %d has size %" PRId64
                      " but label %d is sized %" PRId64,
                      i, d, n, l, e->size[l]);
    return mt__fail(err, MT_EINVAL,
                    "Input %d dim %d has size %" PRId64
                    " but input %d dim %d, the same "
                    "label %d, has size %" PRId64,
                    i, d, n, from[l][0], from[l][1], l, e->size[l]);
  }
  return MT_OK;
}

/* Sizes every label, and the output shape from them. */
static int label_sizes(mt__engine *e, mt_error *err) {
  const mt_dimmap *map = e->map;
  int from[MT_PROP_MAX_LABELS][2];
  for (int l = 0; l < MT_PROP_MAX_LABELS; ++l) {
    int sized = l < map->nlabels && bit(map->sized_labels, l);
    e->size[l] = sized ? map->label_size[l] : -1;
    from[l][0] = from[l][1] = -1;
    for (int i = 0; i < MT_PROP_MAX_INPUTS; ++i) e->dim_of[i][l] = -1;
  }
  for (int i = 0; i < e->ninputs; ++i) {
    for (int d = 0; d < map->in_ndim[i]; ++d) {
      int rc = hold_label(e, i, d, from, err);
      if (rc != MT_OK) return rc;
    }
  }
  e->out_numel = 1;
  for (int l = 0; l < map->nlabels; ++l) e->size[l] = e->size[l] < 0 ? 1 : e->size[l];
  for (int d = 0; d < map->out_ndim; ++d) {
    e->out_shape[d] =
        bit(map->out_resized, d) ? map->out_size[d] : e->size[map->out_labels[d]];
    e->out_numel = sat_mul(e->out_numel, e->out_shape[d]);
  }
  if (e->out_numel == INT64_MAX)
    return mt__fail(err, MT_EOVERFLOW, "The output would have too many elements");
  return MT_OK;
}

/* Which labels a candidate may shard, and where each output label lies. */
static void label_roles(mt__engine *e) {
  const mt_dimmap *map = e->map;
  for (int l = 0; l < MT_PROP_MAX_LABELS; ++l) e->out_pos[l] = -1;
  for (int d = 0; d < map->out_ndim; ++d) e->out_pos[map->out_labels[d]] = d;
  for (int l = 0; l < map->nlabels; ++l) {
    int held = 0, repeated = 0;
    for (int i = 0; i < e->ninputs; ++i) {
      held |= e->dim_of[i][l] >= 0;
      repeated |= e->dim_of[i][l] == -2;
    }
    e->shardable[l] = held && !repeated && map->label_kind[l] != MT_LABEL_REPLICATE;
  }
  /* A repeated label is never sharded, so no input is cut on it. */
  for (int i = 0; i < e->ninputs; ++i) {
    for (int l = 0; l < map->nlabels; ++l) {
      if (e->dim_of[i][l] == -2) e->dim_of[i][l] = -1;
    }
  }
}

int mt__prop_load(mt__engine *e, mt_error *err) {
  int rc = load_inputs(e, err);
  if (rc == MT_OK) rc = label_sizes(e, err);
  if (rc == MT_OK) label_roles(e);
  return rc;
}
