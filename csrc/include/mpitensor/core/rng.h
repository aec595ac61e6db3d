/* Counter-based random numbers: Philox4x32-10 keyed by the seed, counted by each
 * element's global index, so a value depends only on (seed, stream, index) and
 * never on the mesh, the placements or the number of ranks. All calls are Local. */
#ifndef MPITENSOR_RNG_H
#define MPITENSOR_RNG_H

#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_rng_dist {
  MT_RNG_UNIFORM = 0, /* [0, 1) */
  MT_RNG_NORMAL = 1   /* mean 0, standard deviation 1 */
} mt_rng_dist;

/* Local. One Philox4x32 block of 10 rounds (Salmon et al., SC'11), bit-exact with
 * the Random123 reference. */
void mt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* Local. Fills the C-contiguous buffer `out` with the values of the elements of
 * `box` of a tensor of shape `global_shape` (box->ndim dims) drawn from `dist`.
 * `dtype` is MT_DTYPE_FLOAT32 or MT_DTYPE_FLOAT64. `stream` separates successive
 * draws under one seed (the caller advances it once per tensor). */
MT_EXPORT int mt_rng_fill_box(void *out, int dtype, int dist, uint64_t seed,
                              uint64_t stream, const int64_t *global_shape,
                              const mt_box *box, mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
