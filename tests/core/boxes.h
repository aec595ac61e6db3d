/* Box literals for the C tests. */
#ifndef MPITENSOR_TEST_BOXES_H
#define MPITENSOR_TEST_BOXES_H

#include <string.h>

#include "mpitensor/core/layout.h"

/* The 2-D box [o0, o0 + s0) x [o1, o1 + s1). */
static inline mt_box box2(int64_t o0, int64_t s0, int64_t o1, int64_t s1) {
  mt_box b;
  memset(&b, 0, sizeof b);
  b.ndim = 2;
  b.offset[0] = o0, b.shape[0] = s0, b.offset[1] = o1, b.shape[1] = s1;
  return b;
}

#endif
