#include <string.h>

#include "check.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/names.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/status.h"

/* The value of the constant `name` in mt_enum_at's table; -1 when it is not there. */
static int constant(const char *name) {
  int value = -1, v = 0;
  const char *at;
  for (int i = 0; (at = mt_enum_at(i, &v)) != NULL; ++i)
    if (strcmp(at, name) == 0) value = v;
  return value;
}

int main(void) {
  CHECK(strcmp(mt_strerror(MT_OK), "success") == 0);
  CHECK(strcmp(mt_strerror(MT_EINVAL), "invalid argument") == 0);
  CHECK(strcmp(mt_status_name(MT_EMPI), "MT_EMPI") == 0);
  CHECK(strcmp(mt_status_name(12345), "MT_UNKNOWN") == 0);
  CHECK(strcmp(mt_strerror(-999), "unknown error") == 0);
  CHECK(mt_dtype_size(MT_DTYPE_COMPLEX128) == 16);
  CHECK(mt_dtype_size(MT_DTYPE_FLOAT16) == 2);
  CHECK(mt_dtype_size(MT_DTYPE_COUNT) == 0);
  CHECK(strcmp(mt_dtype_name(MT_DTYPE_UINT32), "uint32") == 0);
  /* NumPy's kind and item size name each code; bfloat16 and odd sizes none. */
  CHECK(mt_dtype_of_kind('b', 1) == MT_DTYPE_BOOL);
  CHECK(mt_dtype_of_kind('i', 1) == MT_DTYPE_INT8 && mt_dtype_of_kind('i', 8) == MT_DTYPE_INT64);
  CHECK(mt_dtype_of_kind('u', 2) == MT_DTYPE_UINT16 && mt_dtype_of_kind('u', 8) == MT_DTYPE_UINT64);
  CHECK(mt_dtype_of_kind('f', 2) == MT_DTYPE_FLOAT16 && mt_dtype_of_kind('f', 4) == MT_DTYPE_FLOAT32);
  CHECK(mt_dtype_of_kind('c', 16) == MT_DTYPE_COMPLEX128);
  CHECK(mt_dtype_of_kind('f', 16) == -2 && mt_dtype_of_kind('i', 3) == -2);
  CHECK(mt_dtype_of_kind('V', 2) == -2 && mt_dtype_of_kind('U', 4) == -2);
  /* Python reads the core's constants by these names (mpitensor._clib.CORE). */
  CHECK(constant("LABEL_REPLICATE") == MT_LABEL_REPLICATE);
  CHECK(constant("PARTIAL_ADDITIVE") == MT_PARTIAL_ADDITIVE);
  CHECK(constant("REDUCE_MIN") == MT_REDUCE_MIN && constant("REDUCE_COUNT") == MT_REDUCE_COUNT);
  CHECK(constant("PLACEMENT_PARTIAL") == MT_PLACEMENT_PARTIAL);
  CHECK(constant("ELEMENTWISE_INCREASING") == MT_ELEMENTWISE_INCREASING);
  CHECK(constant("FAMILY_MATMUL") == MT_OP_MATMUL);
  CHECK(constant("PROP_MAX_LABELS") == MT_PROP_MAX_LABELS);
  CHECK(constant("MAX_NDIM") == MT_MAX_NDIM && constant("MAX_MESH_NDIM") == MT_MAX_MESH_NDIM);
  CHECK(constant("NO_SUCH_CONSTANT") == -1);
  int untouched = 7;
  CHECK(mt_enum_at(-1, &untouched) == NULL && mt_enum_at(1 << 20, &untouched) == NULL);
  CHECK(untouched == 7);
  /* Each name once: Python keeps the last of a repeated one. */
  int v = 0, repeats = 0;
  const char *a, *b;
  for (int i = 0; (a = mt_enum_at(i, &v)) != NULL; ++i)
    for (int j = 0; j < i && (b = mt_enum_at(j, &v)) != NULL; ++j) repeats += strcmp(a, b) == 0;
  CHECK(repeats == 0);
  CHECK(strcmp(mt_reduce_op_name(MT_REDUCE_AVG), "avg") == 0);
  CHECK(mt_reduce_op_name(MT_REDUCE_COUNT) == NULL && mt_reduce_op_name(-1) == NULL);
  return mt_test_exit("test_status");
}
