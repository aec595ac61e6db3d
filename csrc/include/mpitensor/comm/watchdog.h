/* The collective watchdog: a job whose ranks wait in a collective that some rank
 * never reaches (an argument that differs between ranks, a rank that raised and
 * went on, a rank stuck elsewhere) is ended with a sentence naming where each
 * waiting rank waits, instead of hanging until someone kills it. As torch's
 * process-group timeout: a collective that has not finished after the timeout
 * aborts the job.
 *
 * A background thread looks a few times a second at which blocking MPI call this
 * process is in and how many it has entered; the hot path only stores a pointer
 * and a counter around each call. */
#ifndef MPITENSOR_WATCHDOG_H
#define MPITENSOR_WATCHDOG_H

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Torch's default for CPU process groups (gloo): 30 minutes. */
#define MT_WATCHDOG_DEFAULT_SECONDS 1800.0

/* Sets the timeout in seconds; 0 turns the watchdog off. The first positive
 * timeout starts the thread (MPI must be initialised: the thread aborts the job
 * through MPI_COMM_WORLD). Local. MT_EINVAL for a negative or non-finite value,
 * MT_ENOMEM when the thread cannot be started.
 *
 *   rc = mt_watchdog_set_timeout(600.0, &err);   // abort after 10 min in one call */
int mt_watchdog_set_timeout(double seconds, mt_error *err);

/* The timeout in seconds; 0 when off. */
double mt_watchdog_timeout(void);

#ifdef __cplusplus
}
#endif

#endif
