/* The words of sharding propagation (prop.h): what makes a dim map valid
 * (mt_dimmap_check: counts, masks, label kinds, and the labels of the inputs and
 * of the output). The engine that reads dim maps is propagate.c's. */
#include "mpitensor/core/prop.h"

#include <inttypes.h>
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/status.h"

static int check_counts(const mt_dimmap *map, mt_error *err) {
  if (map->ninputs < 1 || map->ninputs > MT_PROP_MAX_INPUTS)
    return mt__fail(err, MT_EINVAL, "A dim map has 1 to %d inputs, got %d",
                    MT_PROP_MAX_INPUTS, map->ninputs);
  if (map->nlabels < 0 || map->nlabels > MT_PROP_MAX_LABELS)
    return mt__fail(err, MT_EINVAL, "A dim map has 0 to %d labels, got %d",
                    MT_PROP_MAX_LABELS, map->nlabels);
  if (map->out_ndim < 0 || map->out_ndim > MT_MAX_NDIM)
    return mt__fail(err, MT_EINVAL, "The output may have 0 to %d dims, got %d",
                    MT_MAX_NDIM, map->out_ndim);
  for (int i = 0; i < map->ninputs; ++i) {
    if (map->in_ndim[i] < 0 || map->in_ndim[i] > MT_MAX_NDIM)
      return mt__fail(err, MT_EINVAL, "Input %d may have 0 to %d dims, got %d", i,
                      MT_MAX_NDIM, map->in_ndim[i]);
    if (map->in_bcast[i] & ~low_bits(map->in_ndim[i]))
      return mt__fail(err, MT_EINVAL,
                      "in_bcast[%d] marks dims beyond the input's %d dims", i,
                      map->in_ndim[i]);
    if (map->reduce_first[i] & ~low_bits(MT_REDUCE_COUNT))
      return mt__fail(err, MT_EINVAL, "reduce_first[%d] names unknown reduce ops", i);
  }
  return MT_OK;
}

static int check_masks(const mt_dimmap *map, mt_error *err) {
  if (map->partial_rule < MT_PARTIAL_NONE || map->partial_rule > MT_PARTIAL_MONOTONE)
    return mt__fail(err, MT_EINVAL, "Unknown partial rule %d", map->partial_rule);
  if (map->partial_inputs & ~low_bits(map->ninputs))
    return mt__fail(err, MT_EINVAL, "partial_inputs names inputs beyond the %d inputs",
                    map->ninputs);
  if (map->partial_ops & ~low_bits(MT_REDUCE_COUNT))
    return mt__fail(err, MT_EINVAL, "partial_ops names unknown reduce ops");
  if ((map->even_only | map->sized_labels | map->empty_identity) & ~low_bits(map->nlabels))
    return mt__fail(err, MT_EINVAL,
                    "even_only, sized_labels or empty_identity names labels beyond the %d "
                    "labels", map->nlabels);
  for (int l = 0; l < map->nlabels; ++l) {
    if (bit(map->sized_labels, l) && map->label_size[l] < 0)
      return mt__fail(err, MT_EINVAL, "label_size[%d] is %" PRId64 "; it must be >= 0",
                      l, map->label_size[l]);
  }
  if (map->out_resized & ~low_bits(map->out_ndim))
    return mt__fail(err, MT_EINVAL, "out_resized names dims beyond the output's %d dims",
                    map->out_ndim);
  for (int d = 0; d < map->out_ndim; ++d) {
    if (bit(map->out_resized, d) && map->out_size[d] < 0)
      return mt__fail(err, MT_EINVAL, "out_size[%d] is %" PRId64 "; it must be >= 0", d,
                      map->out_size[d]);
  }
  return MT_OK;
}

static int check_kinds(const mt_dimmap *map, mt_error *err) {
  for (int l = 0; l < map->nlabels; ++l) {
    int kind = map->label_kind[l], op = map->label_reduce_op[l];
    if (kind < MT_LABEL_KEEP || kind > MT_LABEL_REPLICATE)
      return mt__fail(err, MT_EINVAL,
                      "Label %d has kind %d, not KEEP, CONTRACT, REDUCE or REPLICATE",
                      l, kind);
    if (kind == MT_LABEL_REDUCE && (op < 0 || op >= MT_REDUCE_COUNT))
      return mt__fail(err, MT_EINVAL, "Label %d reduces with unknown op %d", l, op);
  }
  return MT_OK;
}

static int check_input_labels(const mt_dimmap *map, uint32_t *held, mt_error *err) {
  *held = 0;
  for (int i = 0; i < map->ninputs; ++i) {
    for (int d = 0; d < map->in_ndim[i]; ++d) {
      int l = map->in_labels[i][d];
      if (l < 0 || l >= map->nlabels)
        return mt__fail(err, MT_EINVAL, "Input %d dim %d has label %d, outside [0, %d)",
                        i, d, l, map->nlabels);
      *held |= 1u << l;
    }
  }
  return MT_OK;
}

static int check_output_labels(const mt_dimmap *map, uint32_t held, uint32_t *out,
                               mt_error *err) {
  *out = 0;
  for (int d = 0; d < map->out_ndim; ++d) {
    int l = map->out_labels[d];
    if (l < 0 || l >= map->nlabels)
      return mt__fail(err, MT_EINVAL, "Output dim %d has label %d, outside [0, %d)", d,
                      l, map->nlabels);
    int kind = map->label_kind[l];
    if (kind != MT_LABEL_KEEP && kind != MT_LABEL_REPLICATE)
      return mt__fail(err, MT_EINVAL,
                      "Output dim %d has label %d, which the op %s away; output "
                      "labels are KEEP or REPLICATE",
                      d, l, kind == MT_LABEL_CONTRACT ? "contracts" : "reduces");
    if (bit(*out, l))
      return mt__fail(err, MT_EINVAL, "Label %d labels two output dims", l);
    if (!bit(held, l) && !bit(map->sized_labels, l))
      return mt__fail(err, MT_EINVAL,
                      "Output label %d has no size: no input holds it and it is not "
                      "in sized_labels",
                      l);
    if (bit(map->out_resized, d) && (!bit(held, l) || bit(map->sized_labels, l)))
      return mt__fail(err, MT_EINVAL,
                      "Output dim %d is resized, so its label %d must be held by an "
                      "input and not be in sized_labels",
                      d, l);
    *out |= 1u << l;
  }
  return MT_OK;
}

int mt_dimmap_check(const mt_dimmap *map, mt_error *err) {
  if (map == NULL) return mt__fail(err, MT_EINVAL, "The dim map is required");
  uint32_t held = 0, out = 0;
  int rc = check_counts(map, err);
  if (rc == MT_OK) rc = check_masks(map, err);
  if (rc == MT_OK) rc = check_kinds(map, err);
  if (rc == MT_OK) rc = check_input_labels(map, &held, err);
  if (rc == MT_OK) rc = check_output_labels(map, held, &out, err);
  for (int l = 0; rc == MT_OK && l < map->nlabels; ++l) {
    if (map->label_kind[l] == MT_LABEL_KEEP && !bit(out, l))
      rc = mt__fail(err, MT_EINVAL,
                    "Label %d is KEEP but labels no output dim (a dim the op removes "
                    "is CONTRACT, REDUCE or REPLICATE)",
                    l);
  }
  return rc;
}
