/* The index of ptr_index.h: linear probing over a power-of-two table of
 * (address, value) cells, keyed by a multiplicative hash of the address. */
#include "mpitensor/core/ptr_index.h"

#include <stdint.h>
#include <stdlib.h>

typedef struct cell {
  const void *key; /* NULL: empty */
  int value;
} cell;

struct mt_ptr_index {
  cell *cells;
  size_t mask; /* cells - 1 */
  size_t count;
};

enum { FIRST_CELLS = 128 };

/* The first cell to probe for `key`: objects are 16-byte aligned, so the low bits
 * carry nothing. */
static size_t home(const mt_ptr_index *ix, const void *key) {
  return (size_t)(((uint64_t)(uintptr_t)key >> 4) * 0x9E3779B97F4A7C15u >> 32) & ix->mask;
}

/* The cell that holds `key`, or the empty one where it would go. */
static cell *slot(const mt_ptr_index *ix, const void *key) {
  size_t i = home(ix, key);
  while (ix->cells[i].key != NULL && ix->cells[i].key != key) i = (i + 1) & ix->mask;
  return &ix->cells[i];
}

int mt_ptr_index_create(mt_ptr_index **out, mt_error *err) {
  mt_ptr_index *ix = malloc(sizeof *ix);
  cell *cells = calloc(FIRST_CELLS, sizeof *cells);
  if (ix == NULL || cells == NULL) {
    free(ix);
    free(cells);
    return mt_error_set(err, MT_ENOMEM, "no memory for an address index");
  }
  ix->cells = cells, ix->mask = FIRST_CELLS - 1, ix->count = 0;
  *out = ix;
  return MT_OK;
}

void mt_ptr_index_destroy(mt_ptr_index *ix) {
  if (ix == NULL) return;
  free(ix->cells);
  free(ix);
}

int mt_ptr_index_find(const mt_ptr_index *ix, const void *key) {
  const cell *c = slot(ix, key);
  return c->key != NULL ? c->value : -1;
}

/* Twice the cells, every key moved to its place in them. */
static int grow(mt_ptr_index *ix, mt_error *err) {
  size_t n = 2 * (ix->mask + 1);
  cell *old = ix->cells, *cells = calloc(n, sizeof *cells);
  if (cells == NULL) return mt_error_set(err, MT_ENOMEM, "no memory for an address index");
  size_t old_mask = ix->mask;
  ix->cells = cells, ix->mask = n - 1;
  for (size_t i = 0; i <= old_mask; ++i)
    if (old[i].key != NULL) *slot(ix, old[i].key) = old[i];
  free(old);
  return MT_OK;
}

int mt_ptr_index_add(mt_ptr_index *ix, const void *key, int value, mt_error *err) {
  if (key == NULL || value < 0)
    return mt_error_set(err, MT_EINVAL, "an address index takes an address and a value >= 0");
  if (slot(ix, key)->key != NULL)
    return mt_error_set(err, MT_EINVAL, "the address is in the index already");
  if (2 * (ix->count + 1) > ix->mask + 1) {
    int rc = grow(ix, err);
    if (rc != MT_OK) return rc;
  }
  *slot(ix, key) = (cell){key, value};
  ix->count++;
  return MT_OK;
}

void mt_ptr_index_clear(mt_ptr_index *ix) {
  for (size_t i = 0; i <= ix->mask; ++i) ix->cells[i] = (cell){NULL, 0};
  ix->count = 0;
}
