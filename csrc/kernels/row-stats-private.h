/* Maximum and sums along a row, in eight interleaved lanes so that the compiler
 * vectorizes them (a single accumulator would be a serial chain it may not
 * reorder). Included by softmax.c and layer_norm.c; T is the element type, ACC the
 * accumulator type, S the name suffix. */
#ifndef MPITENSOR_ROW_STATS_PRIVATE_H
#define MPITENSOR_ROW_STATS_PRIVATE_H

#include <stdint.h>

#define MT__LANES 8

/* The largest element of x[0..n), n >= 1; NaNs are passed over (the callers'
 * exponentials turn them into NaN results anyway). */
#define MT__ROW_MAX(T, S)                                                  \
  static inline T row_max_##S(const T *x, int64_t n) {                    \
    T acc[MT__LANES];                                                      \
    for (int j = 0; j < MT__LANES; ++j) acc[j] = x[0];                     \
    int64_t i = 0;                                                         \
    for (; i + MT__LANES <= n; i += MT__LANES) {                           \
      for (int j = 0; j < MT__LANES; ++j) {                                \
        acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];                    \
      }                                                                    \
    }                                                                      \
    T m = acc[0];                                                          \
    for (int j = 1; j < MT__LANES; ++j) m = acc[j] > m ? acc[j] : m;       \
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;                            \
    return m;                                                              \
  }

/* The sum of x[i] - shift, or with `sq` of its squares, accumulated in ACC. */
#define MT__ROW_SUM(T, ACC, S)                                             \
  static inline ACC row_sum_##S(const T *x, int64_t n, ACC shift, int sq) { \
    ACC acc[MT__LANES] = {0};                                              \
    int64_t i = 0;                                                         \
    for (; i + MT__LANES <= n; i += MT__LANES) {                           \
      for (int j = 0; j < MT__LANES; ++j) {                                \
        ACC d = (ACC)x[i + j] - shift;                                     \
        acc[j] += sq ? d * d : d;                                          \
      }                                                                    \
    }                                                                      \
    ACC s = 0;                                                             \
    for (int j = 0; j < MT__LANES; ++j) s += acc[j];                       \
    for (; i < n; ++i) {                                                   \
      ACC d = (ACC)x[i] - shift;                                           \
      s += sq ? d * d : d;                                                 \
    }                                                                      \
    return s;                                                              \
  }

#endif
