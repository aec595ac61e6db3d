/* The block cache of pool.h: a handful of slots behind a spinlock. Critical
 * sections scan at most MAX_SLOTS entries, so a lock that spins is cheaper than one
 * that sleeps, and it needs no threads library. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "mpitensor/comm/pool.h"

#define HEADER 64              /* keeps the block 64-byte aligned */
#define MIN_CACHED (64 << 10)  /* smaller blocks are malloc's business */
#define MAX_SLOTS 8

/* Every block the pool may cache (from MIN_CACHED) is a mapping of its own, given
 * back to the system when it leaves the pool. From malloc, blocks of ever new
 * sizes (a growing sequence length) would fragment its heap: freeing a block glibc
 * had mapped raises glibc's mmap threshold to that size, the next blocks up to it
 * come from the heap, and the heap keeps resident the freed ones it cannot reuse
 * (tests/python/test_memory_soak.py, tests/core/test_pool.c).
 *
 * Blocks from 4 MiB (NumPy's own threshold for asking the same) are mapped at a
 * 2 MiB boundary and marked MADV_HUGEPAGE, so that with transparent huge pages
 * in "madvise" mode they get huge pages as NumPy's large arrays do: an output
 * built on 4 KiB pages costs 512 times the TLB entries (and, in a virtual
 * machine, two-level page walks) of one the caller's NumPy buffers are made of. */
#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

typedef struct header {
  size_t size;   /* usable bytes after the header */
  size_t mapped; /* bytes of the block's own mapping (0: from aligned_alloc) */
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

/* A mapping of at least `bytes` (*bytes rounded up to whole pages), or NULL (the
 * caller falls back to aligned_alloc). From HUGE_MIN it starts at a huge-page
 * boundary and is marked for huge pages: a huge page more is mapped and what lies
 * outside is unmapped. */
static void *map_block(size_t *bytes_io) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0 || HUGE_PAGE % (size_t)page != 0) return NULL;
  size_t bytes = (*bytes_io + (size_t)page - 1) / (size_t)page * (size_t)page;
  size_t extra = bytes >= HUGE_MIN ? HUGE_PAGE : 0;
  *bytes_io = bytes;
  char *p = mmap(NULL, bytes + extra, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  if (extra == 0) return p;
  size_t head = (HUGE_PAGE - (uintptr_t)p % HUGE_PAGE) % HUGE_PAGE;
  if (head > 0) munmap(p, head);
  munmap(p + head + bytes, HUGE_PAGE - head);
  /* Advice only: a kernel without transparent huge pages refuses it, and the
   * block is then as good as aligned_alloc's. */
  (void)madvise(p + head, bytes, MADV_HUGEPAGE);
  return p + head;
#else
  (void)bytes_io;
  return NULL;
#endif
}

static void release_block(void *h) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  size_t mapped = ((header *)h)->mapped;
  if (mapped > 0) {
    munmap(h, mapped);
    return;
  }
#endif
  free(h);
}

void *mt_pool_alloc(size_t size) {
  void *h = NULL;
  if (size >= MIN_CACHED) {
    acquire();
    h = take_fitting(size);
    release();
  }
  if (h == NULL) {
    if (size > SIZE_MAX - 2 * HUGE_PAGE) return NULL;
    size_t rounded = (size + HEADER - 1) / HEADER * HEADER;
    if (rounded == 0) rounded = HEADER;
    size_t mapped = 0;
    if (rounded >= MIN_CACHED) {
      mapped = HEADER + rounded;
      h = map_block(&mapped);
      if (h == NULL) mapped = 0;
    }
    if (h == NULL) h = aligned_alloc(HEADER, HEADER + rounded);
    if (h == NULL) return NULL;
    ((header *)h)->size = rounded;
    ((header *)h)->mapped = mapped;
  }
  return (char *)h + HEADER;
}

/* Under the lock: caches `h` in a free slot if the limit allows; with every slot
 * taken, in place of the smallest cached block if that is smaller than `h` (the
 * large blocks are the ones worth keeping resident), which is returned in *evicted
 * for the caller to release outside the lock. */
static int try_cache(void *h, void **evicted) {
  size_t s = size_of(h);
  *evicted = NULL;
  if (s < MIN_CACHED) return 0;
  int smallest = -1;
  for (int i = 0; i < MAX_SLOTS; ++i) {
    if (slots[i] == NULL) {
      if (cached + s > limit) return 0;
      slots[i] = h;
      cached += s;
      return 1;
    }
    if (smallest < 0 || size_of(slots[i]) < size_of(slots[smallest])) smallest = i;
  }
  size_t out = size_of(slots[smallest]);
  if (out >= s || cached - out + s > limit) return 0;
  *evicted = slots[smallest];
  slots[smallest] = h;
  cached = cached - out + s;
  return 1;
}

void mt_pool_free(void *block) {
  if (block == NULL) return;
  void *h = (char *)block - HEADER;
  void *evicted = NULL;
  acquire();
  int kept = try_cache(h, &evicted);
  release();
  if (!kept) release_block(h);
  if (evicted != NULL) release_block(evicted);
}

int mt_pool_worth(size_t size) { return size >= MIN_CACHED; }

void *mt_pool_calloc(size_t n, size_t elsize) {
  if (elsize != 0 && n > SIZE_MAX / elsize) return NULL;
  void *p = mt_pool_alloc(n * elsize);
  if (p != NULL) memset(p, 0, n * elsize);
  return p;
}

void *mt_pool_realloc(void *block, size_t size) {
  if (block == NULL) return mt_pool_alloc(size);
  size_t have = mt_pool_block_size(block);
  if (size <= have) return block;
  void *p = mt_pool_alloc(size);
  if (p == NULL) return NULL;
  memcpy(p, block, have);
  mt_pool_free(block);
  return p;
}

size_t mt_pool_block_size(const void *block) {
  return size_of((const char *)block - HEADER);
}

size_t mt_pool_set_limit(size_t bytes) {
  void *drop[MAX_SLOTS] = {0};
  acquire();
  size_t previous = limit;
  limit = bytes;
  for (int i = 0; i < MAX_SLOTS && cached > limit; ++i) {
    if (slots[i] == NULL) continue;
    cached -= size_of(slots[i]);
    drop[i] = slots[i];
    slots[i] = NULL;
  }
  release();
  for (int i = 0; i < MAX_SLOTS; ++i) {
    if (drop[i] != NULL) release_block(drop[i]);
  }
  return previous;
}

void mt_pool_trim(void) {
  (void)mt_pool_set_limit(mt_pool_set_limit(0));
#if defined(__GLIBC__)
  (void)malloc_trim(0);
#endif
}

size_t mt_pool_cached_bytes(void) {
  acquire();
  size_t n = cached;
  release();
  return n;
}
