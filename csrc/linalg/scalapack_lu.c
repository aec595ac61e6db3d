/* pXgetrf's LU, factors, IPIV and INFO in its own layout, for a square cyclic
 * matrix on a grid of one process row, with lookahead. On such a grid each panel
 * lies whole on one process, which finds its pivots without a message; but under
 * pXgetrf every other process waits while it factors the panel, one column at a
 * time. Here the owner of the next panel applies the current one to that panel
 * first, factors it with the local LAPACK's blocked getrf and starts its
 * broadcast, and only then updates the rest of its columns: the factoring hides
 * behind the others' updates. The arithmetic is a right-looking blocked LU with
 * partial pivoting, as pXgetrf's, and its result goes to pXgetrs and pXgetri as
 * pXgetrf's would. A solve from a relabelled copy (mt__sl_job_open_flipped)
 * substitutes here too, block by block, each block sent from the process that
 * holds its part of the factors: no right-hand side goes to a cyclic copy. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mpitensor/core/layout.h"
#include "scalapack-private.h"

/* The local columns one update applies to before the progress of the broadcast
 * in flight is checked: MPI moves a nonblocking message only inside its calls. */
#define CHUNK 256

/* 1 and -1 in an element's layout, a complex number's real part first. */
typedef union scalar {
  float s[2];
  double d[2];
} scalar;

typedef struct lu {
  const mt__sl_job *j;
  const mt__sl_typed *t;
  MPI_Comm comm;
  int n, nb, np, me, lld, nloc, npanels;
  size_t itemsize;
  char *a;         /* the local block, column-major */
  char *buf[2];    /* two panels in flight: rows c0.. of the panel's columns (leading
                      dimension its rows), then its pivots and its INFO */
  MPI_Request req[2];
  scalar one, minus_one;
  int mpi_rc;      /* the first MPI failure, the loop going on so that every
                      process posts the same broadcasts */
} lu;

static int first_col(const lu *L, int k) { return k * L->nb; }
static int width(const lu *L, int k) {
  int rest = L->n - first_col(L, k);
  return rest < L->nb ? rest : L->nb;
}
static int owner(const lu *L, int k) { return k % L->np; }

/* How many of the global columns below g this process holds. */
static int local_below(const lu *L, int g) {
  int zero = 0;
  return L->j->sl->numroc(&g, &L->nb, &L->me, &zero, &L->np);
}

static char *at(const lu *L, int row, int col) {
  return L->a + ((size_t)row + (size_t)col * (size_t)L->lld) * L->itemsize;
}

/* Panel k's pivots (relative to its first row, from 1) and then its INFO. */
static int *panel_ints(const lu *L, int k) {
  int m = L->n - first_col(L, k);
  return (int *)(L->buf[k % 2] + (size_t)m * (size_t)width(L, k) * L->itemsize);
}

static int panel_bytes(const lu *L, int k) {
  int m = L->n - first_col(L, k), kb = width(L, k);
  return (int)((size_t)m * (size_t)kb * L->itemsize + (size_t)(kb + 1) * sizeof(int));
}

static void mpi_check(lu *L, int rc) {
  if (L->mpi_rc == MPI_SUCCESS) L->mpi_rc = rc;
}

/* The owner of panel k, every earlier panel applied to it: its LU in place, then
 * copied with its pivots and INFO to the panel's buffer. */
static void factor(lu *L, int k) {
  int c0 = first_col(L, k), kb = width(L, k), m = L->n - c0, info = 0;
  int col = k / L->np * L->nb;
  int *ints = panel_ints(L, k);
  L->t->lgetrf(&m, &kb, at(L, c0, col), &L->lld, ints, &info);
  for (int c = 0; c < kb; ++c)
    memcpy(L->buf[k % 2] + (size_t)c * (size_t)m * L->itemsize, at(L, c0, col + c),
           (size_t)m * L->itemsize);
  ints[kb] = info;
}

static void post(lu *L, int k) {
  mpi_check(L, MPI_Ibcast(L->buf[k % 2], panel_bytes(L, k), MPI_BYTE, owner(L, k),
                          L->comm, &L->req[k % 2]));
}

/* Panel k applied to the local columns [lo, hi): its row interchanges, then
 * U12 = L11^-1 A12 and A22 -= L21 U12. */
static void apply(const lu *L, int k, int lo, int hi) {
  int c0 = first_col(L, k), kb = width(L, k), m = L->n - c0, rest = m - kb;
  int cols = hi - lo, one = 1;
  const char *panel = L->buf[k % 2];
  char *top = at(L, c0, lo);
  if (cols <= 0) return;
  L->t->laswp(&cols, top, &L->lld, &one, &kb, panel_ints(L, k), &one);
  L->t->trsm("L", "L", "N", "U", &kb, &cols, &L->one, panel, &m, top, &L->lld, 1, 1, 1,
             1);
  if (rest > 0)
    L->t->gemm("N", "N", &rest, &cols, &kb, &L->minus_one,
               panel + (size_t)kb * L->itemsize, &m, top, &L->lld, &L->one,
               at(L, c0 + kb, lo), &L->lld, 1, 1);
}

/* apply() in slices, testing the broadcast in flight (when `pending`) between
 * them. */
static void apply_moving(lu *L, int k, int lo, int hi, MPI_Request *pending) {
  for (int c = lo; c < hi; c += CHUNK) {
    apply(L, k, c, hi - c < CHUNK ? hi : c + CHUNK);
    if (pending != NULL) {
      int done = 0;
      mpi_check(L, MPI_Test(pending, &done, MPI_STATUS_IGNORE));
    }
  }
}

/* Panel k arrived: its pivots into the global IPIV (global rows, from 1), its
 * INFO into `info` when the first. */
static void finish(const lu *L, int k, int *ipiv, int *info) {
  int c0 = first_col(L, k), kb = width(L, k);
  const int *ints = panel_ints(L, k);
  for (int i = 0; i < kb; ++i) ipiv[c0 + i] = c0 + ints[i];
  if (*info == 0 && ints[kb] > 0) *info = c0 + ints[kb];
}

/* The interchanges of every later panel applied to each local panel, as LAPACK's
 * getrf leaves L. Once at the end rather than at each step, so that each panel
 * meets all of them while it is in cache. */
static void swap_left(const lu *L, const int *ipiv) {
  int one = 1;
  for (int col = 0; col < L->nloc; col += L->nb) {
    int k = col / L->nb * L->np + L->me, cols = L->nloc - col < L->nb ? L->nloc - col
                                                                      : L->nb;
    int k1 = first_col(L, k) + cols + 1, k2 = L->n;
    if (k1 <= k2) L->t->laswp(&cols, at(L, 0, col), &L->lld, &k1, &k2, ipiv, &one);
  }
}

static void run(lu *L, int *ipiv, int *info) {
  *info = 0;
  if (owner(L, 0) == L->me) factor(L, 0);
  post(L, 0);
  for (int k = 0; k < L->npanels; ++k) {
    /* The checker cannot pair a request indexed by k % 2 with its MPI_Ibcast. */
    /* NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker) */
    mpi_check(L, MT__LA_MPI("MPI_Wait", MPI_Wait(&L->req[k % 2], MPI_STATUS_IGNORE)));
    finish(L, k, ipiv, info);
    int next = k + 1 < L->npanels;
    MPI_Request *pending = next ? &L->req[(k + 1) % 2] : NULL;
    /* The first local column right of panel k: panel k + 1's when this process
     * holds it (the panels go round the processes). */
    int lo = local_below(L, first_col(L, k) + width(L, k));
    if (next && owner(L, k + 1) == L->me) {
      int kb = width(L, k + 1);
      apply(L, k, lo, lo + kb);
      factor(L, k + 1);
      post(L, k + 1);
      apply_moving(L, k, lo + kb, L->nloc, pending);
    } else {
      if (next) post(L, k + 1);
      apply_moving(L, k, lo, L->nloc, pending);
    }
  }
  /* Both are complete (the loop waited on every panel); this says so to the MPI
   * checker, which cannot follow a request indexed by k % 2. */
  /* NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker) */
  mpi_check(L, MT__LA_MPI("MPI_Waitall", MPI_Waitall(2, L->req, MPI_STATUSES_IGNORE)));
  swap_left(L, ipiv);
}

/* Whether the lookahead LU takes this job: a square matrix on one process row,
 * the local routines loaded and every panel's message countable in an int. */
static int takes(const mt__sl_job *j) {
  size_t panel = (size_t)j->n * (size_t)j->nb * j->itemsize + (size_t)(j->nb + 1) * sizeof(int);
  return j->cg.nprow == 1 && j->m == j->n && j->t->lgetrf != NULL &&
         j->cyc.desc[6] == 0 && j->cyc.desc[7] == 0 && panel <= INT_MAX;
}

/* The LU's view of a job's copy. */
static void lu_init(lu *L, const mt__sl_job *j) {
  *L = (lu){.j = j, .t = j->t, .comm = j->cg.comm, .n = j->n, .nb = j->nb,
            .np = j->cg.npcol, .me = j->cg.mycol, .lld = j->cyc.desc[8],
            .itemsize = j->itemsize, .a = j->cyc.data,
            .req = {MPI_REQUEST_NULL, MPI_REQUEST_NULL}, .mpi_rc = MPI_SUCCESS};
  L->nloc = local_below(L, L->n);
  L->npanels = (L->n + L->nb - 1) / L->nb;
  memset(&L->one, 0, sizeof L->one);
  memset(&L->minus_one, 0, sizeof L->minus_one);
  if (j->k % 2 == 0) /* s and c: single precision */
    L->one.s[0] = 1, L->minus_one.s[0] = -1;
  else
    L->one.d[0] = 1, L->minus_one.d[0] = -1;
}

static int lookahead(const mt__sl_job *j, int *ipiv, int *info, mt_error *err) {
  lu L;
  lu_init(&L, j);
  size_t bytes =
      (size_t)L.n * (size_t)L.nb * L.itemsize + (size_t)(L.nb + 1) * sizeof(int);
  L.buf[0] = malloc(bytes), L.buf[1] = malloc(bytes);
  int rc = L.buf[0] != NULL && L.buf[1] != NULL
               ? MT_OK
               : mt_error_set(err, MT_ENOMEM, "out of memory");
  rc = mt__sl_agree(&j->cg, rc, err);
  if (rc == MT_OK) {
    run(&L, ipiv, info);
    if (L.mpi_rc != MPI_SUCCESS) rc = mt_mpi_error(err, L.mpi_rc, "the LU's panels");
    rc = mt__sl_agree(&j->cg, rc, err);
  }
  free(L.buf[0]);
  free(L.buf[1]);
  return rc;
}

int mt__sl_lu(const mt__sl_job *j, int *ipiv, int *info, mt_error *err) {
  if (takes(j)) {
    int rc = lookahead(j, ipiv, info, err);
    if (rc != MT_OK) return rc;
  } else {
    static const char *const getrf[4] =
        MT__SL_NAMES(psgetrf, pdgetrf, pcgetrf, pzgetrf);
    mt_watchdog_wait_begin(getrf[j->k], 1);
    j->t->getrf(&j->n, &j->n, j->cyc.data, &j->one, &j->one, j->cyc.desc, ipiv, info);
    mt_watchdog_wait_end();
  }
  return mt__sl_agree_info(&j->g, info, err);
}

/* The rows of the n x nrhs row-major z, from row `row`. */
static char *rows_at(const lu *L, char *z, int nrhs, int row) {
  return z + (size_t)row * (size_t)nrhs * L->itemsize;
}

/* Block k of z, solved by its owner, to every process. */
static void share(lu *L, char *z, int nrhs, int k) {
  int bytes = width(L, k) * nrhs * (int)L->itemsize;
  char *rows = rows_at(L, z, nrhs, first_col(L, k));
  mpi_check(L, MT__LA_MPI("MPI_Bcast",
                          MPI_Bcast(rows, bytes, MPI_BYTE, owner(L, k), L->comm)));
}

/* With A''= P L U the LU of the copy, (Pi A) x = Pi b is A''^T x = c: U^T z = c,
 * then L^T w = z, then x = P w, as pXgetrs with TRANS 'T'. Each block of z (and
 * of w) is solved by the owner of U's (L's) column block, which holds all it
 * reads, and sent to all: on z row-major (its transpose column-major), each
 * block's equations read z_k^T U_kk = c_k^T - z_<k^T U_<k,k and
 * w_k^T L_kk = z_k^T - w_>k^T L_>k,k. */
static void substitute(lu *L, const int *ipiv, int nrhs, char *z) {
  const mt__sl_typed *t = L->t;
  for (int k = 0; k < L->npanels; ++k) {
    int c0 = first_col(L, k), kb = width(L, k), col = k / L->np * L->nb;
    char *zk = rows_at(L, z, nrhs, c0);
    if (owner(L, k) == L->me) {
      if (c0 > 0)
        t->gemm("N", "N", &nrhs, &kb, &c0, &L->minus_one, z, &nrhs, at(L, 0, col),
                &L->lld, &L->one, zk, &nrhs, 1, 1);
      t->trsm("R", "U", "N", "N", &nrhs, &kb, &L->one, at(L, c0, col), &L->lld, zk,
              &nrhs, 1, 1, 1, 1);
    }
    share(L, z, nrhs, k);
  }
  for (int k = L->npanels - 1; k >= 0; --k) {
    int c0 = first_col(L, k), kb = width(L, k), col = k / L->np * L->nb;
    int end = c0 + kb, rest = L->n - end;
    char *zk = rows_at(L, z, nrhs, c0);
    if (owner(L, k) == L->me) {
      if (rest > 0)
        t->gemm("N", "N", &nrhs, &kb, &rest, &L->minus_one, rows_at(L, z, nrhs, end),
                &nrhs, at(L, end, col), &L->lld, &L->one, zk, &nrhs, 1, 1);
      t->trsm("R", "L", "N", "U", &nrhs, &kb, &L->one, at(L, c0, col), &L->lld, zk,
              &nrhs, 1, 1, 1, 1);
    }
    share(L, z, nrhs, k);
  }
  size_t row = (size_t)nrhs * L->itemsize;
  char *tmp = rows_at(L, z, nrhs, L->n); /* the workspace's spare row */
  for (int i = L->n - 1; i >= 0; --i) {
    int p = ipiv[i] - 1;
    if (p == i) continue;
    memcpy(tmp, rows_at(L, z, nrhs, i), row);
    memcpy(rows_at(L, z, nrhs, i), rows_at(L, z, nrhs, p), row);
    memcpy(rows_at(L, z, nrhs, p), tmp, row);
  }
}

int mt__sl_lu_solve_relabelled(const mt__sl_job *j, const int *ipiv, int64_t nrhs,
                               void *b, mt_error *err) {
  lu L;
  lu_init(&L, j);
  size_t row = (size_t)nrhs * L.itemsize;
  /* nrhs bounded so that a block of z is a message of int bytes. */
  int fits = nrhs <= INT_MAX / ((int64_t)L.nb * 16);
  char *z = fits ? malloc((size_t)(L.n + 1) * row) : NULL;
  int rc = z != NULL ? MT_OK : mt_error_set(err, MT_ENOMEM, "out of memory");
  rc = mt__sl_agree(&j->cg, rc, err);
  if (rc != MT_OK) {
    free(z);
    return rc;
  }
  /* c = Pi b: the rows of each of this process's column blocks are its own rows
   * of b, in order. */
  for (int col = 0; col < L.nloc; col += L.nb) {
    int k = col / L.nb * L.np + L.me;
    memcpy(rows_at(&L, z, (int)nrhs, first_col(&L, k)), (char *)b + (size_t)col * row,
           (size_t)width(&L, k) * row);
  }
  substitute(&L, ipiv, (int)nrhs, z);
  /* This process's rows of x, where its rows of b were. */
  int64_t rows = 0, lo = 0;
  mt_chunk(L.n, L.np, L.me, &rows, &lo);
  memcpy(b, rows_at(&L, z, (int)nrhs, (int)lo), (size_t)rows * row);
  free(z);
  if (L.mpi_rc != MPI_SUCCESS) rc = mt_mpi_error(err, L.mpi_rc, "the LU's solve");
  return mt__sl_agree(&j->cg, rc, err);
}
