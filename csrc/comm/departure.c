/* A rank that leaves the job while the others still wait for it (watchdog.h).
 *
 * Every process listens, on a duplicate of MPI_COMM_WORLD of its own, with one
 * receive posted that the watchdog thread tests at each look. A process that
 * leaves first enters a nonblocking barrier there: when every process leaves
 * together (a normal end) it completes, and that is all a normal exit costs. When
 * it has not completed after a patience, the leaving process tells every other one
 * who it is and why it leaves, and waits in the barrier as MPI_Finalize would; a
 * process whose watchdog then finds it stuck in a blocking call aborts the job,
 * naming the rank that left. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm-private.h"
#include "mpitensor/watchdog.h"

/* How long a leaving process waits for the others to leave too before it tells
 * them (a second): the ranks of a job that ends normally reach their ends within
 * it. */
#define PATIENCE_US 1000000L
#define TAG 7341

typedef struct notice {
  int rank;
  char reason[252];
} notice;

/* Process-wide, as the watchdog thread that reads it: the listening
 * communicator, its posted receive and what it heard. `lock` guards all of it:
 * the watchdog thread tests the receive, the main thread starts and stops it. */
static struct {
  pthread_mutex_t lock;
  int listening, me, size;
  MPI_Comm comm;
  MPI_Request recv;
  notice in, heard;
  int has_heard;
} ear = {PTHREAD_MUTEX_INITIALIZER, 0, -1, 0, MPI_COMM_NULL, MPI_REQUEST_NULL,
         {0, ""}, {-1, ""}, 0};

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Under the lock: the one receive every process keeps posted. */
static int post(void) {
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
  pthread_mutex_lock(&ear.lock);
  ear.comm = dup;
  MPI_Comm_rank(dup, &ear.me);
  ear.size = size;
  rc = post();
  ear.listening = rc == MPI_SUCCESS;
  pthread_mutex_unlock(&ear.lock);
  if (rc == MPI_SUCCESS) rc = watch_finalize();
  return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Irecv");
}

int mt_watchdog_listening(void) {
  pthread_mutex_lock(&ear.lock);
  int on = ear.listening;
  pthread_mutex_unlock(&ear.lock);
  return on;
}

int mt__departure_heard(int *rank, char *reason, size_t n) {
  pthread_mutex_lock(&ear.lock);
  int done = 0;
  if (ear.listening && MPI_Test(&ear.recv, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
      done) {
    if (!ear.has_heard) {
      ear.heard = ear.in;
      ear.heard.reason[sizeof ear.heard.reason - 1] = '\0';
      ear.has_heard = 1;
    }
    if (post() != MPI_SUCCESS) ear.listening = 0;
  }
  int heard = ear.has_heard;
  if (heard) {
    *rank = ear.heard.rank;
    snprintf(reason, n, "%s", ear.heard.reason);
  }
  pthread_mutex_unlock(&ear.lock);
  return heard;
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
  notice mine = {me, ""};
  snprintf(mine.reason, sizeof mine.reason, "%s", reason != NULL ? reason : "");
  tell_everyone(comm, me, size, &mine);
  rc = MPI_Wait(&barrier, MPI_STATUS_IGNORE);
  return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Wait");
}
