/* Shared by io.c (the calls, their checks and agreements) and io_slabs.c (the
 * pipelined path of interleaved boxes). */
#ifndef MPITENSOR_IO_PRIVATE_H
#define MPITENSOR_IO_PRIVATE_H

#include <mpi.h>
#include <stdint.h>

#include "comm-private.h"
#include "mpitensor/io.h"

/* Adds to the process-wide data bytes read from or written to files. */
void mt__io_count(int64_t read, int64_t written);

/* Local. Writes `len` bytes from `out` at byte `at` of the file `fd`, or (out
 * NULL) reads them into `in`, whole: pwrite and pread may move less than asked.
 * 0, or the errno of the failure (EIO when the file ends first). */
int mt__io_transfer(int fd, const char *out, char *in, int64_t len, int64_t at);

/* One interleaved transfer through row slabs: `boxes` holds every rank's box of
 * `array` (comm rank order); `buf` is this rank's, C-contiguous. `fd` is the file,
 * open on every rank (or -1 on a rank that failed to open it, whose status is in
 * `rc`). `chunk` (bytes) and `threaded` are the same on every rank. */
typedef struct mt__slab_io {
  MPI_Comm comm;
  const mt_io_array *array;
  const mt_box *boxes;
  int fd;
  int64_t chunk;
  int threaded;
} mt__slab_io;

/* Collective on s->comm. Writes the array into the file: the boxes, which tile
 * the array, are exchanged in memory into one run of the file per rank (its row
 * slab), chunk by chunk, while an I/O thread writes the previous chunk. `rc` is
 * this rank's status so far; a failure on any rank stops every rank at the same
 * chunk. Returns this rank's own status (the caller agrees on it). */
int mt__slabs_write(const mt__slab_io *s, int rc, const void *buf, mt_error *err);

/* Collective on s->comm. The reverse: each rank reads its row slab of the boxes'
 * rows, chunk by chunk, and the chunks are exchanged into every rank's box of
 * `buf` while the next chunk is read. */
int mt__slabs_read(const mt__slab_io *s, int rc, void *buf, mt_error *err);

#endif
