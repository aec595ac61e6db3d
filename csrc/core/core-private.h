/* Helpers shared by the core's translation units; not part of the public API. */
#ifndef MPITENSOR_CORE_PRIVATE_H
#define MPITENSOR_CORE_PRIVATE_H

#include "mpitensor/status.h"

/* Records `code` and a printf-style message in `err` (which may be NULL) and
 * returns `code`, so a failure path is one line: `return mt__fail(err, ...);`. */
int mt__fail(mt_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#endif
