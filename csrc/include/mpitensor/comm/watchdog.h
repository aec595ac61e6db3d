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

#include <mpi.h>
#include <stdint.h>

#include "mpitensor/comm/mesh.h"
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
MT_EXPORT int mt_watchdog_set_timeout(double seconds, mt_error *err);

/* The timeout in seconds; 0 when off. */
MT_EXPORT double mt_watchdog_timeout(void);

/* Local. A blocking wait outside comm's own calls, watched as those are: the
 * other libraries' MPI calls (linalg's exchanges and trees), and the routines of
 * other libraries that mpitensor runs on the user's behalf and that communicate
 * inside (ScaLAPACK's drivers, BLACS's grids), which the watchdog otherwise could
 * not see. `what` names the call in the report and must outlive it (a string
 * literal); `routine` says it is another library's routine rather than an MPI
 * call: the whole routine counts as one call, so one that runs longer than the
 * timeout ends the job as a stuck one would. Each begin is followed by an end, on
 * the same thread.
 *
 *   mt_watchdog_wait_begin("ScaLAPACK's pdgesvd", 1);
 *   pdgesvd_(...);
 *   mt_watchdog_wait_end();
 */
MT_EXPORT void mt_watchdog_wait_begin(const char *what, int routine);
MT_EXPORT void mt_watchdog_wait_end(void);

/* Local. What the watchdog calls, before it aborts the job, to print the stack of
 * every thread of the process: `dump(fd, arg, NULL)` with stderr's descriptor, from
 * the watchdog's own thread while the others stay where they are stuck. The
 * Python package hands CPython's traceback dumper and the interpreter, as
 * faulthandler's own watchdog thread calls it. NULL: none.
 *
 *   mt_watchdog_set_dump(dumper, interpreter);
 */
MT_EXPORT void mt_watchdog_set_dump(
    const char *(*dump)(int fd, void *arg, void *unused), void *arg);

/* Collective on `comm` when it holds the ranks of MPI_COMM_WORLD (in any order),
 * else Local and nothing. Starts listening for ranks that leave the job: a process
 * that then stays 2 s in one blocking call after hearing that some rank left
 * (mt_watchdog_leave) prints where it waits and who left, and aborts the job. Does
 * nothing in a job of one process, without MPI_THREAD_MULTIPLE (the watchdog
 * thread tests the notices), or once listening; call it when the first mesh over
 * the world is made, with the watchdog running.
 *
 *   rc = mt_watchdog_listen(MPI_COMM_WORLD, &err);
 */
int mt_watchdog_listen(MPI_Comm comm, mt_error *err);

/* mt_watchdog_listen on the communicator of `mesh`: collective on the mesh when it
 * holds every rank of MPI_COMM_WORLD; on a rank outside the mesh (which then does
 * not hold every rank) nothing. `*listening` says whether this process listens
 * after, 0 outside the mesh. */
MT_EXPORT int mt_watchdog_listen_mesh(mt_mesh *mesh, int *listening, mt_error *err);

/* Local. Whether this process listens (mt_watchdog_listen). */
int mt_watchdog_listening(void);

/* Local. The tag of the work this process runs from now on (an interactive
 * engine's cell: every engine counts its cells alike). A notice of
 * mt_watchdog_tell counts for a process running work of the same tag. */
MT_EXPORT void mt_watchdog_set_work(int64_t tag);

/* Local (sends to every other process). Tells every other process that this one
 * failed in work `tag` (>= 0) for `reason`, without leaving: one that stays 2 s in
 * a blocking call while running the same work aborts the job, as for a rank that
 * left. For interactive engines, whose processes outlive a failed cell. Nothing
 * when not listening.
 *
 *   mt_watchdog_set_work(cell);  ...  rc = mt_watchdog_tell("engine 1 raised", cell, &err);
 */
MT_EXPORT int mt_watchdog_tell(const char *reason, int64_t tag, mt_error *err);

/* Local. How many other processes said they failed in work `tag`. */
MT_EXPORT int mt_watchdog_failed(int64_t tag);

/* Local, though it waits for the other processes. Says that this process leaves
 * the job, with `reason` (its end, an uncaught exception): it waits up to a
 * second for every other process to leave too (a job ending normally, for the
 * cost of one nonblocking barrier); then it tells every other process, and waits
 * for them as MPI_Finalize would. Call it before MPI_Finalize; nothing when not
 * listening. A NULL `reason` only stops listening (a process that is about to
 * abort the job anyway). MPI_Finalize stops the listening by itself.
 *
 *   rc = mt_watchdog_leave("rank 1 raised ValueError: bad input", &err);
 */
MT_EXPORT int mt_watchdog_leave(const char *reason, mt_error *err);

#ifdef __cplusplus
}
#endif

#endif
