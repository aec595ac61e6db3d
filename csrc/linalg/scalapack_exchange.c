/* Between the caller's blocks (torch.chunk's block distribution on the job's grid,
 * each rank's block row-major as NumPy holds it) and a column-major block-cyclic
 * matrix the routines run on: one message per pair of ranks that share entries.
 * Each rank packs, straight from its rows, the column-major piece each peer owns
 * and unpacks what it receives into place, so the transposition to column-major is
 * the packing itself, where ScaLAPACK's pXgemr2d would want a column-major copy
 * first and then pack again. The grid's ranks are row-major in both grids
 * (mt__sl_grid_open), so a cyclic owner's coordinates name its rank in the caller's
 * grid's communicator. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mpitensor/comm/pool.h"
#include "mpitensor/core/layout.h"
#include "scalapack-private.h"

/* How many of the indices below x the cyclic process p owns: blocks of nb dealt
 * over np processes. */
static int64_t owned_below(int64_t x, int64_t nb, int64_t np, int64_t p) {
  int64_t cycle = nb * np, rest = x % cycle - p * nb;
  return x / cycle * nb + (rest < 0 ? 0 : rest > nb ? nb : rest);
}

/* The caller's block of one matrix dim on one process: [lo, hi) of `size`, in
 * torch.chunk's blocks over np processes (the core's rule, mt_chunk). */
static void chunk(int64_t size, int64_t np, int64_t p, int64_t *lo, int64_t *hi) {
  int64_t size_p = 0;
  mt_chunk(size, np, p, &size_p, lo);
  *hi = *lo + size_p;
}

/* One dim of a piece: the indices of a caller's range [lo, hi) that cyclic process
 * p owns, `count` of them, the first at local cyclic index `at`. */
typedef struct side {
  int64_t lo, hi, count, at;
} side;

static side side_of(int64_t lo, int64_t hi, int64_t nb, int64_t np, int64_t p) {
  side s = {lo, hi, 0, owned_below(lo, nb, np, p)};
  s.count = owned_below(hi, nb, np, p) - s.at;
  return s;
}

/* The offsets in the caller's range of the `s.count` indices owned by p, ascending. */
static void offsets(side s, int64_t nb, int64_t np, int64_t p, int64_t *out) {
  int64_t k = 0, cycle = nb * np;
  for (int64_t start = s.lo / cycle * cycle + p * nb; start < s.hi; start += cycle)
    for (int64_t i = start > s.lo ? start : s.lo; i < start + nb && i < s.hi; ++i)
      out[k++] = i - s.lo;
}

/* cm[i + j ldc] and rm[ri[i] ldr + ci[j]], R x C entries of `size` bytes, copied
 * one way or the other in square tiles, so that both sides stay in cache. */
#define TILE 32
#define TRANSPOSE(T)                                                \
  do {                                                              \
    T *c = cm, *r = rm;                                             \
    for (int64_t j0 = 0; j0 < C; j0 += TILE)                        \
      for (int64_t i0 = 0; i0 < R; i0 += TILE)                      \
        for (int64_t j = j0; j < j0 + TILE && j < C; ++j)           \
          for (int64_t i = i0; i < i0 + TILE && i < R; ++i) {       \
            T *pc = &c[i + j * ldc], *pr = &r[ri[i] * ldr + ci[j]]; \
            if (to_cm)                                              \
              *pc = *pr;                                            \
            else                                                    \
              *pr = *pc;                                            \
          }                                                         \
  } while (0)

/* A complex128 moved as one item: its parts are never read apart. */
typedef struct two_doubles {
  /* cppcheck-suppress unusedStructMember */
  double re, im;
} two_doubles;

static void transpose(void *cm, int64_t ldc, void *rm, int64_t ldr, const int64_t *ri,
                      const int64_t *ci, int64_t R, int64_t C, size_t size, int to_cm) {
  if (size == 4)
    TRANSPOSE(float);
  else if (size == 8)
    TRANSPOSE(double);
  else
    TRANSPOSE(two_doubles);
}

/* cm[i + j ldc] = rm[cj[j] ldr + ri[i]], R x C entries of `size` bytes: the
 * column-major piece of the transpose of a row-major block, a copy of runs. */
static void straight(void *cm, int64_t ldc, const void *rm, int64_t ldr,
                     const int64_t *ri, const int64_t *cj, int64_t R, int64_t C,
                     size_t size) {
  for (int64_t j = 0; j < C; ++j) {
    const char *row = (const char *)rm + (size_t)(cj[j] * ldr) * size;
    char *col = (char *)cm + (size_t)(j * ldc) * size;
    for (int64_t i = 0, run; i < R; i += run) {
      for (run = 1; i + run < R && ri[i + run] == ri[i] + run; ++run) {
      }
      memcpy(col + (size_t)i * size, row + (size_t)ri[i] * size, (size_t)run * size);
    }
  }
}

/* Column-major R x C at `a` (leading dimension lda) into or out of a packed one. */
static void columns(char *a, int64_t lda, char *packed, int64_t R, int64_t C,
                    size_t size, int to_packed) {
  for (int64_t j = 0; j < C; ++j) {
    char *col = a + (size_t)(j * lda) * size, *p = packed + (size_t)(j * R) * size;
    memcpy(to_packed ? p : col, to_packed ? col : p, (size_t)R * size);
  }
}

/* One call's plan: the caller's grid, the cyclic matrix's, and the matrix. */
typedef struct plan {
  const mt__sl_grid *g, *on;
  int64_t m, n, mb, nb; /* the cyclic blocks */
  size_t size;
  int ranks;
  int flip;         /* whether the cyclic matrix is the transpose of the caller's */
  int64_t *scratch; /* m + n indices: a piece's offsets */
} plan;

static int my_rank(const plan *p) {
  return p->g->myrow * p->g->npcol + p->g->mycol;
}

/* The piece that the caller's block of rank `from` and the cyclic matrix of rank
 * `to` share. */
static void piece(const plan *p, int from, int to, side *rows, side *cols) {
  int64_t r0, r1, c0, c1, grow = from / p->g->npcol, gcol = from % p->g->npcol;
  chunk(p->m, p->flip ? p->g->npcol : p->g->nprow, p->flip ? gcol : grow, &r0, &r1);
  chunk(p->n, p->flip ? p->g->nprow : p->g->npcol, p->flip ? grow : gcol, &c0, &c1);
  *rows = side_of(r0, r1, p->mb, p->on->nprow, to / p->on->npcol);
  *cols = side_of(c0, c1, p->nb, p->on->npcol, to % p->on->npcol);
}

/* Copies between this rank's rows (`rm`, leading dimension ld) and a column-major
 * R x C piece at `cm` (leading dimension ldc) that cyclic rank `to` owns. */
static void rows_piece(const plan *p, int to, void *cm, int64_t ldc, void *rm,
                       int64_t ld, int to_cm) {
  side rows, cols;
  piece(p, my_rank(p), to, &rows, &cols);
  if (rows.count == 0 || cols.count == 0) return;
  int64_t *ri = p->scratch;
  offsets(rows, p->mb, p->on->nprow, to / p->on->npcol, ri);
  offsets(cols, p->nb, p->on->npcol, to % p->on->npcol, ri + rows.count);
  if (p->flip)
    straight(cm, ldc, rm, ld, ri, ri + rows.count, rows.count, cols.count, p->size);
  else
    transpose(cm, ldc, rm, ld, ri, ri + rows.count, rows.count, cols.count, p->size,
              to_cm);
}

/* The items this rank sends to and receives from each rank, and their offsets in
 * the packed buffers (its own piece is copied in place, never packed). */
typedef struct counts {
  int64_t *send, *recv, *soff, *roff, stotal, rtotal;
  int64_t *direct; /* whether a piece lands straight in the cyclic block */
} counts;

static int count(const plan *p, int to_cyclic, const mt__sl_matrix *cyc, counts *c,
                 mt_error *err) {
  int me = my_rank(p);
  c->send = calloc((size_t)p->ranks * 5, sizeof *c->send);
  if (c->send == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  c->recv = c->send + p->ranks, c->soff = c->recv + p->ranks,
  c->roff = c->soff + p->ranks, c->direct = c->roff + p->ranks;
  c->stotal = c->rtotal = 0;
  for (int k = 0; k < p->ranks; ++k) {
    side rows, cols;
    piece(p, to_cyclic ? me : k, to_cyclic ? k : me, &rows, &cols);
    int64_t out = k == me ? 0 : rows.count * cols.count;
    piece(p, to_cyclic ? k : me, to_cyclic ? me : k, &rows, &cols);
    int64_t in = k == me ? 0 : rows.count * cols.count;
    /* A piece of whole columns of the cyclic block is contiguous there. */
    c->direct[k] = to_cyclic && k != me && rows.count == cyc->desc[8];
    c->soff[k] = c->stotal, c->roff[k] = c->rtotal;
    c->send[k] = out, c->recv[k] = in;
    c->stotal += out, c->rtotal += c->direct[k] ? 0 : in;
    if (out > INT_MAX || in > INT_MAX)
      return mt_error_set(err, MT_EOVERFLOW,
                          "a piece of the matrix is past MPI's counts");
  }
  return MT_OK;
}

/* The local cyclic block of piece (rows, cols) in `cyc`. */
static char *cyclic_at(const plan *p, const mt__sl_matrix *cyc, side rows, side cols) {
  return (char *)cyc->data + (size_t)(rows.at + cols.at * cyc->desc[8]) * p->size;
}

/* Posts the receives, their sources into `from`: one message per rank with a
 * piece, none for an empty one. */
static int post_receives(const plan *p, const counts *c, const mt__sl_matrix *cyc,
                         char *rbuf, MPI_Datatype item, MPI_Request *req, int *from,
                         int *nreq, mt_error *err) {
  *nreq = 0;
  for (int k = 0; k < p->ranks; ++k)
    if (c->recv[k] > 0) {
      side rows, cols;
      char *at = rbuf + (size_t)c->roff[k] * p->size;
      if (c->direct[k]) {
        piece(p, k, my_rank(p), &rows, &cols);
        at = cyclic_at(p, cyc, rows, cols);
      }
      from[*nreq] = k;
      int mpi = MPI_Irecv(at, (int)c->recv[k], item, k, 0, p->g->comm, &req[(*nreq)++]);
      if (mpi != MPI_SUCCESS) return mt_mpi_error(err, mpi, "MPI_Irecv");
    }
  return MT_OK;
}

/* Posts the sends of the packed pieces. */
static int post_sends(const plan *p, const counts *c, char *sbuf, MPI_Datatype item,
                      MPI_Request *req, int *nreq, mt_error *err) {
  for (int k = 0; k < p->ranks; ++k)
    if (c->send[k] > 0) {
      int mpi = MPI_Isend(sbuf + (size_t)c->soff[k] * p->size, (int)c->send[k], item, k,
                          0, p->g->comm, &req[(*nreq)++]);
      if (mpi != MPI_SUCCESS) return mt_mpi_error(err, mpi, "MPI_Isend");
    }
  return MT_OK;
}

/* Packs (to the cyclic matrix: from this rank's rows; back: from its cyclic
 * block) every piece bound for another rank. */
static void pack(const plan *p, const counts *c, int to_cyclic, void *rm, int64_t ld,
                 const mt__sl_matrix *cyc, char *sbuf) {
  int me = my_rank(p);
  for (int k = 0; k < p->ranks; ++k) {
    side rows, cols;
    if (k == me || c->send[k] == 0) continue;
    char *at = sbuf + (size_t)c->soff[k] * p->size;
    if (to_cyclic) {
      piece(p, me, k, &rows, &cols);
      rows_piece(p, k, at, rows.count, rm, ld, 1);
    } else {
      piece(p, k, me, &rows, &cols);
      columns(cyclic_at(p, cyc, rows, cols), cyc->desc[8], at, rows.count, cols.count,
              p->size, 1);
    }
  }
}

/* Unpacks the piece received from rank k; k = this rank copies its own piece
 * straight across. */
static void unpack(const plan *p, const counts *c, int to_cyclic, int k, void *rm,
                   int64_t ld, const mt__sl_matrix *cyc, char *rbuf) {
  side rows, cols;
  int me = my_rank(p);
  char *at = rbuf + (size_t)c->roff[k] * p->size;
  if (!to_cyclic) {
    piece(p, me, k, &rows, &cols);
    if (k == me)
      rows_piece(p, k, cyclic_at(p, cyc, rows, cols), cyc->desc[8], rm, ld, 0);
    else
      rows_piece(p, k, at, rows.count, rm, ld, 0);
    return;
  }
  if (c->direct[k]) return;
  piece(p, k, me, &rows, &cols);
  if (k == me)
    rows_piece(p, k, cyclic_at(p, cyc, rows, cols), cyc->desc[8], rm, ld, 1);
  else
    columns(cyclic_at(p, cyc, rows, cols), cyc->desc[8], at, rows.count, cols.count,
            p->size, 0);
}

/* Both ways: the pieces packed, the messages posted, this rank's own piece copied
 * while they travel, and each received piece unpacked as it lands. */
static int exchange(plan *p, int to_cyclic, void *rm, int64_t ld,
                    const mt__sl_matrix *cyc, mt_error *err) {
  counts c = {0};
  char *sbuf = NULL, *rbuf = NULL;
  MPI_Request *req = NULL;
  int *from = NULL, nrecv = 0, nreq = 0, me = my_rank(p);
  MPI_Datatype item = MPI_DATATYPE_NULL;
  int rc = count(p, to_cyclic, cyc, &c, err);
  if (rc == MT_OK) {
    /* The staging buffers are as large as the matrix's share that moves: from
     * the block pool, as the cyclic copy, so a repeated call faults none in. */
    sbuf = mt_pool_alloc((size_t)(c.stotal > 0 ? c.stotal : 1) * p->size);
    rbuf = mt_pool_alloc((size_t)(c.rtotal > 0 ? c.rtotal : 1) * p->size);
    req = malloc((size_t)(2 * p->ranks) * sizeof(MPI_Request));
    from = malloc((size_t)p->ranks * sizeof *from);
    p->scratch = malloc((size_t)(p->m + p->n) * sizeof *p->scratch);
  }
  /* Whether this rank's buffers are there, kept apart from rc so that no path past
   * the agreement reads one it failed to allocate. */
  int ready = c.send != NULL && sbuf != NULL && rbuf != NULL && req != NULL &&
              from != NULL && p->scratch != NULL;
  if (rc == MT_OK && !ready) rc = mt_error_set(err, MT_ENOMEM, "out of memory");
  if (rc == MT_OK) {
    int mpi = MPI_Type_contiguous((int)p->size, MPI_BYTE, &item);
    if (mpi == MPI_SUCCESS) mpi = MPI_Type_commit(&item);
    rc = mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Type_contiguous");
  }
  rc = mt__sl_agree(p->g, rc, err);
  /* Everything copied before the first message: both ends then wait only on the
   * transfers (a rank busy copying would hold up the peer's shared-memory
   * pipeline, which side by side cost more than the overlap gained). */
  if (rc == MT_OK && ready) {
    pack(p, &c, to_cyclic, rm, ld, cyc, sbuf);
    unpack(p, &c, to_cyclic, me, rm, ld, cyc, rbuf);
    rc = post_receives(p, &c, cyc, rbuf, item, req, from, &nrecv, err);
  }
  nreq = nrecv;
  if (rc == MT_OK) rc = post_sends(p, &c, sbuf, item, req, &nreq, err);
  for (int left = nrecv; rc == MT_OK && left > 0; --left) {
    int done = MPI_UNDEFINED;
    int mpi =
        MT__LA_MPI("MPI_Waitany", MPI_Waitany(nrecv, req, &done, MPI_STATUS_IGNORE));
    if (mpi != MPI_SUCCESS || done == MPI_UNDEFINED)
      rc = mt_mpi_error(err, mpi != MPI_SUCCESS ? mpi : MPI_ERR_REQUEST, "MPI_Waitany");
    else
      unpack(p, &c, to_cyclic, from[done], rm, ld, cyc, rbuf);
  }
  if (nreq > nrecv) {
    int mpi = MT__LA_MPI("MPI_Waitall",
                         MPI_Waitall(nreq - nrecv, req + nrecv, MPI_STATUSES_IGNORE));
    if (rc == MT_OK && mpi != MPI_SUCCESS) rc = mt_mpi_error(err, mpi, "MPI_Waitall");
  }
  if (item != MPI_DATATYPE_NULL) MPI_Type_free(&item);
  free(c.send), mt_pool_free(sbuf), mt_pool_free(rbuf), free(req), free(from), free(p->scratch);
  return rc;
}

/* The copy each entry point below makes between the caller's blocks `rows` and
 * `cyc`: `to_cyclic` or back, of the transpose when `flip` (the caller's block
 * columns then chunk m, the cyclic matrix's rows). */
static int copy(const mt__sl_job *j, const mt__sl_grid *on, int64_t m, int64_t n,
                int flip, int to_cyclic, void *rows, const mt__sl_matrix *cyc,
                mt_error *err) {
  plan p = {&j->g, on, m, n, cyc->desc[4], cyc->desc[5], j->itemsize,
            j->g.nprow * j->g.npcol, flip, NULL};
  int64_t c0, c1;
  chunk(flip ? m : n, j->g.npcol, j->g.mycol, &c0, &c1);
  return exchange(&p, to_cyclic, rows, c1 - c0, cyc, err);
}

int mt__sl_rows_to_cyclic(const mt__sl_job *j, const mt__sl_grid *on, int64_t m,
                          int64_t n, const void *rows, mt__sl_matrix *cyc,
                          mt_error *err) {
  /* Only read on this way: the cast serves the copy that runs both ways. */
  return copy(j, on, m, n, 0, 1, (void *)rows, cyc, err);
}

int mt__sl_rows_to_cyclic_flipped(const mt__sl_job *j, const mt__sl_grid *on, int64_t m,
                                  int64_t n, const void *rows, mt__sl_matrix *cyc,
                                  mt_error *err) {
  return copy(j, on, m, n, 1, 1, (void *)rows, cyc, err);
}

int mt__sl_cyclic_to_rows(const mt__sl_job *j, const mt__sl_grid *on, int64_t m,
                          int64_t n, const mt__sl_matrix *cyc, void *rows,
                          mt_error *err) {
  return copy(j, on, m, n, 0, 0, rows, cyc, err);
}
