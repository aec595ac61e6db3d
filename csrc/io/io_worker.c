/* The I/O worker of the pipelined path (io_slabs.c): one POSIX thread that writes
 * or reads the chunks posted to it, in order, while the calling thread prepares
 * the next one. It makes no MPI call, so no MPI thread level is needed; when the
 * thread cannot start (or is not asked for) each job runs inline when posted. */
#include <errno.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "io-private.h"

int mt__io_transfer(int fd, const char *out, char *in, int64_t len, int64_t at) {
  int64_t moved = 0;
  while (moved < len) {
    size_t want = (size_t)(len - moved);
    off_t where = (off_t)(at + moved);
    ssize_t n = out != NULL ? pwrite(fd, out + moved, want, where)
                            : pread(fd, in + moved, want, where);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO; /* the file ended before the array did */
    moved += (int64_t)n;
  }
  return 0;
}

static int transfer(int fd, int writing, const mt__io_job *j) {
  return mt__io_transfer(fd, writing ? j->buf : NULL, writing ? NULL : j->buf, j->len, j->at);
}

static void *work(void *arg) {
  mt__io_worker *w = arg;
  pthread_mutex_lock(&w->lock);
  for (;;) {
    while (!w->stop && w->done == w->posted) pthread_cond_wait(&w->cond, &w->lock);
    if (w->done == w->posted) break;
    mt__io_job j = w->jobs[w->done % 2];
    int skip = w->error != 0; /* after a failure the rest only counts as done */
    pthread_mutex_unlock(&w->lock);
    int e = skip ? 0 : transfer(w->fd, w->writing, &j);
    pthread_mutex_lock(&w->lock);
    if (e != 0 && w->error == 0) w->error = e;
    w->done++;
    pthread_cond_broadcast(&w->cond);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

void mt__worker_start(mt__io_worker *w, int fd, int writing, int threaded) {
  memset(w, 0, sizeof *w);
  w->fd = fd, w->writing = writing;
  if (!threaded || pthread_mutex_init(&w->lock, NULL) != 0) return;
  if (pthread_cond_init(&w->cond, NULL) != 0) {
    pthread_mutex_destroy(&w->lock);
    return;
  }
  w->threaded = pthread_create(&w->thread, NULL, work, w) == 0;
  if (!w->threaded) {
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
  }
}

void mt__worker_post(mt__io_worker *w, char *buf, int64_t len, int64_t at) {
  mt__io_job j = {buf, len, at};
  if (!w->threaded) {
    if (w->error == 0) w->error = transfer(w->fd, w->writing, &j);
    w->posted++, w->done++;
    return;
  }
  pthread_mutex_lock(&w->lock);
  w->jobs[w->posted % 2] = j;
  w->posted++;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

int mt__worker_wait(mt__io_worker *w, int64_t count) {
  if (!w->threaded) return w->error;
  pthread_mutex_lock(&w->lock);
  while (w->done < count) pthread_cond_wait(&w->cond, &w->lock);
  int e = w->error;
  pthread_mutex_unlock(&w->lock);
  return e;
}

int mt__worker_stop(mt__io_worker *w) {
  if (!w->threaded) return w->error;
  pthread_mutex_lock(&w->lock);
  w->stop = 1;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL);
  pthread_cond_destroy(&w->cond);
  pthread_mutex_destroy(&w->lock);
  return w->error;
}
