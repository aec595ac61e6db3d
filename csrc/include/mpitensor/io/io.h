/* Sharded files: each member of a mesh writes or reads its own box of one C-order
 * array that starts at a byte offset of one file, in one collective call (POSIX
 * I/O by each member, or collective MPI-IO where boxes interleave in long runs),
 * so a tensor saved by N ranks is an ordinary file that M ranks read back.
 *
 * The file format (the .npy header) is the caller's business: the core writes the
 * header bytes it is given and moves data bytes, whatever their element type.
 * Every failure on any member comes back on every member as the same status and
 * message, so no rank is ever left alone in a collective. */
#ifndef MPITENSOR_IO_H
#define MPITENSOR_IO_H

#include <mpi.h>
#include <stdatomic.h>
#include <stdint.h>

#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The array that a file holds: a C-order array of `shape` (ndim dims) with
 * `itemsize`-byte elements, starting at byte `offset` of the file. */
typedef struct mt_io_array {
  int ndim;
  int64_t shape[MT_MAX_NDIM];
  int64_t itemsize;
  int64_t offset;
} mt_io_array;

/* Local. The file datatype of `box` (ndim equal to the array's) within `array`:
 * a committed datatype of the box's bytes, in file order, placed relative to byte
 * *disp of the file. Counts and strides above INT_MAX bytes go through nested
 * derived types, so boxes and files of any size work. An empty box gives
 * MPI_BYTE and *nbytes 0. Free any other type with MPI_Type_free. */
int mt_io_box_type(const mt_io_array *array, const mt_box *box, MPI_Datatype *type,
                   int64_t *disp, int64_t *nbytes, mt_error *err);

/* Data bytes read from and written to files by mt_io_save / mt_io_load (headers
 * not counted): what this process itself transferred. For boxes of many short runs
 * that is its row slab; otherwise its box. Zero-initialise it; the cells are
 * atomic (read them with atomic_load) and only grow. */
typedef struct mt_io_counters {
  _Atomic int64_t read_bytes, written_bytes;
} mt_io_counters;

/* Local. The bytes `counters` have counted, read and written. */
MT_EXPORT void mt_io_counters_read(const mt_io_counters *counters, int64_t *read,
                                   int64_t *written);

/* How one save or load moves its data. Boxes of many short runs go through row
 * slabs, exchanged and transferred in chunks of about `chunk_bytes` per rank (at
 * least one row; every rank uses the smallest value any rank passed); with
 * `io_thread` nonzero a POSIX thread that makes no MPI call writes or reads one
 * chunk while the next is exchanged (with 0, or when the thread cannot start, each
 * chunk's transfer runs after its exchange). `durable` zero skips a save's syncs
 * and starts no device write, as numpy.save: the replacement stays whole or
 * nothing for every process, a killed saving job included (what it wrote is in
 * the page cache, which outlives it), but a crash of the machine may leave at
 * `path` the old file, the new one, or the new name on bytes never written, as it
 * may leave numpy.save's file cut short. `durable` MT_IO_DURABLE_FILE syncs the
 * file but not its directory after the rename: for a caller that saves several
 * files into one directory and syncs it once, after the last (a state_dict's
 * entries, before its index). `counters`, when not NULL, count the bytes this
 * process moved. */
#define MT_IO_DURABLE_FILE 2

typedef struct mt_io_options {
  int64_t chunk_bytes;
  int io_thread;
  int durable;
  mt_io_counters *counters;
} mt_io_options;

/* Local. The defaults: chunks of 2 MiB, the I/O thread, durable saves, no counters.
 *
 *   mt_io_options opts = mt_io_options_default();
 *   opts.counters = &my_counters;
 *   rc = mt_io_save(mesh, path, hdr, hlen, &array, &box, buf, len, &opts, &err);
 */
MT_EXPORT mt_io_options mt_io_options_default(void);

/* Collective on the mesh. Writes a new file at `path`: `hlen` bytes of `header`
 * at offset 0 (all members pass the same header; the first member writes it),
 * then the array, of which this rank supplies `box` from the C-contiguous buffer
 * `buf` of `buflen` bytes, which must be the box's (an empty box contributes
 * nothing). Arguments are checked on every member before any data moves. The
 * file is sized to exactly array->offset plus the array's bytes. Boxes of many
 * short runs that tile the array are written as `opts` says (NULL: the defaults).
 * The file is written under a temporary name in the same directory
 * (`<name cut to 200 bytes>.<hex>-<hex>.tmp`, created by the first member before
 * the others open it), and put at `path` by the first member (swapped with an
 * existing file in one step where the system can, which it then removes; else
 * renamed), only after every member has written its part: an existing file at
 * `path` is replaced whole or not at all; its clean cached pages are released
 * before any member writes (mt_io_release_cache; on one node each member its
 * share of them). Unless `opts->durable` is 0 (then
 * nothing is synced), the new file survives a power cut once this returns: the
 * first member allocates the file's blocks when it creates it, each member writes
 * back the bytes it wrote (mt_io_sync_range, started piece by piece as it writes
 * them, for independent runs), the first member then
 * fsyncs the file (every member does, when they lie on several nodes) before the
 * rename and the directory after it. `path` itself is
 * replaced (a symlink too: callers resolve it first); members that pass different
 * paths fail. On failure the temporary file is removed and MT_EIO (or the first
 * error) returns on every member with the message of the member that failed
 * first. */
MT_EXPORT int mt_io_save(mt_mesh *mesh, const char *path, const void *header,
                         int64_t hlen, const mt_io_array *array, const mt_box *box,
                         const void *buf, int64_t buflen, const mt_io_options *opts,
                         mt_error *err);

/* Collective on the mesh. Reads this rank's `box` of `array` from the existing
 * file `path` into the C-contiguous buffer `buf` of `buflen` bytes, which must be
 * the box's (an empty box reads nothing). Boxes of many short runs are read as
 * row slabs, one run per member, and exchanged into the boxes, as `opts` says
 * (NULL: the defaults). Boxes may overlap. MT_EIO on every member when the file
 * cannot be opened or is too short to hold the array. */
MT_EXPORT int mt_io_load(mt_mesh *mesh, const char *path, const mt_io_array *array,
                         const mt_box *box, void *buf, int64_t buflen,
                         const mt_io_options *opts, mt_error *err);

/* Local. Writes back bytes [at, at + len) of the open file `fd` (named `path`
 * in messages) and waits until the device has them: on Linux sync_file_range,
 * which leaves the rest of the file alone, so members that wrote apart in one
 * file sync at once without waiting for each other's bytes; elsewhere fsync. It
 * does not make the file durable by itself: the file's metadata and the device's
 * write cache need one fsync of the file afterwards. len 0 syncs nothing. MT_EIO
 * with the system's reason on failure.
 *
 *   rc = mt_io_sync_range(fd, at, nbytes, path, &err);  // then one fsync(fd)
 */
MT_EXPORT int mt_io_sync_range(int fd, int64_t at, int64_t len, const char *path,
                               mt_error *err);

/* Local. Swaps the names `a` and `b` in one step (renameat2's exchange), so that
 * a file or directory is replaced whole or not at all. MT_ENOTSUP, with nothing
 * changed, where either is missing or the system or file system cannot swap;
 * MT_EIO for any other failure.
 *
 *   if (mt_io_exchange(tmp, path, &err) == MT_OK) remove_tree(tmp);  // the old one
 */
MT_EXPORT int mt_io_exchange(const char *a, const char *b, mt_error *err);

/* Local. Drops the cached pages of the regular file at `path`, which a save is
 * about to replace, when none is dirty; the file stays whole on the device. The
 * new file's pages then reuse those just freed, as numpy.save's truncation of the
 * old file lets its writes do, instead of taking free memory that has lain unused:
 * in a virtual machine that hands such memory back to its host (free page
 * reporting), the first touch of each of those pages faults in the host and costs
 * several times the copy into it. Dirty pages stay, since dropping them would
 * start their write-back, device writes for a file the save then removes; so does
 * everything where the kernel cannot count them (cachestat, Linux 6.5). A symlink,
 * a missing file or anything but a regular file is let be. mt_io_save calls it;
 * a Zarr save calls it on the chunk files of the store it replaces.
 *
 *   mt_io_release_cache("/data/run.npy");  // then write the new file
 */
MT_EXPORT void mt_io_release_cache(const char *path);

#ifdef __cplusplus
}
#endif
#endif
