/* Interleaved boxes (Shard(1) of a C-order array: every row of the file holds a
 * piece of every rank's box) through row slabs, pipelined.
 *
 * Writing them in place would mean millions of short writes, or MPI-IO's
 * two-phase collective buffering, which gathers each part of the file on a few
 * aggregator ranks and writes it from there, the exchange and the writes taking turns.
 * Instead each rank's share of the file is one run of whole rows of dim 0 (its
 * slab), and the boxes are exchanged in memory into the slabs; each byte crosses
 * the wire at most once and is written once. Done whole, the exchange adds its
 * full time to the write's. So the slabs move in chunks of a few MiB: while an
 * I/O thread writes chunk k with pwrite, the main thread exchanges chunk k + 1.
 * On a file system that serialises writers of one file (ext4's inode lock), the
 * ranks that wait for the lock exchange meanwhile, and the total approaches the
 * writes alone; and a chunk is placed and written while it is still in cache.
 * Reads mirror it: chunk k + 1 is read while chunk k is exchanged.
 *
 * A box's rows of dim 0 are one run of its C-contiguous buffer, so every message
 * is contiguous on the box's side (MPI moves it with a single copy between
 * processes) and only the chunk's side is packed or placed, by plain copies.
 *
 * The I/O thread makes no MPI call, so no MPI thread level is needed; when the
 * thread cannot start (or is turned off) the transfers run inline, in order. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "io-private.h"
#include "mpitensor/comm/pool.h"
#include "mpitensor/core/pack.h"

/* The largest message, so that a count fits an int; and the tag of the chunks'
 * messages (the comm's other traffic is collective, which tags never match). */
#define MSG_MAX ((int64_t)1 << 30)
#define TAG 7411

/* ---- geometry: slabs of rows, and the chunks of each slab ------------------- */

typedef struct slabs {
  const mt__slab_io *s;
  int n, me;
  int64_t lo, hi;     /* the rows of dim 0 that some box touches */
  int64_t rowbytes;   /* one row of dim 0 of the array */
  int64_t rows;       /* rows per chunk */
  int64_t rounds;
  int64_t stage;      /* bytes of the staging buffer: the most any round needs */
  int parts;          /* messages per piece at most (MPI counts are ints) */
  int stopped;        /* some rank failed before the first round */
  MPI_Request *reqs;  /* 2 n parts */
} slabs;

/* Rank r's slab: an even share of rows [lo, hi), the remainder spread. */
static void slab_of(const slabs *g, int r, int64_t *start, int64_t *end) {
  int64_t span = g->hi - g->lo;
  *start = g->lo + span * r / g->n;
  *end = g->lo + span * (r + 1) / g->n;
}

/* The rows of rank r's slab that round k moves: empty past the slab's end. */
static void chunk_of(const slabs *g, int r, int64_t k, int64_t *start, int64_t *end) {
  int64_t a = 0, b = 0;
  slab_of(g, r, &a, &b);
  *start = a + k * g->rows < b ? a + k * g->rows : b;
  *end = *start + g->rows < b ? *start + g->rows : b;
}

static int64_t box_bytes(const slabs *g, const mt_box *b) {
  return mt_box_numel(b) * g->s->array->itemsize;
}

static int64_t row_at(const slabs *g, const mt_box *whole, const mt_box *part) {
  return mt__row_at(g->s->array->itemsize, whole, part);
}

/* Round k's pieces with peer q: the rows of this rank's box that fall in q's
 * chunk, and the rows of q's box that fall in this rank's chunk. */
static void pieces(const slabs *g, int64_t k, int q, mt_box *mine_in_q, mt_box *q_in_mine) {
  int64_t m0 = 0, m1 = 0, q0 = 0, q1 = 0;
  chunk_of(g, g->me, k, &m0, &m1);
  chunk_of(g, q, k, &q0, &q1);
  *mine_in_q = mt__rows_of(&g->s->boxes[g->me], q0, q1);
  *q_in_mine = mt__rows_of(&g->s->boxes[q], m0, m1);
}

/* The staging bytes a round needs at most: what other ranks' boxes take of this
 * rank's chunk (received to be placed when writing, packed to be sent when
 * reading; boxes may overlap when reading, so it can exceed a chunk). */
static int64_t stage_bytes(const slabs *g) {
  int64_t most = 0;
  for (int64_t k = 0; k < g->rounds; ++k) {
    int64_t sum = 0;
    for (int q = 0; q < g->n; ++q) {
      mt_box unused, theirs;
      pieces(g, k, q, &unused, &theirs);
      if (q != g->me) sum += box_bytes(g, &theirs);
    }
    most = sum > most ? sum : most;
  }
  return most;
}

/* The slabs' rows and this rank's place among them; nothing allocated. */
static void geometry(slabs *g, const mt__slab_io *s) {
  memset(g, 0, sizeof *g);
  g->s = s;
  MPI_Comm_size(s->comm, &g->n);
  MPI_Comm_rank(s->comm, &g->me);
  const mt_io_array *a = s->array;
  g->lo = a->shape[0], g->hi = 0;
  for (int r = 0; r < g->n; ++r) {
    const mt_box *b = &s->boxes[r];
    if (mt_box_numel(b) == 0) continue;
    if (b->offset[0] < g->lo) g->lo = b->offset[0];
    if (b->offset[0] + b->shape[0] > g->hi) g->hi = b->offset[0] + b->shape[0];
  }
  if (g->hi < g->lo) g->lo = g->hi = 0;
  g->rowbytes = a->itemsize;
  for (int d = 1; d < a->ndim; ++d) g->rowbytes *= a->shape[d];
}

static int init_slabs(slabs *g, const mt__slab_io *s, mt_error *err) {
  geometry(g, s);
  g->rows = s->chunk / g->rowbytes > 1 ? s->chunk / g->rowbytes : 1;
  int64_t most = (g->hi - g->lo + g->n - 1) / g->n; /* the largest slab */
  g->rounds = (most + g->rows - 1) / g->rows;
  g->stage = stage_bytes(g);
  g->parts = (int)((g->rows * g->rowbytes + MSG_MAX - 1) / MSG_MAX);
  g->reqs = malloc(2 * (size_t)g->n * (size_t)g->parts * sizeof(MPI_Request));
  return g->reqs != NULL ? MT_OK : mt_error_set(err, MT_ENOMEM, "out of memory");
}

/* ---- one round of the exchange: contiguous messages, placed by copies ------- */

/* Posts the messages of `bytes` to `peer` from `out`, or from `peer` into `in`
 * (the other NULL), in parts of at most MSG_MAX bytes (MPI counts are ints);
 * ordered, so the parts pair up. */
static int post(slabs *g, const char *out, char *in, int64_t bytes, int peer, int *nreq,
                mt_error *err) {
  for (int64_t at = 0; at < bytes; at += MSG_MAX) {
    int count = (int)(bytes - at < MSG_MAX ? bytes - at : MSG_MAX);
    MPI_Request *r = &g->reqs[(*nreq)++];
    int rc = out != NULL ? MPI_Isend(out + at, count, MPI_BYTE, peer, TAG, g->s->comm, r)
                         : MPI_Irecv(in + at, count, MPI_BYTE, peer, TAG, g->s->comm, r);
    if (rc != MPI_SUCCESS)
      return mt_mpi_error(err, rc, out ? "MPI_Isend" : "MPI_Irecv");
  }
  return MT_OK;
}

/* Completes the round's messages. MPI waits by spinning, which on a busy core
 * starves the I/O thread of the same rank: whenever the rank runs that thread,
 * poll and yield the core between polls. */
static int wait_round(slabs *g, int nreq, const mt__io_worker *w, mt_error *err) {
  int done = 0, rc = MPI_SUCCESS;
  while (rc == MPI_SUCCESS && !done) {
    if (!w->threaded) {
      rc = MPI_Waitall(nreq, g->reqs, MPI_STATUSES_IGNORE);
      break;
    }
    rc = MPI_Testall(nreq, g->reqs, &done, MPI_STATUSES_IGNORE);
    if (rc == MPI_SUCCESS && !done) sched_yield();
  }
  return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Waitall");
}

static void unpack(const slabs *g, const mt_box *part, const char *piece, char *buf,
                   const mt_box *whole) {
  mt__unpack_box(g->s->array->itemsize, part, piece, buf, whole);
}

/* The reverse: `part` out of `buf` (box `whole`) into `piece`, C-contiguous. */
static void pack(const slabs *g, const mt_box *part, const char *buf, const mt_box *whole,
                 char *piece) {
  int64_t zero[MT_MAX_NDIM] = {0}, at[MT_MAX_NDIM];
  for (int d = 0; d < part->ndim; ++d) at[d] = part->offset[d] - whole->offset[d];
  mt_copy_box(buf, whole->shape, at, piece, part->shape, zero, part, g->s->array->itemsize);
}

/* Collective. Round k of a write: this rank's box rows go to the peers whose
 * chunks hold them, straight from `buf` (a box's rows are one run of it); the
 * peers' rows of this rank's chunk arrive in `stage` and are placed in `chunk`,
 * beside the rows this rank keeps. Adds the bytes sent to *sent. */
static int gather_chunk(slabs *g, int64_t k, const char *buf, char *chunk,
                        const mt_box *cbox, char *stage, const mt__io_worker *w, int64_t *sent,
                        mt_error *err) {
  const mt_box *mine = &g->s->boxes[g->me];
  int nreq = 0, rc = MT_OK;
  int64_t off = 0;
  for (int q = 0; q < g->n && rc == MT_OK; ++q) {
    mt_box out, in;
    pieces(g, k, q, &out, &in);
    if (q == g->me) continue;
    rc = post(g, NULL, stage + off, box_bytes(g, &in), q, &nreq, err);
    off += box_bytes(g, &in);
    const char *from = buf + row_at(g, mine, &out);
    if (rc == MT_OK) rc = post(g, from, NULL, box_bytes(g, &out), q, &nreq, err);
    *sent += box_bytes(g, &out);
  }
  mt_box own, unused;
  pieces(g, k, g->me, &own, &unused);
  if (mt_box_numel(&own) > 0) unpack(g, &own, buf + row_at(g, mine, &own), chunk, cbox);
  int wrc = wait_round(g, nreq, w, err);
  if (rc == MT_OK) rc = wrc;
  off = 0;
  for (int q = 0; q < g->n && rc == MT_OK; ++q) {
    mt_box out, in;
    pieces(g, k, q, &out, &in);
    if (q == g->me || mt_box_numel(&in) == 0) continue;
    unpack(g, &in, stage + off, chunk, cbox);
    off += box_bytes(g, &in);
  }
  return rc;
}

/* Collective. Round k of a read, the mirror image: the peers' rows of this
 * rank's chunk are packed into `stage` and sent; this rank's box rows arrive
 * from the peers straight into their place in `buf`. */
static int scatter_chunk(slabs *g, int64_t k, char *buf, char *chunk, const mt_box *cbox,
                         char *stage, const mt__io_worker *w, int64_t *sent, mt_error *err) {
  const mt_box *mine = &g->s->boxes[g->me];
  int nreq = 0, rc = MT_OK;
  int64_t off = 0;
  for (int q = 0; q < g->n && rc == MT_OK; ++q) {
    mt_box in, out;
    pieces(g, k, q, &in, &out);
    if (q == g->me) continue;
    rc = post(g, NULL, buf + row_at(g, mine, &in), box_bytes(g, &in), q, &nreq, err);
    if (rc == MT_OK && mt_box_numel(&out) > 0) pack(g, &out, chunk, cbox, stage + off);
    if (rc == MT_OK) rc = post(g, stage + off, NULL, box_bytes(g, &out), q, &nreq, err);
    off += box_bytes(g, &out);
    *sent += box_bytes(g, &out);
  }
  mt_box own, unused;
  pieces(g, k, g->me, &own, &unused);
  if (mt_box_numel(&own) > 0) pack(g, &own, chunk, cbox, buf + row_at(g, mine, &own));
  int wrc = wait_round(g, nreq, w, err);
  return rc == MT_OK ? wrc : rc;
}

/* ---- the pipelines ---------------------------------------------------------- */

static int io_status(int e, int writing, mt_error *err) {
  if (e == 0) return MT_OK;
  return mt_error_set(err, MT_EIO, "%s the file failed: %s",
                      writing ? "writing" : "reading", strerror(e));
}

/* Two chunk buffers of this rank's chunk size and the staging buffer, from the
 * pool: fresh ones would be faulted in on every save. */
typedef struct buffers {
  char *chunk[2], *stage;
} buffers;

static int alloc_buffers(const slabs *g, buffers *b, mt_error *err) {
  int64_t s0 = 0, s1 = 0;
  slab_of(g, g->me, &s0, &s1);
  int64_t rows = s1 - s0 < g->rows ? s1 - s0 : g->rows;
  size_t bytes = (size_t)(rows * g->rowbytes);
  b->chunk[0] = bytes > 0 ? mt_pool_alloc(bytes) : NULL;
  b->chunk[1] = bytes > 0 && g->rounds > 1 ? mt_pool_alloc(bytes) : b->chunk[0];
  b->stage = g->stage > 0 ? mt_pool_alloc((size_t)g->stage) : NULL;
  if ((bytes > 0 && (b->chunk[0] == NULL || b->chunk[1] == NULL)) ||
      (g->stage > 0 && b->stage == NULL)) {
    return mt_error_set(err, MT_ENOMEM,
                        "out of memory for the chunks of a sharded file");
  }
  return MT_OK;
}

static void free_buffers(buffers *b) {
  if (b->chunk[1] != b->chunk[0]) mt_pool_free(b->chunk[1]);
  mt_pool_free(b->chunk[0]);
  mt_pool_free(b->stage);
}

/* Where round k's chunk of this rank goes in the file, and its bytes. */
static void chunk_place(const slabs *g, int64_t k, mt_box *box, int64_t *at, int64_t *len) {
  int64_t c0 = 0, c1 = 0;
  chunk_of(g, g->me, k, &c0, &c1);
  *box = mt__whole_rows(g->s->array, c0, c1);
  *at = g->s->array->offset + c0 * g->rowbytes;
  *len = (c1 - c0) * g->rowbytes;
}

static int64_t slab_bytes(const slabs *g) {
  int64_t s0 = 0, s1 = 0;
  slab_of(g, g->me, &s0, &s1);
  return (s1 - s0) * g->rowbytes;
}

void mt__slab_range(const mt__slab_io *s, int64_t *at, int64_t *len) {
  slabs g;
  geometry(&g, s);
  int64_t s0 = 0, s1 = 0;
  slab_of(&g, g.me, &s0, &s1);
  *at = s->array->offset + s0 * g.rowbytes;
  *len = (s1 - s0) * g.rowbytes;
}

/* Collective. Sets up, and agrees that every rank may go on: after this no rank
 * fails alone within a round (a failed transfer is skipped and reported at the
 * end), so the rounds need no agreement of their own. */
static int setup(slabs *g, buffers *b, const mt__slab_io *s, int rc, mt_error *err) {
  memset(b, 0, sizeof *b);
  int local = init_slabs(g, s, err);
  if (local == MT_OK) local = alloc_buffers(g, b, err);
  if (rc == MT_OK) rc = local;
  int failed = rc != MT_OK;
  int mrc = MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, s->comm);
  if (mrc != MPI_SUCCESS && rc == MT_OK) rc = mt_mpi_error(err, mrc, "MPI_Allreduce");
  /* Another rank failed: it reports; this one moves nothing and stops with it. */
  if (failed) g->rounds = 0, g->stopped = 1;
  return rc;
}

static int finish_slabs(slabs *g, buffers *b, mt__io_worker *w, int writing, int rc,
                        int64_t sent, mt_error *err) {
  int e = mt__worker_stop(w);
  if (rc == MT_OK) rc = io_status(e, writing, err);
  if (rc == MT_OK && g->rounds > 0) {
    mt_comm_count(g->s->comm_counters, MT_COLL_ALL_TO_ALL, sent);
  }
  int64_t moved = rc == MT_OK && !g->stopped ? slab_bytes(g) : 0;
  mt__io_count(g->s->io_counters, writing ? 0 : moved, writing ? moved : 0);
  free_buffers(b);
  free(g->reqs);
  return rc;
}

int mt__slabs_write(const mt__slab_io *s, int rc, const void *buf, mt_error *err) {
  slabs g;
  buffers b;
  rc = setup(&g, &b, s, rc, err);
  mt__io_worker w;
  mt__worker_start(&w, s->fd, 1, s->threaded);
  int64_t sent = 0;
  for (int64_t k = 0; rc == MT_OK && k < g.rounds; ++k) {
    mt_box cbox;
    int64_t at = 0, len = 0;
    chunk_place(&g, k, &cbox, &at, &len);
    /* The write of round k - 2 used this buffer; a failed one shows at the end. */
    mt__worker_wait(&w, k - 1);
    rc = gather_chunk(&g, k, buf, b.chunk[k % 2], &cbox, b.stage, &w, &sent, err);
    if (rc == MT_OK) mt__worker_post(&w, b.chunk[k % 2], len, at);
  }
  return finish_slabs(&g, &b, &w, 1, rc, sent, err);
}

int mt__slabs_read(const mt__slab_io *s, int rc, void *buf, mt_error *err) {
  slabs g;
  buffers b;
  rc = setup(&g, &b, s, rc, err);
  mt__io_worker w;
  mt__worker_start(&w, s->fd, 0, s->threaded);
  int64_t sent = 0, at = 0, len = 0;
  mt_box cbox;
  if (rc == MT_OK && g.rounds > 0) {
    chunk_place(&g, 0, &cbox, &at, &len);
    mt__worker_post(&w, b.chunk[0], len, at);
  }
  for (int64_t k = 0; rc == MT_OK && k < g.rounds; ++k) {
    /* The exchange of round k - 1 is done with the other buffer: refill it. */
    if (k + 1 < g.rounds) {
      chunk_place(&g, k + 1, &cbox, &at, &len);
      mt__worker_post(&w, b.chunk[(k + 1) % 2], len, at);
    }
    chunk_place(&g, k, &cbox, &at, &len);
    /* A failed read leaves garbage that is sent on; it shows at the end. */
    mt__worker_wait(&w, k + 1);
    rc = scatter_chunk(&g, k, buf, b.chunk[k % 2], &cbox, b.stage, &w, &sent, err);
  }
  return finish_slabs(&g, &b, &w, 0, rc, sent, err);
}
