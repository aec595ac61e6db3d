/* Copies between the processes of one node, straight from one process's array
 * into another's (Linux's process_vm_readv and process_vm_writev): one pass where
 * a message through MPI packs, copies and unpacks a strided part. The plan
 * executor's direct steps (comm) and the checkpoint writers (io) use them. Every
 * call is Local. */
#ifndef MPITENSOR_DIRECT_H
#define MPITENSOR_DIRECT_H

#include <stdint.h>

#include "mpitensor/core/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies `part` (a global box) between this process's C-contiguous array at
 * address `local`, of box `local_box`, and process `pid`'s array at address
 * `remote`, of box `remote_box`: from there to here (push 0) or from here to
 * there (push 1), in calls of at most 512 runs a side and 1 GiB. Returns 0, or
 * the errno of the failed call (one that stops short counts as EFAULT; ENOSYS
 * off Linux).
 *
 *   mt_box one = {.ndim = 1, .offset = {0}, .shape = {1}};
 *   int e = mt_direct_copy(pid, 0, (uint64_t)(uintptr_t)&v, &one, there, &one, &one, 8);
 */
int mt_direct_copy(int64_t pid, int push, uint64_t local, const mt_box *local_box,
                   uint64_t remote, const mt_box *remote_box, const mt_box *part,
                   int64_t itemsize);

/* This process's token, at the address returned: a value no other process holds
 * at that address (its pid, the clock at first use, the address). The same for
 * the process's life; thread-safe. */
const int64_t *mt_process_token(void);

/* Whether process `pid` holds `expect` at address `token_at` (what it published
 * from mt_process_token): that the pid names that process, and not another of the
 * same pid on another node or in another pid namespace, and that this process
 * may read its memory (no ptrace restriction or seccomp rule against it). */
int mt_process_reads_back(int64_t pid, uint64_t token_at, int64_t expect);

/* For tests: the next `n` direct copies of this process fail (as one the kernel
 * refused would), so that the fallbacks can be exercised. Returns how many of the
 * previous count were left untaken. */
MT_EXPORT int mt_direct_fail_next(int n);

#ifdef __cplusplus
}
#endif

#endif
