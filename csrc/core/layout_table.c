/* Layout ids (layout_table.h) on the core's bounded cache: a layout's words are
 * the key, its id and a copy of the layout the value. */
#include "mpitensor/core/layout_table.h"

#include <stdlib.h>
#include <string.h>

#include "cache-private.h"
#include "core-private.h"

/* mesh_ndim, ndim, dtype, itemsize, then one word per placement, shape, stride. */
enum { HEAD_WORDS = 4, KEY_WORDS = HEAD_WORDS + MT_MAX_MESH_NDIM + 2 * MT_MAX_NDIM };

typedef struct entry {
  int64_t id;
  mt_layout_key layout;
} entry;

struct mt_layout_table {
  mt__cache *cache;
  int64_t next_id;
};

/* The key words of a layout, unused entries zero, so equal layouts have equal words. */
static void pack(const mt_layout_key *k, int64_t *w) {
  memset(w, 0, KEY_WORDS * sizeof *w);
  w[0] = k->mesh_ndim, w[1] = k->ndim, w[2] = k->dtype, w[3] = k->itemsize;
  for (int m = 0; m < k->mesh_ndim; ++m) {
    const mt_placement *p = &k->placements[m];
    /* Distinct for every layout the core accepts: kind below 2^8, dim below 2^16,
     * reduce_op below 2^8, split_factor a positive int. */
    w[HEAD_WORDS + m] = (int64_t)((uint64_t)(uint8_t)p->kind | (uint64_t)(uint16_t)p->dim << 8 |
                                  (uint64_t)(uint8_t)p->reduce_op << 24 |
                                  (uint64_t)(uint32_t)p->split_factor << 32);
  }
  for (int d = 0; d < k->ndim; ++d) {
    w[HEAD_WORDS + MT_MAX_MESH_NDIM + d] = k->shape[d];
    w[HEAD_WORDS + MT_MAX_MESH_NDIM + MT_MAX_NDIM + d] = k->stride[d];
  }
}

void mt_layout_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t step = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    stride[d] = step;
    step *= shape[d] > 1 ? shape[d] : 1;
  }
}

int mt_layout_table_create(int64_t capacity, mt_layout_table **out, mt_error *err) {
  mt_layout_table *t = calloc(1, sizeof *t);
  if (t == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory creating a layout table");
  int rc = mt__cache_create(KEY_WORDS, sizeof(entry), capacity, NULL, NULL, &t->cache, err);
  if (rc != MT_OK) {
    free(t);
    return rc;
  }
  t->next_id = 1;
  *out = t;
  return MT_OK;
}

void mt_layout_table_destroy(mt_layout_table *table) {
  if (table == NULL) return;
  mt__cache_destroy(table->cache);
  free(table);
}

int mt_layout_table_intern(mt_layout_table *table, const mt_layout_key *key,
                           int64_t *id, int64_t *slot, mt_error *err) {
  if (key->ndim < 0 || key->ndim > MT_MAX_NDIM || key->mesh_ndim < 1 ||
      key->mesh_ndim > MT_MAX_MESH_NDIM)
    return mt__fail(err, MT_EINVAL, "A layout of 0 to %d dims on a 1- to %d-d mesh was "
                    "expected", MT_MAX_NDIM, MT_MAX_MESH_NDIM);
  int64_t words[KEY_WORDS], s;
  pack(key, words);
  entry *e = mt__cache_find(table->cache, words, &s);
  if (e == NULL) {
    e = mt__cache_add(table->cache, words, &s, err);
    if (e == NULL) return MT_ENOMEM;
    e->id = table->next_id++;
    e->layout = *key;
  }
  *id = e->id, *slot = s;
  return MT_OK;
}

const mt_layout_key *mt_layout_table_get(const mt_layout_table *table, int64_t id,
                                         int64_t slot) {
  const entry *e = mt__cache_at(table->cache, slot);
  return e != NULL && e->id == id ? &e->layout : NULL;
}

int mt_layout_table_set_capacity(mt_layout_table *table, int64_t capacity,
                                 mt_error *err) {
  return mt__cache_set_capacity(table->cache, capacity, err);
}

int64_t mt_layout_table_count(const mt_layout_table *table) {
  return mt__cache_count(table->cache);
}

int64_t mt_layout_table_capacity(const mt_layout_table *table) {
  return mt__cache_capacity(table->cache);
}
