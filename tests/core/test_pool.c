/* The block pool: alignment, reuse of resident blocks, the fit rule, the limit. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "mpitensor/pool.h"

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
  mt_pool_set_limit(0);
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
  mt_pool_set_limit(0);
  CHECK(mt_pool_cached_bytes() == 0);
}

int main(void) {
  test_small_blocks_are_not_cached();
  test_large_blocks_are_reused();
  test_limit();
  return mt_test_exit("test_pool");
}
