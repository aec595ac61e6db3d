#include <string.h>

#include "check.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/status.h"

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
  return mt_test_exit("test_status");
}
