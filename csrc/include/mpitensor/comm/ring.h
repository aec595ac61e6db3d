/* Exchanges among the ranks of one mesh dim, for ring attention (context
 * parallelism): a nonblocking shift of a block to the next rank of the ring, a
 * nonblocking all-gather of blocks of different sizes, and a small blocking
 * all-gather of int64 metadata (sizes, shapes) that callers check before moving
 * data, so bad input fails the same way on every rank.
 *
 * Blocks are raw bytes: the caller owns every buffer and keeps it valid and
 * untouched (the receive side unread) until mt_exchange_wait returns. */
#ifndef MPITENSOR_RING_H
#define MPITENSOR_RING_H

#include <stdint.h>

#include "mpitensor/comm/mesh.h"
#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An exchange in flight, started by mt_ring_shift_start or mt_ring_allgatherv_start. */
typedef struct mt_exchange mt_exchange;

/* The most blocks one shift moves (keys and values, say, without packing them). */
#define MT_RING_MAX_BLOCKS 4

/* Collective on the ranks of mesh dim `dim`. Starts sending `nblocks` blocks, block
 * i being `send_bytes[i]` bytes at `send[i]`, to the rank at the next coordinate on
 * that dim (the last sends to the first), and receiving block i, `recv_bytes[i]`
 * bytes, into `recv[i]` from the previous one, with nonblocking point-to-point
 * calls, and returns at once. On a dim of size 1 the blocks are copied (the sizes
 * must then agree). Counted as one all_to_all_single of all the bytes sent, as
 * torch counts its permute_tensor of cat([k, v]). */
MT_EXPORT int mt_ring_shift_start(const mt_mesh *mesh, int dim, int nblocks,
                                  const void *const *send, const int64_t *send_bytes,
                                  void *const *recv, const int64_t *recv_bytes,
                                  mt_exchange **out, mt_error *err);

/* Collective on the ranks of mesh dim `dim`. Starts a nonblocking all-gather:
 * the rank at coordinate k contributes `bytes[k]` bytes (`n` entries, the dim's
 * size, the same on every rank), and `recv` receives them all, in coordinate
 * order, back to back. MT_EINVAL, before any communication, unless `send` holds
 * `send_bytes` == bytes[own coordinate] and `recv` the sum, `recv_bytes`: MPI
 * would write past it. Counted as an all_gather_into_tensor. */
MT_EXPORT int mt_ring_allgatherv_start(const mt_mesh *mesh, int dim, const void *send,
                                       int64_t send_bytes, void *recv,
                                       int64_t recv_bytes, const int64_t *bytes, int n,
                                       mt_exchange **out, mt_error *err);

/* Local. Lets MPI progress the exchange; sets *done to 1 once it has completed
 * (mt_exchange_wait must still be called to free it). */
int mt_exchange_test(mt_exchange *ex, int *done, mt_error *err);

/* Local once started. Completes the exchange and frees it (also on error). Accepts
 * NULL. */
MT_EXPORT int mt_exchange_wait(mt_exchange *ex, mt_error *err);

/* Collective on the ranks of mesh dim `dim`. Every rank contributes `n` int64
 * values (the same n everywhere); `out` receives n * (dim size) values in
 * coordinate order. Metadata, not payload: not counted. */
MT_EXPORT int mt_ring_allgather_int64(const mt_mesh *mesh, int dim,
                                      const int64_t *values, int n, int64_t *out,
                                      mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
