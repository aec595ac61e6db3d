/* A cache of large memory blocks kept resident between redistributes.
 *
 * A fresh multi-megabyte malloc is an mmap that the first write page-faults in, and
 * on a busy node that costs more than copying the data: a large redistribute can
 * spend more time faulting its new output and staging buffers in than in MPI.
 * Blocks that the executor and mpitensor's output arrays give back are kept (up to
 * a byte limit) and handed out again. All calls are Local and thread-safe; the
 * cache is process-wide, like the MPI library it serves. */
#ifndef MPITENSOR_POOL_H
#define MPITENSOR_POOL_H

#include <stddef.h>

#include "mpitensor/core/status.h" /* MT_EXPORT */

#ifdef __cplusplus
extern "C" {
#endif

/* Local. A block of at least `size` bytes, 64-byte aligned, or NULL when memory
 * is exhausted. Blocks of 64 KiB and more come from the cache when one fits (no
 * more than twice the size asked for), else are mapped on their own (and unmapped
 * when they leave the pool), so that blocks of ever new sizes never fragment
 * malloc's heap. */
void *mt_pool_alloc(size_t size);

/* Local. Gives a block from mt_pool_alloc back: large blocks are cached while the
 * cache holds fewer bytes than its limit, others are freed; with every one of the
 * eight slots taken, a block takes the place of the smallest cached one when it
 * is larger (that one is freed). So the cache holds at most eight blocks and at
 * most its limit in bytes. Accepts NULL. */
void mt_pool_free(void *block);

/* Local. calloc and realloc over the pool: `n` zeroed elements of `elsize` bytes
 * (NULL when the product overflows), and a block grown to `size` bytes (the same
 * block while it is large enough, else a new one holding its bytes; the old one
 * is given back), so that an allocator made of the pool (NumPy's, for arrays)
 * needs nothing else. */
void *mt_pool_calloc(size_t n, size_t elsize);
void *mt_pool_realloc(void *block, size_t size);

/* Local. Whether a block of `size` bytes is worth taking from the pool: smaller
 * ones are malloc's business, whose own caching keeps them warm. */
int mt_pool_worth(size_t size);

/* Local. The usable size of a block from mt_pool_alloc. */
size_t mt_pool_block_size(const void *block);

/* Local. Sets the cache's byte limit (0 turns caching off) and frees cached blocks
 * beyond it; returns the limit it replaces, so that a caller can empty the cache
 * and put the limit back. The default is 512 MiB. */
MT_EXPORT size_t mt_pool_set_limit(size_t bytes);

/* Local. Bytes currently cached (not in use). */
MT_EXPORT size_t mt_pool_cached_bytes(void);

/* Local. Frees every cached block (the limit stays) and hands back to the system
 * what the C heap keeps free (glibc's malloc_trim; elsewhere the cache only), so
 * that a measure of peak memory starts from what is in use. */
MT_EXPORT void mt_pool_trim(void);

#ifdef __cplusplus
}
#endif
#endif
