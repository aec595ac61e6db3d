/* splitmix64 for the randomised tests: deterministic on every platform, so a
 * failure reproduces from its seed. */
#ifndef MPITENSOR_TEST_RNG_H
#define MPITENSOR_TEST_RNG_H

#include <stdint.h>

static inline uint64_t next_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

/* A draw in [0, n). */
static inline int64_t below(uint64_t *state, int64_t n) {
  return (int64_t)(next_u64(state) % (uint64_t)n);
}

#endif
