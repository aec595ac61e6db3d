/* One handle for an exchange in flight, whichever started it: a redistribute
 * (mt_redistribute_start, an mt_request) or a ring exchange (an mt_exchange).
 * It completes its exchange once, whichever thread asks first: threads that wait
 * at the same time take turns on its lock, the first completes the exchange and
 * gets its status, the others find it complete. A handle destroyed unwaited
 * completes its exchange first, so MPI never touches memory its owner freed. */
#ifndef MPITENSOR_PENDING_H
#define MPITENSOR_PENDING_H

#include "mpitensor/comm/redistribute.h"
#include "mpitensor/comm/ring.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_pending mt_pending;

/* Local. A handle that takes over `req` or `ex` (one of them; neither: an
 * exchange complete already). MT_ENOMEM when it cannot be made: the exchange is
 * then completed (and freed) before the call returns. */
MT_EXPORT int mt_pending_create(mt_request *req, mt_exchange *ex, mt_pending **out,
                                mt_error *err);

/* Collective on the mesh for a redistribute, Local for a ring exchange. Completes
 * the exchange: the first caller gets its status, any later or concurrent one
 * MT_OK once it has completed. */
MT_EXPORT int mt_pending_wait(mt_pending *p, mt_error *err);

/* Local. Lets MPI progress the exchange; sets *done to 1 once it has completed
 * (a wait no longer blocks on MPI), else 0. A handle some thread is completing
 * reports 0 until that wait returns. */
MT_EXPORT int mt_pending_test(mt_pending *p, int *done, mt_error *err);

/* Local. Whether a wait has completed the exchange. */
MT_EXPORT int mt_pending_done(const mt_pending *p);

/* As mt_pending_wait, ignoring its status, then frees the handle. Accepts NULL. */
MT_EXPORT void mt_pending_destroy(mt_pending *p);

#ifdef __cplusplus
}
#endif
#endif
