/* Sharded files: each rank writes or reads its own box of one array in one file.
 * How depends on every rank's box, decided alike everywhere:
 * - every box one run of the file: each rank pwrites / preads its run on its own
 *   descriptor (no shared handle, no collective open);
 * - some box many runs shorter than LONG_RUN (Shard(1)): row slabs, one run per
 *   rank, exchanged in memory chunk by chunk (io_slabs.c);
 * - otherwise (long runs, or boxes that do not tile the array on a save): one
 *   file view per rank and one collective MPI-IO write or read.
 *
 * For MPI-IO a box is described as nested hvectors of byte runs rather than as an
 * MPI_Type_create_subarray, whose int sizes cap every dim at INT_MAX elements and
 * whose extent spans the whole array; here every count, stride and displacement
 * is 64-bit safe, and the box's start goes into the view's displacement. Between
 * phases the members agree on the first failure (mt_agree_comm) so that they all
 * return it. */
#include "mpitensor/io/io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include "io-private.h"
#include "mpitensor/comm/agree.h"

/* ---- datatypes --------------------------------------------------------------- */

/* `count` copies of `inner`, `stride` bytes apart (count <= INT_MAX). */
static int hvector(int64_t count, int64_t stride, MPI_Datatype inner, MPI_Datatype *out) {
  MPI_Aint lb = 0, extent = 0;
  int rc = MPI_Type_get_extent(inner, &lb, &extent);
  if (rc != MPI_SUCCESS) return rc;
  if ((int64_t)extent == stride) return MPI_Type_contiguous((int)count, inner, out);
  return MPI_Type_create_hvector((int)count, 1, (MPI_Aint)stride, inner, out);
}

/* Any count: MPI counts are ints, so above INT_MAX the copies go in groups of
 * 2**30, and a struct appends the remainder after the last whole group. */
static int repeat(int64_t count, int64_t stride, MPI_Datatype inner, MPI_Datatype *out) {
  if (count <= INT_MAX) return hvector(count, stride, inner, out);
  const int64_t group = (int64_t)1 << 30;
  int64_t q = count / group, r = count % group;
  MPI_Datatype g = MPI_DATATYPE_NULL, whole = MPI_DATATYPE_NULL, rest = MPI_DATATYPE_NULL;
  int rc = hvector(group, stride, inner, &g);
  if (rc == MPI_SUCCESS) rc = hvector(q, group * stride, g, r == 0 ? out : &whole);
  if (rc == MPI_SUCCESS && r != 0) rc = hvector(r, stride, inner, &rest);
  if (rc == MPI_SUCCESS && r != 0) {
    int lens[2] = {1, 1};
    MPI_Aint disps[2] = {0, (MPI_Aint)(q * group * stride)};
    MPI_Datatype types[2] = {whole, rest};
    rc = MPI_Type_create_struct(2, lens, disps, types, out);
  }
  if (g != MPI_DATATYPE_NULL) MPI_Type_free(&g);
  if (whole != MPI_DATATYPE_NULL) MPI_Type_free(&whole);
  if (rest != MPI_DATATYPE_NULL) MPI_Type_free(&rest);
  return rc;
}

/* Wraps `*type` in `count` copies `stride` bytes apart, replacing it. */
static int wrap(int64_t count, int64_t stride, MPI_Datatype *type) {
  MPI_Datatype outer;
  int rc = repeat(count, stride, *type, &outer);
  if (*type != MPI_BYTE) MPI_Type_free(type);
  *type = rc == MPI_SUCCESS ? outer : MPI_DATATYPE_NULL;
  return rc;
}

static int check_box(const mt_io_array *a, const mt_box *box, mt_error *err) {
  if (a->ndim < 0 || a->ndim > MT_MAX_NDIM || box->ndim != a->ndim || a->itemsize < 1 ||
      a->offset < 0) {
    return mt_error_set(err, MT_EINVAL,
                        "a box of %d dims does not fit an array of %d dims", box->ndim,
                        a->ndim);
  }
  for (int d = 0; d < a->ndim; ++d) {
    int64_t o = box->offset[d], s = box->shape[d], n = a->shape[d];
    if (n < 0 || s < 0 || (s > 0 && (o < 0 || o > n - s))) {
      return mt_error_set(err, MT_EINDEX,
                          "dim %d of the box (offset %lld, size %lld) lies "
                          "outside the array's %lld",
                          d, (long long)o, (long long)s, (long long)n);
    }
  }
  return MT_OK;
}

/* Dims inner to the first one the box does not span whole form one byte run. */
static int64_t run_start(const mt_io_array *a, const mt_box *box, int64_t *run) {
  int k = a->ndim - 1;
  *run = a->itemsize * (a->ndim > 0 ? box->shape[k] : 1);
  while (k > 0 && box->shape[k] == a->shape[k]) *run *= box->shape[--k];
  return k;
}

int mt_io_box_type(const mt_io_array *array, const mt_box *box, MPI_Datatype *type,
                   int64_t *disp, int64_t *nbytes, mt_error *err) {
  int rc = check_box(array, box, err);
  if (rc != MT_OK) return rc;
  int64_t n = mt_box_numel(box), stride[MT_MAX_NDIM], step = array->itemsize;
  if (n == 0) {
    *type = MPI_BYTE, *disp = array->offset, *nbytes = 0;
    return MT_OK;
  }
  int64_t at = array->offset;
  for (int d = array->ndim - 1; d >= 0; --d) {
    stride[d] = step;
    step *= array->shape[d];
    at += box->offset[d] * stride[d];
  }
  int64_t run = 0;
  int64_t k = run_start(array, box, &run);
  MPI_Datatype t = MPI_BYTE;
  int mrc = wrap(run, 1, &t);
  for (int64_t d = k - 1; mrc == MPI_SUCCESS && d >= 0; --d) {
    if (box->shape[d] > 1) mrc = wrap(box->shape[d], stride[d], &t);
  }
  if (mrc == MPI_SUCCESS) mrc = MPI_Type_commit(&t);
  if (mrc != MPI_SUCCESS) {
    if (t != MPI_DATATYPE_NULL && t != MPI_BYTE) MPI_Type_free(&t);
    return mt_mpi_error(err, mrc, "building the file type of a box");
  }
  *type = t, *disp = at, *nbytes = n * array->itemsize;
  return MT_OK;
}

/* A committed datatype of `nbytes` contiguous bytes, and the count to send of it. */
static int bytes_type(int64_t nbytes, MPI_Datatype *type, int *count, mt_error *err) {
  *type = MPI_BYTE, *count = (int)(nbytes > 0);
  if (nbytes == 0) return MT_OK;
  int rc = wrap(nbytes, 1, type);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(type);
  return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Type_contiguous");
}

static void free_type(MPI_Datatype *t) {
  if (*t != MPI_BYTE && *t != MPI_DATATYPE_NULL) MPI_Type_free(t);
}

/* ---- options ---------------------------------------------------------------- */

void mt_io_counters_read(const mt_io_counters *c, int64_t *read, int64_t *written) {
  *read = atomic_load(&c->read_bytes);
  *written = atomic_load(&c->written_bytes);
}

mt_io_options mt_io_options_default(void) {
  /* The pipeline's chunk per rank: a few MiB keeps both the exchange and the
   * writes efficient while letting them overlap. */
  mt_io_options o = {(int64_t)2 << 20, 1, 1, NULL};
  return o;
}

/* ---- agreement --------------------------------------------------------------- */

/* Every phase ends in the agreement primitive (agree.h), so every rank returns the
 * first failure's status and message. */
static int agree(MPI_Comm comm, int rc, mt_error *err) {
  return mt_agree_comm(comm, rc, NULL, 0, err);
}

/* File errors are I/O errors for the user, whatever MPI's error class. */
static int io_fail(mt_error *err, int rc, const char *what, const char *path) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) strcpy(text, "unknown MPI error");
  return mt_error_set(err, MT_EIO, "%s of '%s' failed: %s", what, path, text);
}

/* ---- one call ---------------------------------------------------------------- */

typedef struct io_call {
  MPI_Comm comm;
  int rank, size;
  MPI_Datatype ftype, mtype;
  int64_t disp;
  int count;
  int contiguous; /* every rank's box is one run of the file */
  int short_runs; /* some rank's box is many runs, each short: it goes through slabs */
  int threaded;   /* this rank's I/O thread option (ranks may differ) */
  int durable;    /* sync the file (every rank passes the same) */
  int sync_dir;   /* durable, and the directory after the rename too */
  int sync_all;   /* durable, on several nodes: every rank syncs the whole file */
  int64_t chunk;  /* the slab pipeline's chunk, the same on every rank */
  mt_comm_counters *comm_counters; /* the mesh's */
  mt_io_counters *io_counters;     /* the caller's */
  int64_t end;    /* the file's final size: the array's offset plus its bytes */
  mt_box box;     /* this rank's */
  mt_box *boxes;  /* every rank's, when short_runs */
} io_call;

/* Runs shorter than this, many to a box, are exchanged into slabs: per run, a
 * seek or an MPI-IO piece costs more than moving the bytes through memory. */
#define LONG_RUN ((int64_t)4 << 20)

/* Whether `t` covers its extent without holes. */
static int is_contiguous(MPI_Datatype t) {
  MPI_Count size = 0, lb = 0, extent = 0;
  MPI_Type_size_x(t, &size);
  MPI_Type_get_true_extent_x(t, &lb, &extent);
  return t == MPI_BYTE || size == extent;
}

/* Whether the box is more than one run of the file, each shorter than LONG_RUN. */
static int has_short_runs(const mt_io_array *a, const mt_box *box) {
  if (mt_box_numel(box) == 0) return 0;
  int64_t run = 0;
  int64_t k = run_start(a, box, &run);
  int many = 0;
  for (int64_t d = 0; d < k; ++d) many = many || box->shape[d] > 1;
  return many && run < LONG_RUN;
}

static int64_t array_bytes(const mt_io_array *a) {
  int64_t n = a->itemsize;
  for (int d = 0; d < a->ndim; ++d) n *= a->shape[d];
  return n;
}

/* Local. The types of this rank's box, in the file and in memory, and room for
 * every rank's box. */
static int prepare(io_call *c, const mt_io_array *a, const mt_box *box, int64_t buflen,
                   mt_error *err) {
  int64_t nbytes = 0;
  c->ftype = c->mtype = MPI_BYTE;
  c->end = a->offset + array_bytes(a);
  c->box = *box;
  int rc = mt_io_box_type(a, box, &c->ftype, &c->disp, &nbytes, err);
  if (rc == MT_OK && nbytes != buflen) {
    rc = mt_error_set(err, MT_EINVAL, "the buffer holds %lld bytes; the box needs %lld",
                      (long long)buflen, (long long)nbytes);
  }
  if (rc == MT_OK) rc = bytes_type(nbytes, &c->mtype, &c->count, err);
  c->boxes = rc == MT_OK ? malloc((size_t)c->size * sizeof *c->boxes) : NULL;
  if (rc == MT_OK && c->boxes == NULL)
    rc = mt_error_set(err, MT_ENOMEM, "out of memory");
  return rc;
}

/* Collective. Checks the arguments everywhere and decides how the data moves.
 * Two-phase collective buffering pays off when boxes interleave in the file; when
 * every box is one run it only adds copies through aggregators (with Open MPI's
 * OMPIO it writes slower than plain writes), so then each rank moves its run
 * itself, as ROMIO's automatic mode decides. Boxes of many short runs go through
 * row slabs (io_slabs.c), for which every rank learns every box.
 * `rc` is the caller's own verdict so far; `extra` (n <= 2 values) is reduced to
 * its minimum. */
static int start(io_call *c, mt_mesh *mesh, int rc, const mt_io_array *a,
                 const mt_box *box, int64_t buflen, int64_t *extra, int n, mt_error *err) {
  c->ftype = c->mtype = MPI_BYTE;
  int mrc = mt_mesh_comm(mesh, &c->comm, err);
  if (mrc != MT_OK) return mrc;
  c->comm_counters = mt_mesh_counters(mesh);
  mt_mesh_nodes nodes;
  mt_mesh_nodes_of(mesh, &nodes);
  c->sync_all = nodes.kind != MT_NODES_ONE;
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  if (rc == MT_OK) rc = prepare(c, a, box, buflen, err);
  int64_t v[5] = {rc == MT_OK && is_contiguous(c->ftype),
                  rc != MT_OK || !has_short_runs(a, box), c->chunk > 0 ? c->chunk : 1};
  for (int i = 0; i < n; ++i) v[3 + i] = extra[i];
  rc = mt_agree_comm(c->comm, rc, v, 3 + n, err);
  c->contiguous = (int)v[0], c->short_runs = !v[1], c->chunk = v[2];
  for (int i = 0; i < n; ++i) extra[i] = v[3 + i];
  if (rc == MT_OK && c->short_runs) {
    int bytes = (int)sizeof *c->boxes;
    mrc = MPI_Allgather(&c->box, bytes, MPI_BYTE, c->boxes, bytes, MPI_BYTE, c->comm);
    if (mrc != MPI_SUCCESS) rc = mt_mpi_error(err, mrc, "MPI_Allgather");
  }
  return rc;
}

/* The caller's options (NULL: the defaults) into the call. */
static void take_options(io_call *c, const mt_io_options *opts) {
  mt_io_options o = opts != NULL ? *opts : mt_io_options_default();
  c->chunk = o.chunk_bytes;
  c->threaded = o.io_thread != 0;
  c->durable = o.durable != 0;
  c->sync_dir = c->durable && o.durable != MT_IO_DURABLE_FILE;
  c->io_counters = o.counters;
}

static void finish(io_call *c) {
  free_type(&c->ftype);
  free_type(&c->mtype);
  free(c->boxes);
}

/* A failed system call on a file, as an I/O error with the system's reason. */
static int posix_fail(mt_error *err, const char *what, const char *path) {
  return mt_error_set(err, MT_EIO, "%s of '%s' failed: %s", what, path,
                      strerror(errno));
}

static int truncated(mt_error *err, const char *path, int64_t size, int64_t need) {
  return mt_error_set(err, MT_EIO,
                      "'%s' is truncated: it has %lld bytes, the array needs "
                      "%lld",
                      path, (long long)size, (long long)need);
}

/* Whether the boxes cover the array exactly once (the slabs of a save must be
 * filled whole): their sizes add up to it and no two overlap. Local. */
static int boxes_tile(const io_call *c, const mt_io_array *a) {
  if (c->boxes == NULL) return 0;
  int64_t total = 0;
  for (int r = 0; r < c->size; ++r) total += mt_box_numel(&c->boxes[r]);
  if (total != array_bytes(a) / a->itemsize) return 0;
  for (int r = 0; r < c->size; ++r) {
    for (int q = r + 1; q < c->size; ++q) {
      const mt_box *x = &c->boxes[r], *y = &c->boxes[q];
      int apart = mt_box_numel(x) == 0 || mt_box_numel(y) == 0;
      for (int d = 0; d < a->ndim && !apart; ++d) {
        apart = x->offset[d] + x->shape[d] <= y->offset[d] ||
                y->offset[d] + y->shape[d] <= x->offset[d];
      }
      if (!apart) return 0;
    }
  }
  return 1;
}

/* ---- save -------------------------------------------------------------------- */

/* Bytes of the target's name kept in its temporary name: with the suffix (at most
 * 35 bytes) any name the file system accepts (NAME_MAX, 255) gives a temporary
 * name it accepts too. checkpoint/_paths.py knows this form, to remove what a
 * killed save left. */
#define TEMP_NAME_KEEP 200

/* A temporary name beside `path`, the same on every rank:
 * `<name, cut to TEMP_NAME_KEEP bytes>.<pid>-<clock>.tmp` in hex, with rank 0's pid
 * and clock, so no two saves, even of crashed jobs, share one. */
static int temp_name(const char *path, const int64_t *nonce, char *out, size_t cap,
                     mt_error *err) {
  const char *slash = strrchr(path, '/');
  size_t dir = slash != NULL ? (size_t)(slash - path) + 1 : 0, name = strlen(path) - dir;
  int n = -1;
  if (dir + name < cap) {
    n = snprintf(out, cap, "%.*s%.*s.%llx-%llx.tmp", (int)dir, path,
                 (int)(name < TEMP_NAME_KEEP ? name : TEMP_NAME_KEEP), path + dir,
                 (unsigned long long)nonce[0], (unsigned long long)nonce[1]);
  }
  if (n < 0 || (size_t)n >= cap) {
    return mt_error_set(err, MT_EINVAL, "the path '%s' is too long", path);
  }
  return MT_OK;
}

/* The first rank creates the temporary file before any other rank opens it, and
 * they open it without O_CREAT: if it is removed meanwhile (a cleanup of
 * leftovers racing this save), the save fails instead of renaming into place a
 * file recreated by some ranks, holding their bytes only.
 * Given a `size` (a durable save), it allocates the file's blocks for that size
 * first, in as few extents as the file system can: the ranks start the
 * write-back of their pieces side by side (write_early), so blocks allocated as
 * the pages reach the device would interleave the ranks' pieces in many extents,
 * and a file system that discards what it frees waits once per extent when the
 * file is replaced. Where it cannot allocate ahead, the pages' write-back still
 * allocates them. */
static int create_temp(const char *tmp, int64_t size, mt_error *err) {
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return posix_fail(err, "open", tmp);
#if defined(__linux__)
  /* not posix_fallocate, which writes zeros where fallocate is refused */
  if (size > 0) (void)fallocate(fd, 0, 0, (off_t)size);
#else
  (void)size;
#endif
  return close(fd) == 0 ? MT_OK : posix_fail(err, "close", tmp);
}

/* The size of the file that `a` describes (its offset and its bytes), or 0 where
 * its shape is not one (start refuses it, on every rank). Local. */
static int64_t planned_size(const mt_io_array *a) {
  if (a->ndim < 0 || a->ndim > MT_MAX_NDIM || a->itemsize < 1 || a->offset < 0) return 0;
  int64_t n = a->itemsize;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] < 0 || (a->shape[d] > 0 && n > INT64_MAX / a->shape[d])) return 0;
    n *= a->shape[d];
  }
  return n <= INT64_MAX - a->offset ? a->offset + n : 0;
}

/* Every rank makes every collective call here, failed or not, so none waits. The
 * boxes cover the array, so the file ends exactly where its last byte lands. */
static int write_all(io_call *c, MPI_File fh, const void *header, int64_t hlen,
                     const void *buf, const char *path, mt_error *err) {
  int rc = MPI_SUCCESS, mine = MT_OK;
  if (c->rank == 0 && hlen > 0) {
    rc = MPI_File_write_at(fh, 0, header, (int)hlen, MPI_BYTE, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) mine = io_fail(err, rc, "writing the header", path);
  }
  rc = MPI_File_set_view(fh, (MPI_Offset)c->disp, MPI_BYTE, c->ftype, "native",
                         MPI_INFO_NULL);
  if (rc != MPI_SUCCESS && mine == MT_OK) mine = io_fail(err, rc, "MPI_File_set_view", path);
  rc = MPI_File_write_at_all(fh, 0, buf, c->count, c->mtype, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS && mine == MT_OK) {
    mine = io_fail(err, rc, "MPI_File_write_at_all", path);
  }
  return mine;
}

/* The collective path (boxes of long runs): opens, writes and closes `tmp`; on
 * every rank the agreed status. A collective write needs every rank's handle, so
 * its open is agreed first. */
static int write_file(io_call *c, const char *tmp, const void *header, int64_t hlen,
                      const void *buf, mt_error *err) {
  MPI_File fh = MPI_FILE_NULL;
  int rc = MPI_File_open(c->comm, tmp, MPI_MODE_WRONLY, MPI_INFO_NULL, &fh);
  int mine = rc == MPI_SUCCESS ? MT_OK : io_fail(err, rc, "MPI_File_open", tmp);
  int agreed = agree(c->comm, mine, err);
  /* A collective open fails on every rank or none; a handle left open by a
   * partial failure is not closed, since closing is collective too. */
  if (agreed != MT_OK) return agreed;
  mine = write_all(c, fh, header, hlen, buf, tmp, err);
  /* No MPI_File_sync: it fsyncs the whole file on every rank at once, each
   * waiting for all of it; the file is synced once, in commit. */
  rc = MPI_File_close(&fh);
  if (rc != MPI_SUCCESS && mine == MT_OK) mine = io_fail(err, rc, "MPI_File_close", tmp);
  return agree(c->comm, mine, err);
}

/* Opens `tmp` for this rank alone and writes the header on the first rank; -1 and
 * *mine set on failure. Independent writes need no shared handle (MPI-IO's
 * independent writes are these same pwrites behind a costlier open), and the
 * ranks agree through `comm` instead. */
static int open_for_writing(const io_call *c, const char *tmp, const void *header,
                            int64_t hlen, int *mine, mt_error *err) {
  int fd = open(tmp, O_WRONLY | O_CLOEXEC);
  *mine = fd >= 0 ? MT_OK : posix_fail(err, "open", tmp);
  if (*mine == MT_OK && c->rank == 0 && hlen > 0) {
    int e = mt__io_transfer(fd, header, NULL, hlen, 0);
    if (e != 0)
      *mine = mt_error_set(err, MT_EIO, "writing the header of '%s' failed: %s", tmp,
                           strerror(e));
  }
  return fd;
}

static int close_file(int fd, int mine, const char *path, mt_error *err) {
  if (fd >= 0 && close(fd) != 0 && mine == MT_OK) return posix_fail(err, "close", path);
  return mine;
}

/* Writes back bytes [at, at + len) of `fd` and waits for them: 0 or an errno.
 * On Linux through sync_file_range (wait for write-back under way, start it,
 * wait for it), which touches only this range, so ranks that wrote apart in one
 * file do not each wait for all of it, as concurrent fsyncs of the file do. It
 * neither commits the file's metadata (its size, its blocks, allocated as the
 * pages are written) nor flushes the device's write cache: that is left to one
 * fsync of the file (sync_file), cheap once the data is written. Elsewhere, or
 * where the call is refused, an fsync of the file. */
static int sync_range(int fd, int64_t at, int64_t len) {
  if (len <= 0) return 0; /* sync_file_range reads 0 as "to the end of the file" */
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
  unsigned flags =
      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
  if (sync_file_range(fd, (off_t)at, (off_t)len, flags) == 0) return 0;
  if (errno != ENOSYS && errno != EINVAL && errno != ESPIPE) return errno;
#endif
  return fsync(fd) == 0 ? 0 : errno;
}

int mt_io_sync_range(int fd, int64_t at, int64_t len, const char *path, mt_error *err) {
  if (at < 0 || len < 0) {
    return mt_error_set(err, MT_EINVAL, "cannot sync %lld bytes at byte %lld of '%s'",
                        (long long)len, (long long)at, path);
  }
  int e = sync_range(fd, at, len);
  if (e == 0) return MT_OK;
  errno = e;
  return posix_fail(err, "the write-back", path);
}

/* A writer's end: the bytes it wrote, written back before the file is renamed
 * into place (commit syncs the rest). */
static int sync_close(const io_call *c, int fd, int64_t at, int64_t len, int mine,
                      const char *path, mt_error *err) {
  if (c->durable && fd >= 0 && mine == MT_OK) {
    mine = mt_io_sync_range(fd, at, len, path, err);
  }
  return close_file(fd, mine, path, err);
}

/* A durable save's write-back starts piece by piece behind a rank's writes, so
 * that the device writes one piece while the next is copied in; started after
 * the last copy, it left the device idle meanwhile. Pieces end on multiples of
 * this file offset, so only the pages at a run's ends are shared. */
#define WRITEBACK_PIECE ((int64_t)4 << 20)

/* Starts the write-back of bytes [at, at + len) of `fd` without waiting for it.
 * A refusal is let be: the sync_range that follows writes them back. */
static void start_writeback(int fd, int64_t at, int64_t len) {
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
  (void)sync_file_range(fd, (off_t)at, (off_t)len, SYNC_FILE_RANGE_WRITE);
#else
  (void)fd, (void)at, (void)len;
#endif
}

/* Writes `len` bytes of `buf` at `at` of `fd`, starting the write-back of each
 * WRITEBACK_PIECE but the last once it is written: 0 or an errno. The caller's
 * sync_range waits for them all. */
static int write_early(int fd, const char *buf, int64_t len, int64_t at) {
  int64_t moved = 0;
  while (moved < len) {
    int64_t end = (at + moved) / WRITEBACK_PIECE * WRITEBACK_PIECE + WRITEBACK_PIECE - at;
    if (end > len) end = len;
    int e = mt__io_transfer(fd, buf + moved, NULL, end - moved, at + moved);
    if (e != 0) return e;
    if (end < len) start_writeback(fd, at + moved, end - moved);
    moved = end;
  }
  return 0;
}

/* The independent path: every box one run, each rank pwrites its own. Sizing the
 * file before its data lands spares the file system extending it under each
 * write; every rank sets the same final size, so no order
 * between them matters and no byte written is cut. */
static int write_runs(io_call *c, const char *tmp, const void *header, int64_t hlen,
                      const void *buf, int64_t buflen, mt_error *err) {
  int mine = MT_OK;
  int fd = open_for_writing(c, tmp, header, hlen, &mine, err);
  if (mine == MT_OK && buflen > 0 && ftruncate(fd, (off_t)c->end) != 0) {
    mine = posix_fail(err, "ftruncate", tmp);
  }
  int e = 0;
  if (mine == MT_OK && c->durable) e = write_early(fd, buf, buflen, c->disp);
  else if (mine == MT_OK) e = mt__io_transfer(fd, buf, NULL, buflen, c->disp);
  if (e != 0)
    mine = mt_error_set(err, MT_EIO, "writing '%s' failed: %s", tmp, strerror(e));
  return agree(c->comm, sync_close(c, fd, c->disp, buflen, mine, tmp, err), err);
}

/* The slab pipeline's view of this call. */
static mt__slab_io slab_io(const io_call *c, const mt_io_array *a, int fd) {
  mt__slab_io s = {.comm = c->comm,
                   .array = a,
                   .boxes = c->boxes,
                   .fd = fd,
                   .chunk = c->chunk,
                   .threaded = c->threaded,
                   .comm_counters = c->comm_counters,
                   .io_counters = c->io_counters};
  return s;
}

/* The slab path. The file is sized first, as in write_runs, by one rank: the
 * slabs' writers would each extend it. The pipeline agrees once before its first
 * round, and this once at the end. */
static int write_slabs(io_call *c, const mt_io_array *a, const char *tmp, const void *header,
                       int64_t hlen, const void *buf, mt_error *err) {
  int mine = MT_OK;
  int fd = open_for_writing(c, tmp, header, hlen, &mine, err);
  mt__slab_io s = slab_io(c, a, fd);
  if (mine == MT_OK && c->rank == 0 && ftruncate(fd, (off_t)c->end) != 0) {
    mine = posix_fail(err, "ftruncate", tmp);
  }
  mine = mt__slabs_write(&s, mine, buf, err);
  int64_t at = 0, len = 0;
  mt__slab_range(&s, &at, &len);
  return agree(c->comm, sync_close(c, fd, at, len, mine, tmp, err), err);
}

/* Syncs the directory that holds `path`, so that a rename into it survives a
 * power cut too. File systems that cannot sync a directory (EINVAL) keep their
 * own order, and are let be. */
static int sync_dir(const char *path, mt_error *err) {
  char dir[4096] = ".";
  const char *slash = strrchr(path, '/');
  size_t n = slash == NULL ? 0 : slash == path ? 1 : (size_t)(slash - path);
  if (n >= sizeof dir) return mt_error_set(err, MT_EINVAL, "the path '%s' is too long", path);
  if (n > 0) {
    memcpy(dir, path, n);
    dir[n] = '\0';
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = fd >= 0 && (fsync(fd) == 0 || errno == EINVAL) ? MT_OK
                                                         : posix_fail(err, "fsync", dir);
  if (fd >= 0) close(fd);
  return rc;
}

int mt_io_exchange(const char *a, const char *b, mt_error *err) {
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0) return MT_OK;
  if (errno != ENOENT && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
    return mt_error_set(err, MT_EIO, "swapping '%s' and '%s' failed: %s", a, b,
                        strerror(errno));
  }
  return mt_error_set(err, MT_ENOTSUP, "cannot swap '%s' and '%s': %s", a, b,
                      strerror(errno));
#else
  return mt_error_set(err, MT_ENOTSUP, "cannot swap '%s' and '%s': no renameat2", a, b);
#endif
}

/* Local. Puts `tmp` at `path` in one step. Over an existing name the two are
 * swapped (*swapped set: `tmp` then names the old file, for the caller to
 * remove): a plain rename over a file makes ext4 write out the whole new file
 * inside the rename (auto_da_alloc), on this one rank while the others wait,
 * which a swap does not: a save that is not durable then waits for no device
 * write, as numpy.save does not. A rename does it where nothing is at `path`, or
 * where the file system cannot swap. */
static int replace(const char *tmp, const char *path, int *swapped, mt_error *err) {
  *swapped = 0;
  int rc = mt_io_exchange(tmp, path, err);
  if (rc == MT_OK) {
    struct stat st;
    if (lstat(tmp, &st) == 0 && S_ISDIR(st.st_mode)) {
      /* rename refuses to replace a directory by a file: so does the save */
      (void)mt_io_exchange(tmp, path, err);
      return mt_error_set(err, MT_EIO, "renaming '%s' to '%s' failed: %s", tmp, path,
                          strerror(EISDIR));
    }
    *swapped = 1;
    return MT_OK;
  }
  if (rc != MT_ENOTSUP) return rc;
  if (rename(tmp, path) != 0) {
    return mt_error_set(err, MT_EIO, "renaming '%s' to '%s' failed: %s", tmp, path,
                        strerror(errno));
  }
  return MT_OK;
}

/* Syncs the whole file `path`: its metadata, what no rank's range covered (the
 * header), and the device's write cache. */
static int sync_file(const char *path, mt_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  int mine = fd >= 0 && fsync(fd) == 0 ? MT_OK : posix_fail(err, "fsync", path);
  return close_file(fd, mine, path, err);
}

/* Before the rename of a durable save, once every rank's bytes are written back:
 * on one node, one fsync by the first rank covers every rank's pages (they share
 * the page cache and the file's inode). Where the ranks lie on several nodes of
 * a shared file system, a sync flushes only what its own node wrote, so every
 * rank syncs, and they agree before the rename. */
static int sync_before_rename(const io_call *c, const char *tmp, mt_error *err) {
  if (!c->durable) return MT_OK;
  if (!c->sync_all) return c->rank == 0 ? sync_file(tmp, err) : MT_OK;
  return agree(c->comm, sync_file(tmp, err), err);
}

/* Rank 0 puts the finished file in place, removes the file it replaced (a
 * failure there leaves a temporary that the next save removes) and syncs the
 * directory; every rank learns the outcome, and no temporary is left once any
 * rank returns. The removal frees what numpy.save's truncation of the old file
 * frees, at the same cost, so it stays before the agreement. */
static int commit(io_call *c, const char *tmp, const char *path, mt_error *err) {
  int mine = sync_before_rename(c, tmp, err), swapped = 0;
  if (c->sync_all && mine != MT_OK) return mine; /* agreed already */
  if (c->rank == 0 && mine == MT_OK) mine = replace(tmp, path, &swapped, err);
  if (swapped) (void)unlink(tmp);
  if (c->rank == 0 && mine == MT_OK && c->sync_dir) mine = sync_dir(path, err);
  return agree(c->comm, mine, err);
}

/* Linux 6.5's cachestat, which headers older than the kernel lack: its number is
 * the same on x86-64 and in the generic table (arm64, riscv64). */
#if defined(__NR_cachestat)
#define MT_NR_CACHESTAT __NR_cachestat
#elif defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__) || \
                             (defined(__riscv) && __riscv_xlen == 64))
#define MT_NR_CACHESTAT 451
#endif

#if defined(MT_NR_CACHESTAT) && defined(POSIX_FADV_DONTNEED)
typedef struct cache_range {
  uint64_t off, len; /* len 0: to the end of the file */
} cache_range;
typedef struct cache_stat {
  uint64_t cached, dirty, writeback, evicted, recently_evicted;
} cache_stat;
#endif

/* The pages of share `part` of `parts` of a file of `size` bytes: [*at, *at +
 * *len), cut on page bounds (len 0: to the end, for the last share). */
static void share_of(int64_t size, int part, int parts, uint64_t *at, uint64_t *len) {
  const int64_t page = 4096;
  int64_t lo = size / parts * part + size % parts * part / parts;
  int64_t hi = size / parts * (part + 1) + size % parts * (part + 1) / parts;
  lo = lo / page * page, hi = hi / page * page;
  *at = (uint64_t)lo;
  *len = part == parts - 1 ? 0 : (uint64_t)(hi - lo);
}

/* Local. mt_io_release_cache of share `part` of `parts` of the file: each share
 * whose pages are clean is dropped, so ranks that split a file between them drop
 * it side by side. */
static void release_share(const char *path, int part, int parts) {
#if defined(MT_NR_CACHESTAT) && defined(POSIX_FADV_DONTNEED)
  /* O_NONBLOCK: a FIFO at the path must not hold the save; O_NOFOLLOW: a
   * symlink is replaced, not the file it names. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return;
  struct stat st;
  cache_range range = {0, 0};
  cache_stat cs = {0, 0, 0, 0, 0};
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    share_of((int64_t)st.st_size, part, parts, &range.off, &range.len);
    if ((range.len > 0 || part == parts - 1) &&
        syscall(MT_NR_CACHESTAT, fd, &range, &cs, 0) == 0 && cs.cached > 0 && cs.dirty == 0) {
      (void)posix_fadvise(fd, (off_t)range.off, (off_t)range.len, POSIX_FADV_DONTNEED);
    }
  }
  close(fd);
#else
  (void)path, (void)part, (void)parts;
#endif
}

void mt_io_release_cache(const char *path) { release_share(path, 0, 1); }

/* Before any rank writes (start agrees), the cache of the file this save
 * replaces is released: on one node each rank drops its share of it, where one
 * rank dropping the whole file kept the others waiting; where the ranks lie on
 * several nodes, each its own node's whole. */
static void release_replaced(mt_mesh *mesh, const char *path) {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  mt_error ignored = {0};
  if (mt_mesh_comm(mesh, &comm, &ignored) != MT_OK) return; /* start reports it */
  mt_mesh_nodes nodes;
  mt_mesh_nodes_of(mesh, &nodes);
  if (nodes.kind == MT_NODES_ONE) {
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
  }
  release_share(path, rank, size);
}

/* Rank 0's pid and clock; the others offer the maximum, so the minimum over the
 * ranks is rank 0's. Returns whether this rank is rank 0. */
static int nonce_of(mt_mesh *mesh, int64_t *nonce) {
  int64_t coord[MT_MAX_MESH_NDIM] = {0};
  int first = mt_mesh_coordinate(mesh, coord);
  for (int d = 0; d < mt_mesh_ndim(mesh); ++d) first = first && coord[d] == 0;
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  nonce[0] = first ? (int64_t)getpid() : INT64_MAX;
  nonce[1] = first ? (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec : INT64_MAX;
  return first;
}

int mt_io_save(mt_mesh *mesh, const char *path, const void *header, int64_t hlen,
               const mt_io_array *array, const mt_box *box, const void *buf,
               int64_t buflen, const mt_io_options *opts, mt_error *err) {
  io_call c = {0};
  int64_t nonce[2];
  char tmp[4096];
  int rc = MT_OK, slabs = 0, first = nonce_of(mesh, nonce), made = 0;
  take_options(&c, opts);
  if (hlen < 0 || hlen > INT_MAX || hlen > array->offset) {
    rc = mt_error_set(err, MT_EINVAL,
                      "a header of %lld bytes does not fit before the data "
                      "at byte %lld",
                      (long long)hlen, (long long)array->offset);
  }
  if (rc == MT_OK) release_replaced(mesh, path);
  if (rc == MT_OK && first) {
    rc = temp_name(path, nonce, tmp, sizeof tmp, err);
    if (rc == MT_OK) rc = create_temp(tmp, c.durable ? planned_size(array) : 0, err);
    made = rc == MT_OK;
  }
  rc = start(&c, mesh, rc, array, box, buflen, nonce, 2, err);
  /* Every rank builds the same name from the same inputs: no need to agree. */
  if (rc == MT_OK) rc = temp_name(path, nonce, tmp, sizeof tmp, err);
  if (rc == MT_OK) {
    /* Every rank has every box: all choose alike, with no message. */
    slabs = c.short_runs && boxes_tile(&c, array);
    if (c.contiguous) rc = write_runs(&c, tmp, header, hlen, buf, buflen, err);
    else if (slabs) rc = write_slabs(&c, array, tmp, header, hlen, buf, err);
    else rc = write_file(&c, tmp, header, hlen, buf, err);
    if (rc == MT_OK) rc = commit(&c, tmp, path, err);
  }
  if (rc != MT_OK && made) remove(tmp);
  if (rc == MT_OK && !slabs) mt__io_count(c.io_counters, 0, buflen);
  finish(&c);
  return rc;
}

/* ---- load -------------------------------------------------------------------- */

/* Local. MPI_File_get_size is not collective, so the size check costs no message. */
static int check_size(MPI_File fh, int64_t need, const char *path, mt_error *err) {
  MPI_Offset size = 0;
  int rc = MPI_File_get_size(fh, &size);
  if (rc != MPI_SUCCESS) return io_fail(err, rc, "MPI_File_get_size", path);
  return (int64_t)size < need ? truncated(err, path, (int64_t)size, need) : MT_OK;
}

static int read_all(io_call *c, MPI_File fh, void *buf, const char *path, mt_error *err) {
  int mine = MT_OK;
  int rc = MPI_File_set_view(fh, (MPI_Offset)c->disp, MPI_BYTE, c->ftype, "native",
                             MPI_INFO_NULL);
  if (rc != MPI_SUCCESS) mine = io_fail(err, rc, "MPI_File_set_view", path);
  rc = MPI_File_read_at_all(fh, 0, buf, c->count, c->mtype, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS && mine == MT_OK) mine = io_fail(err, rc, "MPI_File_read_at_all", path);
  return mine;
}

/* The collective path: opens, checks and reads, agreeing after the open. */
static int read_file(io_call *c, const char *path, void *buf, mt_error *err) {
  MPI_File fh = MPI_FILE_NULL;
  int rc = MPI_File_open(c->comm, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &fh);
  int mine = rc == MPI_SUCCESS ? check_size(fh, c->end, path, err)
                               : io_fail(err, rc, "MPI_File_open", path);
  mine = agree(c->comm, mine, err);
  if (mine == MT_OK) mine = read_all(c, fh, buf, path, err);
  rc = fh != MPI_FILE_NULL ? MPI_File_close(&fh) : MPI_SUCCESS;
  if (rc != MPI_SUCCESS && mine == MT_OK) mine = io_fail(err, rc, "MPI_File_close", path);
  return agree(c->comm, mine, err);
}

/* Opens `path` for this rank alone and checks that it holds the array; -1 and
 * *mine set on failure. */
static int open_for_reading(const io_call *c, const char *path, int *mine, mt_error *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  *mine = fd >= 0 ? MT_OK : posix_fail(err, "open", path);
  struct stat st;
  if (*mine == MT_OK && fstat(fd, &st) != 0) *mine = posix_fail(err, "fstat", path);
  if (*mine == MT_OK && (int64_t)st.st_size < c->end) {
    *mine = truncated(err, path, (int64_t)st.st_size, c->end);
  }
  return fd;
}

/* The independent path: every box one run, each rank preads its own; one
 * agreement, at the end. */
static int read_runs(io_call *c, const char *path, void *buf, int64_t buflen,
                     mt_error *err) {
  int mine = MT_OK;
  int fd = open_for_reading(c, path, &mine, err);
  int e = mine == MT_OK ? mt__io_transfer(fd, NULL, buf, buflen, c->disp) : 0;
  if (e != 0)
    mine = mt_error_set(err, MT_EIO, "reading '%s' failed: %s", path, strerror(e));
  return agree(c->comm, close_file(fd, mine, path, err), err);
}

/* The slab path of a load: as write_slabs. */
static int read_slabs(io_call *c, const mt_io_array *a, const char *path, void *buf,
                      mt_error *err) {
  int mine = MT_OK;
  int fd = open_for_reading(c, path, &mine, err);
  mt__slab_io s = slab_io(c, a, fd);
  mine = mt__slabs_read(&s, mine, buf, err);
  return agree(c->comm, close_file(fd, mine, path, err), err);
}

int mt_io_load(mt_mesh *mesh, const char *path, const mt_io_array *array,
               const mt_box *box, void *buf, int64_t buflen, const mt_io_options *opts,
               mt_error *err) {
  io_call c = {0};
  take_options(&c, opts);
  int rc = start(&c, mesh, MT_OK, array, box, buflen, NULL, 0, err);
  if (rc == MT_OK && c.contiguous) rc = read_runs(&c, path, buf, buflen, err);
  else if (rc == MT_OK && c.short_runs) rc = read_slabs(&c, array, path, buf, err);
  else if (rc == MT_OK) rc = read_file(&c, path, buf, err);
  if (rc == MT_OK && !c.short_runs) mt__io_count(c.io_counters, buflen, 0);
  finish(&c);
  return rc;
}
