/* The plain C program benchmarks/linalg.py holds mpitensor's ScaLAPACK path to:
 * the process grid and block-cyclic descriptors mpitensor builds for a [Shard(0)]
 * n x n float64 matrix (csrc/linalg/scalapack_grid.c: a P x 1 grid in row-major
 * BLACS order, or for a solve and an eigh the 1 x P grid csrc/linalg/scalapack_job.c
 * turns it to, square blocks of min(ceil(n/P), 64)), the matrix generated in
 * place in that layout, and the same routines called on it: pdgesv of one
 * right-hand side, the eigensolver mpitensor's eigh calls. No redistribution, no
 * copies: what a ScaLAPACK program written by hand spends.
 *
 *   mpicc -O2 -o scalapack_plain benchmarks/scalapack_plain.c -lscalapack-openmpi -lm
 *
 * or on MKL's ScaLAPACK (MPITENSOR_SCALAPACK=mkl's libraries: LP64, BLACS over Open
 * MPI, sequential), from the mkl package's lib directory L (the venv's lib/):
 *
 *   mpicc -O2 -o scalapack_plain benchmarks/scalapack_plain.c -L$L \
 *       -Wl,--no-as-needed,-rpath,$L -l:libmkl_scalapack_lp64.so.2 \
 *       -l:libmkl_blacs_openmpi_lp64.so.2 -l:libmkl_intel_lp64.so.3 \
 *       -l:libmkl_sequential.so.3 -l:libmkl_core.so.3 -lm
 *
 *   OPENBLAS_NUM_THREADS=1 mpiexec -n 2 ./scalapack_plain OP N REPS WARMUP \
 *       [NB] [NPROW] [DRIVER]
 *
 * OP is solve, eigh, or redist (pdgemr2d of the matrix from torch.chunk's blocks of
 * ceil(n/P) rows to the cyclic layout and back: the move mpitensor makes with its
 * own exchange instead, csrc/linalg/scalapack_exchange.c); NB 0 or absent is mpitensor's block; NPROW 0 or absent is P (the grid is
 * NPROW x P/NPROW); DRIVER is syevd (mpitensor's, with vectors), syevr or syevx. Rank 0 prints one
 * JSON object: the seconds of each repetition, the slowest rank's, and for eigh the
 * largest |A v - w v| / (|A| n) over a few eigenvectors as a check. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int numroc_(const int *n, const int *nb, const int *iproc, const int *isrc,
            const int *nprocs);
void descinit_(int *desc, const int *m, const int *n, const int *mb, const int *nb,
               const int *irsrc, const int *icsrc, const int *ctxt, const int *lld,
               int *info);
void Cblacs_get(int ctxt, int what, int *val);
void Cblacs_gridinit(int *ctxt, const char *order, int nprow, int npcol);
void Cblacs_gridinfo(int ctxt, int *nprow, int *npcol, int *myrow, int *mycol);
void Cblacs_gridexit(int ctxt);
void pdgesv_(const int *n, const int *nrhs, double *a, const int *ia, const int *ja,
             const int *desca, int *ipiv, double *b, const int *ib, const int *jb,
             const int *descb, int *info);
void pdsyevr_(const char *jobz, const char *range, const char *uplo, const int *n,
              double *a, const int *ia, const int *ja, const int *desca, const double *vl,
              const double *vu, const int *il, const int *iu, int *m, int *nz, double *w,
              double *z, const int *iz, const int *jz, const int *descz, double *work,
              const int *lwork, int *iwork, const int *liwork, int *info);
void pdsyevd_(const char *jobz, const char *uplo, const int *n, double *a, const int *ia,
              const int *ja, const int *desca, double *w, double *z, const int *iz,
              const int *jz, const int *descz, double *work, const int *lwork, int *iwork,
              const int *liwork, int *info);
void pdsyevx_(const char *jobz, const char *range, const char *uplo, const int *n,
              double *a, const int *ia, const int *ja, const int *desca, const double *vl,
              const double *vu, const int *il, const int *iu, const double *abstol, int *m,
              int *nz, double *w, const double *orfac, double *z, const int *iz,
              const int *jz, const int *descz, double *work, const int *lwork, int *iwork,
              const int *liwork, int *ifail, int *iclustr, double *gap, int *info);
void pdgemr2d_(const int *m, const int *n, const double *a, const int *ia, const int *ja,
               const int *desca, double *b, const int *ib, const int *jb, const int *descb,
               const int *ctxt);

typedef struct grid {
  int ctxt, nprow, npcol, myrow, mycol;
} grid;

typedef struct mat {
  int desc[9], rows, cols;
  double *data;
} mat;

static const int ONE = 1, ZERO = 0;

/* A matrix of n x cols on the grid in blocks of mb x nb, zeroed. */
static mat mat_make(const grid *g, int n, int cols, int mb, int nb) {
  mat a;
  int info = 0;
  a.rows = numroc_(&n, &mb, &g->myrow, &ZERO, &g->nprow);
  a.cols = numroc_(&cols, &nb, &g->mycol, &ZERO, &g->npcol);
  int lld = a.rows > 1 ? a.rows : 1;
  descinit_(a.desc, &n, &cols, &mb, &nb, &ZERO, &ZERO, &g->ctxt, &lld, &info);
  a.data = calloc((size_t)lld * (size_t)(a.cols > 0 ? a.cols : 1), sizeof(double));
  return a;
}

/* The global index of local index `l` of a dim in blocks of `nb` over `np`. */
static int global(int l, int nb, int p, int np) { return (l / nb * np + p) * nb + l % nb; }

/* A reproducible value of entry (i, j), symmetric, in [-1, 1). */
static double entry(int i, int j) {
  unsigned long long k = (unsigned long long)(i < j ? i : j) * 2654435761ULL +
                         (unsigned long long)(i < j ? j : i) * 40503ULL + 12345ULL;
  k ^= k >> 33, k *= 0xff51afd7ed558ccdULL, k ^= k >> 33, k *= 0xc4ceb9fe1a85ec53ULL,
      k ^= k >> 33;
  return (double)(k >> 11) / (double)(1ULL << 52) - 1.0;
}

/* Fills A as benchmarks/linalg.py's square problem is made: random entries and a
 * diagonal of 2 sqrt(n) (symmetric here, which pdgesv does not mind). */
static void fill(const grid *g, mat *a, int n) {
  int mb = a->desc[4], nb = a->desc[5], lld = a->desc[8];
  for (int c = 0; c < a->cols; ++c)
    for (int r = 0; r < a->rows; ++r) {
      int i = global(r, mb, g->myrow, g->nprow), j = global(c, nb, g->mycol, g->npcol);
      a->data[r + (size_t)c * lld] = entry(i, j) + (i == j ? 2 * sqrt((double)n) : 0);
    }
}

/* One eigensolver call of `driver`; lwork -1 asks for the workspace into work[0],
 * iwork[0]. */
static void eigen(const char *driver, int n, mat *a, double *w, mat *z, double *work,
                  int lwork, int *iwork, int liwork, int *info) {
  double bound = 0, orfac = 1e-3, abstol = 0;
  int m = 0, nz = 0;
  if (strcmp(driver, "syevd") == 0) {
    pdsyevd_("V", "L", &n, a->data, &ONE, &ONE, a->desc, w, z->data, &ONE, &ONE, z->desc,
             work, &lwork, iwork, &liwork, info);
  } else if (strcmp(driver, "syevx") == 0) {
    static int *ifail, *iclustr;
    static double *gap;
    int np = 64;
    if (ifail == NULL) {
      ifail = calloc((size_t)n, sizeof *ifail);
      iclustr = calloc((size_t)(2 * np), sizeof *iclustr);
      gap = calloc((size_t)np, sizeof *gap);
    }
    pdsyevx_("V", "A", "L", &n, a->data, &ONE, &ONE, a->desc, &bound, &bound, &ZERO,
             &ZERO, &abstol, &m, &nz, w, &orfac, z->data, &ONE, &ONE, z->desc, work,
             &lwork, iwork, &liwork, ifail, iclustr, gap, info);
  } else {
    pdsyevr_("V", "A", "L", &n, a->data, &ONE, &ONE, a->desc, &bound, &bound, &ZERO,
             &ZERO, &m, &nz, w, z->data, &ONE, &ONE, z->desc, work, &lwork, iwork, &liwork,
             info);
  }
}

/* The residual |A v - w v|_max / (|A|_max n) of eigenvector `k`, its column summed
 * onto every rank from its owners. */
static double residual(const grid *g, int n, const mat *z, const double *w, int k) {
  double worst = 0;
  double *v = calloc((size_t)n, sizeof *v);
  int nb = z->desc[5], mb = z->desc[4], lld = z->desc[8];
  if ((k / nb) % g->npcol == g->mycol) {
    int lc = (k / nb / g->npcol) * nb + k % nb;
    for (int r = 0; r < z->rows; ++r)
      v[global(r, mb, g->myrow, g->nprow)] = z->data[r + (size_t)lc * lld];
  }
  MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double amax = 2 * sqrt((double)n) + 1;
  for (int i = 0; i < n; ++i) {
    double s = -w[k] * v[i];
    for (int j = 0; j < n; ++j)
      s += (entry(i, j) + (i == j ? 2 * sqrt((double)n) : 0)) * v[j];
    if (fabs(s) > worst) worst = fabs(s);
  }
  free(v);
  return worst / (amax * n);
}

/* The seconds of one repetition, the slowest rank's. */
static double slowest(double t0) {
  double t = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

static double run_solve(const grid *g, int n, int nb, int *info) {
  mat a = mat_make(g, n, n, nb, nb), b = mat_make(g, n, 1, nb, nb);
  int *ipiv = calloc((size_t)(a.rows + nb), sizeof *ipiv);
  fill(g, &a, n);
  for (int r = 0; r < b.rows; ++r) b.data[r] = entry(r, n + 1);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  pdgesv_(&n, &ONE, a.data, &ONE, &ONE, a.desc, ipiv, b.data, &ONE, &ONE, b.desc, info);
  double t = slowest(t0);
  free(ipiv), free(a.data), free(b.data);
  return t;
}

static double run_eigh(const grid *g, int n, int nb, const char *driver, double *check,
                       int *info) {
  mat a = mat_make(g, n, n, nb, nb), z = mat_make(g, n, n, nb, nb);
  double *w = calloc((size_t)n, sizeof *w), wq = 0;
  int iq = 0;
  fill(g, &a, n);
  eigen(driver, n, &a, w, &z, &wq, -1, &iq, -1, info);
  /* The margin mpitensor's eigh_query adds. */
  int lwork = (int)wq + 1 + 4 * n + 2 * nb * nb, liwork = iq + 1 + 4 * n + 2 * nb * nb;
  double *work = malloc((size_t)lwork * sizeof *work);
  int *iwork = malloc((size_t)liwork * sizeof *iwork);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  eigen(driver, n, &a, w, &z, work, lwork, iwork, liwork, info);
  double t = slowest(t0);
  int ascending = 1;
  for (int i = 1; i < n; ++i) ascending &= w[i - 1] <= w[i];
  if (check != NULL)
    *check = ascending ? fmax(residual(g, n, &z, w, 0), residual(g, n, &z, w, n - 1))
                       : INFINITY;
  free(work), free(iwork), free(w), free(a.data), free(z.data);
  return t;
}

/* pdgemr2d from torch.chunk's row blocks to the cyclic layout and back. */
static double run_redist(const grid *g, int n, int nb) {
  int mb = (n + g->nprow - 1) / g->nprow, cb = (n + g->npcol - 1) / g->npcol;
  mat blk = mat_make(g, n, n, mb, cb), cyc = mat_make(g, n, n, nb, nb);
  fill(g, &blk, n);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  pdgemr2d_(&n, &n, blk.data, &ONE, &ONE, blk.desc, cyc.data, &ONE, &ONE, cyc.desc,
            &g->ctxt);
  pdgemr2d_(&n, &n, cyc.data, &ONE, &ONE, cyc.desc, blk.data, &ONE, &ONE, blk.desc,
            &g->ctxt);
  double t = slowest(t0);
  free(blk.data), free(cyc.data);
  return t;
}

/* One timed repetition of `op` (solve, eigh, redist) at size n on an nprow x P/nprow
 * grid (0: P x 1) in blocks of nb (0: mpitensor's), the slowest rank's seconds;
 * `check` (may be NULL) gets eigh's residual, `info` the routine's INFO.
 * benchmarks/linalg.py calls this from the library build of this file, so that its
 * repetitions interleave with mpitensor's in the same processes. Collective on
 * MPI_COMM_WORLD. */
double plain_once(const char *op, int n, int nb, int nprow, const char *driver,
                  double *check, int *info) {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  grid g;
  g.nprow = nprow > 0 ? nprow : size, g.npcol = size / g.nprow;
  if (nb <= 0) {
    int p = g.nprow > g.npcol ? g.nprow : g.npcol;
    nb = (n + p - 1) / p;
    nb = nb > 64 ? 64 : nb;
  }
  Cblacs_get(0, 0, &g.ctxt);
  Cblacs_gridinit(&g.ctxt, "R", g.nprow, g.npcol);
  Cblacs_gridinfo(g.ctxt, &g.nprow, &g.npcol, &g.myrow, &g.mycol);
  *info = 0;
  double t = strcmp(op, "solve") == 0  ? run_solve(&g, n, nb, info)
             : strcmp(op, "eigh") == 0 ? run_eigh(&g, n, nb, driver, check, info)
                                       : run_redist(&g, n, nb);
  Cblacs_gridexit(g.ctxt);
  return t;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 5) {
    if (rank == 0) fprintf(stderr, "usage: OP N REPS WARMUP [NB] [NPROW] [DRIVER]\n");
    MPI_Finalize();
    return 2;
  }
  const char *op = argv[1], *driver = argc > 7 ? argv[7] : "syevd";
  int n = atoi(argv[2]), reps = atoi(argv[3]), warmup = atoi(argv[4]);
  int nb = argc > 5 ? atoi(argv[5]) : 0, nprow = argc > 6 ? atoi(argv[6]) : 0;
  double check = 0;
  int info = 0;
  if (rank == 0)
    printf("{\"op\": \"%s\", \"n\": %d, \"nb\": %d, \"nprow\": %d, \"driver\": \"%s\", "
           "\"seconds\": [", op, n, nb, nprow, driver);
  for (int r = -warmup; r < reps; ++r) {
    double t = plain_once(op, n, nb, nprow, driver, r == reps - 1 ? &check : NULL, &info);
    if (rank == 0 && r >= 0) printf("%s%.9f", r > 0 ? ", " : "", t);
  }
  if (rank == 0) printf("], \"info\": %d, \"check\": %.3e}\n", info, check);
  MPI_Finalize();
  return 0;
}
