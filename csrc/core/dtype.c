#include "mpitensor/core/dtype.h"

#include <string.h>

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

/* The name NumPy's kind character gives its types ("int" for 'i'), or NULL. */
static const char *kind_word(char kind) {
  switch (kind) {
    case 'b': return "bool";
    case 'i': return "int";
    case 'u': return "uint";
    case 'f': return "float";
    case 'c': return "complex";
    default: return NULL;
  }
}

int mt_dtype_of_kind(char kind, size_t size) {
  const char *word = kind_word(kind);
  size_t n = word != NULL ? strlen(word) : 0;
  for (int t = 0; word != NULL && t < MT_DTYPE_BFLOAT16; ++t) {
    const char *name = mt_dtype_name(t);
    if (strncmp(name, word, n) == 0 && (name[n] == '\0' || (name[n] >= '0' && name[n] <= '9')) &&
        mt_dtype_size(t) == size)
      return t;
  }
  return -2;
}
