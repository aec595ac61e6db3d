/* The row geometry of C-order boxes that the slab path uses: a box cut to some
 * rows of dim 0, whole rows as a box, where a box's rows start in its C-contiguous
 * buffer, and placing a piece into a larger box. */
#include "io-private.h"
#include "mpitensor/core/pack.h"

mt_box mt__rows_of(const mt_box *b, int64_t start, int64_t end) {
  mt_box out = *b;
  int64_t lo = b->offset[0] > start ? b->offset[0] : start;
  int64_t hi = b->offset[0] + b->shape[0] < end ? b->offset[0] + b->shape[0] : end;
  out.offset[0] = lo;
  out.shape[0] = hi > lo ? hi - lo : 0;
  return out;
}

mt_box mt__whole_rows(const mt_io_array *a, int64_t start, int64_t end) {
  mt_box out = {.ndim = a->ndim};
  for (int d = 1; d < a->ndim; ++d) out.shape[d] = a->shape[d];
  out.offset[0] = start, out.shape[0] = end - start;
  return out;
}

int64_t mt__row_at(int64_t itemsize, const mt_box *whole, const mt_box *part) {
  int64_t row =
      whole->shape[0] > 0 ? mt_box_numel(whole) * itemsize / whole->shape[0] : 0;
  return (part->offset[0] - whole->offset[0]) * row;
}

void mt__unpack_box(int64_t itemsize, const mt_box *part, const char *piece, char *buf,
                    const mt_box *whole) {
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM];
  for (int d = 0; d < part->ndim; ++d) at[d] = part->offset[d] - whole->offset[d];
  mt_copy_box(piece, part->shape, zero, buf, whole->shape, at, part, itemsize);
}
