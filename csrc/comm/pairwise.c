/* Large blocking steps by pairwise exchanges in chunks: a reduce-scatter, and an
 * all-gather along an inner dim.
 *
 * Open MPI's ring reduce-scatter (what MPI_Reduce_scatter runs on large buffers)
 * first copies the whole input into a temporary of the input's size, reduces the
 * blocks it receives into that temporary and copies this rank's block out at the
 * end: two passes over memory more than the reduction needs, and a temporary as
 * large as the input. An all-gather along an inner dim lands the blocks one after
 * another, so they had to be gathered into a staging buffer the size of the
 * output and copied to their places in a second pass over all of it.
 *
 * Here, in step s = 1 .. G-1, member `me` sends to member me + s and receives from
 * member me - s, one chunk of about 1 MiB at a time, two in flight each way,
 * into one of two staging chunks; each chunk is consumed (reduced into the output,
 * or copied to its place in the output) as soon as it arrives, while it is still
 * in cache. The bytes and the partners are the ring's: every member sends every
 * other member its part once, G - 1 partners per rank. The all-gather's chunks
 * are sent straight from the input, so it posts all its sends at once instead of
 * two at a time (post_sends). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm-private.h"
#include "exec-private.h"
#include "mpitensor/comm/pool.h"
#include "mpitensor/core/pack.h"

/* Point-to-point messages of these exchanges; collectives on the same
 * communicator never match them, nor do ring shifts (their own tag), and the
 * chunks from one peer match in the order they were sent. */
#define PAIR_TAG 0x6d72

/* Bytes per chunk. Every chunk is a rendezvous of its own (the receiver asks,
 * then copies it out of the sender's memory), whose round trip, and on a loaded
 * machine the wait for the peer to be scheduled, cost more than placing a chunk
 * from beyond the L2: a block of up to 1 MiB travels as one message. */
#define CHUNK_BYTES ((int64_t)1 << 20)

/* A block that travels in chunks: `rows` rows of `row_bytes` bytes, contiguous,
 * `per` rows a chunk. */
typedef struct chunked {
  int64_t rows, row_bytes, per, chunks;
} chunked;

static chunked chunk_rows(int64_t rows, int64_t row_bytes) {
  chunked c = {rows, row_bytes, 1, 0};
  if (row_bytes > 0 && row_bytes < CHUNK_BYTES) c.per = CHUNK_BYTES / row_bytes;
  c.chunks = rows > 0 && row_bytes > 0 ? (rows + c.per - 1) / c.per : 0;
  return c;
}

static int64_t rows_in(const chunked *c, int64_t i) {
  int64_t left = c->rows - i * c->per;
  return left < c->per ? left : c->per;
}

/* A block travels cut along its first dim of extent above 1 (everything inside
 * that dim is one contiguous row of the sender's input). */
static int cut_dim(const mt_box *b) {
  int a = 0;
  while (a < b->ndim - 1 && b->shape[a] == 1) ++a;
  return a;
}

static chunked block_chunks(const mt_box *b, int64_t isz) {
  int64_t numel = mt_box_numel(b);
  if (numel == 0 || b->ndim == 0) return chunk_rows(numel > 0 ? 1 : 0, numel * isz);
  int64_t rows = b->shape[cut_dim(b)];
  return chunk_rows(rows, numel / rows * isz);
}

/* One direction of a step: the peer, the block's layout, and its two requests. */
typedef struct side {
  int peer;
  chunked k;
  const char *base; /* sends: the block in this rank's input, when contiguous there */
  /* sends of a block that is not contiguous in the input: each chunk is packed
   * from `whole` (the input's box) into one of two send chunks first */
  const char *in;
  const mt_box *whole, *block;
  char *pack;
  int64_t isz;
  MPI_Request req[2];
} side;

/* What a received chunk becomes: reduced into the output, or put in its place. */
typedef struct consumer {
  int (*eat)(const struct consumer *u, const side *from, int64_t i, const char *chunk,
             mt_error *err);
  char *out;
  const mt_box *t;    /* the output box */
  const mt_box *from; /* the block that arrives (gather: the sender's; reduce: ours) */
  const char *in;     /* reduce: this rank's input, of box `whole` */
  const mt_box *whole;
  int first;          /* reduce: no partner's chunk has reached the output yet */
  int dtype, op;      /* reduce */
  int64_t isz;
} consumer;

/* Rows [i per, i per + n) of `block` cut along `a`, a box of the same global
 * coordinates. */
static mt_box chunk_box(const mt_box *block, int a, const chunked *k, int64_t i) {
  mt_box part = *block;
  if (part.ndim > 0) {
    part.offset[a] += i * k->per;
    part.shape[a] = rows_in(k, i);
  }
  return part;
}

/* Copies `part` between the C-contiguous array of box `from` and that of box `to`. */
static void copy_part(const char *src, const mt_box *from, char *dst, const mt_box *to,
                      const mt_box *part, int64_t isz) {
  int64_t at_src[MT_MAX_NDIM], at_dst[MT_MAX_NDIM];
  for (int d = 0; d < part->ndim; ++d) {
    at_src[d] = part->offset[d] - from->offset[d];
    at_dst[d] = part->offset[d] - to->offset[d];
  }
  mt_copy_box(src, from->shape, at_src, dst, to->shape, at_dst, part, isz);
}

static int post(side *s, int is_send, int64_t i, char *stage, int64_t stride,
                MPI_Comm comm, mt_error *err) {
  int n = (int)(rows_in(&s->k, i) * s->k.row_bytes);
  MPI_Request *r = &s->req[i % 2];
  const char *from = NULL;
  if (is_send && s->pack != NULL) {
    mt_box part = chunk_box(s->block, cut_dim(s->block), &s->k, i);
    char *to = s->pack + (i % 2) * stride;
    copy_part(s->in, s->whole, to, &part, &part, s->isz);
    from = to;
  } else if (is_send) {
    from = s->base + i * s->k.per * s->k.row_bytes;
  }
  int rc = is_send ? MPI_Isend(from, n, MPI_BYTE, s->peer, PAIR_TAG, comm, r)
                   : MPI_Irecv(stage + (i % 2) * stride, n, MPI_BYTE, s->peer, PAIR_TAG,
                               comm, r);
  return rc == MPI_SUCCESS ? MT_OK
                           : mt_mpi_error(err, rc, is_send ? "MPI_Isend" : "MPI_Irecv");
}

/* Requests still posted when a step fails are cancelled (the receives, so that
 * no message lands in a staging chunk after it is freed) and completed. Only MPI
 * itself can fail a step (the executor checked the dtype and reduction before
 * the first message), after which the communicator is of no further use. */
static void abandon(side *to, side *from) {
  for (int k = 0; k < 2; ++k) {
    if (from->req[k] != MPI_REQUEST_NULL) MPI_Cancel(&from->req[k]);
    if (to->req[k] != MPI_REQUEST_NULL) MPI_Cancel(&to->req[k]);
  }
  MPI_Request all[4] = {to->req[0], to->req[1], from->req[0], from->req[1]};
  /* The requests come from post(), which the MPI checker does not follow through
   * `side`; unused ones are MPI_REQUEST_NULL. */
  (void)MT__BLOCKING("MPI_Waitall", MPI_Waitall(4, all, MPI_STATUSES_IGNORE)); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
}

/* `r` comes from post(), which the MPI checker does not follow through `side`. */
static int wait_one(MPI_Request *r, mt_error *err) {
  int rc = MT__BLOCKING("MPI_Wait", MPI_Wait(r, MPI_STATUS_IGNORE)); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
  return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Wait");
}

/* One step: sends `to` its chunks and consumes those `from` sends, two chunks in
 * flight each way; `stride` is the size of one staging chunk. */
static int step(side *to, side *from, const consumer *u, char *stage, int64_t stride,
                MPI_Comm comm, mt_error *err) {
  int rc = MT_OK;
  for (int64_t i = 0; i < 2; ++i) {
    if (rc == MT_OK && i < from->k.chunks) rc = post(from, 0, i, stage, stride, comm, err);
    if (rc == MT_OK && i < to->k.chunks) rc = post(to, 1, i, stage, stride, comm, err);
  }
  int64_t most = to->k.chunks > from->k.chunks ? to->k.chunks : from->k.chunks;
  for (int64_t i = 0; rc == MT_OK && i < most; ++i) {
    if (i < from->k.chunks) {
      rc = wait_one(&from->req[i % 2], err);
      if (rc == MT_OK) rc = u->eat(u, from, i, stage + (i % 2) * stride, err);
      if (rc == MT_OK && i + 2 < from->k.chunks)
        rc = post(from, 0, i + 2, stage, stride, comm, err);
    }
    if (rc == MT_OK && i < to->k.chunks) {
      rc = wait_one(&to->req[i % 2], err);
      if (rc == MT_OK && i + 2 < to->k.chunks)
        rc = post(to, 1, i + 2, stage, stride, comm, err);
    }
  }
  if (rc != MT_OK) abandon(to, from);
  return rc;
}

/* Room for four staging chunks of `stride` bytes (two to receive, two to pack
 * sends), of one size for every step up to 1 MiB chunks, so that the pool hands
 * the same resident block to every call. */
static size_t stage_bytes(int64_t stride) {
  return (size_t)(4 * (stride > CHUNK_BYTES ? stride : CHUNK_BYTES));
}

static side side_of(int64_t peer, chunked k, const char *base) {
  side s = {(int)peer, k, base, NULL, NULL, NULL, NULL, 0,
            {MPI_REQUEST_NULL, MPI_REQUEST_NULL}};
  return s;
}

/* ---- reduce-scatter ------------------------------------------------------------- */

/* The chunk's rows of the output are contiguous: the output is the block. */
static int eat_reduce(const consumer *u, const side *from, int64_t i, const char *chunk,
                      mt_error *err) {
  int64_t n = rows_in(&from->k, i) * from->k.row_bytes / u->isz;
  char *o = u->out + i * from->k.per * from->k.row_bytes;
  if (u->first) {
    mt_box part = chunk_box(u->from, cut_dim(u->from), &from->k, i);
    copy_part(u->in, u->whole, u->out, u->t, &part, u->isz);
  }
  return mt_reduce(o, chunk, n, u->dtype, u->op, err);
}

int mt__reduce_scatter_pairwise(const void *in, void *out, const mt_box *sb,
                                const mt_box *blocks, int64_t g, int64_t me, int dtype,
                                int op, int64_t isz, MPI_Comm comm, mt_error *err) {
  const mt_box *b = &blocks[me];
  chunked mine = block_chunks(b, isz);
  int64_t stride = 0;
  for (int64_t k = 0; k < g; ++k) {
    chunked c = block_chunks(&blocks[k], isz);
    if (c.chunks > 0 && c.per * c.row_bytes > stride) stride = c.per * c.row_bytes;
  }
  /* A block is contiguous in the input, and sent from there, when it spans the
   * input's whole extent in every dim after the one it is cut along; else each
   * chunk is packed into one of two send chunks on its way. */
  int slabs = 1;
  for (int64_t k = 0; k < g && slabs; ++k) {
    for (int d = cut_dim(&blocks[k]) + 1; d < sb->ndim; ++d)
      slabs &= blocks[k].shape[d] == sb->shape[d];
  }
  char *stage = stride > 0 ? mt_pool_alloc(stage_bytes(stride)) : NULL;
  if (stride > 0 && stage == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  consumer u = {eat_reduce, out, b, b, in, sb, 1, dtype, op, isz};
  if (g == 1 && mt_box_numel(b) > 0) copy_part(in, sb, out, b, b, isz);
  int rc = MT_OK;
  for (int64_t s = 1; s < g && rc == MT_OK; ++s) {
    int64_t t = (me + s) % g, f = (me - s + g) % g;
    const mt_box *bt = &blocks[t];
    side to = side_of(t, block_chunks(bt, isz), NULL);
    if (slabs) {
      int64_t off = 0, step_bytes = isz;
      for (int d = sb->ndim - 1; d >= 0; --d) {
        off += (bt->offset[d] - sb->offset[d]) * step_bytes;
        step_bytes *= sb->shape[d];
      }
      to.base = (const char *)in + off;
    } else if (stage != NULL) { /* else no block has a chunk to send */
      to.in = in, to.whole = sb, to.block = bt, to.pack = stage + 2 * stride;
      to.isz = isz;
    }
    side from = side_of(f, mine, NULL);
    u.first = s == 1;
    /* step() completes every request it posts (abandon() on failure). */
    rc = step(&to, &from, &u, stage, stride, comm, err); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
  }
  mt_pool_free(stage);
  return rc;
}

/* ---- all-gather along an inner dim -------------------------------------------- */

int mt__pairwise_fits(const mt_box *blocks, int64_t g, int64_t isz) {
  for (int64_t k = 0; k < g; ++k) {
    chunked c = block_chunks(&blocks[k], isz);
    /* the gather's sends are completed with one MPI_Waitall */
    if (c.per * c.row_bytes > INT_MAX || (g - 1) * c.chunks > INT_MAX) return 0;
  }
  return 1;
}

static int eat_gather(const consumer *u, const side *from, int64_t i, const char *chunk,
                      mt_error *err) {
  (void)err;
  mt_box part = chunk_box(u->from, cut_dim(u->from), &from->k, i);
  copy_part(chunk, &part, u->out, u->t, &part, u->isz);
  return MT_OK;
}

/* Every send of the gather, posted before anything else: each chunk is contiguous
 * in `in`, so nothing is packed and all can be in flight at once. A receiver then
 * pulls this rank's chunks (Open MPI's shared-memory transport reads them straight
 * from `in`) whenever it gets to them, without waiting for this rank to post the
 * next one: a posting rank descheduled on a loaded machine would otherwise hold
 * up each of its peers' chunks in turn. `reqs` holds (g - 1) * chunks requests. */
static int post_sends(const void *in, const chunked *k, int64_t g, int64_t me,
                      MPI_Request *reqs, MPI_Comm comm, mt_error *err) {
  for (int64_t s = 1; s < g; ++s) {
    int peer = (int)((me + s) % g);
    for (int64_t i = 0; i < k->chunks; ++i) {
      int n = (int)(rows_in(k, i) * k->row_bytes);
      const char *from = (const char *)in + i * k->per * k->row_bytes;
      MPI_Request *r = &reqs[(s - 1) * k->chunks + i];
      int rc = MPI_Isend(from, n, MPI_BYTE, peer, PAIR_TAG, comm, r);
      if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Isend");
    }
  }
  return MT_OK;
}

/* Receives the chunks of the member `from`, two in flight, each placed as it
 * arrives. */
static int gather_from(side *from, const consumer *u, char *stage, int64_t stride,
                       MPI_Comm comm, mt_error *err) {
  int rc = MT_OK;
  for (int64_t i = 0; rc == MT_OK && i < 2 && i < from->k.chunks; ++i)
    rc = post(from, 0, i, stage, stride, comm, err);
  for (int64_t i = 0; rc == MT_OK && i < from->k.chunks; ++i) {
    rc = wait_one(&from->req[i % 2], err);
    if (rc == MT_OK) rc = u->eat(u, from, i, stage + (i % 2) * stride, err);
    if (rc == MT_OK && i + 2 < from->k.chunks)
      rc = post(from, 0, i + 2, stage, stride, comm, err);
  }
  return rc;
}

/* After a failure: the receives still posted are cancelled, so that no message
 * lands in a staging chunk after it is freed, and every request is completed (see
 * abandon). */
static void abandon_gather(side *from, MPI_Request *sends, int64_t nsends) {
  for (int k = 0; k < 2; ++k) {
    if (from->req[k] != MPI_REQUEST_NULL) MPI_Cancel(&from->req[k]);
  }
  for (int64_t i = 0; i < nsends; ++i) {
    if (sends[i] != MPI_REQUEST_NULL) MPI_Cancel(&sends[i]);
  }
  (void)MT__BLOCKING("MPI_Waitall", MPI_Waitall(2, from->req, MPI_STATUSES_IGNORE)); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
  (void)MT__BLOCKING("MPI_Waitall", MPI_Waitall((int)nsends, sends, MPI_STATUSES_IGNORE)); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
}

int mt__allgather_pairwise(const void *in, void *out, const mt_box *t,
                           const mt_box *blocks, int64_t g, int64_t me, int64_t isz,
                           MPI_Comm comm, mt_error *err) {
  int64_t stride = 0;
  for (int64_t k = 0; k < g; ++k) {
    chunked c = block_chunks(&blocks[k], isz);
    if (k != me && c.chunks > 0 && c.per * c.row_bytes > stride)
      stride = c.per * c.row_bytes;
  }
  const mt_box *b = &blocks[me];
  chunked mine = block_chunks(b, isz);
  int64_t nsends = (g - 1) * mine.chunks;
  MPI_Request *sends = nsends > 0 ? malloc((size_t)nsends * sizeof(MPI_Request)) : NULL;
  char *stage = stride > 0 ? mt_pool_alloc(stage_bytes(stride)) : NULL;
  if ((nsends > 0 && sends == NULL) || (stride > 0 && stage == NULL)) {
    free(sends);
    mt_pool_free(stage);
    return mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  for (int64_t i = 0; i < nsends; ++i) sends[i] = MPI_REQUEST_NULL;
  int rc = post_sends(in, &mine, g, me, sends, comm, err);
  /* The peers read this rank's chunks while it places its own block. */
  if (rc == MT_OK && mt_box_numel(b) > 0) copy_part(in, b, out, t, b, isz);
  consumer u = {eat_gather, out, t, NULL, NULL, NULL, 0, 0, 0, isz};
  side from = side_of(0, mine, NULL);
  for (int64_t s = 1; s < g && rc == MT_OK; ++s) {
    int64_t f = (me - s + g) % g;
    from = side_of(f, block_chunks(&blocks[f], isz), NULL);
    u.from = &blocks[f];
    rc = gather_from(&from, &u, stage, stride, comm, err);
  }
  if (rc == MT_OK && nsends > 0) {
    int mpi = MT__BLOCKING("MPI_Waitall",
                           MPI_Waitall((int)nsends, sends, MPI_STATUSES_IGNORE)); /* NOLINT(clang-analyzer-optin.mpi.MPI-Checker) */
    if (mpi != MPI_SUCCESS) rc = mt_mpi_error(err, mpi, "MPI_Waitall");
  } else if (rc != MT_OK) {
    abandon_gather(&from, sends, nsends);
  }
  free(sends);
  mt_pool_free(stage);
  return rc;
}
