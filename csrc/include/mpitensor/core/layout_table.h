/* Layout ids: one number per distinct layout of tensors on one mesh, so that an
 * operation's decision can be looked up by the identity of its inputs' layouts.
 *
 * A layout here is what a DTensor's spec says besides its mesh: placements,
 * global shape and strides, and the element type. The table is bounded (CLOCK
 * eviction); ids are never reused, so a tensor still holding the id of an evicted
 * layout keeps a valid id: its layout merely gets a new one when interned again.
 * All calls are Local; a table is not thread-safe (its owner serialises calls). */
#ifndef MPITENSOR_LAYOUT_TABLE_H
#define MPITENSOR_LAYOUT_TABLE_H

#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The layout of a tensor on a mesh whose shape the table's owner knows. `dtype`
 * is the owner's exact code of the element type (only compared); `itemsize` its
 * size in bytes. Entries past ndim and mesh_ndim are ignored. */
typedef struct mt_layout_key {
  int mesh_ndim;
  int ndim;
  int dtype;
  int64_t itemsize;
  mt_placement placements[MT_MAX_MESH_NDIM];
  int64_t shape[MT_MAX_NDIM];
  int64_t stride[MT_MAX_NDIM];
} mt_layout_key;

typedef struct mt_layout_table mt_layout_table;

/* Local. torch's strides of a contiguous tensor of `shape`, in elements (a dim of
 * size 0 counts as 1, so every stride is at least 1). */
MT_EXPORT void mt_layout_contiguous_strides(int ndim, const int64_t *shape,
                                            int64_t *stride);

/* Local. A table of at most `capacity` (>= 1) layouts. */
int mt_layout_table_create(int64_t capacity, mt_layout_table **out, mt_error *err);

/* Local. Frees the table; accepts NULL. */
void mt_layout_table_destroy(mt_layout_table *table);

/* Local. The id of `key` (> 0) and the slot that holds it: the layout's id while
 * it stays in the table, else a new one (evicting a layout when full). A slot
 * holds one layout at a time; mt_layout_table_get finds it again by (id, slot).
 * MT_EINVAL for counts out of range, MT_ENOMEM. */
int mt_layout_table_intern(mt_layout_table *table, const mt_layout_key *key,
                           int64_t *id, int64_t *slot, mt_error *err);

/* Local. The layout of `id` if `slot` still holds it, else NULL (evicted). Valid
 * until the next intern. */
const mt_layout_key *mt_layout_table_get(const mt_layout_table *table, int64_t id,
                                         int64_t slot);

/* Local. Empties the table and sets its capacity (>= 1); ids go on increasing. */
int mt_layout_table_set_capacity(mt_layout_table *table, int64_t capacity, mt_error *err);

/* Local. Layouts held, and the capacity. */
MT_EXPORT int64_t mt_layout_table_count(const mt_layout_table *table);
MT_EXPORT int64_t mt_layout_table_capacity(const mt_layout_table *table);

#ifdef __cplusplus
}
#endif
#endif
