/* How close an all-gather along an inner dim (Shard(1) -> Replicate of a C-ordered
 * 2-D array) can come to the raw MPI_Allgather between preallocated buffers, at
 * np 2, by three ways of putting the peer's rows in place:
 *
 *   staged  what csrc/comm/pairwise.c does: the block is sent in chunks of
 *           1 MiB straight from the input, this rank's rows go to their columns
 *           while the peer reads them, and each chunk of the peer's is received
 *           into a staging buffer and its rows copied to their columns from there;
 *   direct  no staging: after a handshake that swaps pids and input addresses,
 *           the peer's rows are read straight into their columns with
 *           process_vm_readv, one local iovec per row (what the library's direct
 *           copies do for all-to-alls), then a second handshake releases the input;
 *   get     MPI's own one-pass way: an MPI_Get of the peer's block from a window
 *           over its input, into this rank's output through a vector datatype
 *           (the window is made once, outside the timing: its best case).
 *
 * The raw call writes each block once into one contiguous buffer; every other way
 * must cut the peer's block into rows. Each way is timed against the raw call in
 * its own pass, the two alternating repetition by repetition after a barrier (as
 * benchmarks/redistribute.py does), each time the max over the ranks. Prints the
 * median times and the median and [min..max] of the per-repetition ratio. After its
 * timing, each way's output is checked row by row against the raw call's blocks; a
 * way that misplaces a row ends the run with an error.
 *
 *   mpicc -O2 -o build/inner_gather benchmarks/inner_gather.c
 *   mpiexec -n 2 build/inner_gather 1 4     # local blocks of 1 and 4 MiB
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#define COLS 256   /* doubles per local row, as redistribute.py's S1->R at np 2 */
#define REPS 61
#define WARMUP 3
#define BATCH 512  /* iovecs per process_vm_readv, as csrc/comm/direct.c */
#define TAG 7
#define CHUNK ((int64_t)1 << 20) /* bytes a staged chunk, as pairwise.c */

typedef struct {
  int64_t rows, row; /* rows of the local block, bytes of a local row */
  int me, peer;
  char *in, *out, *stage, *raw_out;
  struct iovec *iov;
  int denied; /* a direct read failed on this rank since it was last cleared */
  MPI_Win win;      /* over `in`, for get */
  MPI_Datatype col; /* the peer's column block of the output, for get */
} gather;

static char *buffer(size_t bytes) {
  char *p = aligned_alloc(4096, bytes);
  if (p == NULL) MPI_Abort(MPI_COMM_WORLD, 1);
  /* NumPy asks for huge pages from 4 MiB on, so redistribute.py's buffers have them */
  if (bytes >= ((size_t)4 << 20)) (void)madvise(p, bytes, MADV_HUGEPAGE);
  memset(p, 1, bytes);
  return p;
}

/* `n` rows of `src` (contiguous, `g->row` bytes each) into column block `col` of
 * the output's rows from `first` on. */
static void place(const gather *g, const char *src, int64_t first, int64_t n, int col) {
  for (int64_t i = 0; i < n; ++i)
    memcpy(g->out + (2 * (first + i) + col) * g->row, src + i * g->row, (size_t)g->row);
}

static void raw(gather *g) {
  int n = (int)(g->rows * g->row);
  MPI_Allgather(g->in, n, MPI_BYTE, g->raw_out, n, MPI_BYTE, MPI_COMM_WORLD);
}

static void staged(gather *g) {
  int64_t per = CHUNK / g->row, chunks = (g->rows + per - 1) / per;
  MPI_Request *sends = malloc((size_t)chunks * sizeof *sends);
  for (int64_t k = 0; k < chunks; ++k) {
    int64_t n = (k + 1) * per <= g->rows ? per : g->rows - k * per;
    MPI_Isend(g->in + k * per * g->row, (int)(n * g->row), MPI_BYTE, g->peer, TAG,
              MPI_COMM_WORLD, &sends[k]);
  }
  place(g, g->in, 0, g->rows, g->me);
  for (int64_t k = 0; k < chunks; ++k) {
    int64_t n = (k + 1) * per <= g->rows ? per : g->rows - k * per;
    MPI_Recv(g->stage, (int)(n * g->row), MPI_BYTE, g->peer, TAG, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    place(g, g->stage, k * per, n, g->peer);
  }
  MPI_Waitall((int)chunks, sends, MPI_STATUSES_IGNORE);
  free(sends);
}

static void direct(gather *g) {
  long mine[2] = {(long)getpid(), (long)(uintptr_t)g->in}, theirs[2];
  MPI_Sendrecv(mine, 2, MPI_LONG, g->peer, TAG, theirs, 2, MPI_LONG, g->peer, TAG,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  place(g, g->in, 0, g->rows, g->me);
  for (int64_t i = 0; i < g->rows; ++i) {
    g->iov[i].iov_base = g->out + (2 * i + g->peer) * g->row;
    g->iov[i].iov_len = (size_t)g->row;
  }
  for (int64_t done = 0; done < g->rows;) {
    int64_t k = g->rows - done < BATCH ? g->rows - done : BATCH;
    struct iovec far = {(void *)(uintptr_t)(theirs[1] + done * g->row), (size_t)(k * g->row)};
    if (process_vm_readv((pid_t)theirs[0], g->iov + done, (unsigned long)k, &far, 1, 0) !=
        (ssize_t)(k * g->row)) {
      g->denied = 1; /* no ptrace permission between the ranks: reported, not timed */
      break;
    }
    done += k;
  }
  char a = 0, b;
  MPI_Sendrecv(&a, 1, MPI_BYTE, g->peer, TAG, &b, 1, MPI_BYTE, g->peer, TAG,
               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

static void get(gather *g) {
  MPI_Get(g->out + g->peer * g->row, 1, g->col, g->peer, 0, (int)(g->rows * g->row), MPI_BYTE,
          g->win);
  place(g, g->in, 0, g->rows, g->me);
  MPI_Win_flush(g->peer, g->win);
  MPI_Barrier(MPI_COMM_WORLD); /* the peer has read this rank's input */
}

static void run(gather *g, int way) {
  if (way == 0) raw(g);
  else if (way == 1) staged(g);
  else if (way == 2) direct(g);
  else get(g);
}

/* Whether the output holds this rank's rows and, beside each, the peer's row as the
 * raw call gathered it (`raw_out` holds the peer's block after any raw call). */
static int placed_right(const gather *g) {
  const char *theirs = g->raw_out + g->peer * g->rows * g->row;
  for (int64_t i = 0; i < g->rows; ++i) {
    if (memcmp(g->out + (2 * i + g->me) * g->row, g->in + i * g->row, (size_t)g->row) != 0 ||
        memcmp(g->out + (2 * i + g->peer) * g->row, theirs + i * g->row, (size_t)g->row) != 0)
      return 0;
  }
  return 1;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return v[n / 2];
}

/* Median seconds of `way` and of the raw call, timed alternately, and the
 * per-repetition ratios in `ratio`. */
static void time_pair(gather *g, int way, double *t_way, double *t_raw, double *ratio) {
  double t[2][REPS];
  for (int r = -WARMUP; r < REPS; ++r) {
    for (int k = 0; k < 2; ++k) {
      int which = (k + r + WARMUP) % 2; /* alternate which runs first */
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      run(g, which ? way : 0);
      double dt = MPI_Wtime() - t0, worst;
      MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (r >= 0) t[which][r] = worst;
    }
  }
  for (int r = 0; r < REPS; ++r) ratio[r] = t[1][r] / t[0][r];
  *t_way = median(t[1], REPS), *t_raw = median(t[0], REPS);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int size;
  gather g = {0};
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &g.me);
  if (size != 2) {
    if (g.me == 0) fprintf(stderr, "inner_gather runs at np 2\n");
    MPI_Finalize();
    return 2;
  }
  g.peer = 1 - g.me;
  g.row = COLS * (int64_t)sizeof(double);
  static const char *ways[] = {"raw", "staged", "direct", "get"};
  if (g.me == 0) printf("S1->R at np 2, rows of %lld B; median us, ratio to the raw call [min..max]\n",
                        (long long)g.row);
  for (int a = 1; a < argc; ++a) {
    int64_t bytes = atoll(argv[a]) << 20;
    g.rows = bytes / g.row;
    g.in = buffer((size_t)bytes), g.stage = buffer((size_t)bytes);
    g.out = buffer((size_t)(2 * bytes)), g.raw_out = buffer((size_t)(2 * bytes));
    g.iov = malloc((size_t)g.rows * sizeof *g.iov);
    double *values = (double *)(void *)g.in; /* distinct on every rank and row */
    for (int64_t i = 0; i < bytes / (int64_t)sizeof(double); ++i)
      values[i] = (double)(g.me * bytes + i);
    MPI_Win_create(g.in, (MPI_Aint)bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &g.win);
    MPI_Win_lock_all(0, g.win);
    MPI_Type_vector((int)g.rows, (int)g.row, (int)(2 * g.row), MPI_BYTE, &g.col);
    MPI_Type_commit(&g.col);
    for (int way = 1; way < 4; ++way) {
      double tw, tr, ratio[REPS];
      g.denied = 0;
      time_pair(&g, way, &tw, &tr, ratio);
      double med = median(ratio, REPS);
      int denied, right = 0;
      MPI_Allreduce(&g.denied, &denied, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (!denied) {
        memset(g.out, 0, (size_t)(2 * bytes));
        run(&g, way);
        right = placed_right(&g);
        MPI_Allreduce(MPI_IN_PLACE, &right, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      }
      if (!denied && !right) {
        if (g.me == 0) fprintf(stderr, "%s put rows in the wrong places\n", ways[way]);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      if (denied) {
        if (g.me == 0) printf("%4lld MiB  %-7s unavailable: process_vm_readv needs ptrace "
                              "permission between the ranks\n", (long long)(bytes >> 20), ways[way]);
        continue;
      }
      if (g.me == 0)
        printf("%4lld MiB  %-7s %8.1f  raw %8.1f  ratio %.2f [%.2f..%.2f]\n",
               (long long)(bytes >> 20), ways[way], tw * 1e6, tr * 1e6, med, ratio[0],
               ratio[REPS - 1]);
    }
    MPI_Type_free(&g.col);
    MPI_Win_unlock_all(g.win);
    MPI_Win_free(&g.win);
    free(g.in), free(g.stage), free(g.out), free(g.raw_out), free(g.iov);
  }
  MPI_Finalize();
  return 0;
}
