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

#include "scalapack-private.h"

/* How many of the indices below x the cyclic process p owns: blocks of nb dealt
 * over np processes. */
static int64_t owned_below(int64_t x, int64_t nb, int64_t np, int64_t p) {
  int64_t cycle = nb * np, rest = x % cycle - p * nb;
  return x / cycle * nb + (rest < 0 ? 0 : rest > nb ? nb : rest);
}

/* The caller's block of one matrix dim on one process: [lo, hi) of `size`, in
 * torch.chunk's blocks over np processes. */
static void chunk(int64_t size, int64_t np, int64_t p, int64_t* lo, int64_t* hi) {
  int64_t block = (size + np - 1) / np;
  *lo = p * block < size ? p * block : size;
  *hi = *lo + block < size ? *lo + block : size;
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
static void offsets(side s, int64_t nb, int64_t np, int64_t p, int64_t* out) {
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

typedef struct two_doubles {
  double re, im;
} two_doubles;

static void transpose(void* cm, int64_t ldc, void* rm, int64_t ldr, const int64_t* ri,
                      const int64_t* ci, int64_t R, int64_t C, size_t size, int to_cm) {
  if (size == 4)
    TRANSPOSE(float);
  else if (size == 8)
    TRANSPOSE(double);
  else
    TRANSPOSE(two_doubles);
}

/* Column-major R x C at `a` (leading dimension lda) into or out of a packed one. */
static void columns(char* a, int64_t lda, char* packed, int64_t R, int64_t C,
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
} plan;

static int my_rank(const plan* p) {
  return p->g->myrow * p->g->npcol + p->g->mycol;
}

/* The piece that the caller's block of rank `from` and the cyclic matrix of rank
 * `to` share. */
static void piece(const plan* p, int from, int to, side* rows, side* cols) {
  int64_t r0, r1, c0, c1;
  chunk(p->m, p->g->nprow, from / p->g->npcol, &r0, &r1);
  chunk(p->n, p->g->npcol, from % p->g->npcol, &c0, &c1);
  *rows = side_of(r0, r1, p->mb, p->on->nprow, to / p->on->npcol);
  *cols = side_of(c0, c1, p->nb, p->on->npcol, to % p->on->npcol);
}

/* Copies between this rank's rows (`rm`, leading dimension ld) and a column-major
 * R x C piece at `cm` (leading dimension ldc) that cyclic rank `to` owns. */
static int rows_piece(const plan* p, int to, void* cm, int64_t ldc, void* rm,
                      int64_t ld, int to_cm, mt_error* err) {
  side rows, cols;
  piece(p, my_rank(p), to, &rows, &cols);
  if (rows.count == 0 || cols.count == 0) return MT_OK;
  int64_t* ri = malloc((size_t)(rows.count + cols.count) * sizeof *ri);
  if (ri == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  offsets(rows, p->mb, p->on->nprow, to / p->on->npcol, ri);
  offsets(cols, p->nb, p->on->npcol, to % p->on->npcol, ri + rows.count);
  transpose(cm, ldc, rm, ld, ri, ri + rows.count, rows.count, cols.count, p->size,
            to_cm);
  free(ri);
  return MT_OK;
}

/* The items this rank sends to and receives from each rank, and their offsets in
 * the packed buffers (its own piece is copied in place, never packed). */
typedef struct counts {
  int64_t *send, *recv, *soff, *roff, stotal, rtotal;
} counts;

static int count(const plan* p, int to_cyclic, counts* c, mt_error* err) {
  int me = my_rank(p);
  c->send = calloc((size_t)p->ranks * 4, sizeof *c->send);
  if (c->send == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  c->recv = c->send + p->ranks, c->soff = c->recv + p->ranks,
  c->roff = c->soff + p->ranks;
  c->stotal = c->rtotal = 0;
  for (int k = 0; k < p->ranks; ++k) {
    side rows, cols;
    piece(p, to_cyclic ? me : k, to_cyclic ? k : me, &rows, &cols);
    int64_t out = k == me ? 0 : rows.count * cols.count;
    piece(p, to_cyclic ? k : me, to_cyclic ? me : k, &rows, &cols);
    int64_t in = k == me ? 0 : rows.count * cols.count;
    c->soff[k] = c->stotal, c->roff[k] = c->rtotal;
    c->send[k] = out, c->recv[k] = in;
    c->stotal += out, c->rtotal += in;
    if (out > INT_MAX || in > INT_MAX)
      return mt_error_set(err, MT_EOVERFLOW,
                          "a piece of the matrix is past MPI's counts");
  }
  return MT_OK;
}

/* Posts the receives (their sources into `from`) and the sends of the packed
 * pieces: one message per rank with a piece, none for an empty one. */
static int post(const plan* p, const counts* c, char* sbuf, char* rbuf,
                MPI_Datatype item, MPI_Request* req, int* from, int* nrecv, int* nreq,
                mt_error* err) {
  *nreq = 0;
  for (int k = 0; k < p->ranks; ++k)
    if (c->recv[k] > 0) {
      from[*nreq] = k;
      int mpi = MPI_Irecv(rbuf + (size_t)c->roff[k] * p->size, (int)c->recv[k], item, k,
                          0, p->g->comm, &req[(*nreq)++]);
      if (mpi != MPI_SUCCESS) return mt_mpi_error(err, mpi, "MPI_Irecv");
    }
  *nrecv = *nreq;
  for (int k = 0; k < p->ranks; ++k)
    if (c->send[k] > 0) {
      int mpi = MPI_Isend(sbuf + (size_t)c->soff[k] * p->size, (int)c->send[k], item, k,
                          0, p->g->comm, &req[(*nreq)++]);
      if (mpi != MPI_SUCCESS) return mt_mpi_error(err, mpi, "MPI_Isend");
    }
  return MT_OK;
}

/* The local cyclic block of piece (rows, cols) in `cyc`. */
static char* cyclic_at(const plan* p, const mt__sl_matrix* cyc, side rows, side cols) {
  return (char*)cyc->data + (size_t)(rows.at + cols.at * cyc->desc[8]) * p->size;
}

/* Packs (to the cyclic matrix: from this rank's rows; back: from its cyclic
 * block) every piece bound for another rank, and copies its own in place. */
static int pack(const plan* p, const counts* c, int to_cyclic, void* rm, int64_t ld,
                const mt__sl_matrix* cyc, char* sbuf, mt_error* err) {
  int me = my_rank(p), rc = MT_OK;
  for (int k = 0; k < p->ranks && rc == MT_OK; ++k) {
    side rows, cols;
    if (to_cyclic) {
      piece(p, me, k, &rows, &cols);
      if (k == me)
        rc = rows_piece(p, k, cyclic_at(p, cyc, rows, cols), cyc->desc[8], rm, ld, 1,
                        err);
      else if (c->send[k] > 0)
        rc = rows_piece(p, k, sbuf + (size_t)c->soff[k] * p->size, rows.count, rm, ld,
                        1, err);
    } else if (k != me && c->send[k] > 0) {
      piece(p, k, me, &rows, &cols);
      columns(cyclic_at(p, cyc, rows, cols), cyc->desc[8],
              sbuf + (size_t)c->soff[k] * p->size, rows.count, cols.count, p->size, 1);
    }
  }
  return rc;
}

/* Unpacks the piece received from rank k; back to the rows, k = this rank copies
 * its own piece straight from its cyclic block. */
static int unpack(const plan* p, const counts* c, int to_cyclic, int k, void* rm,
                  int64_t ld, const mt__sl_matrix* cyc, char* rbuf, mt_error* err) {
  side rows, cols;
  int me = my_rank(p);
  if (!to_cyclic) {
    piece(p, me, k, &rows, &cols);
    if (k == me)
      return rows_piece(p, k, cyclic_at(p, cyc, rows, cols), cyc->desc[8], rm, ld, 0,
                        err);
    return rows_piece(p, k, rbuf + (size_t)c->roff[k] * p->size, rows.count, rm, ld, 0,
                      err);
  }
  piece(p, k, me, &rows, &cols);
  columns(cyclic_at(p, cyc, rows, cols), cyc->desc[8],
          rbuf + (size_t)c->roff[k] * p->size, rows.count, cols.count, p->size, 0);
  return MT_OK;
}

/* Both ways: the pieces packed, the messages posted, this rank's own piece copied
 * while they travel, and each received piece unpacked as it lands. */
static int exchange(const plan* p, int to_cyclic, void* rm, int64_t ld,
                    const mt__sl_matrix* cyc, mt_error* err) {
  counts c = {0};
  char *sbuf = NULL, *rbuf = NULL;
  MPI_Request* req = NULL;
  int *from = NULL, nrecv = 0, nreq = 0;
  MPI_Datatype item = MPI_DATATYPE_NULL;
  int rc = count(p, to_cyclic, &c, err);
  if (rc == MT_OK) {
    sbuf = malloc((size_t)(c.stotal > 0 ? c.stotal : 1) * p->size);
    rbuf = malloc((size_t)(c.rtotal > 0 ? c.rtotal : 1) * p->size);
    req = malloc((size_t)(2 * p->ranks) * sizeof *req);
    from = malloc((size_t)p->ranks * sizeof *from);
    if (sbuf == NULL || rbuf == NULL || req == NULL || from == NULL)
      rc = mt_error_set(err, MT_ENOMEM, "out of memory");
  }
  rc = mt__sl_agree(p->g, rc, err);
  if (rc == MT_OK) {
    int mpi = MPI_Type_contiguous((int)p->size, MPI_BYTE, &item);
    if (mpi == MPI_SUCCESS) mpi = MPI_Type_commit(&item);
    rc = mpi == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, mpi, "MPI_Type_contiguous");
  }
  if (rc == MT_OK) rc = pack(p, &c, to_cyclic, rm, ld, cyc, sbuf, err);
  if (rc == MT_OK) rc = post(p, &c, sbuf, rbuf, item, req, from, &nrecv, &nreq, err);
  if (rc == MT_OK && !to_cyclic)
    rc = unpack(p, &c, 0, my_rank(p), rm, ld, cyc, rbuf, err);
  for (int left = nrecv; rc == MT_OK && left > 0; --left) {
    int done = MPI_UNDEFINED;
    int mpi = MPI_Waitany(nrecv, req, &done, MPI_STATUS_IGNORE);
    if (mpi != MPI_SUCCESS || done == MPI_UNDEFINED)
      rc = mt_mpi_error(err, mpi != MPI_SUCCESS ? mpi : MPI_ERR_REQUEST, "MPI_Waitany");
    else
      rc = unpack(p, &c, to_cyclic, from[done], rm, ld, cyc, rbuf, err);
  }
  if (nreq > nrecv) {
    int mpi = MPI_Waitall(nreq - nrecv, req + nrecv, MPI_STATUSES_IGNORE);
    if (rc == MT_OK && mpi != MPI_SUCCESS) rc = mt_mpi_error(err, mpi, "MPI_Waitall");
  }
  if (item != MPI_DATATYPE_NULL) MPI_Type_free(&item);
  free(c.send), free(sbuf), free(rbuf), free(req), free(from);
  return rc;
}

static plan plan_of(const mt__sl_job* j, const mt__sl_grid* on, int64_t m, int64_t n,
                    const mt__sl_matrix* cyc) {
  plan p = {&j->g,        on,           m,           n,
            cyc->desc[4], cyc->desc[5], j->itemsize, j->g.nprow * j->g.npcol};
  return p;
}

int mt__sl_rows_to_cyclic(const mt__sl_job* j, const mt__sl_grid* on, int64_t m,
                          int64_t n, const void* rows, mt__sl_matrix* cyc,
                          mt_error* err) {
  plan p = plan_of(j, on, m, n, cyc);
  int64_t c0, c1;
  chunk(n, j->g.npcol, j->g.mycol, &c0, &c1);
  /* Only read on this way: the casts serve the copy that runs both ways. */
  return exchange(&p, 1, (void*)rows, c1 - c0, cyc, err);
}

int mt__sl_cyclic_to_rows(const mt__sl_job* j, const mt__sl_grid* on, int64_t m,
                          int64_t n, const mt__sl_matrix* cyc, void* rows,
                          mt_error* err) {
  plan p = plan_of(j, on, m, n, cyc);
  int64_t c0, c1;
  chunk(n, j->g.npcol, j->g.mycol, &c0, &c1);
  return exchange(&p, 0, rows, c1 - c0, cyc, err);
}
