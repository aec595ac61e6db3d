/* The ScaLAPACK drivers (linalg/scalapack.h) at whatever size mpiexec gave, on
 * Debian's ScaLAPACK for Open MPI, through the table mt_scalapack_open fills: a
 * library that does not exist is MT_ENOTSUP with the loader's message; on a P x 1
 * grid of the world mesh, with torch.chunk's uneven blocks of rows (a rank without
 * rows when P > n), pXgesv's x solves A x = b, inv's A^-1 times A is I, slogdet
 * matches the product of a triangular matrix's diagonal, and a matrix with a zero
 * row gives INFO > 0 on every rank; geqrf's reflectors and tau are LAPACK's
 * (tau = 2 / v^T v, alike on every rank) and the SVD's complete U is orthogonal;
 * the grids are cached per mesh and released with it. Without the library the test is skipped (77). */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/linalg/scalapack.h"
#include "world_mesh.h"

static int rank, size;

/* This rank's rows [*lo, *hi) of n: torch.chunk's blocks of ceil(n/P). */
static void my_rows(int64_t n, int64_t *lo, int64_t *hi) {
  int64_t block = (n + size - 1) / size;
  *lo = rank * block < n ? rank * block : n;
  *hi = *lo + block < n ? *lo + block : n;
}

/* Entry (i, j) of the test matrix: diagonally dominant, or (zero_row) with row
 * n / 2 zero. */
static double entry(int64_t n, int64_t i, int64_t j, int zero_row) {
  if (zero_row && i == n / 2) return 0.0;
  return (i == j ? 2.0 * (double)n + 3.0 : 0.0) + (double)((i * 7 + j * 3) % 5) - 2.0;
}

/* This rank's rows of A, row-major. */
static double *my_block(int64_t n, int zero_row, int64_t *rows) {
  int64_t lo, hi;
  my_rows(n, &lo, &hi);
  *rows = hi - lo;
  double *a = calloc((size_t)((*rows > 0 ? *rows : 1) * n), sizeof *a);
  CHECK(a != NULL);
  for (int64_t j = 0; a != NULL && j < n; ++j)
    for (int64_t i = lo; i < hi; ++i) a[(i - lo) * n + j] = entry(n, i, j, zero_row);
  return a;
}

static void test_solve(const mt_scalapack *sl, mt_mesh *mesh, int64_t n) {
  int64_t rows, lo, hi;
  double *a = my_block(n, 0, &rows), *x = calloc((size_t)(rows + 1), sizeof *x);
  my_rows(n, &lo, &hi);
  for (int64_t i = 0; i < rows; ++i) x[i] = 1.0;  /* b = ones */
  int info = -1;
  mt_error err = {0};
  CHECK_MSG(mt_scalapack_solve(sl, mesh, 0, -1, 'd', n, a, 1, x, &info, &err) == MT_OK,
            "%s", err.msg);
  CHECK(info == 0);
  /* Every rank's residual rows of A x - b, with x gathered. */
  double *whole = calloc((size_t)n, sizeof *whole);
  int *counts = calloc((size_t)size, sizeof *counts), *displs = calloc((size_t)size, sizeof *displs);
  for (int r = 0; r < size; ++r) {
    int64_t block = (n + size - 1) / size, l = r * block < n ? r * block : n;
    counts[r] = (int)((l + block < n ? l + block : n) - l), displs[r] = (int)l;
  }
  MPI_Allgatherv(x, (int)rows, MPI_DOUBLE, whole, counts, displs, MPI_DOUBLE, MPI_COMM_WORLD);
  for (int64_t i = 0; i < n; ++i) {
    double r = -1.0;
    for (int64_t j = 0; j < n; ++j) r += entry(n, i, j, 0) * whole[j];
    CHECK_MSG(fabs(r) < 1e-12 * (double)n, "row %lld residual %g", (long long)i, r);
  }
  free(a), free(x), free(whole), free(counts), free(displs);
}

static void test_singular(const mt_scalapack *sl, mt_mesh *mesh, int64_t n) {
  int64_t rows;
  double *a = my_block(n, 1, &rows);
  int info = 0;
  mt_error err = {0};
  CHECK(mt_scalapack_inv(sl, mesh, 0, -1, 'd', n, a, &info, &err) == MT_OK);
  int seen_min = info, seen_max = info;
  MPI_Allreduce(MPI_IN_PLACE, &seen_min, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &seen_max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK_MSG(seen_min > 0 && seen_min == seen_max, "info %d..%d", seen_min, seen_max);
  free(a);
}

/* slogdet of the lower triangle of the test matrix: the log of its diagonal. */
static void test_slogdet(const mt_scalapack *sl, mt_mesh *mesh, int64_t n) {
  int64_t rows, lo, hi;
  double *a = my_block(n, 0, &rows), out[2] = {0, 0}, want = 0;
  my_rows(n, &lo, &hi);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = lo; i < hi; ++i)
      if (j > i) a[(i - lo) * n + j] = 0.0;
  for (int64_t i = 0; i < n; ++i) want += log(fabs(entry(n, i, i, 0)));
  mt_error err = {0};
  CHECK(mt_scalapack_slogdet(sl, mesh, 0, -1, 'd', n, a, out, &err) == MT_OK);
  CHECK_MSG(fabs(out[0] - want) < 1e-12 * fabs(want), "%g vs %g", out[0], want);
  CHECK(fabs(out[1]) < 1e-12);  /* positive diagonal: no half turn */
  free(a);
}

/* Rows [*lo, *hi) of n that coordinate k of p holds: torch.chunk's blocks. */
static void span(int64_t n, int64_t p, int64_t k, int64_t *lo, int64_t *hi) {
  int64_t block = (n + p - 1) / p;
  *lo = k * block < n ? k * block : n;
  *hi = *lo + block < n ? *lo + block : n;
}

/* det(2 I) through slogdet with rows over mesh dim `rd` and columns over `cd`. */
static void check_two_eye(const mt_scalapack *sl, mt_mesh *mesh, int64_t n, int rd, int cd) {
  int64_t coord[MT_MAX_MESH_NDIM], r0, r1, c0, c1;
  CHECK(mt_mesh_coordinate(mesh, coord));
  span(n, rd < 0 ? 1 : mt_mesh_dim_size(mesh, rd), rd < 0 ? 0 : coord[rd], &r0, &r1);
  span(n, cd < 0 ? 1 : mt_mesh_dim_size(mesh, cd), cd < 0 ? 0 : coord[cd], &c0, &c1);
  int64_t rows = r1 - r0, cols = c1 - c0;
  double *a = calloc((size_t)((rows > 0 ? rows : 1) * (cols > 0 ? cols : 1)), sizeof *a);
  CHECK(a != NULL);
  for (int64_t c = 0; a != NULL && c < cols; ++c)
    for (int64_t i = 0; i < rows; ++i) a[i * cols + c] = r0 + i == c0 + c ? 2.0 : 0.0;
  double out[2] = {0, 0};
  mt_error err = {0};
  CHECK_MSG(mt_scalapack_slogdet(sl, mesh, rd, cd, 'd', n, a, out, &err) == MT_OK, "%s",
            err.msg);
  CHECK_MSG(fabs(out[0] - (double)n * log(2.0)) < 1e-12 * (double)n, "%g", out[0]);
  free(a);
}

/* The drivers' process grids are cached on the mesh: a second call on a layout
 * makes no grid, another layout one more, and destroying the mesh releases them
 * (the table counts one mesh fewer). Columns first: a row-sharded slogdet runs on
 * its grid's turn, the columns' grid. */
static void test_grid_cache(const mt_scalapack *sl) {
  int64_t n = 2 * (int64_t)size + 1;
  int before = mt_scalapack_cached_meshes(sl);
  mt_mesh *mesh = world_mesh();
  CHECK(mt_scalapack_cached_grids(sl, mesh) == 0);
  check_two_eye(sl, mesh, n, -1, 0);
  check_two_eye(sl, mesh, n, -1, 0);
  CHECK(mt_scalapack_cached_grids(sl, mesh) == 1);
  CHECK(mt_scalapack_cached_meshes(sl) == before + 1);
  check_two_eye(sl, mesh, n, 0, -1);
  CHECK(mt_scalapack_cached_grids(sl, mesh) == 2);
  mt_mesh_destroy(mesh);
  CHECK(mt_scalapack_cached_meshes(sl) == before);
}

/* On a 2 x 2 mesh, six layouts: the cache keeps the last few, and a layout it
 * dropped is made again with the same answer. */
static void test_grid_cache_drops_the_oldest(const mt_scalapack *sl) {
  if (size != 4) return;
  int ranks[4] = {0, 1, 2, 3};
  int64_t shape[2] = {2, 2};
  mt_mesh *mesh = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 2, shape, ranks, &mesh, NULL) == MT_OK);
  const int dims[6][2] = {{0, -1}, {1, -1}, {-1, 0}, {-1, 1}, {0, 1}, {1, 0}};
  for (int k = 0; k < 6; ++k) check_two_eye(sl, mesh, 7, dims[k][0], dims[k][1]);
  int kept = mt_scalapack_cached_grids(sl, mesh);
  CHECK_MSG(kept >= 1 && kept < 6, "%d grids", kept);
  check_two_eye(sl, mesh, 7, 0, -1);
  CHECK(mt_scalapack_cached_grids(sl, mesh) == kept);
  mt_mesh_destroy(mesh);
}

/* This rank's rows of an m x n matrix (entry(m, i, j) as the square one's),
 * row-major: torch.chunk's blocks of ceil(m/P) rows. */
static double *tall_block(int64_t m, int64_t n, int64_t *lo, int64_t *rows) {
  int64_t hi;
  my_rows(m, lo, &hi);
  *rows = hi - *lo;
  double *a = calloc((size_t)((*rows > 0 ? *rows : 1) * n), sizeof *a);
  CHECK(a != NULL);
  for (int64_t j = 0; a != NULL && j < n; ++j)
    for (int64_t i = 0; i < *rows; ++i) a[i * n + j] = entry(m, *lo + i, j, 0);
  return a;
}

/* geqrf's reflectors, as LAPACK's: tau on every rank, and for each column j,
 * v = (1, A[j+1:, j]) with tau = 2 / (v^T v) (dlarfg's reflector is orthogonal);
 * |R[0, 0]| is the norm of column 0. */
static void test_geqrf(const mt_scalapack *sl, mt_mesh *mesh, int64_t m, int64_t n) {
  int64_t lo, rows, k = m < n ? m : n;
  double *a = tall_block(m, n, &lo, &rows), *tau = calloc((size_t)k, sizeof *tau);
  double *sums = calloc((size_t)k + 1, sizeof *sums), norm0 = 0.0;
  for (int64_t i = 0; i < m; ++i) norm0 += entry(m, i, 0, 0) * entry(m, i, 0, 0);
  mt_error err = {0};
  CHECK_MSG(mt_scalapack_geqrf(sl, mesh, 0, -1, 'd', m, n, a, tau, &err) == MT_OK, "%s",
            err.msg);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t i = 0; i < rows; ++i)
      if (lo + i > j) sums[j] += a[i * n + j] * a[i * n + j];
  if (rows > 0 && lo == 0) sums[k] = fabs(a[0]);
  MPI_Allreduce(MPI_IN_PLACE, sums, (int)k + 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double *first = calloc((size_t)k, sizeof *first);
  if (rank == 0) memcpy(first, tau, (size_t)k * sizeof *tau);
  MPI_Bcast(first, (int)k, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  for (int64_t j = 0; j < k; ++j) {
    CHECK_MSG(tau[j] == first[j], "tau[%lld] differs between ranks", (long long)j);
    double want = sums[j] > 0.0 ? 2.0 / (1.0 + sums[j]) : 0.0;  /* no tail: H = I */
    CHECK_MSG(fabs(tau[j] - want) < 1e-12, "tau[%lld] %g, want %g", (long long)j, tau[j],
              want);
  }
  CHECK_MSG(fabs(sums[k] - sqrt(norm0)) < 1e-12 * sqrt(norm0), "|R00| %g", sums[k]);
  free(a), free(tau), free(sums), free(first);
}

/* The complete U (m x m) of the SVD is orthogonal: U^T U, summed over the ranks'
 * rows, is I. */
static void test_svd_complete_u(const mt_scalapack *sl, mt_mesh *mesh, int64_t m, int64_t n) {
  int64_t lo, rows, k = m < n ? m : n;
  double *a = tall_block(m, n, &lo, &rows), *s = calloc((size_t)k, sizeof *s);
  double *u = calloc((size_t)((rows > 0 ? rows : 1) * m), sizeof *u);
  double *g = calloc((size_t)(m * m), sizeof *g);
  int info = -1;
  mt_error err = {0};
  CHECK_MSG(mt_scalapack_svd(sl, mesh, 0, -1, 'd', m, n, a, s, u, m, NULL, &info, &err) ==
                MT_OK, "%s", err.msg);
  CHECK(info == 0);
  for (int64_t p = 0; p < m; ++p)
    for (int64_t q = 0; q < m; ++q)
      for (int64_t i = 0; i < rows; ++i) g[p + q * m] += u[i * m + p] * u[i * m + q];
  MPI_Allreduce(MPI_IN_PLACE, g, (int)(m * m), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  for (int64_t p = 0; p < m; ++p)
    for (int64_t q = 0; q < m; ++q)
      CHECK_MSG(fabs(g[p + q * m] - (p == q)) < 1e-12 * (double)m, "U^T U [%lld, %lld] %g",
                (long long)p, (long long)q, g[p + q * m]);
  CHECK(mt_scalapack_svd(sl, mesh, 0, -1, 'd', m, n, a, s, u, m + 1, NULL, &info, &err) ==
        MT_EINVAL);
  free(a), free(s), free(u), free(g);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  mt_scalapack *sl = NULL;
  mt_error err = {0};
  CHECK(mt_scalapack_open("/nonexistent/libscalapack.so", &sl, &err) == MT_ENOTSUP);
  CHECK(sl == NULL && strstr(err.msg, "nonexistent") != NULL);
  /* A source of several libraries stops at the first that does not load, naming it. */
  const char *missing[] = {"/nonexistent/libmkl_core.so.3",
                           "/nonexistent/libscalapack.so"};
  CHECK(mt_scalapack_open_libraries(missing, 2, &sl, &err) == MT_ENOTSUP);
  CHECK(sl == NULL && strstr(err.msg, "libmkl_core") != NULL);
  CHECK(mt_scalapack_open_libraries(missing, 0, &sl, &err) == MT_EINVAL);
  if (mt_scalapack_open("libscalapack-openmpi.so.2.2", &sl, &err) != MT_OK) {
    if (rank == 0) printf("test_scalapack: skipped, %s\n", err.msg);
    MPI_Finalize();
    return 77;
  }
  mt_mesh *mesh = world_mesh();
  const int64_t sizes[] = {1, 5, 2 * (int64_t)size + 1, 70};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; ++k) {
    test_solve(sl, mesh, sizes[k]);
    test_slogdet(sl, mesh, sizes[k]);
    if (sizes[k] > 1) test_singular(sl, mesh, sizes[k]);
  }
  test_geqrf(sl, mesh, 2 * (int64_t)size + 3, 3);
  test_geqrf(sl, mesh, 2, 5);
  test_svd_complete_u(sl, mesh, 2 * (int64_t)size + 3, 3);
  mt_mesh_destroy(mesh);
  test_grid_cache(sl);
  test_grid_cache_drops_the_oldest(sl);
  mt_scalapack_close(sl);
  int rc = mt_test_exit("test_scalapack");
  int failures = mt_test_failures;
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return failures == 0 ? rc : 1;
}
