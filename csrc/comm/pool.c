/* The block cache of pool.h: a handful of slots behind a spinlock. Critical
 * sections scan at most MAX_SLOTS entries, so a lock that spins is cheaper than one
 * that sleeps, and it needs no threads library. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpitensor/pool.h"

#define HEADER 64              /* keeps the block 64-byte aligned */
#define MIN_CACHED (64 << 10)  /* smaller blocks are malloc's business */
#define MAX_SLOTS 8

typedef struct header {
  size_t size; /* usable bytes after the header */
} header;

/* The cache is process-wide state on purpose: the blocks it keeps are the
 * process's resident memory, shared by every mesh and every thread, like the MPI
 * library it serves (a per-mesh cache would keep the same megabytes once per
 * mesh). Thread-safe: `slots`, `cached` and `limit` are read and written only
 * while holding `lock`. */
static atomic_flag lock = ATOMIC_FLAG_INIT;
static void *slots[MAX_SLOTS]; /* cached blocks (their headers) */
static size_t cached, limit = (size_t)512 << 20;

static void acquire(void) {
  while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire)) {
  }
}

static void release(void) { atomic_flag_clear_explicit(&lock, memory_order_release); }

static size_t size_of(const void *h) { return ((const header *)h)->size; }

/* Under the lock: removes and returns the smallest cached block that holds `size`
 * bytes without wasting more than half of itself, or NULL. */
static void *take_fitting(size_t size) {
  int best = -1;
  for (int i = 0; i < MAX_SLOTS; ++i) {
    if (slots[i] == NULL) continue;
    size_t s = size_of(slots[i]);
    if (s >= size && s / 2 <= size && (best < 0 || s < size_of(slots[best]))) best = i;
  }
  if (best < 0) return NULL;
  void *h = slots[best];
  slots[best] = NULL;
  cached -= size_of(h);
  return h;
}

void *mt_pool_alloc(size_t size) {
  void *h = NULL;
  if (size >= MIN_CACHED) {
    acquire();
    h = take_fitting(size);
    release();
  }
  if (h == NULL) {
    if (size > SIZE_MAX - 2 * (size_t)HEADER) return NULL;
    size_t rounded = (size + HEADER - 1) / HEADER * HEADER;
    h = aligned_alloc(HEADER, HEADER + (rounded > 0 ? rounded : HEADER));
    if (h == NULL) return NULL;
    ((header *)h)->size = rounded > 0 ? rounded : HEADER;
  }
  return (char *)h + HEADER;
}

/* Under the lock: caches `h` in a free slot if the limit allows. */
static int try_cache(void *h) {
  size_t s = size_of(h);
  if (s < MIN_CACHED || cached + s > limit) return 0;
  for (int i = 0; i < MAX_SLOTS; ++i) {
    if (slots[i] != NULL) continue;
    slots[i] = h;
    cached += s;
    return 1;
  }
  return 0;
}

void mt_pool_free(void *block) {
  if (block == NULL) return;
  void *h = (char *)block - HEADER;
  acquire();
  int kept = try_cache(h);
  release();
  if (!kept) free(h);
}

size_t mt_pool_block_size(const void *block) {
  return size_of((const char *)block - HEADER);
}

void mt_pool_set_limit(size_t bytes) {
  void *drop[MAX_SLOTS] = {0};
  acquire();
  limit = bytes;
  for (int i = 0; i < MAX_SLOTS && cached > limit; ++i) {
    if (slots[i] == NULL) continue;
    cached -= size_of(slots[i]);
    drop[i] = slots[i];
    slots[i] = NULL;
  }
  release();
  for (int i = 0; i < MAX_SLOTS; ++i) free(drop[i]);
}

size_t mt_pool_cached_bytes(void) {
  acquire();
  size_t n = cached;
  release();
  return n;
}
