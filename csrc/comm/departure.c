/* A rank that leaves the job while the others still wait for it (watchdog.h).
 *
 * Every process listens, on a duplicate of MPI_COMM_WORLD of its own, with one
 * receive posted that the watchdog thread tests at each look. A process that
 * leaves first enters a nonblocking barrier there: when every process leaves
 * together (a normal end) it completes, and that is all a normal exit costs. When
 * it has not completed after a patience, the leaving process tells every other one
 * who it is and why it leaves, and waits in the barrier as MPI_Finalize would; a
 * process whose watchdog then finds it stuck in a blocking call aborts the job,
 * naming the rank that left. An interactive engine that raised in a cell tells
 * the others the same way without leaving (mt_watchdog_tell): its notice counts
 * for the engines that run the same cell (the same tag). A process whose watchdog
 * ends the job tells the others the same way, so that each says where it is
 * before the job ends (watchdog.c). */
#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm-private.h"
#include "mpitensor/comm/watchdog.h"

/* How long a leaving process waits for the others to leave too before it tells
 * them (a second): the ranks of a job that ends normally reach their ends within
 * it. */
#define PATIENCE_US 1000000L
#define TAG 7341

/* What a process tells the others: who, what (`kind`), about which piece of work
 * (`tag`: the cell an interactive engine ran when it raised; < 0 for a process
 * that left), and why. */
enum {
  LEFT_OR_FAILED = 0, /* it left the job, or failed in a piece of work */
  MPI_FAILED = 1,     /* an MPI call of the library failed there */
  STUCK = 2           /* its watchdog ended the job and it said where it is */
};
typedef struct notice {
  int32_t rank, kind;
  int64_t tag;
  char reason[240];
} notice;

/* Process-wide, as the watchdog thread that reads it: the listening
 * communicator, its posted receive, the tag of the work this process runs now,
 * the latest notice heard from each rank that it left or failed (`heard[r].rank`
 * is -1 until one comes) and, for a failed MPI call's, this process's count of
 * blocking calls when it was first looked at (`heard_at[r]`, UINT64_MAX before),
 * and whether each rank said where it is as its watchdog ended the job
 * (`stuck[r]`). `lock` guards all of it: the watchdog thread tests the receive,
 * the main thread starts and stops it and sets the tag. */
static struct {
  pthread_mutex_t lock;
  int listening, me, size;
  MPI_Comm comm;
  MPI_Request recv;
  notice in;
  notice *heard;
  uint64_t *heard_at;
  char *stuck;
  int64_t now;
} ear = {PTHREAD_MUTEX_INITIALIZER, 0, -1, 0, MPI_COMM_NULL, MPI_REQUEST_NULL,
         {0, 0, 0, ""}, NULL, NULL, NULL, 0};

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Under the lock: the one receive every process keeps posted. It is posted again
 * only once MPI_Test found the previous one complete (drain), which the MPI
 * checker cannot follow across calls. */
static int post(void) {
  /* NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker) */
  return MPI_Irecv(&ear.in, (int)sizeof ear.in, MPI_BYTE, MPI_ANY_SOURCE, TAG, ear.comm,
                   &ear.recv);
}

/* Stops listening (the posted receive cancelled) and hands the communicator to
 * the caller. */
static MPI_Comm stop_listening(int *me, int *size) {
  pthread_mutex_lock(&ear.lock);
  MPI_Comm comm = ear.listening ? ear.comm : MPI_COMM_NULL;
  if (ear.listening) {
    /* The receive was posted by post(), in another function: the MPI checker
     * cannot pair them. */
    MPI_Cancel(&ear.recv);
    MPI_Wait(&ear.recv, MPI_STATUS_IGNORE); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
    ear.listening = 0;
  }
  *me = ear.me, *size = ear.size;
  pthread_mutex_unlock(&ear.lock);
  return comm;
}

/* MPI_COMM_SELF's attribute: MPI_Finalize deletes it first, while MPI still
 * works, so a program that finalizes MPI itself stops the listening first (the
 * watchdog thread must not test a receive once MPI is gone). */
static int on_finalize(MPI_Comm comm, int keyval, void *value, void *extra) {
  (void)comm, (void)keyval, (void)value, (void)extra;
  int me, size;
  (void)stop_listening(&me, &size);
  return MPI_SUCCESS;
}

static int watch_finalize(void) {
  int keyval = MPI_KEYVAL_INVALID;
  int rc = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize, &keyval, NULL);
  return rc == MPI_SUCCESS ? MPI_Comm_set_attr(MPI_COMM_SELF, keyval, NULL) : rc;
}

static void tell_everyone(MPI_Comm comm, int me, int size, const notice *mine);

/* mt__mpi_failure_hook: an MPI call that failed here leaves the others waiting
 * in a collective this process will not enter in step; they are told as for a
 * failed piece of work (the one this process runs now). */
static void tell_failure(const char *reason) {
  pthread_mutex_lock(&ear.lock);
  MPI_Comm comm = ear.listening ? ear.comm : MPI_COMM_NULL;
  notice mine = {ear.me, MPI_FAILED, ear.now, ""};
  int size = ear.size;
  pthread_mutex_unlock(&ear.lock);
  if (comm == MPI_COMM_NULL) return;
  snprintf(mine.reason, sizeof mine.reason, "%s", reason);
  tell_everyone(comm, mine.rank, size, &mine);
}

int mt_watchdog_listen(MPI_Comm comm, mt_error *err) {
  int same = MPI_UNEQUAL, size = 0, provided = MPI_THREAD_SINGLE;
  /* MPI_SIMILAR: the world's ranks in another order, as a mesh's own. */
  /* No call here is shown to the watchdog (MT__MPI_TRY), which calls into this
   * file: the dup follows the mesh's creation on every rank, so it cannot hang. */
  int rc = MPI_Comm_compare(comm, MPI_COMM_WORLD, &same);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rc == MPI_SUCCESS) rc = MPI_Query_thread(&provided);
  if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Comm_compare");
  pthread_mutex_lock(&ear.lock);
  int skip = ear.listening || size < 2 || provided != MPI_THREAD_MULTIPLE ||
             same == MPI_UNEQUAL;
  pthread_mutex_unlock(&ear.lock);
  /* Every rank of `comm` decides alike: the same call, the same MPI. */
  if (skip) return MT_OK;
  MPI_Comm dup = MPI_COMM_NULL;
  rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  notice *heard = malloc((size_t)size * sizeof(notice));
  uint64_t *heard_at = malloc((size_t)size * sizeof(uint64_t));
  char *stuck = calloc((size_t)size, 1);
  if (heard == NULL || heard_at == NULL || stuck == NULL) {
    free(heard);
    free(heard_at);
    free(stuck);
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  for (int r = 0; r < size; ++r) heard[r].rank = -1;
  pthread_mutex_lock(&ear.lock);
  ear.comm = dup;
  MPI_Comm_rank(dup, &ear.me);
  ear.size = size;
  ear.heard = heard;
  ear.heard_at = heard_at;
  ear.stuck = stuck;
  rc = post();
  ear.listening = rc == MPI_SUCCESS;
  pthread_mutex_unlock(&ear.lock);
  if (rc == MPI_SUCCESS) rc = watch_finalize();
  if (rc == MPI_SUCCESS) atomic_store(&mt__mpi_failure_hook, tell_failure);
  return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Irecv");
}

int mt_watchdog_listening(void) {
  pthread_mutex_lock(&ear.lock);
  int on = ear.listening;
  pthread_mutex_unlock(&ear.lock);
  return on;
}

/* Under the lock: takes every notice that has come, posting the receive again
 * after each. */
static void drain(void) {
  int done = 1;
  while (ear.listening && done) {
    if (MPI_Test(&ear.recv, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
    if (!done) break;
    if (ear.in.rank >= 0 && ear.in.rank < ear.size && ear.in.kind == STUCK) {
      ear.stuck[ear.in.rank] = 1;
    } else if (ear.in.rank >= 0 && ear.in.rank < ear.size) {
      ear.heard[ear.in.rank] = ear.in;
      ear.heard[ear.in.rank].reason[sizeof ear.in.reason - 1] = '\0';
      ear.heard_at[ear.in.rank] = UINT64_MAX;
    }
    if (post() != MPI_SUCCESS) ear.listening = 0;
  }
}

/* Under the lock: whether the notice of rank `r` still counts when this process
 * has entered `waits` blocking calls. A failed MPI call's counts for the call this
 * process was in when it first looked at it (the collective the failed rank
 * left), and the next one (which it was about to enter): one that failed on every
 * rank alike, each raising, must not end the job at a later long wait. */
static int counts(int r, uint64_t waits) {
  const notice *h = &ear.heard[r];
  if (h->rank < 0 || (h->tag >= 0 && h->tag != ear.now)) return 0;
  if (h->kind != MPI_FAILED) return 1;
  if (ear.heard_at[r] == UINT64_MAX) ear.heard_at[r] = waits;
  return waits <= ear.heard_at[r] + 1;
}

int mt__departure_heard(uint64_t waits, int *rank, char *reason, size_t n) {
  pthread_mutex_lock(&ear.lock);
  drain();
  int found = -1;
  for (int r = 0; ear.heard != NULL && r < ear.size && found < 0; ++r) {
    if (counts(r, waits)) found = r;
  }
  if (found >= 0) {
    *rank = found;
    snprintf(reason, n, "%s: %s", ear.heard[found].tag < 0 ? "has left the job" : "failed",
             ear.heard[found].reason);
  }
  pthread_mutex_unlock(&ear.lock);
  return found >= 0;
}

int mt__stuck_heard(int *first, int *done, int *others) {
  pthread_mutex_lock(&ear.lock);
  drain();
  *first = -1, *done = 0, *others = 0;
  for (int r = 0; ear.listening && r < ear.size; ++r) {
    if (r == ear.me) continue;
    ++*others;
    if (ear.stuck[r] && *first < 0) *first = r;
    /* A rank that left waits in its final barrier and says nothing more. */
    *done += ear.stuck[r] || (ear.heard[r].rank >= 0 && ear.heard[r].tag < 0);
  }
  pthread_mutex_unlock(&ear.lock);
  return *first >= 0;
}

void mt__stuck_tell(void) {
  pthread_mutex_lock(&ear.lock);
  MPI_Comm comm = ear.listening ? ear.comm : MPI_COMM_NULL;
  notice mine = {ear.me, STUCK, 0, ""};
  int size = ear.size;
  pthread_mutex_unlock(&ear.lock);
  if (comm != MPI_COMM_NULL) tell_everyone(comm, mine.rank, size, &mine);
}

void mt_watchdog_set_work(int64_t tag) {
  pthread_mutex_lock(&ear.lock);
  ear.now = tag;
  pthread_mutex_unlock(&ear.lock);
}

int mt_watchdog_failed(int64_t tag) {
  pthread_mutex_lock(&ear.lock);
  drain();
  int count = 0;
  for (int r = 0; ear.heard != NULL && r < ear.size; ++r) {
    count += ear.heard[r].rank >= 0 && ear.heard[r].tag == tag;
  }
  pthread_mutex_unlock(&ear.lock);
  return count;
}

/* Tells every other process that this one leaves, and why. */
static void tell_everyone(MPI_Comm comm, int me, int size, const notice *mine) {
  MPI_Request *sent = malloc((size_t)size * sizeof(MPI_Request));
  if (sent == NULL) return;
  int n = 0;
  for (int r = 0; r < size; ++r) {
    if (r != me && MPI_Isend(mine, (int)sizeof *mine, MPI_BYTE, r, TAG, comm, &sent[n]) ==
                       MPI_SUCCESS)
      ++n;
  }
  MPI_Waitall(n, sent, MPI_STATUSES_IGNORE);
  free(sent);
}

int mt_watchdog_tell(const char *reason, int64_t tag, mt_error *err) {
  (void)err;
  pthread_mutex_lock(&ear.lock);
  MPI_Comm comm = ear.listening ? ear.comm : MPI_COMM_NULL;
  int me = ear.me, size = ear.size;
  pthread_mutex_unlock(&ear.lock);
  if (comm == MPI_COMM_NULL) return MT_OK;
  notice mine = {me, LEFT_OR_FAILED, tag < 0 ? 0 : tag, ""};
  snprintf(mine.reason, sizeof mine.reason, "%s", reason != NULL ? reason : "");
  tell_everyone(comm, me, size, &mine);
  return MT_OK;
}

int mt_watchdog_leave(const char *reason, mt_error *err) {
  int me = 0, size = 0, done = 0, finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return MT_OK;
  MPI_Comm comm = stop_listening(&me, &size);
  if (comm == MPI_COMM_NULL || reason == NULL) return MT_OK;
  /* None of these calls is shown to the watchdog: a process that leaves waits
   * for the others as long as they take (as MPI_Finalize would), and is never
   * the one that is stuck. */
  MPI_Request barrier;
  int rc = MPI_Ibarrier(comm, &barrier);
  /* Looks often at first (the others are usually leaving too), then every 10 ms. */
  for (long waited = 0, pause = 20; rc == MPI_SUCCESS && !done && waited < PATIENCE_US;
       waited += pause, pause = pause < 10000 ? 2 * pause : pause) {
    rc = MPI_Test(&barrier, &done, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && !done) sleep_us(pause);
  }
  if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Ibarrier");
  if (done) return MT_OK;
  notice mine = {me, LEFT_OR_FAILED, -1, ""};
  snprintf(mine.reason, sizeof mine.reason, "%s", reason != NULL ? reason : "");
  tell_everyone(comm, me, size, &mine);
  rc = MPI_Wait(&barrier, MPI_STATUS_IGNORE);
  return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Wait");
}
