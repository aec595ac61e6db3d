/* Element types the core knows, as plain codes with their sizes. bfloat16 (the
 * upper half of a float32, ml_dtypes' type for NumPy) comes last, so that the
 * codes before it keep their values. */
#ifndef MPITENSOR_DTYPE_H
#define MPITENSOR_DTYPE_H

#include <stddef.h>

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_DTYPE_MAP(X)            \
  X(BOOL, 1, "bool")               \
  X(INT8, 1, "int8")               \
  X(INT16, 2, "int16")             \
  X(INT32, 4, "int32")             \
  X(INT64, 8, "int64")             \
  X(UINT8, 1, "uint8")             \
  X(UINT16, 2, "uint16")           \
  X(UINT32, 4, "uint32")           \
  X(UINT64, 8, "uint64")           \
  X(FLOAT16, 2, "float16")         \
  X(FLOAT32, 4, "float32")         \
  X(FLOAT64, 8, "float64")         \
  X(COMPLEX64, 8, "complex64")     \
  X(COMPLEX128, 16, "complex128") \
  X(BFLOAT16, 2, "bfloat16")

typedef enum mt_dtype {
#define MT__DTYPE_ENUM(name, size, text) MT_DTYPE_##name,
  MT_DTYPE_MAP(MT__DTYPE_ENUM)
#undef MT__DTYPE_ENUM
  MT_DTYPE_COUNT
} mt_dtype;

/* Local. Bytes per element, or 0 for a code outside the enum. */
size_t mt_dtype_size(int dtype);

/* Local. NumPy's name for the type ("float32"), or "unknown". */
MT_EXPORT const char *mt_dtype_name(int dtype);

/* Local. The code of NumPy's dtype of kind `kind` ('b', 'i', 'u', 'f', 'c') and
 * `size` bytes per element, or -2 for one the core does not know (bfloat16, of
 * NumPy kind 'V', is its caller's to recognise). */
int mt_dtype_of_kind(char kind, size_t size);

#ifdef __cplusplus
}
#endif
#endif
