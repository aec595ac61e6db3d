#include "mpitensor/core/dtype.h"

size_t mt_dtype_size(int dtype) {
  switch (dtype) {
#define MT__DTYPE_SIZE(name, size, text) \
  case MT_DTYPE_##name:                  \
    return size;
    /* Dtypes of one size share a branch body by design. */
    MT_DTYPE_MAP(MT__DTYPE_SIZE)  /* NOLINT(bugprone-branch-clone) */
#undef MT__DTYPE_SIZE
    default:
      return 0;
  }
}

const char *mt_dtype_name(int dtype) {
  switch (dtype) {
#define MT__DTYPE_TEXT(name, size, text) \
  case MT_DTYPE_##name:                  \
    return text;
    MT_DTYPE_MAP(MT__DTYPE_TEXT)
#undef MT__DTYPE_TEXT
    default:
      return "unknown";
  }
}
