/* Sharded files with MPI-IO at whatever size mpiexec gave: file types of boxes
 * beyond INT_MAX (checked without allocating them), a round trip in which the ranks
 * that read cut the array differently from those that wrote, the slab pipeline of
 * interleaved boxes at several chunk sizes, with and without its thread, a box at
 * an offset above 4 GiB of a sparse file, and failures that every rank reports
 * alike.
 * MPITENSOR_BIG_IO=1 also writes and reads back a real 2 GiB + 1 KiB box. */
#include <limits.h>
#include <mpi.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "mpitensor/io/io.h"
#include "world_mesh.h"

static int world_rank, world_size;

/* The options (and their counters) that the test's saves and loads pass; the
 * high-offset test passes NULL, the defaults. */
static mt_io_counters test_io_counters;
static mt_io_options test_opts;
static char dir[256];

static mt_io_array array2(int64_t rows, int64_t cols, int64_t itemsize, int64_t offset) {
  mt_io_array a = {.ndim = 2, .itemsize = itemsize, .offset = offset};
  a.shape[0] = rows, a.shape[1] = cols;
  return a;
}

static mt_box box2(int64_t r0, int64_t nr, int64_t c0, int64_t nc) {
  mt_box b = {.ndim = 2};
  b.offset[0] = r0, b.shape[0] = nr, b.offset[1] = c0, b.shape[1] = nc;
  return b;
}

static void check_type(const mt_io_array *a, const mt_box *b, MPI_Count size,
                       MPI_Count extent, int64_t disp) {
  MPI_Datatype t;
  int64_t d = -1, n = -1;
  CHECK(mt_io_box_type(a, b, &t, &d, &n, NULL) == MT_OK);
  MPI_Count s = 0, lb = -1, e = 0;
  MPI_Type_size_x(t, &s);
  MPI_Type_get_extent_x(t, &lb, &e);
  CHECK_MSG(s == (size == 0 ? 1 : size) && n == size, "size %lld, expected %lld", (long long)s, (long long)size);
  CHECK_MSG(lb == 0 && e == extent, "extent %lld, expected %lld", (long long)e,
            (long long)extent);
  CHECK_MSG(d == disp, "disp %lld, expected %lld", (long long)d, (long long)disp);
  if (t != MPI_BYTE) MPI_Type_free(&t);
}

/* Counts and strides past INT_MAX, built but never allocated. */
static void test_large_types(void) {
  const int64_t big = (int64_t)1 << 31; /* one more than INT_MAX */
  mt_io_array a = array2(3, big, 1, 128);
  mt_box b = box2(1, 2, 5, big - 5);
  check_type(&a, &b, 2 * (big - 5), big + big - 5, 128 + big + 5);
  mt_io_array flat = {.ndim = 1, .itemsize = 4, .offset = 64};
  flat.shape[0] = big + 7; /* a run of 8 GiB + 28 bytes: whole groups and a rest */
  mt_box all = {.ndim = 1};
  all.shape[0] = big + 7;
  check_type(&flat, &all, 4 * (big + 7), 4 * (big + 7), 64);
  mt_io_array tall = array2(big + 3, 2, 8, 0); /* more rows than an int counts */
  mt_box col = box2(0, big + 3, 1, 1);
  check_type(&tall, &col, 8 * (big + 3), 16 * (big + 2) + 8, 8);
  mt_box empty = box2(3, 0, 0, 4);
  check_type(&a, &empty, 0, 1, 128); /* MPI_BYTE, sent 0 times */
  mt_box outside = box2(2, 2, 0, 1);
  MPI_Datatype t;
  int64_t d, n;
  CHECK(mt_io_box_type(&a, &outside, &t, &d, &n, NULL) == MT_EINDEX);
}

static void path_of(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

/* On rank 0: the file is the 16-byte header and then the values 0, 1, 2, ... */
static void check_file(const char *path, int64_t n) {
  if (world_rank != 0) return;
  FILE *f = fopen(path, "rb");
  char head[16];
  /* Sized by n: a fixed 64 overflowed at 4 ranks (13 x 5 values), which only ASan saw. */
  int32_t *all = malloc((size_t)n * sizeof *all);
  CHECK(all != NULL);
  CHECK(f != NULL && fread(head, 1, 16, f) == 16 && memcmp(head, "0123456789abcdef", 16) == 0);
  CHECK(f != NULL && all != NULL && fread(all, 4, (size_t)n, f) == (size_t)n);
  CHECK(f != NULL && fgetc(f) == EOF);
  for (int64_t i = 0; all != NULL && i < n; ++i) CHECK(all[i] == i);
  free(all);
  if (f != NULL) fclose(f);
}

/* Rows split among ranks (uneven) on write, columns on read, and back: both the
 * independent path (every box one run) and, from 2 ranks, the collective one
 * (boxes interleave). */
static void test_round_trip(mt_mesh *m) {
  const int64_t rows = 3 * world_size + 1, cols = 5;
  char path[512];
  path_of(path, sizeof path, "round.bin");
  mt_io_array a = array2(rows, cols, 4, 16);
  int64_t per = (rows + world_size - 1) / world_size;
  int64_t r0 = per * world_rank < rows ? per * world_rank : rows;
  int64_t nr = r0 + per <= rows ? per : rows - r0;
  int32_t *mine = malloc((size_t)(rows * cols) * sizeof *mine);
  for (int64_t i = 0; i < nr * cols; ++i) mine[i] = (int32_t)(r0 * cols + i);
  mt_box b = box2(r0, nr, 0, cols);
  mt_error err = {0};
  int rc = mt_io_save(m, path, "0123456789abcdef", 16, &a, &b, mine, nr * cols * 4,
                      &test_opts, &err);
  CHECK_MSG(rc == MT_OK, "%s", err.msg);
  check_file(path, rows * cols);
  int64_t per_c = (cols + world_size - 1) / world_size;
  int64_t c0 = per_c * world_rank < cols ? per_c * world_rank : cols;
  int64_t nc = c0 + per_c <= cols ? per_c : cols - c0;
  mt_box rb = box2(1, rows - 1, c0, nc);
  CHECK(mt_io_load(m, path, &a, &rb, mine, (rows - 1) * nc * 4, &test_opts, &err) ==
        MT_OK);
  for (int64_t i = 0; i < (rows - 1) * nc; ++i) {
    CHECK(mine[i] == (i / nc + 1) * cols + c0 + i % nc);
  }
  mt_box cb = box2(0, rows, c0, nc);
  for (int64_t i = 0; i < rows * nc; ++i) mine[i] = (int32_t)((i / nc) * cols + c0 + i % nc);
  rc = mt_io_save(m, path, "0123456789abcdef", 16, &a, &cb, mine, rows * nc * 4,
                  &test_opts, &err);
  CHECK_MSG(rc == MT_OK, "%s", err.msg);
  check_file(path, rows * cols);
  free(mine);
}

/* Column block r of n of `cols` columns (uneven: the first ranks get one more). */
static void split(int64_t cols, int r, int n, int64_t *c0, int64_t *nc) {
  *c0 = cols * r / n;
  *nc = cols * (r + 1) / n - *c0;
}

/* A 3-D box: all of dims 0 and 1 of `a`, a block of dim 2. */
static mt_box box3(const mt_io_array *a, int64_t c0, int64_t nc) {
  mt_box b = {.ndim = 3};
  b.shape[0] = a->shape[0], b.shape[1] = a->shape[1];
  b.offset[2] = c0, b.shape[2] = nc;
  return b;
}

/* The value of element i (flat, C order) of the test arrays. */
static int32_t value(int64_t i) { return (int32_t)(i * 7 + 3); }

/* This rank's box of `a` (int32, offset 16), filled with the values it holds. */
static int32_t *fill(const mt_io_array *a, const mt_box *b) {
  int64_t n = mt_box_numel(b);
  int32_t *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof *buf);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, flat = 0, step = 1;
    int64_t idx[MT_MAX_NDIM];
    for (int d = b->ndim - 1; d >= 0; --d) {
      idx[d] = b->offset[d] + rest % b->shape[d];
      rest /= b->shape[d];
    }
    for (int d = a->ndim - 1; d >= 0; --d) {
      flat += idx[d] * step;
      step *= a->shape[d];
    }
    buf[i] = value(flat);
  }
  return buf;
}

/* Saves `sb`, checks the file on rank 0, loads `lb` and checks it; returns the
 * data bytes this rank wrote and read. */
static void slab_round_trip(mt_mesh *m, const mt_io_array *a, const mt_box *sb,
                            const mt_box *lb, const char *what, int64_t *moved) {
  char path[512];
  path_of(path, sizeof path, "slabs.bin");
  int64_t written = atomic_load(&test_io_counters.written_bytes);
  int64_t read = atomic_load(&test_io_counters.read_bytes);
  int32_t *mine = fill(a, sb);
  mt_error err = {0};
  int rc = mt_io_save(m, path, "0123456789abcdef", 16, a, sb, mine,
                      mt_box_numel(sb) * 4, &test_opts, &err);
  CHECK_MSG(rc == MT_OK, "%s: %s", what, err.msg);
  int64_t n = a->shape[0] * a->shape[1] * (a->ndim == 3 ? a->shape[2] : 1);
  if (world_rank == 0) {
    FILE *f = fopen(path, "rb");
    int32_t *all = malloc((size_t)n * sizeof *all);
    CHECK(f != NULL && fseek(f, 16, SEEK_SET) == 0 && fread(all, 4, (size_t)n, f) == (size_t)n);
    CHECK(f != NULL && fgetc(f) == EOF);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += all[i] != value(i);
    CHECK_MSG(bad == 0, "%s: %lld wrong values in the file", what, (long long)bad);
    free(all);
    if (f != NULL) fclose(f);
  }
  int32_t *expect = fill(a, lb), *got = malloc((size_t)(mt_box_numel(lb) + 1) * sizeof *got);
  rc = mt_io_load(m, path, a, lb, got, mt_box_numel(lb) * 4, &test_opts, &err);
  CHECK_MSG(rc == MT_OK, "%s: %s", what, err.msg);
  CHECK_MSG(memcmp(got, expect, (size_t)mt_box_numel(lb) * 4) == 0, "%s: loaded values", what);
  moved[0] = atomic_load(&test_io_counters.written_bytes) - written;
  moved[1] = atomic_load(&test_io_counters.read_bytes) - read;
  free(mine);
  free(expect);
  free(got);
}

/* Interleaved boxes through the slab pipeline at chunks of one byte (one row),
 * of rows that divide no slab, and of more than a slab; threaded and inline;
 * uneven column blocks, 3-D, 2-D blocks of a 2 x (n/2) grid, overlapping boxes on
 * load and rows no box reads. Every byte is written once, each rank's row slab by
 * that rank. */
static void test_pipeline(mt_mesh *m) {
  int64_t chunks[3] = {1, 3 * 4 * 11 + 5, 1 << 20}, moved[2];
  mt_io_options old = test_opts;
  for (int i = 0; i < 6; ++i) {
    int thread = i % 2;
    test_opts.chunk_bytes = chunks[i / 2];
    test_opts.io_thread = thread;
    char what[64];
    snprintf(what, sizeof what, "chunk %lld thread %d", (long long)chunks[i / 2], thread);
    int64_t rows = 5 * world_size + 3, c0, nc, c1, nc1;
    mt_io_array a = array2(rows, 11, 4, 16);
    split(11, world_rank, world_size, &c0, &nc);
    mt_box cols = box2(0, rows, c0, nc);
    /* Loads overlap (every rank from column 0) and skip the first two rows. */
    mt_box wide = box2(2, rows - 2, 0, c0 + nc);
    slab_round_trip(m, &a, &cols, &wide, what, moved);
    int64_t total[2] = {moved[0], moved[1]};
    MPI_Allreduce(MPI_IN_PLACE, total, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK_MSG(total[0] == rows * 11 * 4, "%s: %lld bytes written", what, (long long)total[0]);
    int64_t slab = (rows * (world_rank + 1) / world_size - rows * world_rank / world_size);
    int64_t mine = slab * 11 * 4;
    CHECK_MSG(world_size == 1 || moved[0] == mine, "%s: wrote %lld, not %lld", what,
              (long long)moved[0], (long long)mine);
    mt_io_array t = {.ndim = 3, .itemsize = 4, .offset = 16};
    t.shape[0] = 3, t.shape[1] = world_size + 2, t.shape[2] = 6;
    split(6, world_rank, world_size, &c0, &nc);
    split(6, world_size - 1 - world_rank, world_size, &c1, &nc1);
    mt_box sb = box3(&t, c0, nc), lb = box3(&t, c1, nc1);
    slab_round_trip(m, &t, &sb, &lb, what, moved);
    if (world_size % 2 == 0) { /* [Shard(0), Shard(1)] on a 2 x n/2 grid */
      mt_io_array q = array2(9, 2 * world_size + 1, 4, 16);
      int half = world_size / 2, r = world_rank / half, c = world_rank % half;
      int64_t r0, nr;
      split(9, r, 2, &r0, &nr);
      split(q.shape[1], c, half, &c0, &nc);
      mt_box grid = box2(r0, nr, c0, nc);
      slab_round_trip(m, &q, &grid, &grid, what, moved);
    }
  }
  test_opts = old;
}

/* Each rank writes 64 bytes near the end of a 6 GiB sparse file. */
static void test_high_offset(mt_mesh *m) {
  const int64_t big = (int64_t)1 << 31;
  char path[512];
  path_of(path, sizeof path, "sparse.bin");
  mt_io_array a = array2(3, big, 1, 64);
  mt_box b = box2(2, 1, big - 64 * (world_rank + 1), 64);
  unsigned char buf[64];
  for (int i = 0; i < 64; ++i) buf[i] = (unsigned char)(world_rank * 64 + i);
  mt_error err = {0};
  CHECK_MSG(mt_io_save(m, path, "H", 1, &a, &b, buf, 64, NULL, &err) == MT_OK, "%s",
            err.msg);
  int other = (world_rank + 1) % world_size;
  mt_box rb = box2(2, 1, big - 64 * (other + 1), 64);
  memset(buf, 0, sizeof buf);
  CHECK_MSG(mt_io_load(m, path, &a, &rb, buf, 64, NULL, &err) == MT_OK, "%s", err.msg);
  for (int i = 0; i < 64; ++i) CHECK(buf[i] == (unsigned char)(other * 64 + i));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank == 0) remove(path);
}

/* Every rank gets the same status and message, also when only one rank failed. */
static void expect_everywhere(int rc, int code, const mt_error *err, const char *needle) {
  CHECK_MSG(rc == code, "status %d, expected %d (%s)", rc, code, err->msg);
  CHECK_MSG(strstr(err->msg, needle) != NULL, "'%s' lacks '%s'", err->msg, needle);
  char first[MT_ERROR_LEN];
  memcpy(first, err->msg, sizeof first);
  MPI_Bcast(first, (int)sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
  CHECK(strcmp(first, err->msg) == 0);
}

static void test_failures(mt_mesh *m) {
  char path[512], missing[512];
  path_of(path, sizeof path, "keep.bin");
  path_of(missing, sizeof missing, "no-such-dir/x.bin");
  mt_io_array a = array2(2, 2, 1, 4);
  mt_box b = box2(0, world_rank == 0 ? 2 : 0, 0, 2);
  unsigned char buf[4] = {1, 2, 3, 4};
  mt_error err = {0};
  int64_t nb = mt_box_numel(&b);
  CHECK(mt_io_save(m, path, "KEEP", 4, &a, &b, buf, nb, &test_opts, &err) == MT_OK);
  int rc = mt_io_save(m, missing, "HEAD", 4, &a, &b, buf, nb, &test_opts, &err);
  expect_everywhere(rc, MT_EIO, &err, "no-such-dir");
  rc = mt_io_load(m, missing, &a, &b, buf, nb, &test_opts, &err);
  expect_everywhere(rc, MT_EIO, &err, "no-such-dir");
  mt_io_array longer = array2(4, 2, 1, 4);
  rc = mt_io_load(m, path, &longer, &b, buf, nb, &test_opts, &err);
  expect_everywhere(rc, MT_EIO, &err, "truncated");
  /* A bad box on the last rank only: the others must not write, and the file at
   * `path` stays as it was. */
  mt_box bad = box2(world_rank == world_size - 1 ? 1 : 0, 2, 0, 2);
  unsigned char other[4] = {9, 9, 9, 9};
  rc = mt_io_save(m, path, "LOST", 4, &a, &bad, other, mt_box_numel(&bad), &test_opts,
                  &err);
  expect_everywhere(rc, MT_EINDEX, &err, "outside");
  int short_buf = world_rank == world_size - 1;
  rc = mt_io_save(m, path, "LOST", 4, &a, &b, other, nb - short_buf, &test_opts, &err);
  expect_everywhere(rc, MT_EINVAL, &err, "buffer");
  memset(buf, 0, sizeof buf);
  mt_box whole = box2(0, 2, 0, 2);
  CHECK(mt_io_load(m, path, &a, &whole, buf, 4, &test_opts, &err) == MT_OK);
  CHECK(buf[0] == 1 && buf[3] == 4);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank == 0) remove(path);
}

/* A name of 251 bytes, which the file system and numpy.save accept: the temporary
 * name beside it must fit NAME_MAX too. */
static void test_long_name(mt_mesh *m) {
  char name[256], path[512];
  memset(name, 'n', 247);
  memcpy(name + 247, ".bin", 5);
  path_of(path, sizeof path, name);
  mt_io_array a = array2(world_size, 3, 4, 16);
  mt_box b = box2(world_rank, 1, 0, 3);
  int32_t mine[3] = {world_rank * 3, world_rank * 3 + 1, world_rank * 3 + 2};
  mt_error err = {0};
  int rc = mt_io_save(m, path, "0123456789abcdef", 16, &a, &b, mine, 12, NULL, &err);
  CHECK_MSG(rc == MT_OK, "%s", err.msg);
  check_file(path, 3 * world_size);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank == 0) remove(path);
}

/* Ranks that pass different paths must not each write a file of their own rows
 * (and zeros elsewhere): the save fails on every rank and leaves no file. */
static void test_paths_differ(mt_mesh *m) {
  if (world_size < 2) return;
  char name[32], path[512];
  snprintf(name, sizeof name, "rank%d.bin", world_rank);
  path_of(path, sizeof path, name);
  mt_io_array a = array2(world_size, 3, 4, 16);
  mt_box b = box2(world_rank, 1, 0, 3);
  int32_t mine[3] = {1, 2, 3};
  mt_error err = {0};
  int rc = mt_io_save(m, path, "0123456789abcdef", 16, &a, &b, mine, 12, NULL, &err);
  expect_everywhere(rc, MT_EIO, &err, "failed");
  for (int r = 0; r < world_size; ++r) {
    snprintf(name, sizeof name, "rank%d.bin", r);
    path_of(path, sizeof path, name);
    CHECK_MSG(access(path, F_OK) != 0, "'%s' was written", path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/* A real box of more than INT_MAX bytes, written by rank 0 and read by the last. */
static void test_big_box(mt_mesh *m) {
  const int64_t n = ((int64_t)1 << 31) + 1024;
  char path[512];
  path_of(path, sizeof path, "big.bin");
  mt_io_array a = {.ndim = 1, .itemsize = 1, .offset = 64};
  a.shape[0] = n;
  int reader = world_rank == world_size - 1, writer = world_rank == 0;
  unsigned char *buf = (reader || writer) ? malloc((size_t)n) : NULL;
  for (int64_t i = 0; writer && i < n; ++i) buf[i] = (unsigned char)(i % 251);
  mt_box b = {.ndim = 1};
  b.shape[0] = writer ? n : 0;
  mt_error err = {0};
  CHECK_MSG(
      mt_io_save(m, path, "B", 1, &a, &b, buf, b.shape[0], &test_opts, &err) == MT_OK,
      "%s", err.msg);
  if (reader) memset(buf, 0, (size_t)n);
  b.shape[0] = reader ? n : 0;
  CHECK_MSG(mt_io_load(m, path, &a, &b, buf, b.shape[0], &test_opts, &err) == MT_OK,
            "%s", err.msg);
  int64_t bad = 0;
  for (int64_t i = 0; reader && i < n; ++i) bad += buf[i] != (unsigned char)(i % 251);
  CHECK(bad == 0);
  free(buf);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank == 0) remove(path);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  long long pid = (long long)getpid();
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/mt-test-io-%lld", tmp ? tmp : "/tmp", pid);
  if (world_rank == 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(system(cmd) == 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  mt_mesh *m = world_mesh();
  test_opts = mt_io_options_default();
  test_opts.counters = &test_io_counters;
  test_large_types();
  test_round_trip(m);
  test_pipeline(m);
  test_high_offset(m);
  test_failures(m);
  test_long_name(m);
  test_paths_differ(m);
  const char *big = getenv("MPITENSOR_BIG_IO");
  if (big != NULL && strcmp(big, "1") == 0) test_big_box(m);
  mt_mesh_destroy(m);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank == 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
  }
  int failed = mt_test_failures;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = mt_test_exit("test_io");
  MPI_Finalize();
  return failed == 0 ? rc : 1;
}
