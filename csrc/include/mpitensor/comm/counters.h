/* Communication counters: the collectives a mesh ran and the payload bytes this
 * process delivered to other ranks, per kind, as torch's CommDebugMode counts them.
 *
 * The caller owns the counters and attaches them to the meshes it wants counted
 * (mt_mesh_set_counters); a mesh without counters counts nothing. So no count is
 * process-wide state of the library: the Python extension keeps one mt_comm_counters
 * in its module state and gives it to every mesh it makes. */
#ifndef MPITENSOR_COUNTERS_H
#define MPITENSOR_COUNTERS_H

#include <stdatomic.h>
#include <stdint.h>

#include "mpitensor/comm/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective kinds, named as torch's functional collectives so CommDebugMode keys
 * read the same. A DIRECT exchange counts as an all-to-all. */
#define MT_COLL_MAP(X)                       \
  X(ALL_GATHER, "all_gather_into_tensor")    \
  X(ALL_REDUCE, "all_reduce")                \
  X(REDUCE_SCATTER, "reduce_scatter_tensor") \
  X(ALL_TO_ALL, "all_to_all_single")         \
  X(BROADCAST, "broadcast")                  \
  X(SCATTER, "scatter")                      \
  X(SCAN, "exscan")

typedef enum mt_coll {
#define MT__COLL_ENUM(name, text) MT_COLL_##name,
  MT_COLL_MAP(MT__COLL_ENUM)
#undef MT__COLL_ENUM
      MT_COLL_COUNT
} mt_coll;

/* Calls made and payload bytes delivered to other ranks, per kind. Zero-initialise
 * it (static storage, calloc or `= {0}`); the cells only grow, so callers diff two
 * readings. They are atomic, so meshes used from several threads may share one
 * struct; read them with atomic_load:
 *
 *   static mt_comm_counters counters;
 *   mt_mesh_set_counters(mesh, &counters);
 *   ... collectives on mesh ...
 *   int64_t sent = atomic_load(&counters.bytes[MT_COLL_ALL_GATHER]);
 */
typedef struct mt_comm_counters {
  _Atomic int64_t calls[MT_COLL_COUNT];
  _Atomic int64_t bytes[MT_COLL_COUNT];
} mt_comm_counters;

/* A reading of counters: plain numbers, for comparing two readings. */
typedef struct mt_comm_totals {
  int64_t calls[MT_COLL_COUNT];
  int64_t bytes[MT_COLL_COUNT];
} mt_comm_totals;

/* Local. Reads every cell of `counters` (NULL reads as zeros) into `out`. */
MT_EXPORT void mt_comm_counters_read(const mt_comm_counters *counters,
                                     mt_comm_totals *out);

/* Local. Counts one call of kind `coll` that delivered `bytes` of payload from this
 * process to other ranks. Accepts NULL counters (nothing is counted). */
void mt_comm_count(mt_comm_counters *counters, int coll, int64_t bytes);

/* Local. torch's name of a collective kind ("all_reduce"), or "unknown". */
MT_EXPORT const char *mt_coll_name(int coll);

/* Local. The counters that the collectives of `mesh` count into from now on (NULL:
 * none). Slices made from the mesh afterwards count into the same ones. The
 * counters must outlive the mesh, or be detached first. */
MT_EXPORT void mt_mesh_set_counters(mt_mesh *mesh, mt_comm_counters *counters);

/* Local. The counters of `mesh`, or NULL. */
mt_comm_counters *mt_mesh_counters(const mt_mesh *mesh);

#ifdef __cplusplus
}
#endif
#endif
