/* Shared by the io library's files. Calls go one way: io.c (the calls, their
 * checks and agreements) uses io_slabs.c (the pipelined path of interleaved
 * boxes), which uses io_rows.c (the row geometry of C-order boxes) and io_worker.c
 * (the I/O thread), which use nothing of the io library. */
#ifndef MPITENSOR_IO_PRIVATE_H
#define MPITENSOR_IO_PRIVATE_H

#include <mpi.h>
#include <pthread.h>
#include <stdint.h>

#include "mpitensor/comm/counters.h"
#include "mpitensor/core/status.h"
#include "mpitensor/io/io.h"

/* Adds to the caller's counters (when given) the data bytes this process read from
 * or wrote to files. */
static inline void mt__io_count(mt_io_counters *counters, int64_t read,
                                int64_t written) {
  if (counters == NULL) return;
  atomic_fetch_add_explicit(&counters->read_bytes, read, memory_order_relaxed);
  atomic_fetch_add_explicit(&counters->written_bytes, written, memory_order_relaxed);
}

/* Local. Writes `len` bytes from `out` at byte `at` of the file `fd`, or (out
 * NULL) reads them into `in`, whole: pwrite and pread may move less than asked.
 * 0, or the errno of the failure (EIO when the file ends first). */
int mt__io_transfer(int fd, const char *out, char *in, int64_t len, int64_t at);

/* ---- geometry of C-order boxes by rows of dim 0 (io_rows.c) ----------------- */

/* Local. `b` cut to rows [start, end) of dim 0 (empty when they miss it). */
mt_box mt__rows_of(const mt_box *b, int64_t start, int64_t end);

/* Local. Whole rows [start, end) of the array, as a box. */
mt_box mt__whole_rows(const mt_io_array *a, int64_t start, int64_t end);

/* Local. Where the rows of `part` start in the C-contiguous buffer of `whole`
 * (elements of `itemsize` bytes), which holds them as one run: a box's rows of
 * dim 0 are consecutive in it. */
int64_t mt__row_at(int64_t itemsize, const mt_box *whole, const mt_box *part);

/* Local. Copies `part`, held C-contiguous at `piece`, into its place in `buf`,
 * the C-contiguous array of box `whole`. */
void mt__unpack_box(int64_t itemsize, const mt_box *part, const char *piece, char *buf,
                    const mt_box *whole);

/* ---- the I/O worker (io_worker.c): one thread, jobs in order, at most two posted */

typedef struct mt__io_job {
  char *buf;
  int64_t len, at;
} mt__io_job;

typedef struct mt__io_worker {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  pthread_t thread;
  int fd, writing, threaded, stop;
  int64_t posted, done;
  mt__io_job jobs[2];
  int error; /* the first errno of a transfer, or 0 */
} mt__io_worker;

/* Local. Starts the thread that writes (or reads) `fd` when `threaded` and
 * possible; otherwise jobs run inline when posted. */
void mt__worker_start(mt__io_worker *w, int fd, int writing, int threaded);

/* Local. Job number w->posted: `len` bytes of `buf` at byte `at` of the file. The
 * caller has waited for job posted - 2, so a slot is free. */
void mt__worker_post(mt__io_worker *w, char *buf, int64_t len, int64_t at);

/* Local. Waits until `count` jobs are done; the first error so far (an errno), or 0. */
int mt__worker_wait(mt__io_worker *w, int64_t count);

/* Local. Lets the thread finish what was posted and joins it; the first error, or 0. */
int mt__worker_stop(mt__io_worker *w);

/* One interleaved transfer through row slabs: `boxes` holds every rank's box of
 * `array` (comm rank order); `buf` is this rank's, C-contiguous. `fd` is the file,
 * open on every rank (or -1 on a rank that failed to open it, whose status is in
 * `rc`). `chunk` (bytes) is the same on every rank; `threaded` is this process's
 * option (mt_io_options). The bytes moved are counted into
 * `comm_counters` (the mesh's) and `io_counters`, either of which may be NULL. */
typedef struct mt__slab_io {
  MPI_Comm comm;
  const mt_io_array *array;
  const mt_box *boxes;
  int fd;
  int64_t chunk;
  int threaded;
  mt_comm_counters *comm_counters;
  mt_io_counters *io_counters;
} mt__slab_io;

/* Collective on s->comm. Writes the array into the file: the boxes, which tile
 * the array, are exchanged in memory into one run of the file per rank (its row
 * slab), chunk by chunk, while an I/O thread writes the previous chunk. `rc` is
 * this rank's status so far; a failure on any rank stops every rank at the same
 * chunk. Returns this rank's own status (the caller agrees on it). */
int mt__slabs_write(const mt__slab_io *s, int rc, const void *buf, mt_error *err);

/* Local. The bytes of the file that this rank's slab covers: where
 * mt__slabs_write wrote on this rank (len 0 when its slab is empty). */
void mt__slab_range(const mt__slab_io *s, int64_t *at, int64_t *len);

/* Collective on s->comm. The reverse: each rank reads its row slab of the boxes'
 * rows, chunk by chunk, and the chunks are exchanged into every rank's box of
 * `buf` while the next chunk is read. */
int mt__slabs_read(const mt__slab_io *s, int rc, void *buf, mt_error *err);

#endif
