/* Helpers shared by the core's translation units; not part of the public API. */
#ifndef MPITENSOR_CORE_PRIVATE_H
#define MPITENSOR_CORE_PRIVATE_H

#include "mpitensor/layout.h"
#include "mpitensor/status.h"

/* Records `code` and a printf-style message in `err` (which may be NULL) and
 * returns `code`, so a failure path is one line: `return mt__fail(err, ...);`. */
int mt__fail(mt_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* The box of the rank whose coordinate is `coord` with mesh dim `m` set to `k`
 * (m < 0: `coord` itself), for a layout already validated: the member boxes of a
 * group along one mesh dim, as the executors walk them. */
void mt__box_at(const mt_layout *layout, const int64_t *coord, int m, int64_t k,
                mt_box *out);

#endif
