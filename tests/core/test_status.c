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
  return mt_test_exit("test_status");
}
