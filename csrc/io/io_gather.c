/* Saving interleaved boxes (Shard(1) of a C-order array) when every rank shares
 * one node: two writers assemble and write the file, chunk by chunk, reading the
 * other ranks' rows straight out of their memory into their place in the chunk
 * (mt_direct_copy, Linux's cross-memory attach: the single copy Open MPI's
 * shared-memory transport makes for a large message). The writers take turns,
 * each filling and then writing its own chunks, so that one fills while the other
 * writes: two threads of the first rank when it may run on two CPUs, else the
 * first two ranks when each is bound to a CPU of its own (Open MPI binds two ranks
 * to cores by default). The other ranks sleep until they are done.
 *
 * Why so few writers: a local file system serialises the buffered writers of one
 * file (ext4 and XFS hold the inode lock through each write), so N writers of
 * their row slabs take at least as long as one writer of the whole file, and the
 * exchange into slabs (io_slabs.c) adds N ranks' worth of threads copying each
 * byte twice (the MPI transfer and the placement), all competing with the writes
 * for the cores. Here each byte is copied once before its write and two threads
 * run, and it keeps more of numpy.save's bandwidth than the row-slab exchange
 * (docs/benchmarks.md, "Checkpoints").
 *
 * It runs only where it can work and pays: on Linux, with the I/O thread allowed
 * and the gather not turned off (mt_io_options), when the writers have two CPUs
 * between them (two threads bound to one core would only take turns on it, and lose
 * to the exchange; mode 2 takes the first rank's threads regardless) and they can
 * read every other rank's memory. That last check reads back a token each rank
 * publishes, so a rank on another node or in another PID namespace, where the same
 * pid is some other process, is never read from by mistake; ptrace restrictions
 * (Yama) or a seccomp filter make it fail the same way. Otherwise the caller takes
 * the row-slab exchange. Loads keep the exchange: readers of one file run in
 * parallel, so there every rank reading its own slab is the faster way. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "io-private.h"
#include "mpitensor/comm/direct.h"
#include "mpitensor/comm/pool.h"

/* What each rank tells the others: where its box is, where its token is and what
 * it says, whether it can take part, and the CPUs it may run on (how many, and
 * the first of them). */
typedef struct peer {
  int64_t pid, buf, token_at, token, ready, cpus, cpu;
} peer;

/* Who writes, chunk k by writer k % 2: nobody (the caller exchanges row slabs),
 * two threads of the first rank (it may use two CPUs), or the main threads of the
 * first two ranks (each bound to a CPU of its own, as Open MPI binds two ranks). */
enum { NOBODY, THREADS, PAIR };

typedef struct gather {
  const mt__slab_io *s;
  int n, me, plan;
  int64_t rowbytes, rows; /* bytes per row of dim 0; rows per full chunk */
  char *chunk[2];         /* a writer's: both in THREADS, its own half's in PAIR */
  peer *peers;            /* every rank's */
} gather;

static int64_t box_bytes(const gather *g, const mt_box *b) {
  return mt_box_numel(b) * g->s->array->itemsize;
}

/* ---- whether to gather: asked of the first rank, answered to all ------------ */

/* The CPUs this process may run on, which only Linux tells; elsewhere one, and
 * reading another process's memory fails (mt_direct_copy), so the gather is never
 * chosen. */
#ifdef __linux__
static void cpu_info(int64_t *count, int64_t *first) {
  cpu_set_t set;
  CPU_ZERO(&set);
  *count = 1, *first = -1;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return;
  *count = CPU_COUNT(&set);
  for (size_t c = 0; c < CPU_SETSIZE && *first < 0; ++c) *first = CPU_ISSET(c, &set) ? (int64_t)c : -1;
}
#else
static void cpu_info(int64_t *count, int64_t *first) { *count = 1, *first = -1; }
#endif

/* Whether `p`'s token reads back from `p`'s memory: that process is the rank. */
static int reads_back(const peer *p) {
  return mt_process_reads_back(p->pid, (uint64_t)p->token_at, p->token);
}

/* Whether this rank writes chunk k. */
static int writes(const gather *g, int64_t k) {
  return g->plan == PAIR ? g->me == (int)(k % 2) : g->plan == THREADS && g->me == 0;
}

/* The plan, from every rank's record and the first rank's mode: the same on every
 * rank. Two threads of one rank bound to one CPU would only take turns on it. */
static int plan_of(const gather *g, int mode) {
  const peer *p = g->peers;
  for (int q = 0; q < g->n; ++q) {
    if (!p[q].ready) return NOBODY;
  }
  if (mode == 2 || p[0].cpus >= 2) return THREADS;
  if (p[0].cpus == 1 && p[1].cpus == 1 && p[0].cpu != p[1].cpu) return PAIR;
  return NOBODY;
}

/* A writer: whether every other rank's memory reads back, and its chunks. */
static int writer_ready(gather *g) {
  for (int q = 0; q < g->n; ++q) {
    if (q != g->me && !reads_back(&g->peers[q])) return 0;
  }
  size_t bytes = (size_t)(g->rows * g->rowbytes);
  for (int i = 0; i < 2; ++i) {
    if (g->plan == THREADS || i == g->me) g->chunk[i] = mt_pool_alloc(bytes);
    if ((g->plan == THREADS || i == g->me) && g->chunk[i] == NULL) return 0;
  }
  return 1;
}

/* Collective. Three messages: whether a gather may happen at all (the first
 * rank's settings; every rank's room for the records), every rank's record to
 * every rank, and whether the writers are ready. The answer is the same on every
 * rank; an MPI failure answers NOBODY on this rank and is left to the caller's
 * agreement. */
static int decide(gather *g, int rc, const void *buf) {
  const mt__slab_io *s = g->s;
  int mode = s->gather;
  if (!s->threaded || g->n < 2 || g->rowbytes == 0) mode = 0;
  g->peers = malloc((size_t)g->n * sizeof *g->peers);
  int may = g->peers == NULL ? 0 : g->me == 0 ? mode : 2;
  /* A rank without room offered 0, so may is 0 wherever peers is NULL. */
  if (MPI_Allreduce(MPI_IN_PLACE, &may, 1, MPI_INT, MPI_MIN, s->comm) != MPI_SUCCESS ||
      may == 0 || g->peers == NULL) {
    return NOBODY;
  }
  const int64_t *token = mt_process_token();
  peer mine = {(int64_t)getpid(), (int64_t)(intptr_t)buf, (int64_t)(intptr_t)token, *token,
               rc == MT_OK, 1, -1};
  cpu_info(&mine.cpus, &mine.cpu);
  int bytes = (int)sizeof mine;
  if (MPI_Allgather(&mine, bytes, MPI_BYTE, g->peers, bytes, MPI_BYTE, s->comm) !=
      MPI_SUCCESS) {
    return NOBODY;
  }
  g->plan = plan_of(g, may);
  int ready = g->plan == NOBODY || !(g->me == 0 || (g->plan == PAIR && g->me == 1)) ||
              writer_ready(g);
  if (MPI_Allreduce(MPI_IN_PLACE, &ready, 1, MPI_INT, MPI_MIN, s->comm) != MPI_SUCCESS ||
      !ready) {
    return NOBODY;
  }
  return g->plan;
}

/* ---- the assembly, on the first rank --------------------------------------- */

/* Reads `part` of rank q's box, out of its buffer (the C-contiguous array of its
 * box), into its place in `chunk`, the array of box `rows`. */
static int pull(const gather *g, int q, const mt_box *part, const mt_box *rows, char *chunk,
                mt_error *err) {
  const peer *p = &g->peers[q];
  int e = mt_direct_copy(p->pid, 0, (uint64_t)(uintptr_t)chunk, rows, (uint64_t)p->buf,
                         &g->s->boxes[q], part, g->s->array->itemsize);
  if (e != 0) {
    return mt_error_set(err, MT_EIO, "reading rank %d's box from its memory failed: %s", q,
                        strerror(e));
  }
  return MT_OK;
}

/* Rows [r0, r1) of the file into `chunk`: this rank's own rows by copies, the
 * others' read from their memory. */
static int fill(const gather *g, int64_t r0, int64_t r1, char *chunk, const void *buf,
                mt_error *err) {
  const mt__slab_io *s = g->s;
  mt_box rows = mt__whole_rows(s->array, r0, r1);
  int rc = MT_OK;
  for (int q = 0; q < g->n && rc == MT_OK; ++q) {
    mt_box part = mt__rows_of(&s->boxes[q], r0, r1);
    if (mt_box_numel(&part) == 0) continue;
    if (q == g->me) {
      const char *piece = (const char *)buf + mt__row_at(s->array->itemsize, &s->boxes[q], &part);
      mt__unpack_box(s->array->itemsize, &part, piece, chunk, &rows);
    } else {
      rc = pull(g, q, &part, &rows, chunk, err);
    }
  }
  return rc;
}

/* Rows in chunk k: the first three chunks are an eighth, a quarter and a half of
 * the others, so that the writes start early (only the first chunk's assembly is
 * not hidden behind a write). */
static int64_t rows_in(const gather *g, int64_t k) {
  int64_t rows = k < 3 ? g->rows >> (3 - k) : g->rows;
  return rows > 0 ? rows : 1;
}

/* Chunk k's rows [*r0, *r1) of the file, empty past its end. */
static void chunk_rows(const gather *g, int64_t k, int64_t *r0, int64_t *r1) {
  int64_t total = g->s->array->shape[0], at = 0;
  for (int64_t j = 0; j < k && j < 3; ++j) at += rows_in(g, j);
  if (k > 3) at += (k - 3) * g->rows;
  *r0 = at < total ? at : total;
  *r1 = at + rows_in(g, k) < total ? at + rows_in(g, k) : total;
}

/* One of the two threads of the assembly: the chunks k with k % 2 == part, each
 * filled and then written by this same thread, from its own buffer. */
typedef struct half {
  const gather *g;
  const void *buf;
  int part;
  atomic_int *stop; /* shared: set by the first failure */
  int rc;
  mt_error err;
} half;

static void *run_half(void *arg) {
  half *h = arg;
  const gather *g = h->g;
  char *chunk = g->chunk[h->part];
  for (int64_t k = h->part;; k += 2) {
    int64_t r0 = 0, r1 = 0;
    chunk_rows(g, k, &r0, &r1);
    if (r0 == r1 || atomic_load(h->stop)) break;
    h->rc = fill(g, r0, r1, chunk, h->buf, &h->err);
    int e = h->rc == MT_OK ? mt__io_transfer(g->s->fd, chunk, NULL, (r1 - r0) * g->rowbytes,
                                              g->s->array->offset + r0 * g->rowbytes)
                           : 0;
    if (e != 0)
      h->rc = mt_error_set(&h->err, MT_EIO, "writing the file failed: %s", strerror(e));
    if (h->rc != MT_OK) {
      atomic_store(h->stop, 1);
      break;
    }
  }
  return NULL;
}

/* The whole file, by two writers that take turns: while one writes its chunk (the
 * file system lets one writer in at a time) the other fills the next. Each chunk is
 * filled and written on one core, so the write reads it from that core's cache;
 * handing the chunks to an I/O thread to write (as io_slabs.c does) moved every
 * byte across cores once more and was slower. In THREADS the first rank runs both
 * halves (in order, when a second thread cannot start); in PAIR each of the first
 * two ranks runs its own. */
static int assemble(const gather *g, const void *buf, mt_error *err) {
  atomic_int stop = 0;
  half halves[2] = {{g, buf, 0, &stop, MT_OK, {0}}, {g, buf, 1, &stop, MT_OK, {0}}};
  if (g->plan == PAIR) {
    run_half(&halves[g->me]);
    if (halves[g->me].rc != MT_OK && err != NULL) *err = halves[g->me].err;
    return halves[g->me].rc;
  }
  pthread_t other;
  int threaded = pthread_create(&other, NULL, run_half, &halves[1]) == 0;
  run_half(&halves[0]);
  if (threaded) {
    pthread_join(other, NULL);
  } else if (halves[0].rc == MT_OK) {
    run_half(&halves[1]);
  }
  for (int i = 0; i < 2; ++i) {
    if (halves[i].rc != MT_OK) {
      if (err != NULL) *err = halves[i].err;
      return halves[i].rc;
    }
  }
  return MT_OK;
}

/* This rank's bytes of the file written, and of its box read by another rank. */
static void moved(const gather *g, int64_t *written, int64_t *sent) {
  const mt_box *mine = &g->s->boxes[g->me];
  *written = *sent = 0;
  for (int64_t k = 0;; ++k) {
    int64_t r0 = 0, r1 = 0;
    chunk_rows(g, k, &r0, &r1);
    if (r0 == r1) break;
    mt_box part = mt__rows_of(mine, r0, r1);
    if (writes(g, k)) *written += (r1 - r0) * g->rowbytes;
    else *sent += box_bytes(g, &part);
  }
}

/* ---- the end: the others wait, asleep, for the writers' verdict ------------ */

/* Collective. *failed becomes whether any writer failed, on every rank; an MPI
 * error code, or MPI_SUCCESS. The others have nothing to do meanwhile, and
 * spinning in MPI would take the cores the writers need, so they poll with naps
 * (up to 200 us, short beside the smallest saves that gain from this path). */
static int wait_for_writers(const gather *g, int *failed, int writer) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, failed, 1, MPI_INT, MPI_MAX, g->s->comm, &req);
  int done = rc != MPI_SUCCESS;
  if (done) req = MPI_REQUEST_NULL;
  long nap = 10L * 1000;
  while (!done && !writer && MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
         !done) {
    struct timespec ts = {0, nap};
    nanosleep(&ts, NULL);
    nap = nap < 200L * 1000 ? nap * 2 : nap;
  }
  /* A writer waits outright; for the others it is a no-op once done, and
   * completes the request if a test failed. */
  int wrc = MPI_Wait(&req, MPI_STATUS_IGNORE);
  return rc != MPI_SUCCESS ? rc : wrc;
}

int mt__gather_write(const mt__slab_io *s, int *rc, const void *buf, mt_error *err) {
  gather g = {.s = s};
  MPI_Comm_size(s->comm, &g.n);
  MPI_Comm_rank(s->comm, &g.me);
  const mt_io_array *a = s->array;
  g.rowbytes = a->itemsize;
  for (int d = 1; d < a->ndim; ++d) g.rowbytes *= a->shape[d];
  g.rows = g.rowbytes > 0 && s->chunk / g.rowbytes > 1 ? s->chunk / g.rowbytes : 1;
  if (g.rows > a->shape[0] && a->shape[0] > 0) g.rows = a->shape[0];
  g.plan = decide(&g, *rc, buf);
  if (g.plan != NOBODY) {
    int writer = g.me == 0 || (g.plan == PAIR && g.me == 1);
    if (writer) *rc = assemble(&g, buf, err);
    /* The others keep MT_OK: a writer's failure reaches them through the
     * caller's agreement, with its message. */
    int failed = *rc != MT_OK;
    int mrc = wait_for_writers(&g, &failed, writer);
    if (mrc != MPI_SUCCESS && *rc == MT_OK)
      *rc = mt_mpi_error(err, mrc, "MPI_Iallreduce");
    if (*rc == MT_OK && !failed) {
      int64_t written = 0, sent = 0;
      moved(&g, &written, &sent);
      mt_comm_count(s->comm_counters, MT_COLL_ALL_TO_ALL, sent);
      mt__io_count(s->io_counters, 0, written);
    }
  }
  mt_pool_free(g.chunk[0]);
  mt_pool_free(g.chunk[1]);
  free(g.peers);
  return g.plan != NOBODY;
}
