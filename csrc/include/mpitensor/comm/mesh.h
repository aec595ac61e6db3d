/* Device meshes over MPI: a duplicate of the user's communicator and one
 * sub-communicator per mesh dim, created once per mesh. */
#ifndef MPITENSOR_MESH_H
#define MPITENSOR_MESH_H

#include <mpi.h>
#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/timemodel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_mesh mt_mesh;

/* Collective on `comm`. Builds a mesh of shape `shape` (ndim dims) whose element at
 * row-major position i is rank ranks[i] of `comm`. Every rank of `comm` calls it,
 * members or not; a non-member gets a mesh with no coordinate and null
 * communicators. Ranks must be distinct and in [0, size of comm). Every rank
 * checks that every rank passed the same arguments (see mt_mesh_create_agreed). */
int mt_mesh_create(MPI_Comm comm, int ndim, const int64_t *shape, const int *ranks,
                   mt_mesh **out, mt_error *err);

/* Collective on `comm`. Before any communicator is made, the ranks of `comm` agree
 * (mt_agree_fingerprint_comm) that each checked its arguments and passed the same
 * shape and ranks: otherwise every rank returns the same status and message, the
 * first failing rank's, or MT_EINVAL "the ranks ... passed different meshes".
 * mt_mesh_create is this with MT_OK and 0; a caller with more to agree on passes
 * its own verdict so far (`status`, with its message in err->msg) and a
 * `fingerprint` of the rest (a binding: the dims' names).
 *
 *   rc = mt_mesh_create_agreed(comm, 2, shape, ranks, MT_OK, hash_of(names), &m, &err);
 */
MT_EXPORT int mt_mesh_create_agreed(MPI_Comm comm, int ndim, const int64_t *shape,
                                    const int *ranks, int status, uint64_t fingerprint,
                                    mt_mesh **out, mt_error *err);

/* Local. The sub-mesh over mesh dims `dims` (n of them, ascending) that holds this
 * rank. It reuses the parent's communicators and keeps the parent alive. */
MT_EXPORT int mt_mesh_slice(mt_mesh *parent, int n, const int *dims, mt_mesh **out,
                            mt_error *err);

/* Local. Releases the caller's reference; the last one frees the communicators
 * (with no MPI call once MPI has been finalized). Accepts NULL. */
MT_EXPORT void mt_mesh_destroy(mt_mesh *mesh);

/* Local. Whether the mesh can communicate from here: MT_ESTATE, with a message
 * saying why, on a thread other than the one that created it (or its slice), once
 * MPI has been finalized or once one of the mesh's communicators was
 * freed by someone else (an MPI_Comm_free of a communicator mt_mesh_dim_comm gave,
 * such as `mesh.get_group().Free()` in Python), instead of the crash a collective
 * on a freed communicator is. A few loads: callers check before each collective.
 *
 *   if ((rc = mt_mesh_check(mesh, &err)) != MT_OK) return rc;
 */
MT_EXPORT int mt_mesh_check(const mt_mesh *mesh, mt_error *err);

/* Local. Number of mesh dims. */
MT_EXPORT int mt_mesh_ndim(const mt_mesh *mesh);

/* Local. Size of mesh dim `dim`. */
MT_EXPORT int64_t mt_mesh_dim_size(const mt_mesh *mesh, int dim);

/* Local. Writes this rank's coordinate (ndim entries) and returns 1, or returns 0
 * when this rank is not in the mesh. */
MT_EXPORT int mt_mesh_coordinate(const mt_mesh *mesh, int64_t *coord);

/* Local. This rank's box of `layout` (mt_layout_local_box at its coordinate);
 * MT_ESTATE on a rank outside the mesh. */
int mt_mesh_local_box(const mt_mesh *mesh, const mt_layout *layout, mt_box *box,
                      mt_error *err);

/* Local. The communicator of mesh dim `dim` (ranks ordered by their coordinate on
 * that dim), or MPI_COMM_NULL on a non-member. Owned by the mesh. */
MT_EXPORT MPI_Comm mt_mesh_dim_comm(const mt_mesh *mesh, int dim);

/* Collective on the ranks of mesh dim `dim` the first time, Local afterwards. The
 * communicators of a split of the dim's groups into runs of `run` consecutive
 * members (`inside`, ordered by coordinate) and the members `run` apart
 * (`across`): how a reduction runs within nodes first (a run of members on each
 * node) and then across them. Owned by the mesh (a slice's by the mesh it was
 * cut from), which keeps one split per dim: a call with another run makes the new
 * split and frees the old one. MT_EINVAL unless `run` divides the dim's size.
 *
 *   MPI_Comm inside, across;
 *   rc = mt_mesh_node_comms(mesh, 0, 2, &inside, &across, &err);
 */
int mt_mesh_node_comms(const mt_mesh *mesh, int dim, int64_t run, MPI_Comm *inside,
                       MPI_Comm *across, mt_error *err);

/* The communicator of all members of the mesh, ranked by row-major mesh position,
 * owned by the mesh. A created mesh has it; a slice creates it on first use, which
 * is then Collective on the slice's members (Local afterwards). MT_ESTATE on a
 * rank outside the mesh.
 *
 *   MPI_Comm comm;
 *   if (mt_mesh_comm(mesh, &comm, &err) == MT_OK) MPI_Barrier(comm);
 */
int mt_mesh_comm(mt_mesh *mesh, MPI_Comm *out, mt_error *err);

/* Collective on the ranks of mesh dim `dim`. Broadcasts `nbytes` bytes of `buf`
 * from coordinate 0 on that dim; counts above INT_MAX use a derived type. */
MT_EXPORT int mt_mesh_bcast(const mt_mesh *mesh, int dim, void *buf, int64_t nbytes,
                            mt_error *err);

/* mt_mesh_bcast from coordinate `root` of that dim (MT_EINDEX out of range). */
int mt_mesh_bcast_from(const mt_mesh *mesh, int dim, int64_t root, void *buf,
                       int64_t nbytes, mt_error *err);

/* Collective on the ranks of mesh dim `dim`. Gathers every member's `value` into
 * `out` (one per coordinate of that dim, mt_mesh_dim_size entries), counted as an
 * all-gather: how uneven shards learn each other's sizes. */
MT_EXPORT int mt_mesh_allgather_i64(const mt_mesh *mesh, int dim, int64_t value,
                                    int64_t *out, mt_error *err);

/* Collective on the mesh. Bitwise OR of `flag` over every member (nonzero when any
 * member's is: several yes-or-no questions in one call), combined along one mesh
 * dim after another so no whole-mesh communicator is needed. */
MT_EXPORT int mt_mesh_any(const mt_mesh *mesh, int flag, int *result, mt_error *err);

/* Collective on mesh dim `dim`. Exclusive prefix of `count` elements of `dtype`
 * (mt_dtype) in place, combined by `op` (a reduce op of layout.h) over the ranks
 * before this one along that dim, by coordinate (MPI_Exscan); coordinate 0 has no
 * ranks before it and keeps its buffer as it was. Counted as one "exscan" of
 * the buffer's bytes. */
MT_EXPORT int mt_mesh_exscan(const mt_mesh *mesh, int dim, void *buf, int64_t count,
                             int dtype, int op, mt_error *err);

/* Collective on mesh dim `dim`. Sends send[q] to coordinate q of that dim and
 * receives recv[q] from it (MPI_Alltoall of one int64 each): how the parts of a
 * variable all-to-all learn their sizes. Counted as one all-to-all. */
MT_EXPORT int mt_mesh_alltoall_i64(const mt_mesh *mesh, int dim, const int64_t *send,
                                   int64_t *recv, mt_error *err);

/* Collective on mesh dim `dim`. Sends send_counts[q] items of `itemsize` bytes to
 * coordinate q of that dim, the parts laid one after another in `send`, and
 * receives recv_counts[q] items from it into `recv` likewise (MPI_Alltoallv); the
 * counts must match the peers' (mt_mesh_alltoall_i64 finds them). MT_EOVERFLOW
 * on every rank of the dim when a count or offset of any of them exceeds MPI's int
 * (the ranks agree first, mt_agree_comm: the first failing rank's message). Counted as one
 * all-to-all of the bytes sent to other ranks:
 *
 *   int64_t out[P], in[P];   (P: the dim's size; out filled by bucketing)
 *   mt_mesh_alltoall_i64(mesh, 0, out, in, &err);
 *   mt_mesh_alltoallv(mesh, 0, buckets, out, merged, in, sizeof(double), &err);
 */
MT_EXPORT int mt_mesh_alltoallv(const mt_mesh *mesh, int dim, const void *send,
                                const int64_t *send_counts, void *recv,
                                const int64_t *recv_counts, int64_t itemsize,
                                mt_error *err);

/* Local. Whether large steps between the mesh's members copy each part straight
 * from one process's array into another's (Linux's process_vm_readv), one pass
 * where MPI packs, copies and unpacks a strided part: the members are all on one
 * node, on CPUs where this was measured faster (AMD's) or with
 * MPITENSOR_DIRECT_READ=1, none set MPITENSOR_DIRECT_READ=0, and each could read
 * every other one when the mesh was made. A slice answers for the mesh it was cut from. Fixed for the
 * mesh's life, and the same on every member: a step whose copy fails somewhere
 * goes through MPI, agreed within its group, and the next one tries again (a
 * flag turned off by one group would differ from another group's). */
MT_EXPORT int mt_mesh_direct_read(const mt_mesh *mesh);

/* Local. 1 when this member's agreements on the mesh (mt_agree, mt_mesh_any) meet
 * in memory the members share, not in an MPI all-reduce: a created mesh whose
 * members are on one node, no more than the cores they may run on together
 * (their affinity masks), and could map a segment of POSIX shared memory; 0 for a
 * slice (its own communicator), a mesh over nodes or over more ranks than cores,
 * or a rank outside it. */
MT_EXPORT int mt_mesh_shared_agreement(const mt_mesh *mesh);

/* How the members of a mesh lie on nodes (the ranks MPI_Comm_split_type SHARED
 * puts together), in row-major mesh order: all on one node; in `count` nodes of
 * consecutive positions, all of the same size (BLOCKS, one rank each included)
 * or not (UNEQUAL: `smallest` and `largest` say how they differ); or nodes whose
 * positions are not consecutive (INTERLEAVED). Learnt once when the mesh is made
 * (every member sees the same). */
typedef enum mt_nodes_kind {
  MT_NODES_ONE = 0,
  MT_NODES_BLOCKS = 1,
  MT_NODES_UNEQUAL = 2,
  MT_NODES_INTERLEAVED = 3
} mt_nodes_kind;

typedef struct mt_mesh_nodes {
  int kind;
  int64_t count;
  int64_t smallest;
  int64_t largest;
} mt_mesh_nodes;

/* Local. How the mesh's members lie on nodes; a slice answers for the mesh it was
 * cut from. Plans price UNEQUAL and INTERLEAVED nodes as one rank per node.
 *
 *   mt_mesh_nodes n;
 *   mt_mesh_nodes_of(mesh, &n);
 *   if (n.kind == MT_NODES_UNEQUAL) printf("nodes of %lld to %lld ranks\n", ...);
 */
MT_EXPORT void mt_mesh_nodes_of(const mt_mesh *mesh, mt_mesh_nodes *out);

/* Local. The time model that ranks plans on this mesh: the built-in costs until
 * mt_mesh_set_time_model, with ranks_per_node learnt when the mesh was created
 * (MPI_Comm_split_type SHARED; a slice derives its own). Owned by the mesh. */
MT_EXPORT const mt_time_model *mt_mesh_time_model(const mt_mesh *mesh);

/* Local. Takes the alphas and betas of `model` (a calibrated table) and keeps the
 * mesh's ranks_per_node; MT_EINVAL, changing nothing, unless the result passes
 * mt_time_model_check. A slice made later inherits them.
 *
 *   mt_time_model t = *mt_mesh_time_model(mesh);
 *   t.alpha[MT_LINK_SHM] = 0.4e-6;
 *   rc = mt_mesh_set_time_model(mesh, &t, &err);
 */
MT_EXPORT int mt_mesh_set_time_model(mt_mesh *mesh, const mt_time_model *model,
                                     mt_error *err);

/* Local. Communicators created by mpitensor and not yet freed, process-wide. */
MT_EXPORT int64_t mt_comm_live_count(void);

/* Local. The version string of the MPI library this code is linked to. */
MT_EXPORT int mt_mpi_library_version(char *buf, int buflen, mt_error *err);

/* Turns the failure `mpi_rc` of the MPI call named `what` into MT_EMPI with MPI's
 * own explanation in `err` (which may be NULL), and returns MT_EMPI. It also tells
 * every other process that this one failed (mt_watchdog_tell, when listening), so
 * that ranks left waiting for this one abort the job within seconds:
 *
 *   int rc = MPI_Barrier(comm);
 *   if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Barrier");
 */
int mt_mpi_error(mt_error *err, int mpi_rc, const char *what);

#ifdef __cplusplus
}
#endif
#endif
