/* The handle of pending.h: the exchange it owns behind a mutex, taken out by the
 * first wait, and a flag read without the lock once that wait has finished. */
#include "mpitensor/comm/pending.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct mt_pending {
  pthread_mutex_t lock; /* held by the wait that completes the exchange */
  _Atomic(mt_request *) req;
  _Atomic(mt_exchange *) ex;
  atomic_int done;
};

/* Completes whichever exchange the caller took out. */
static int complete(mt_request *req, mt_exchange *ex, mt_error *err) {
  if (req != NULL) return mt_request_wait(req, err);
  return ex != NULL ? mt_exchange_wait(ex, err) : MT_OK;
}

int mt_pending_create(mt_request *req, mt_exchange *ex, mt_pending **out, mt_error *err) {
  mt_pending *p = malloc(sizeof *p);
  if (p == NULL || pthread_mutex_init(&p->lock, NULL) != 0) {
    free(p);
    mt_error ignored = {0};
    complete(req, ex, &ignored);
    return mt_error_set(err, MT_ENOMEM, "no memory for the handle of an exchange");
  }
  atomic_init(&p->req, req);
  atomic_init(&p->ex, ex);
  atomic_init(&p->done, 0);
  *out = p;
  return MT_OK;
}

int mt_pending_wait(mt_pending *p, mt_error *err) {
  if (atomic_load(&p->done)) return MT_OK;
  pthread_mutex_lock(&p->lock);
  mt_request *req = atomic_exchange(&p->req, NULL);
  mt_exchange *ex = atomic_exchange(&p->ex, NULL);
  int rc = complete(req, ex, err);
  atomic_store(&p->done, 1);
  pthread_mutex_unlock(&p->lock);
  return rc;
}

int mt_pending_test(mt_pending *p, int *done, mt_error *err) {
  if (atomic_load(&p->req) == NULL && atomic_load(&p->ex) == NULL) {
    *done = atomic_load(&p->done);
    return MT_OK;
  }
  int rc = MT_OK, finished = 1;
  pthread_mutex_lock(&p->lock);
  /* A wait takes both out under the lock: none left means it has completed. */
  mt_request *req = atomic_load(&p->req);
  mt_exchange *ex = atomic_load(&p->ex);
  if (ex != NULL) rc = mt_exchange_test(ex, &finished, err);
  else if (req != NULL) rc = mt_request_test(req, &finished, err);
  pthread_mutex_unlock(&p->lock);
  if (rc == MT_OK) *done = finished;
  return rc;
}

int mt_pending_done(const mt_pending *p) { return atomic_load(&p->done); }

void mt_pending_destroy(mt_pending *p) {
  if (p == NULL) return;
  mt_error ignored = {0};
  mt_pending_wait(p, &ignored);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
