/* Executing redistribution plans with MPI.
 *
 * Buffers are C-contiguous local arrays: `src` holds this rank's box of the plan's
 * source layout, `dst` receives its box of the target layout. Every call that moves
 * data is Collective on the mesh (every member calls it with the same plan) and
 * counts what it sent into the mesh's counters (counters.h). */
#ifndef MPITENSOR_REDISTRIBUTE_H
#define MPITENSOR_REDISTRIBUTE_H

#include <stdint.h>

#include "mpitensor/comm/counters.h"
#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective on the mesh. Moves a selection (basic indexing) of a tensor laid out
 * by `src` into layout `dst` of the selection's output, as
 * mt_selection_exchange_boxes describes, with one MPI_Alltoallw: `in` holds, C
 * contiguous, the image of this rank's src box (its local array indexed by the
 * selection), `out` receives this rank's dst box. Only selected elements move.
 * Agrees first as mt_redistribute does, on the selection too, and whatever the
 * size: a selection that differs by rank (a key computed from the rank) raises on
 * every rank instead of leaving elements of `out` that nobody sent. `key` is the
 * caller's fingerprint of what else the key decides (where it drops or adds dims),
 * agreed with the selection: a rank whose key the exchange alone would not tell
 * apart, or that takes no exchange at all and agrees on its key by mt_agree
 * instead, fails every rank alike. `out` may be NULL for a box the caller could
 * not allocate. */
MT_EXPORT int mt_selection_exchange(mt_mesh *mesh, const mt_layout *src,
                                    const mt_selection *sel, uint64_t key,
                                    const mt_layout *dst, int dtype, const void *in,
                                    void *out, mt_error *err);

/* An in-flight redistribute started by mt_redistribute_start. */
typedef struct mt_request mt_request;

/* Collective on the mesh. Runs every step of `plan` (built for this mesh's shape)
 * on elements of `dtype`, from `src` to `dst`. Intermediate steps use buffers the
 * call allocates and frees. A plan without steps moves nothing and leaves `dst`
 * untouched: `src` already holds the result, and callers use it as it is. When
 * the global tensor holds at least MT_AGREE_MIN_BYTES (agree.h) and a step
 * communicates (not only local cuts, which gain no collective), the members first
 * agree (mt_agree, one small all-reduce) that each passed its checks with the same
 * layouts and dtype and has its `dst`: `dst` may be NULL for a non-empty box when
 * the caller could not allocate it, and then every member returns MT_ENOMEM with
 * one message (below that size, only this rank does). At that size the buffers
 * of intermediate steps are allocated before the agreement too, and a rank that
 * cannot allocate them makes every member return MT_ENOMEM. A float16
 * Partial(avg) is reduced in float32 and rounded once, as NumPy's mean adds
 * float16: its sum could overflow float16 where the average does not (the
 * counters count the plan's float16 bytes). */
MT_EXPORT int mt_redistribute(mt_mesh *mesh, const mt_plan *plan, int dtype,
                              const void *src, void *dst, mt_error *err);

/* Collective on the mesh. Issues every communicating step of the plan before it
 * returns: the earlier ones run to completion, the last one is posted with a
 * nonblocking MPI call, so the order in which requests are waited on never changes
 * a result. `dst` must stay valid until mt_request_wait, which runs any local
 * steps after the last collective. `src` is read before this returns: a collective
 * posted on it reads a copy or runs in place in the request's buffers, so the
 * result is the one of its values at the call, whatever the caller does with it
 * afterwards. Agrees first as mt_redistribute does. */
int mt_redistribute_start(mt_mesh *mesh, const mt_plan *plan, int dtype,
                          const void *src, void *dst, mt_request **out, mt_error *err);

/* Collective on the mesh. Completes the redistribute and frees the request (also
 * on error). */
int mt_request_wait(mt_request *req, mt_error *err);

/* Local. Lets MPI progress the request's posted collective (MPI_Test), which an
 * MPI library without a progress thread moves only inside MPI calls: calling it
 * between pieces of compute lets the collective overlap them. Sets *done to 1 once
 * the collective has completed (mt_request_wait then runs only the local steps),
 * else 0; *done is untouched on error. */
int mt_request_test(mt_request *req, int *done, mt_error *err);

/* Local. How a reduce-scatter of `group` blocks of counts[k] elements of `itemsize`
 * bytes is issued when MPI takes counts up to `limit` (INT_MAX): 0 when one call
 * takes them all (their total, not only each block, within the limit, since the
 * library sums them into one count), else how many elements of every block one
 * round of calls carries (at most 256 MiB of each, and group times it within the
 * limit). Example: counts {2**30 + 8, 2**30 + 8} of int8 -> 2**28 per round. */
int64_t mt_reduce_scatter_round(const int64_t *counts, int64_t group, int64_t itemsize,
                                int64_t limit);

#ifdef __cplusplus
}
#endif
#endif
