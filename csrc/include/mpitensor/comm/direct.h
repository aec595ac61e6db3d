/* Copies between the processes of one node, straight from one process's array
 * into another's (Linux's process_vm_readv and process_vm_writev): one pass where
 * a message through MPI packs, copies and unpacks a strided part. The plan
 * executor's direct steps use them (comm/direct.c); what is public is the hook
 * that lets tests make them fail. Local. */
#ifndef MPITENSOR_DIRECT_H
#define MPITENSOR_DIRECT_H

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For tests: the next `n` direct copies of this process fail (as one the kernel
 * refused would), so that the fallbacks can be exercised. Returns how many of the
 * previous count were left untaken. */
MT_EXPORT int mt_direct_fail_next(int n);

#ifdef __cplusplus
}
#endif

#endif
