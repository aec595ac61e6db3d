/* Layout math: where each rank's shard of a global tensor lies.
 *
 * Every function here is Local (no MPI): it answers for any rank of any mesh, so the
 * same code serves the executor and simulations of meshes far larger than the job. */
#ifndef MPITENSOR_LAYOUT_H
#define MPITENSOR_LAYOUT_H

#include <stdint.h>

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_MAX_NDIM 16
#define MT_MAX_MESH_NDIM 8

typedef enum mt_placement_kind {
  MT_PLACEMENT_REPLICATE = 0,
  MT_PLACEMENT_SHARD = 1,
  MT_PLACEMENT_PARTIAL = 2,
  /* torch's _StridedShard: read only by the functions of strided.h; every other
   * function takes plain layouts, and mt_layout_init refuses it. */
  MT_PLACEMENT_STRIDED = 3
} mt_placement_kind;

typedef enum mt_reduce_op {
  MT_REDUCE_SUM = 0,
  MT_REDUCE_AVG = 1,
  MT_REDUCE_PRODUCT = 2,
  MT_REDUCE_MAX = 3,
  MT_REDUCE_MIN = 4,
  MT_REDUCE_COUNT
} mt_reduce_op;

/* How a tensor lies along one mesh dim. `dim` is the tensor dim for SHARD and
 * STRIDED, `reduce_op` the pending reduction for PARTIAL, `split_factor` the
 * number of pieces a STRIDED dim is cut into before each piece is sharded; the
 * other fields are ignored (and zero, so equal placements are equal bytes). */
typedef struct mt_placement {
  int kind;
  int dim;
  int reduce_op;
  int split_factor;
} mt_placement;

/* An axis-aligned block of a tensor: element offsets and extents per dim. */
typedef struct mt_box {
  int ndim;
  int64_t offset[MT_MAX_NDIM];
  int64_t shape[MT_MAX_NDIM];
} mt_box;

/* A global tensor shape laid out over a mesh, one placement per mesh dim. */
typedef struct mt_layout {
  int ndim;
  int64_t shape[MT_MAX_NDIM];
  int mesh_ndim;
  int64_t mesh_shape[MT_MAX_MESH_NDIM];
  mt_placement placements[MT_MAX_MESH_NDIM];
} mt_layout;

/* Local. The torch.chunk rule: `n` items cut into `k` chunks of ceil(n/k), the
 * trailing ones short or empty. Chunk `i` starts at `*offset` and holds `*size`
 * items; an empty chunk starts at `n`. Requires n >= 0, k >= 1, 0 <= i < k. */
MT_EXPORT void mt_chunk(int64_t n, int64_t k, int64_t i, int64_t *size,
                        int64_t *offset);

/* Local. Validates and fills `out`: 0 <= ndim <= MT_MAX_NDIM, sizes >= 0,
 * 1 <= mesh_ndim <= MT_MAX_MESH_NDIM, mesh sizes >= 1, shard dims in [0, ndim),
 * reduce ops known. `out` is untouched on error. */
MT_EXPORT int mt_layout_init(mt_layout *out, int ndim, const int64_t *shape,
                             int mesh_ndim, const int64_t *mesh_shape,
                             const mt_placement *placements, mt_error *err);

/* Local. The box of the rank at mesh coordinate `coord` (mesh_ndim entries).
 * Shards nest left to right over mesh dims: a tensor dim sharded on mesh dims 0
 * and 1 is chunked over dim 0 first, then each chunk over dim 1. An empty extent
 * reports the global size of that dim as its offset. */
MT_EXPORT int mt_layout_local_box(const mt_layout *layout, const int64_t *coord,
                                  mt_box *out, mt_error *err);

/* Local. The global shape that local shards of shape `local_shape` make when the
 * tensor is evenly sharded (each Shard multiplies its dim by the mesh dim size),
 * the rule torch uses for DTensor.from_local without `shape`. */
MT_EXPORT int mt_layout_even_global_shape(int ndim, const int64_t *local_shape,
                                          int mesh_ndim, const int64_t *mesh_shape,
                                          const mt_placement *placements,
                                          int64_t *global_shape, mt_error *err);

/* A basic-indexing selection (NumPy's ints and slices) of every dim of a tensor:
 * index k of output dim d is input index start[d] + k * step[d], for
 * 0 <= k < count[d]. step != 0; a negative step walks backwards. An integer index
 * is a dim of count 1 here (the caller drops it afterwards). */
typedef struct mt_selection {
  int ndim;
  int64_t start[MT_MAX_NDIM];
  int64_t step[MT_MAX_NDIM];
  int64_t count[MT_MAX_NDIM];
} mt_selection;

/* Local. Checks `sel` against a tensor of `ndim` dims of sizes `shape`: the same
 * ndim, step != 0, count >= 0 and, where count > 0, its first and last indices in
 * range. MT_EINVAL or MT_EINDEX with a sentence otherwise. */
MT_EXPORT int mt_selection_check(const mt_selection *sel, int ndim,
                                 const int64_t *shape, mt_error *err);

/* Local. The elements of input box `in` that a checked `sel` picks, as a box of the
 * selection's output (contiguous there, since indices are monotone in k), in
 * output order. Returns 1 when it holds an element; else 0 and `out` is an empty
 * box (extent 0 where nothing is picked). */
MT_EXPORT int mt_selection_image(const mt_selection *sel, const mt_box *in,
                                 mt_box *out);

/* Local. Number of elements in a box (1 for a 0-d box). */
int64_t mt_box_numel(const mt_box *box);

/* Local. Whether an array of `ndim` dims of sizes `shape` is exactly `box`'s
 * shape, as a rank's local array must be before MPI reads or writes it: anything
 * else would move bytes outside it. MT_EINVAL with the sentence the user sees
 * otherwise (the executor's and the bindings' one check). */
MT_EXPORT int mt_box_check_local(const mt_box *box, int ndim, const int64_t *shape,
                                 mt_error *err);

/* Local. The intersection of two boxes of equal ndim; returns 1 when it holds at
 * least one element (and fills `out`), 0 otherwise (and leaves `out` untouched). */
int mt_box_intersect(const mt_box *a, const mt_box *b, mt_box *out);

#ifdef __cplusplus
}
#endif
#endif
