/* How fast the processes of one node can move Shard(0) -> Shard(1)'s parts to each
 * other, by four means, against the raw all-to-all's (Open MPI over shared memory
 * moves a large message with one process_vm_readv of contiguous bytes):
 *
 *   writev  each rank pushes its part for peer q, runs of row/N bytes out of its
 *           rows, into q's output with process_vm_writev (what mpitensor's direct
 *           steps do today);
 *   mapped  the same parts stored by plain user-space copies into q's output,
 *           which every rank has mapped (a memfd) once and for all, as if
 *           outputs were shared and peers kept their mappings;
 *   remap   the same stores, but each exchange maps the part's range of q's
 *           output (MAP_POPULATE) and unmaps it after, as a design must that
 *           leaves no peer's pages in a rank's resident memory;
 *   raw     each rank pulls its contiguous block from every peer's packed input
 *           with process_vm_readv, and copies its own (MPI_Alltoall's work).
 *
 * No MPI: N forked processes, a shared-memory barrier that yields while it waits
 * (as Open MPI does when ranks outnumber cores). Prints each mean's time per
 * exchange and its ratio to raw, after two warm-up rounds.
 *
 *   cc -O2 -o build/cross_copy benchmarks/cross_copy.c
 *   build/cross_copy 4 1      # 4 processes, 1 MiB of input each
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROW 4096   /* bytes per input row, as benchmarks/redistribute.py's 512 doubles */
#define BATCH 512  /* iovecs per call, as csrc/comm/direct.c */
#define ITERS 20
#define MEANS 4

typedef struct shared {
  atomic_int count, sense;
  int n;
  pid_t pid[64];
  char *packed[64];   /* each rank's input, packed by destination (raw's layout) */
  double seconds[MEANS];
} shared;

typedef struct rank {
  int p, n, sense;
  size_t rows, run, part; /* rows of its input, bytes per run, bytes per part */
  char *in, *packed, *own;
  char **out;             /* every rank's mapped output */
  int *fd;                /* and the memfd behind each */
  shared *s;
} rank;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void barrier(rank *k) {
  shared *s = k->s;
  k->sense = !k->sense;
  if (atomic_fetch_add(&s->count, 1) == s->n - 1) {
    atomic_store(&s->count, 0);
    atomic_store(&s->sense, k->sense);
  } else {
    while (atomic_load(&s->sense) != k->sense) sched_yield();
  }
}

/* Rank p's part for q: column block q of its rows, into rows p*rows.. of q's output. */
static void push_writev(const rank *k, int q) {
  struct iovec l[BATCH], r;
  for (size_t r0 = 0; r0 < k->rows; r0 += BATCH) {
    size_t m = k->rows - r0 < BATCH ? k->rows - r0 : BATCH;
    for (size_t i = 0; i < m; ++i) {
      l[i].iov_base = k->in + (r0 + i) * ROW + (size_t)q * k->run;
      l[i].iov_len = k->run;
    }
    r.iov_base = k->out[q] + (size_t)k->p * k->part + r0 * k->run;
    r.iov_len = m * k->run;
    if (process_vm_writev(k->s->pid[q], l, m, &r, 1, 0) < 0) perror("process_vm_writev");
  }
}

static void store_mapped(const rank *k, int q, char *dst) {
  for (size_t i = 0; i < k->rows; ++i)
    memcpy(dst + (size_t)k->p * k->part + i * k->run, k->in + i * ROW + (size_t)q * k->run,
           k->run);
}

/* The stores of store_mapped through a mapping made for this exchange only. */
static void store_remapped(const rank *k, int q) {
  char *m = mmap(NULL, k->part, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, k->fd[q],
                 (off_t)((size_t)k->p * k->part));
  if (m == MAP_FAILED) {
    perror("mmap");
    return;
  }
  store_mapped(k, q, m - (size_t)k->p * k->part);
  munmap(m, k->part);
}

static void pull_raw(const rank *k, int q) {
  struct iovec l = {k->own + (size_t)q * k->part, k->part};
  struct iovec r = {k->s->packed[q] + (size_t)k->p * k->part, k->part};
  if (process_vm_readv(k->s->pid[q], &l, 1, &r, 1, 0) < 0) perror("process_vm_readv");
}

/* One exchange by `mean`: every peer's part, starting with the next rank, and its
 * own (a strided copy, but for raw, whose input is packed). */
static void exchange(const rank *k, int mean) {
  for (int i = 1; i <= k->n; ++i) {
    int q = (k->p + i) % k->n;
    if (mean == 3 && q == k->p)
      memcpy(k->own + (size_t)q * k->part, k->packed + (size_t)q * k->part, k->part);
    else if (mean == 3) pull_raw(k, q);
    else if (mean == 2 && q != k->p) store_remapped(k, q);
    else if (mean >= 1 || q == k->p) store_mapped(k, q, k->out[q]);
    else push_writev(k, q);
  }
}

static void run_rank(rank *k) {
  k->in = aligned_alloc(ROW, k->rows * ROW);
  k->packed = aligned_alloc(ROW, k->rows * ROW);
  k->own = aligned_alloc(ROW, k->rows * ROW);
  memset(k->in, k->p + 1, k->rows * ROW);
  memset(k->packed, k->p + 1, k->rows * ROW);
  memset(k->own, 0, k->rows * ROW);
  k->s->pid[k->p] = getpid();
  k->s->packed[k->p] = k->packed;
  barrier(k);
  for (int round = 0; round < 3; ++round) {
    for (int mean = 0; mean < MEANS; ++mean) {
      barrier(k);
      double t0 = now();
      for (int it = 0; it < ITERS; ++it) {
        exchange(k, mean);
        barrier(k);
      }
      if (k->p == 0 && round == 2) k->s->seconds[mean] = (now() - t0) / ITERS;
    }
  }
}

static void *shared_map(size_t bytes) {
  void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return m == MAP_FAILED ? NULL : m;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  double mib = argc > 2 ? atof(argv[2]) : 1.0;
  size_t bytes = (size_t)(mib * 1048576.0) / ((size_t)n * ROW) * ((size_t)n * ROW);
  if (n < 2 || n > 64 || bytes == 0) {
    fprintf(stderr, "usage: %s RANKS(2..64) MIB_PER_RANK\n", argv[0]);
    return 2;
  }
  shared *s = shared_map(sizeof *s);
  char **out = malloc((size_t)n * sizeof *out);
  int *fd = malloc((size_t)n * sizeof *fd);
  if (s == NULL || out == NULL || fd == NULL) return 1;
  s->n = n;
  for (int q = 0; q < n; ++q) { /* outputs every rank maps, made before the fork */
    fd[q] = memfd_create("output", 0);
    if (fd[q] < 0 || ftruncate(fd[q], (off_t)bytes) != 0) return 1;
    out[q] = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd[q], 0);
    if (out[q] == MAP_FAILED) return 1;
  }
  for (int p = 0; p < n; ++p) {
    if (fork() != 0) continue;
    rank k = {p, n, 0, bytes / ROW, ROW / (size_t)n, bytes / (size_t)n, NULL, NULL, NULL, out, fd, s};
    run_rank(&k);
    _exit(0);
  }
  for (int p = 0; p < n; ++p) wait(NULL);
  double raw = s->seconds[3];
  printf("%d ranks, %.2f MiB per rank, runs of %d B: writev %.0f us (%.2f of raw), "
         "mapped %.0f us (%.2f), remap %.0f us (%.2f), raw %.0f us\n", n,
         (double)bytes / 1048576.0, ROW / n, s->seconds[0] * 1e6, s->seconds[0] / raw,
         s->seconds[1] * 1e6, s->seconds[1] / raw, s->seconds[2] * 1e6, s->seconds[2] / raw,
         raw * 1e6);
  return 0;
}
