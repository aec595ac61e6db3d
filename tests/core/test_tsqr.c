/* TSQR (linalg/tsqr.h) at whatever size mpiexec gave, on the system's reference
 * LAPACK (liblapack.so.3, 32-bit integers: the LP64 path, where the Python tests
 * take NumPy's ILP64 OpenBLAS): every rank ends with the same upper triangular R,
 * its rows of Q times R give back its block, Q's columns are orthonormal over the
 * ranks, one all-reduce is counted, and a block shorter than the matrix is wide on
 * one rank fails on every rank with that rank's message before anything moves.
 * Without liblapack.so.3 the test is skipped (exit 77). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/comm/counters.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/linalg/tsqr.h"
#include "world_mesh.h"

static int world_rank, world_size;

/* A dlsym'd routine as a function pointer (ISO C has no cast between the two). */
static mt_lapack_fn *symbol(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  mt_lapack_fn *f = NULL;
  memcpy(&f, &p, sizeof f);
  return f;
}

static int load(mt_lapack *out) {
  void *lib = dlopen("liblapack.so.3", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) return 0;
  *out = (mt_lapack){.sgeqrf = symbol(lib, "sgeqrf_"),   .dgeqrf = symbol(lib, "dgeqrf_"),
                     .stpqrt = symbol(lib, "stpqrt_"),   .dtpqrt = symbol(lib, "dtpqrt_"),
                     .stpmqrt = symbol(lib, "stpmqrt_"), .dtpmqrt = symbol(lib, "dtpmqrt_"),
                     .sormqr = symbol(lib, "sormqr_"),   .dormqr = symbol(lib, "dormqr_"),
                     .ilp64 = 0};
  return mt_lapack_supports(out, MT_DTYPE_FLOAT64) && mt_lapack_supports(out, MT_DTYPE_FLOAT32);
}

/* Element (i, j) of the global matrix: the same on every rank, in [-1, 1). */
static double entry(int64_t i, int64_t j) {
  uint64_t x = (uint64_t)(i * 1000003 + j * 7919 + 17) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return (double)(x >> 11) / 4503599627370496.0 - 1.0;
}

/* This rank's rows [off, off + m) of the M x n matrix, column-major, as doubles. */
static double *block(int64_t off, int64_t m, int64_t n) {
  double *a = malloc((size_t)(m * n + 1) * sizeof *a);
  for (int64_t j = 0; j < n && a != NULL; ++j)
    for (int64_t i = 0; i < m; ++i) a[j * m + i] = entry(off + i, j);
  return a;
}

static double get(const void *x, int single, int64_t k) {
  return single ? (double)((const float *)x)[k] : ((const double *)x)[k];
}

/* ||block - Q R||^2 and ||block||^2 of this rank, and Q's Gram matrix (n x n). */
static void measure(const double *a, const void *q, const void *r, int single, int64_t m,
                    int64_t n, double sums[2], double *gram) {
  sums[0] = sums[1] = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double qr = 0.0;
      for (int64_t k = 0; k <= j; ++k) qr += get(q, single, k * m + i) * get(r, single, j * n + k);
      sums[0] += (a[j * m + i] - qr) * (a[j * m + i] - qr);
      sums[1] += a[j * m + i] * a[j * m + i];
    }
  }
  for (int64_t j1 = 0; j1 < n; ++j1) {
    for (int64_t j2 = 0; j2 < n; ++j2) {
      double g = 0.0;
      for (int64_t i = 0; i < m; ++i) g += get(q, single, j1 * m + i) * get(q, single, j2 * m + i);
      gram[j1 * n + j2] = g;
    }
  }
}

/* Whether r is upper triangular and the same on every rank. */
static int same_triangle(const void *r, int single, int64_t n) {
  int ok = 1;
  double *lo = malloc((size_t)(n * n) * sizeof *lo), *hi = malloc((size_t)(n * n) * sizeof *hi);
  if (lo == NULL || hi == NULL) ok = 0;
  for (int64_t k = 0; ok && k < n * n; ++k) {
    lo[k] = hi[k] = get(r, single, k);
    if (k % n > k / n && lo[k] != 0.0) ok = 0; /* below the diagonal */
  }
  if (lo != NULL && hi != NULL) {
    MPI_Allreduce(MPI_IN_PLACE, lo, (int)(n * n), MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, hi, (int)(n * n), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    for (int64_t k = 0; k < n * n; ++k) ok &= lo[k] == hi[k];
  }
  free(lo), free(hi);
  return ok;
}

/* The factorization of an M x n matrix and the checks on its result. */
static void test_case(mt_mesh *mesh, const mt_lapack *lapack, int64_t big_m, int64_t n,
                      int single) {
  int64_t m = 0, off = 0;
  mt_chunk(big_m, world_size, world_rank, &m, &off);
  size_t es = single ? sizeof(float) : sizeof(double);
  double *a = block(off, m, n), gram_sum[2], *gram = malloc((size_t)(n * n) * sizeof *gram);
  char *work = malloc((size_t)(m * n + 1) * es), *q = malloc((size_t)(m * n + 1) * es);
  char *r = malloc((size_t)(n * n) * es);
  CHECK(a != NULL && gram != NULL && work != NULL && q != NULL && r != NULL);
  for (int64_t k = 0; k < m * n; ++k) {
    if (single) ((float *)(void *)work)[k] = (float)a[k];
    else ((double *)(void *)work)[k] = a[k];
  }
  if (single) /* the matrix measured against is the one factored */
    for (int64_t k = 0; k < m * n; ++k) a[k] = (double)((float *)(void *)work)[k];
  mt_comm_totals before, after;
  mt_comm_counters_read(&test_counters, &before);
  mt_error err = {0};
  int rc = mt_tsqr(mesh, 0, lapack, single ? MT_DTYPE_FLOAT32 : MT_DTYPE_FLOAT64, m, n,
                   work, m, r, n, q, m, &err);
  mt_comm_counters_read(&test_counters, &after);
  CHECK_MSG(rc == MT_OK, "%lld x %lld: %s", (long long)big_m, (long long)n, err.msg);
  CHECK(after.calls[MT_COLL_ALL_REDUCE] - before.calls[MT_COLL_ALL_REDUCE] ==
        (world_size > 1 ? 1 : 0));
  measure(a, q, r, single, m, n, gram_sum, gram);
  MPI_Allreduce(MPI_IN_PLACE, gram_sum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, gram, (int)(n * n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double tol = single ? 1e-5 : 1e-13, worst = 0.0;
  for (int64_t k = 0; k < n * n; ++k)
    worst = fmax(worst, fabs(gram[k] - (k % n == k / n ? 1.0 : 0.0)));
  CHECK_MSG(sqrt(gram_sum[0] / gram_sum[1]) <= tol, "||A - QR|| / ||A|| = %g",
            sqrt(gram_sum[0] / gram_sum[1]));
  CHECK_MSG(worst <= tol, "|Q^T Q - I| = %g", worst);
  CHECK(same_triangle(r, single, n));
  free(a), free(gram), free(work), free(q), free(r);
}

/* The last rank's block is shorter than the matrix is wide: every rank returns its
 * status and message, and the next factorization runs. */
static void test_short_block(mt_mesh *mesh, const mt_lapack *lapack) {
  int64_t n = 4, m = world_rank == world_size - 1 ? n - 1 : n + 2;
  double a[6 * 4] = {0}, r[4 * 4] = {0};
  for (int64_t k = 0; k < m * n; ++k) a[k] = entry(k, world_rank);
  mt_error err = {0};
  int rc = mt_tsqr(mesh, 0, lapack, MT_DTYPE_FLOAT64, m, n, a, m > 1 ? m : 1, r, n, NULL, 0,
                   &err);
  CHECK_MSG(rc == MT_EINVAL && strstr(err.msg, "3 x 4") != NULL, "%s: '%s'",
            mt_status_name(rc), err.msg);
}

/* R alone (no Q asked) is the R of the factorization with Q. */
static void test_r_alone(mt_mesh *mesh, const mt_lapack *lapack) {
  int64_t n = 3, m = 0, off = 0;
  mt_chunk(11 * (int64_t)world_size, world_size, world_rank, &m, &off);
  double *a = block(off, m, n), *b = block(off, m, n), r1[9], r2[9], *q = malloc((size_t)(m * n) * sizeof *q);
  CHECK(a != NULL && b != NULL && q != NULL);
  mt_error err = {0};
  CHECK(mt_tsqr(mesh, 0, lapack, MT_DTYPE_FLOAT64, m, n, a, m, r1, n, NULL, 0, &err) == MT_OK);
  CHECK(mt_tsqr(mesh, 0, lapack, MT_DTYPE_FLOAT64, m, n, b, m, r2, n, q, m, &err) == MT_OK);
  CHECK(memcmp(r1, r2, sizeof r1) == 0);
  free(a), free(b), free(q);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  mt_lapack lapack;
  int found = load(&lapack), everywhere = 0;
  MPI_Allreduce(&found, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!everywhere) {
    if (world_rank == 0) printf("test_tsqr: skipped, no liblapack.so.3 with tpqrt\n");
    MPI_Finalize();
    return 77;
  }
  mt_mesh *mesh = world_mesh();
  int64_t p = world_size;
  test_case(mesh, &lapack, 40 * p + 3, 5, 0);
  test_case(mesh, &lapack, 8 * p, 8, 0);
  test_case(mesh, &lapack, 33 * p + 1, 1, 0);
  test_case(mesh, &lapack, 30 * p + 2, 4, 1);
  test_case(mesh, &lapack, 70 * p, 40, 0); /* n above tpqrt's block of 32 */
  /* Blocks taller than several of the leaf's chunks, the last one short. */
  test_case(mesh, &lapack, 1100 * p + 3, 64, 0);
  test_case(mesh, &lapack, 2100 * p + 1, 64, 1);
  test_short_block(mesh, &lapack);
  test_r_alone(mesh, &lapack);
  mt_mesh_destroy(mesh);
  int failures = mt_test_failures;
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rc = mt_test_exit("test_tsqr");
  MPI_Finalize();
  return failures == 0 ? rc : 1;
}
