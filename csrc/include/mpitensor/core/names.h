/* The names of the core's codes that Python uses: the constants of its enums and
 * size limits, read once through ctypes (mpitensor._clib.CORE) so that Python
 * never copies a value, and torch's names of the reduce ops. All calls are
 * Local. */
#ifndef MPITENSOR_NAMES_H
#define MPITENSOR_NAMES_H

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Local. The name of constant `i` ("LABEL_KEEP", "REDUCE_SUM", "MAX_NDIM", ...:
 * its C name without MT_) with its value in *value, or NULL, *value untouched,
 * for an `i` outside [0, count). Example: enumerate i = 0, 1, ... until NULL. */
MT_EXPORT const char *mt_enum_at(int i, int *value);

/* Local. torch's name of a reduce op ("sum", "avg", "product", "max", "min"), or
 * NULL for a code outside mt_reduce_op. */
MT_EXPORT const char *mt_reduce_op_name(int op);

#ifdef __cplusplus
}
#endif
#endif
