/* The block pool: alignment, reuse of resident blocks, the fit rule, the limit. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef __GLIBC__
#include <malloc.h> /* mallinfo2 */
#endif

#include "check.h"
#include "mpitensor/comm/pool.h"

static void test_small_blocks_are_not_cached(void) {
  mt_pool_set_limit((size_t)512 << 20);
  void *a = mt_pool_alloc(100);
  CHECK(a != NULL && (uintptr_t)a % 64 == 0 && mt_pool_block_size(a) >= 100);
  memset(a, 1, 100);
  mt_pool_free(a);
  CHECK(mt_pool_cached_bytes() == 0);
  void *z = mt_pool_alloc(0);
  CHECK(z != NULL && mt_pool_block_size(z) > 0);
  mt_pool_free(z);
  mt_pool_free(NULL);
}

static void test_large_blocks_are_reused(void) {
  size_t n = (size_t)1 << 20;
  char *a = mt_pool_alloc(n);
  CHECK(a != NULL && (uintptr_t)a % 64 == 0);
  memset(a, 7, n);
  mt_pool_free(a);
  CHECK(mt_pool_cached_bytes() >= n);
  char *b = mt_pool_alloc(n - 4096); /* fits: same block, still resident */
  CHECK(b == a);
  CHECK(mt_pool_cached_bytes() == 0);
  char *c = mt_pool_alloc(n / 4); /* would waste 3/4 of a cached block: fresh one */
  mt_pool_free(b);
  char *d = mt_pool_alloc(n / 4);
  CHECK(d != b);
  mt_pool_free(c);
  mt_pool_free(d);
  char *e = mt_pool_alloc(2 * n); /* larger than anything cached */
  CHECK(e != NULL && e != b && mt_pool_block_size(e) >= 2 * n);
  mt_pool_free(e);
}

static void test_limit(void) {
  size_t before = mt_pool_set_limit(0);
  CHECK(mt_pool_set_limit(0) == 0); /* the limit it replaced */
  CHECK(mt_pool_cached_bytes() == 0);
  void *a = mt_pool_alloc((size_t)1 << 20);
  mt_pool_free(a);
  CHECK(mt_pool_cached_bytes() == 0);
  mt_pool_set_limit((size_t)3 << 20);
  void *blocks[6];
  for (int i = 0; i < 6; ++i) blocks[i] = mt_pool_alloc((size_t)1 << 20);
  for (int i = 0; i < 6; ++i) mt_pool_free(blocks[i]);
  CHECK(mt_pool_cached_bytes() <= (size_t)3 << 20);
  CHECK(mt_pool_cached_bytes() > 0);
  CHECK(mt_pool_set_limit(0) == (size_t)3 << 20);
  CHECK(mt_pool_cached_bytes() == 0);
  mt_pool_set_limit(before);
}

/* A trim empties the cache and keeps the limit. */
static void test_trim(void) {
  size_t before = mt_pool_set_limit((size_t)8 << 20);
  mt_pool_free(mt_pool_alloc((size_t)1 << 20));
  CHECK(mt_pool_cached_bytes() > 0);
  mt_pool_trim();
  CHECK(mt_pool_cached_bytes() == 0);
  CHECK(mt_pool_set_limit(before) == (size_t)8 << 20);
}

/* With every slot taken by small blocks, a larger block freed takes the place of
 * the smallest, and a smaller one is not kept. */
static void test_full_slots_keep_the_largest(void) {
  mt_pool_set_limit(0);
  mt_pool_set_limit((size_t)512 << 20);
  size_t small = (size_t)64 << 10;
  void *blocks[8];
  for (int i = 0; i < 8; ++i) blocks[i] = mt_pool_alloc(small + (size_t)i * 4096);
  size_t smallest = mt_pool_block_size(blocks[0]);
  for (int i = 0; i < 8; ++i) mt_pool_free(blocks[i]);
  size_t full = mt_pool_cached_bytes();
  CHECK(full >= 8 * small);
  char *big = mt_pool_alloc((size_t)1 << 20);
  mt_pool_free(big);
  CHECK(mt_pool_cached_bytes() == full - smallest + ((size_t)1 << 20));
  char *again = mt_pool_alloc((size_t)1 << 20); /* the large block stayed resident */
  CHECK(again == big);
  mt_pool_free(again);
  size_t before = mt_pool_cached_bytes();
  void *tiny = mt_pool_alloc(small - 4096); /* below MIN_CACHED: never cached */
  mt_pool_free(tiny);
  CHECK(mt_pool_cached_bytes() == before);
  mt_pool_set_limit(0);
  mt_pool_set_limit((size_t)512 << 20);
}

/* The VmFlags line of the mapping that holds `p` (/proc/self/smaps), or "". */
static void vm_flags_of(const void *p, char *out, size_t n) {
  out[0] = '\0';
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == NULL) return;
  char line[512];
  int inside = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
      inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    } else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
      snprintf(out, n, "%s", line);
      break;
    }
  }
  fclose(f);
}

/* Where the kernel offers transparent huge pages on request, a block of 4 MiB and
 * more asks for them (as NumPy's large arrays do), and starts on a huge page. */
static void test_large_blocks_ask_for_huge_pages(void) {
  char mode[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f != NULL) {
    if (fgets(mode, sizeof mode, f) == NULL) mode[0] = '\0';
    fclose(f);
  }
  if (mode[0] == '\0' || strstr(mode, "[never]") != NULL) return;
  mt_pool_set_limit(0);
  size_t n = (size_t)8 << 20;
  char *a = mt_pool_alloc(n);
  CHECK(a != NULL && (uintptr_t)a % 64 == 0 && mt_pool_block_size(a) >= n);
  CHECK((uintptr_t)(a - 64) % ((size_t)2 << 20) == 0);
  memset(a, 3, n);
  char flags[512];
  vm_flags_of(a + n / 2, flags, sizeof flags);
  CHECK(strstr(flags, " hg") != NULL);
  char *small = mt_pool_alloc((size_t)1 << 20); /* below NumPy's threshold: 4 KiB pages */
  CHECK(small != NULL);
  mt_pool_free(small);
  mt_pool_free(a);
  mt_pool_set_limit((size_t)512 << 20);
}

/* Blocks the pool may cache are mappings of their own, given back when they leave
 * it, so blocks of ever new sizes (a growing sequence length) leave nothing behind
 * in malloc's heap: from malloc, freeing a block glibc had mapped raised its mmap
 * threshold, and the heap then kept the freed blocks, tens of MiB. */
static void test_growing_blocks_leave_the_heap_as_it_was(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  mt_pool_set_limit(0);
  size_t heap = mallinfo2().arena;
  for (size_t i = 0; i < 2000; ++i) {
    char *a = mt_pool_alloc(((size_t)128 << 10) + i * 1024);
    char *b = mt_pool_alloc(((size_t)96 << 10) + i * 512);
    CHECK(a != NULL && b != NULL);
    memset(a, 1, 4096);
    memset(b, 1, 4096);
    mt_pool_free(a);
    void *c = mt_pool_alloc(((size_t)64 << 10) + i * 700);
    mt_pool_free(b);
    mt_pool_free(c);
  }
  CHECK(mallinfo2().arena <= heap + ((size_t)1 << 20));
  mt_pool_set_limit((size_t)512 << 20);
#endif
}

/* calloc and realloc over the pool: zeroed, overflow refused, grown in place
 * while the block is large enough, else moved with its bytes. */
static void test_calloc_realloc(void) {
  CHECK(!mt_pool_worth(1000) && mt_pool_worth((size_t)1 << 20));
  CHECK(mt_pool_calloc(SIZE_MAX / 2, 4) == NULL);
  unsigned char *a = mt_pool_calloc(1000, 3);
  CHECK(a != NULL && a[0] == 0 && a[2999] == 0);
  a[0] = 5;
  CHECK(mt_pool_realloc(a, 2000) == a);
  unsigned char *b = mt_pool_realloc(a, (size_t)1 << 20);
  CHECK(b != NULL && b[0] == 5 && mt_pool_block_size(b) >= ((size_t)1 << 20));
  mt_pool_free(b);
  void *c = mt_pool_realloc(NULL, 10);
  CHECK(c != NULL && mt_pool_block_size(c) >= 10);
  mt_pool_free(c);
}

int main(void) {
  test_growing_blocks_leave_the_heap_as_it_was();
  test_small_blocks_are_not_cached();
  test_large_blocks_are_reused();
  test_limit();
  test_trim();
  test_full_slots_keep_the_largest();
  test_large_blocks_ask_for_huge_pages();
  test_calloc_realloc();
  return mt_test_exit("test_pool");
}
