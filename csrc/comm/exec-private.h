/* The plan executor's parts (exchange.c, compiled.c, redistribute*.c): the
 * all-to-all-w of one exchange, and the per-rank compiled form of a plan that owns
 * such exchanges and the counts of its other steps. */
#ifndef MPITENSOR_EXEC_PRIVATE_H
#define MPITENSOR_EXEC_PRIVATE_H

#include <mpi.h>
#include <stdint.h>

#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"

/* ---- one MPI_Alltoallw with a subarray datatype per peer (exchange.c) -------- */

/* What a rank sends and receives in one exchange over `g` peers: counts (1 or 0),
 * zero displacements and a subarray type per peer (MPI_BYTE where no message), its
 * own src and dst boxes, and the part of its src box it keeps. Built once; then
 * only read, so a compiled plan may share it among calls. */
typedef struct mt__exchange {
  int g;
  int *ints;           /* 4g: send counts, send displs, recv counts, recv displs */
  MPI_Datatype *types; /* 2g: send types, then receive types */
  mt_box sb, tb, keep; /* keep: the box this rank receives from itself */
  int64_t itemsize;
  int64_t sent; /* bytes sent to other ranks */
  /* For direct copies (NULL where the exchange has none): 4g boxes, g each of
   * the part received from each peer, that peer's src box, the part sent to it
   * and its dst box (mt__direct_parts). */
  mt_box *direct;
} mt__exchange;

/* What building one exchange takes besides this rank's own boxes: room for the
 * box this rank sends to and receives from every rank of the mesh (the global
 * boxes of mt_exchange_boxes, which the caller fills), and the mesh position of
 * each of its peers with its own index among them. */
typedef struct mt__exchange_scratch {
  int64_t n;    /* ranks of the mesh */
  mt_box *send; /* n boxes, and recv the n after them in one block */
  mt_box *recv;
  int64_t *lin; /* the peers' mesh positions, in peer order */
  int me;       /* this rank's index among the peers */
} mt__exchange_scratch;

/* Local. The scratch of an exchange of the rank at `coord` with its peers along
 * mesh dim `m` (m < 0: the whole mesh, in mesh order). MT_ENOMEM leaves nothing to
 * free. */
int mt__exchange_scratch_init(const mt_mesh *mesh, const int64_t *coord, int m,
                              mt__exchange_scratch *sc, mt_error *err);

/* Frees what mt__exchange_scratch_init allocated. */
void mt__exchange_scratch_free(mt__exchange_scratch *sc);

/* Local. Builds the exchange in which this rank (index `me` among g peers of mesh
 * positions `lin`, with boxes `sb` and `tb`) sends send[lin[q]] to peer q and
 * receives recv[lin[q]] from it (the global boxes of mt_exchange_boxes).
 * `peers` (2g boxes, or NULL: no direct copies) are the peers' src boxes, then
 * their dst boxes, kept with the parts for direct copies (mt__exchange_direct). */
int mt__exchange_build(const mt_box *sb, const mt_box *tb, const mt_box *send,
                       const mt_box *recv, const int64_t *lin, int g, int me,
                       int64_t itemsize, const mt_box *peers, mt__exchange *x,
                       mt_error *err);

/* Copies the kept part from `in` to `out`, then posts the MPI_Alltoallw on `comm`
 * (nonblocking into *req when req is not NULL). Collective on comm. */
int mt__exchange_post(const mt__exchange *x, const void *in, void *out, MPI_Comm comm,
                      MPI_Request *req, mt_error *err);

/* Blocking, collective on comm. Moves the exchange by direct copies where its
 * mesh allows them (mt_mesh_direct_read) and `step_bytes` (the global tensor's)
 * is large: the kept part copied, then every other part straight between the
 * members' `in` and `out` (mt__direct_step). Returns 1 when done, 0 when the
 * exchange must be posted through MPI instead, -1 with *err when a collective
 * fails. The same answer on every member. */
int mt__exchange_direct(const mt_mesh *mesh, const mt__exchange *x, int64_t step_bytes,
                        const void *in, void *out, MPI_Comm comm, mt_error *err);

/* Frees what the exchange holds (never after MPI_Finalize); accepts a zeroed one. */
void mt__exchange_free(mt__exchange *x);

/* ---- large steps by pairwise exchanges in chunks (pairwise.c) ---------------- */

/* Local. Whether the pairwise exchanges below can move these blocks (every chunk
 * a message of at most INT_MAX bytes); the same answer on every member. */
int mt__pairwise_fits(const mt_box *blocks, int64_t g, int64_t isz);

/* Blocking, collective on comm (g members, this one `me`). Reduces with mt_reduce's
 * `op` every member's copy of blocks[me] (the global box this member keeps, inside
 * `sb`, the box of every member's C-contiguous `in`) into `out`, the C-contiguous
 * array of blocks[me]. Staging: two chunks of about 256 KiB, four when blocks are
 * not contiguous in the input (packed chunk by chunk). */
int mt__reduce_scatter_pairwise(const void *in, void *out, const mt_box *sb,
                                const mt_box *blocks, int64_t g, int64_t me, int dtype,
                                int op, int64_t isz, MPI_Comm comm, mt_error *err);

/* Blocking, collective on comm. Gathers every member's block (blocks[k], the
 * global box member k holds, contiguous in its `in`) into `out`, the
 * C-contiguous array of box `t`, each block in its place. Staging: two chunks of
 * about 256 KiB (one row of a block when that is larger), and one request per
 * chunk this member sends, all posted before the first receive. */
int mt__allgather_pairwise(const void *in, void *out, const mt_box *t,
                           const mt_box *blocks, int64_t g, int64_t me, int64_t isz,
                           MPI_Comm comm, mt_error *err);

/* ---- a plan compiled for one rank (compiled.c) ------------------------------- */

/* One step's counts, displacements and datatypes for this rank. */
typedef struct mt__step_exec {
  int64_t group;     /* the step's group size (its mesh dim's, or the mesh's) */
  int *ints;         /* all-gather: 2g counts and displacements in units;
                        reduce-scatter: g counts in elements (0 in rounds) */
  MPI_Datatype unit; /* all-gather's unit (MPI_BYTE, or a contiguous type) */
  int64_t unit_bytes;
  int64_t *counts; /* reduce-scatter: g counts in elements */
  int64_t round;   /* reduce-scatter: elements of each block per round, 0 for one call */
  int even;        /* all-gather: every member's count the same (MPI_Allgather) */
  mt__exchange x;  /* all-to-all and direct steps */
} mt__step_exec;

/* Every step of a plan for the rank at `coord` with elements of `itemsize`. */
typedef struct mt__compiled {
  int mesh_ndim;
  int64_t coord[MT_MAX_MESH_NDIM];
  int64_t itemsize;
  int nsteps;
  mt__step_exec *steps;
} mt__compiled;

/* Local. The plan's compiled part for this rank and itemsize: the one the plan
 * holds (compiled and attached on its first execution), or, when the plan holds
 * one for another coordinate or itemsize (the same plan run on another mesh), a
 * private one returned in *owned as well, for the caller to free with
 * mt__compiled_free after its last use. */
int mt__compiled_get(const mt_mesh *mesh, const mt_plan *plan, const int64_t *coord,
                     int64_t itemsize, const mt__compiled **out, mt__compiled **owned,
                     mt_error *err);

/* Frees a compiled plan (the destructor a plan is given); accepts NULL. */
void mt__compiled_free(void *compiled);

#endif
