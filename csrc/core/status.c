#include "mpitensor/core/status.h"

#include <stdarg.h>
#include <stdio.h>

const char *mt_strerror(int code) {
  switch (code) {
    case MT_OK:
      return "success";
#define MT__ERRNO_TEXT(name, value, text) \
  case MT_##name:                         \
    return text;
      MT_ERRNO_MAP(MT__ERRNO_TEXT)
#undef MT__ERRNO_TEXT
    default:
      return "unknown error";
  }
}

const char *mt_status_name(int code) {
  switch (code) {
    case MT_OK:
      return "MT_OK";
#define MT__ERRNO_NAME(name, value, text) \
  case MT_##name:                         \
    return "MT_" #name;
      MT_ERRNO_MAP(MT__ERRNO_NAME)
#undef MT__ERRNO_NAME
    default:
      return "MT_UNKNOWN";
  }
}

int mt_error_set(mt_error *err, int code, const char *fmt, ...) {
  if (err != NULL) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    /* clang-analyzer 14 loses va_start across the field store above. */
    vsnprintf(err->msg, sizeof err->msg, fmt, ap); /* NOLINT(clang-analyzer-valist.Uninitialized) */
    va_end(ap);
  }
  return code;
}
