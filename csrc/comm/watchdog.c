/* The collective watchdog (watchdog.h). The comm library's blocking MPI calls go
 * through MT__BLOCKING (comm-private.h), which stores the call's name in
 * `mt__waiting_in` and bumps `mt__waits`; the other libraries' calls, and the
 * routines of other libraries that communicate inside (ScaLAPACK's), through
 * mt_watchdog_wait_begin, which does the same. The thread here samples both. A
 * process that stays in the same call, with no call entered since, for the whole
 * timeout is stuck: it says where, and the stack of each of its threads, on
 * stderr, and aborts the job. It tells the other processes first (departure.c),
 * and each says where it is too, stuck or not, before the job ends. */
#include "mpitensor/comm/watchdog.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "comm-private.h"

/* Process-wide by nature (one watchdog per process), written by the threads that
 * run collectives and read by the watchdog thread: atomics, relaxed, since only
 * "has it changed" matters. */
_Atomic(const char *) mt__waiting_in = NULL;
_Atomic uint64_t mt__waits = 0;
_Atomic(const char *) mt__routine_in = NULL;
/* The stack dumper (mt_watchdog_set_dump) and its argument, set once by the
 * binding before the thread has reason to read them. */
static const char *(*_Atomic dumper)(int fd, void *arg, void *unused);
static void *_Atomic dump_arg;
/* The timeout in milliseconds (0: off), read by the thread at each look. */
static _Atomic int64_t timeout_ms = 0;
/* Whether the thread runs, and facts for its report taken when it starts (the
 * watchdog thread makes no MPI call but MPI_Abort, and that only when MPI allows
 * calls from any thread); written under `lock` by mt_watchdog_set_timeout. */
static struct {
  pthread_mutex_t lock;
  int started, world_rank, multiple;
} state = {PTHREAD_MUTEX_INITIALIZER, 0, -1, 0};

static void pause_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* After a notice that rank `gone` left, or failed in the work this process runs:
 * how long a process may stay in one blocking call before it is taken as waiting
 * for that rank. */
#define GRACE_MS 2000

/* How long a process that ends the job, its report printed, waits for every
 * other process to say where it is: they hear it at their next look, so this
 * bounds only a process that cannot answer (its watchdog gone with its MPI). */
#define REPORTS_MS 10000
/* Then how long it leaves the launcher to pass on what they printed. */
#define FORWARD_MS 500
/* What it waits instead when the others cannot hear it (MPI without threads):
 * those stuck with it reach their own timeout within a few looks. */
#define REPORT_MS 1500

/* Ends the job once this process has said where it is. `answering`: it reports
 * because another process ends the job, and leaves the abort to that one (many
 * processes aborting at once garble the launcher's message), aborting itself only
 * if that one could not. */
static void end_job(int answering) {
  const char *(*dump)(int, void *, void *) = atomic_load(&dumper);
  if (dump != NULL) {
    fprintf(stderr,
            "mpitensor: the stack of each thread of rank %d, the most recent call "
            "first:\n",
            state.world_rank);
    fflush(stderr);
    (void)dump(2, atomic_load(&dump_arg), NULL);
  }
  fflush(stderr);
  mt__stuck_tell();
  int first, done, others;
  for (int64_t waited = 0; waited < REPORTS_MS; waited += 50) {
    (void)mt__stuck_heard(&first, &done, &others);
    if (done >= others) break;
    pause_ms(50);
  }
  pause_ms(others > 0 ? FORWARD_MS : REPORT_MS);
  if (answering) pause_ms(REPORTS_MS + FORWARD_MS);
  if (state.multiple) MPI_Abort(MPI_COMM_WORLD, 1);
  /* Without MPI_THREAD_MULTIPLE only this process may end here; mpiexec then
   * ends the others, as for any rank that exits without finalizing. */
  _exit(1);
}

static void report_departure_and_abort(const char *what, uint64_t n, double waited,
                                       int gone, const char *why) {
  fprintf(stderr,
          "mpitensor: rank %d has waited %.0f s in %s (MPI call %llu of this process), "
          "and rank %d %s. Its collectives will never come, so the job is aborted.\n",
          state.world_rank, waited, what, (unsigned long long)n, gone, why);
  end_job(0);
}

static void report_and_abort(const char *what, uint64_t n, double waited, int answering) {
  if (what == atomic_load_explicit(&mt__routine_in, memory_order_relaxed)) {
    fprintf(stderr,
            "mpitensor: rank %d has been in %s for %.0f s (call %llu of this "
            "process: a routine of another library that mpitensor runs for the "
            "program, and that communicates inside) and it has not returned: it "
            "waits for a rank that is not in the same routine, or for a message the "
            "routine never sends, or it computes longer than the timeout. Aborting "
            "the job (MPITENSOR_TIMEOUT=%.0f seconds; 0 turns this off, and a longer "
            "one lets a long factorization finish).\n",
            state.world_rank, what, waited, (unsigned long long)n,
            (double)atomic_load(&timeout_ms) / 1000.0);
    end_job(answering);
  }
  fprintf(stderr,
          "mpitensor: rank %d has waited %.0f s in %s (MPI call %llu of this process) "
          "and it has not finished: some rank of the job is not in the same collective "
          "(an argument that differs between ranks, a rank that raised and went on, "
          "or a rank still busy elsewhere; MPITENSOR_CHECK=1 names the first call "
          "that differs). Aborting the job (MPITENSOR_TIMEOUT=%.0f seconds; 0 turns "
          "this off).\n",
          state.world_rank, waited, what, (unsigned long long)n,
          (double)atomic_load(&timeout_ms) / 1000.0);
  end_job(answering);
}

/* Another process ended the job (rank `first`) while this one runs, in no
 * blocking call that the watchdog sees: it says so, and where it is. */
static void report_elsewhere_and_abort(int first) {
  fprintf(stderr,
          "mpitensor: rank %d is in no collective that mpitensor watches, and rank %d "
          "ends the job stuck in one: this rank computes, sleeps or waits outside "
          "mpitensor (its stack below shows where). Aborting the job "
          "(MPITENSOR_TIMEOUT=%.0f seconds).\n",
          state.world_rank, first, (double)atomic_load(&timeout_ms) / 1000.0);
  end_job(1);
}

/* A few looks per timeout, at most four per second: a sleeping thread. */
static int64_t look_every(int64_t limit) {
  if (limit <= 0) return 1000;
  int64_t step = limit / 4;
  if (step > 250) return 250;
  return step > 10 ? step : 10;
}

static void *watch(void *unused) {
  (void)unused;
  uint64_t last = 0;
  int64_t stuck_ms = 0;
  char why[256];
  for (;;) {
    int64_t limit = atomic_load_explicit(&timeout_ms, memory_order_relaxed);
    int64_t step = look_every(limit);
    pause_ms(step);
    const char *what = atomic_load_explicit(&mt__waiting_in, memory_order_relaxed);
    uint64_t n = atomic_load_explicit(&mt__waits, memory_order_relaxed);
    int gone = -1, heard = mt__departure_heard(n, &gone, why, sizeof why);
    int first = -1, done, others;
    if (limit > 0 && mt__stuck_heard(&first, &done, &others)) {
      if (what == NULL) report_elsewhere_and_abort(first);
      report_and_abort(what, n, n == last ? (double)stuck_ms / 1000.0 : 0.0, 1);
    }
    if (limit <= 0 || what == NULL || n != last) {
      last = n;
      stuck_ms = 0;
      continue;
    }
    stuck_ms += step;
    if (heard && stuck_ms >= GRACE_MS) {
      report_departure_and_abort(what, n, (double)stuck_ms / 1000.0, gone, why);
    }
    if (stuck_ms >= limit) report_and_abort(what, n, (double)stuck_ms / 1000.0, 0);
  }
  return NULL;
}

int mt_watchdog_set_timeout(double seconds, mt_error *err) {
  if (!isfinite(seconds) || seconds < 0) {
    return mt_error_set(err, MT_EINVAL,
                        "the collective timeout must be a finite number of seconds >= 0 "
                        "(0 turns the watchdog off), got %g", seconds);
  }
  int rc = MT_OK;
  pthread_mutex_lock(&state.lock);
  atomic_store(&timeout_ms, (int64_t)llround(seconds * 1000.0));
  if (seconds > 0 && !state.started) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Comm_rank(MPI_COMM_WORLD, &state.world_rank);
    MPI_Query_thread(&provided);
    state.multiple = provided == MPI_THREAD_MULTIPLE;
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, watch, NULL) == 0) {
      state.started = 1;
    } else {
      atomic_store(&timeout_ms, 0);
      rc = mt_error_set(err, MT_ENOMEM, "could not start the collective watchdog thread");
    }
    pthread_attr_destroy(&attr);
  }
  pthread_mutex_unlock(&state.lock);
  return rc;
}

double mt_watchdog_timeout(void) { return (double)atomic_load(&timeout_ms) / 1000.0; }

void mt_watchdog_wait_begin(const char *what, int routine) {
  if (routine) atomic_store_explicit(&mt__routine_in, what, memory_order_relaxed);
  mt__wait_begin(what);
}

void mt_watchdog_wait_end(void) { (void)mt__wait_end(0); }

void mt_watchdog_set_dump(const char *(*dump)(int fd, void *arg, void *unused),
                          void *arg) {
  atomic_store(&dump_arg, arg);
  atomic_store(&dumper, dump);
}
