/* The time model that ranks redistribution plans: how long one step takes.
 *
 * Each message costs `alpha` seconds and each byte `beta` seconds on its link
 * class: shared memory between ranks of one node, the network between nodes.
 * Each byte a rank passes over locally costs `copy` seconds (placing, cutting,
 * packing) or `reduce` seconds (combining partial values). A
 * collective costs what the algorithm that Open MPI's tuned component picks for
 * its size and group costs (ring, recursive doubling, Bruck, pairwise, linear),
 * so a step over G ranks is not simply G - 1 messages: an all-gather of a small
 * tensor takes ceil(log2 G) rounds. Pure data, no MPI; the comm library fills
 * the node layout of a mesh and a calibrated table may replace the defaults.
 * All calls are Local. */
#ifndef MPITENSOR_TIMEMODEL_H
#define MPITENSOR_TIMEMODEL_H

#include <stdint.h>

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MT_LINK_SHM = 0, MT_LINK_NET = 1, MT_NLINKS = 2 };

/* The collective algorithms the model knows, as Open MPI 4.1's tuned component
 * names them. */
typedef enum mt_coll_alg {
  MT_ALG_NONE = 0,          /* no communication */
  MT_ALG_TWO_PROC = 1,      /* one exchange between two ranks */
  MT_ALG_RECURSIVE = 2,     /* recursive doubling/halving or Bruck: log2 G rounds */
  MT_ALG_RING = 3,          /* ring or neighbour exchange: G - 1 rounds */
  MT_ALG_LINEAR = 4,        /* every peer at once (Alltoallw, direct exchanges) */
  MT_ALG_RABENSEIFNER = 5   /* all-reduce as reduce-scatter then all-gather, by ring */
} mt_coll_alg;

/* `alpha[link]` seconds per message and `beta[link]` seconds per byte. `call`:
 * seconds of every communicating step besides its messages (the MPI call and
 * the executor around it), which makes one exchange of a few messages cheaper
 * than a chain of collectives of one message each. `copy` and `reduce`: seconds
 * per byte a rank copies or reduces in local memory while every rank of its node
 * does the same (they share the memory bandwidth); on shared memory these passes
 * weigh as much as the messages. `ranks_per_node`: the mesh's ranks, in
 * row-major mesh order, fill nodes of this many ranks each; 0 means the whole
 * mesh is on one node. */
typedef struct mt_time_model {
  double alpha[MT_NLINKS];
  double beta[MT_NLINKS];
  double call;
  double copy;
  double reduce;
  int64_t ranks_per_node;
} mt_time_model;

/* Local. The built-in model: shared memory at 1 us and 5 GB/s, a network at
 * 20 us and 1.25 GB/s (10 Gb/s), 2 us per step, local copies at 10 GB/s and
 * reductions at 8 GB/s, one node. */
MT_EXPORT mt_time_model mt_time_model_default(void);

/* Local. MT_EINVAL unless call, copy, reduce and every alpha and beta are finite
 * and >= 0, the network's are not below shared memory's, and ranks_per_node >= 0;
 * the message says which.
 *
 *   if (mt_time_model_check(&m, &err) != MT_OK) return err.code;
 */
MT_EXPORT int mt_time_model_check(const mt_time_model *model, mt_error *err);

/* Local. The link class of a group of `group` ranks whose row-major mesh
 * positions are `stride` apart: shared memory when every such group of the mesh
 * (of `numel` ranks) lies within one node, else the network. */
int mt_time_link(const mt_time_model *model, int64_t numel, int64_t group,
                 int64_t stride);

/* Local. How many members of each group of `group` ranks whose row-major mesh
 * positions are `stride` apart share one node: `group` when each group lies within
 * one node (mt_time_link says shared memory); ranks_per_node / stride when the
 * nodes hold whole runs of that many consecutive members of every group; else 1,
 * priced as if every member had a node of its own.
 *
 *   // (8, 128) mesh, 64 ranks per node: mesh dim 1's groups of 128 span two nodes
 *   int64_t local = mt_time_members_per_node(&m, 1024, 128, 1);   // 64
 */
int64_t mt_time_members_per_node(const mt_time_model *model, int64_t numel,
                                 int64_t group, int64_t stride);

/* Kinds of collectives the model prices (the plan's step kinds map onto them). */
typedef enum mt_time_kind {
  MT_TIME_ALLGATHER = 0,      /* `bytes`: what each rank holds after */
  MT_TIME_ALLTOALL = 1,       /* `bytes`: what each rank holds, before and after */
  MT_TIME_ALLREDUCE = 2,      /* `bytes`: the vector each rank reduces */
  MT_TIME_REDUCE_SCATTER = 3  /* `bytes`: the vector before scattering */
} mt_time_kind;

/* Local. Which algorithm Open MPI's tuned component (4.1, fixed decisions) runs
 * for `kind` over `group` ranks on `bytes` (as mt_time_kind says). */
mt_coll_alg mt_time_coll_alg(int kind, int64_t group, int64_t bytes);

/* Local. Seconds that collective `kind` over `group` ranks on `bytes` takes on
 * `link`, by the algorithm mt_time_coll_alg picks, plus the model's `call`.
 * `received` is the most bytes one rank receives of the others' data (uneven
 * shards: more than bytes * (G - 1) / G); an all-reduce ignores it.
 *
 *   double t = mt_time_coll(&m, MT_TIME_ALLGATHER, 64, 1 << 20, 63 << 14, MT_LINK_NET);
 */
double mt_time_coll(const mt_time_model *model, int kind, int64_t group, int64_t bytes,
                    int64_t received, int link);

/* Local. The share of what each member of collective `kind` over `group` ranks
 * on `bytes` (as mt_time_kind says) receives that crosses between nodes, when
 * `local` members of each group share a node (mt_time_members_per_node), by the
 * algorithm mt_time_coll_alg picks: a ring crosses once per run of `local`
 * members, recursive doubling and halving in the rounds whose partners are
 * `local` or more apart, a linear exchange to the members of other nodes. 0 when
 * the group lies within one node. */
double mt_time_net_share(int kind, int64_t group, int64_t local, int64_t bytes);

/* Local. mt_time_coll for groups of which `local` members share each node, all
 * ranks of a node in such groups at once (a mesh dim's groups run together). The
 * rounds between members of one node cost shared memory's alpha, the others the
 * network's; what crosses between nodes passes the node's one network link, so
 * its bytes are those of all the node's ranks together (ranks_per_node times the
 * share each receives across, mt_time_net_share), at the network's beta. With
 * `local` >= `group` or one node it is mt_time_coll on shared memory; with one
 * rank per node, mt_time_coll on the network.
 *
 *   double t = mt_time_coll_nodes(&m, MT_TIME_ALLREDUCE, 16, 4, 1 << 20, 0);
 */
double mt_time_coll_nodes(const mt_time_model *model, int kind, int64_t group,
                          int64_t local, int64_t bytes, int64_t received);

/* Local. Seconds a rank spends copying `copied` bytes and reducing `reduced`
 * bytes in its own memory.
 *
 *   double t = mt_time_local(&m, step->copy_bytes, step->reduce_bytes);
 */
double mt_time_local(const mt_time_model *model, int64_t copied, int64_t reduced);

/* Local. Seconds of a linear exchange in which the busiest rank sends or receives
 * `messages` messages and `bytes` bytes on `link` (MPI_Alltoallw), plus `call`. */
double mt_time_linear(const mt_time_model *model, int64_t messages, int64_t bytes,
                      int link);

#ifdef __cplusplus
}
#endif
#endif
