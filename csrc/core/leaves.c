/* The leaves of a tensor dim: the extents its nested chunking over the mesh dims
 * that shard it gives the ranks. They partition [0, n) and take few distinct
 * lengths (ceil-chunking a length L gives full chunks, at most one remainder and
 * empty ones), which is what lets the planner price a step without visiting
 * every rank. */
#include <assert.h>
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/layout.h"
#include "plan-private.h"

static void hist_add(mt__hist *h, int64_t len, int64_t count) {
  if (count == 0) return;
  for (int i = 0; i < h->n; ++i) {
    if (h->len[i] == len) {
      h->count[i] += count;
      return;
    }
  }
  assert(h->n < MT__HIST_MAX);
  h->len[h->n] = len;
  h->count[h->n++] = count;
}

/* The leaf lengths of tensor dim `d` under `l`, as mt_chunk cuts them: of a
 * length L over G ranks, L / ceil(L / G) full chunks, one remainder if any, and
 * empty chunks for the rest. Leaf counts are products of mesh sizes: they fit. */
void mt__leaf_hist(const mt_layout *l, int d, mt__hist *out) {
  out->n = 1;
  out->len[0] = l->shape[d];
  out->count[0] = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (!is_shard(&l->placements[m], d)) continue;
    int64_t g = l->mesh_shape[m];
    mt__hist next = {0, {0}, {0}};
    for (int i = 0; i < out->n; ++i) {
      int64_t len = out->len[i], k = out->count[i];
      int64_t chunk = len / g + (len % g != 0);
      if (chunk == 0) {
        hist_add(&next, 0, k * g);
        continue;
      }
      int64_t full = len / chunk, rem = len - full * chunk;
      hist_add(&next, chunk, k * full);
      hist_add(&next, rem, rem > 0 ? k : 0);
      hist_add(&next, 0, k * (g - full - (rem > 0)));
    }
    *out = next;
  }
}

int64_t mt__hist_max(const mt__hist *h) {
  int64_t top = 0;
  for (int i = 0; i < h->n; ++i) top = h->len[i] > top ? h->len[i] : top;
  return top;
}

/* Leaves of tensor dim `d` under `l` into off/len, refined one sharding mesh dim
 * at a time in place (a parent's children land at or after it); their count. */
int64_t mt__fill_leaves(const mt_layout *l, int d, int64_t *off, int64_t *len) {
  int64_t n = 1;
  off[0] = 0;
  len[0] = l->shape[d];
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (!is_shard(&l->placements[m], d)) continue;
    int64_t g = l->mesh_shape[m];
    for (int64_t j = n - 1; j >= 0; --j) {
      int64_t o = off[j], size = len[j], chunk = size / g + (size % g != 0);
      for (int64_t i = g - 1; i >= 0; --i) {
        int64_t start = i * chunk, c = start >= size ? 0 : size - start;
        off[j * g + i] = o + start;
        len[j * g + i] = c < chunk ? c : chunk;
      }
    }
    n *= g;
  }
  return n;
}

int64_t mt__leaf_total(const mt_layout *l, int d) {
  int64_t n = 1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (is_shard(&l->placements[m], d)) n *= l->mesh_shape[m];
  }
  return n;
}
