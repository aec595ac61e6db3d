/* The mpitensor C core without Python: lay an 8 x 6 float64 tensor out over a mesh
 * of every rank, plan its move from Shard(0) (rows cut) to Shard(1) (columns cut),
 * print the plan, run it, and check every element that arrived.
 *
 *   mpiexec -n 4 ./example_redistribute     (any rank count, 1 included)
 *
 * Build: link mpitensor_comm and mpitensor_core (CMake targets of this repository,
 * see CMakeLists.txt); `make test` builds and runs it at 1 and 4 ranks.
 * Exit status 0 when every rank received exactly its box of the tensor. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/redistribute.h"
#include "mpitensor/mpitensor.h"

enum { ROWS = 8, COLS = 6 };

/* The value of global element (i, j): its row-major index, so any element can be
 * checked anywhere. */
static double value_at(int64_t i, int64_t j) { return (double)(i * COLS + j); }

/* Fills `buf` (C-contiguous, box->shape) with the global values of `box`. */
static void fill_box(double *buf, const mt_box *box) {
  for (int64_t i = 0; i < box->shape[0]; i++)
    for (int64_t j = 0; j < box->shape[1]; j++)
      buf[i * box->shape[1] + j] = value_at(box->offset[0] + i, box->offset[1] + j);
}

/* Counts the elements of `buf` that differ from the global values of `box`. */
static int64_t count_wrong(const double *buf, const mt_box *box) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < box->shape[0]; i++)
    for (int64_t j = 0; j < box->shape[1]; j++)
      wrong += buf[i * box->shape[1] + j] != value_at(box->offset[0] + i, box->offset[1] + j);
  return wrong;
}

static void print_plan(const mt_plan *plan) {
  static const char *kinds[] = {"all-gather", "all-to-all", "chunk (local)",
                                "all-reduce", "reduce-scatter", "direct exchange"};
  printf("plan: %d step(s), %" PRId64 " bytes received in all\n", mt_plan_nsteps(plan),
         mt_plan_bytes(plan));
  for (int s = 0; s < mt_plan_nsteps(plan); s++) {
    const mt_step *step = mt_plan_step(plan, s);
    printf("  step %d: %s on mesh dim %d, %" PRId64 " bytes\n", s, kinds[step->kind],
           step->mesh_dim, step->bytes);
  }
}

/* Plans, runs and checks the move; returns the number of wrong elements on this
 * rank, or -1 after printing an error. Collective on `mesh`. */
static int64_t run(mt_mesh *mesh, int rank) {
  const int64_t shape[2] = {ROWS, COLS}, mesh_shape[1] = {mt_mesh_dim_size(mesh, 0)};
  const mt_placement rows[1] = {{MT_PLACEMENT_SHARD, 0, 0, 0}};
  const mt_placement cols[1] = {{MT_PLACEMENT_SHARD, 1, 0, 0}};
  mt_layout src, dst;
  mt_box src_box, dst_box;
  mt_plan *plan = NULL;
  mt_error err = {0};
  int64_t coord[1], wrong = -1;
  double *in = NULL, *out = NULL;
  if (mt_layout_init(&src, 2, shape, 1, mesh_shape, rows, &err) ||
      mt_layout_init(&dst, 2, shape, 1, mesh_shape, cols, &err) ||
      !mt_mesh_coordinate(mesh, coord) ||
      mt_layout_local_box(&src, coord, &src_box, &err) ||
      mt_layout_local_box(&dst, coord, &dst_box, &err) ||
      mt_plan_create(&src, &dst, sizeof(double), &plan, &err))
    goto done;
  if (rank == 0)
    print_plan(plan);
  /* +1: a rank may hold an empty box, and malloc(0) may return NULL. */
  in = malloc((size_t)mt_box_numel(&src_box) * sizeof(double) + 1);
  out = malloc((size_t)mt_box_numel(&dst_box) * sizeof(double) + 1);
  if (in == NULL || out == NULL) {
    snprintf(err.msg, sizeof err.msg, "out of memory");
    goto done;
  }
  fill_box(in, &src_box);
  if (mt_redistribute(mesh, plan, MT_DTYPE_FLOAT64, in, out, &err))
    goto done;
  /* An empty plan (one rank) moves nothing: the source buffer is the result. */
  wrong = count_wrong(mt_plan_nsteps(plan) ? out : in, &dst_box);
  printf("rank %d: %" PRId64 " row(s) from %" PRId64 " -> %" PRId64
         " column(s) from %" PRId64 ", %" PRId64 " wrong element(s)\n", rank,
         src_box.shape[0], src_box.offset[0], dst_box.shape[1], dst_box.offset[1], wrong);
done:
  if (wrong < 0)
    fprintf(stderr, "rank %d: %s: %s\n", rank, mt_status_name(err.code), err.msg);
  free(in);
  free(out);
  mt_plan_destroy(plan);
  return wrong;
}

int main(int argc, char **argv) {
  int rank, size;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int *ranks = malloc((size_t)size * sizeof *ranks);
  for (int r = 0; r < size; r++)
    ranks[r] = r;
  const int64_t mesh_shape[1] = {size};
  mt_mesh *mesh = NULL;
  mt_error err = {0};
  int64_t wrong = -1;
  if (mt_mesh_create(MPI_COMM_WORLD, 1, mesh_shape, ranks, &mesh, &err) == 0)
    wrong = run(mesh, rank);
  else
    fprintf(stderr, "rank %d: %s: %s\n", rank, mt_status_name(err.code), err.msg);
  int ok = wrong == 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (rank == 0)
    printf("%s\n", all_ok ? "every rank holds its columns" : "FAILED");
  mt_mesh_destroy(mesh);
  free(ranks);
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
