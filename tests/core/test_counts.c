/* The reduce-scatter's rounds decision: one MPI call while the counts' total is an
 * int, rounds as soon as the total (not only one block) is above it, with every
 * round's total an int again. Elements just above 2**31 in total or per block, at
 * group sizes 1..8 and itemsizes 1..16, and with small limits standing for INT_MAX. */
#include <limits.h>
#include <stdint.h>

#include "check.h"
#include "mpitensor/comm/redistribute.h"

static const int64_t MIB256 = (int64_t)1 << 28;

/* Blocks of `n` elements split as the planner's chunks are: ceil(n / g) each, the
 * last ones shorter. */
static void chunks(int64_t n, int64_t g, int64_t *counts) {
  int64_t size = (n + g - 1) / g;
  for (int64_t k = 0; k < g; ++k) {
    int64_t left = n - k * size;
    counts[k] = left < 0 ? 0 : (left < size ? left : size);
  }
}

/* What any answer must satisfy: one call only when the total fits; else a round of
 * at least one element whose packed total fits and which is no wider than 256 MiB. */
static void check_round(const int64_t *counts, int64_t g, int64_t isz, int64_t limit) {
  int64_t total = 0;
  for (int64_t k = 0; k < g; ++k) total += counts[k];
  int64_t r = mt_reduce_scatter_round(counts, g, isz, limit);
  CHECK_MSG((r == 0) == (total <= limit), "total %lld limit %lld: round %lld",
            (long long)total, (long long)limit, (long long)r);
  if (r == 0) return;
  CHECK_MSG(r >= 1 && g * r <= limit && r * isz <= MIB256,
            "g %lld isz %lld: round %lld", (long long)g, (long long)isz, (long long)r);
}

static void test_transitions_at_int_max(void) {
  int64_t counts[8];
  const int64_t big = (int64_t)INT_MAX;
  for (int64_t g = 1; g <= 8; ++g) {
    for (int64_t isz = 1; isz <= 16; isz *= 2) {
      /* total just below, at and above INT_MAX, then one block just above it */
      const int64_t totals[] = {big - 1, big, big + 1, big + 16, g * (big + 1), g * big + 16};
      for (int i = 0; i < 6; ++i) {
        chunks(totals[i], g, counts);
        check_round(counts, g, isz, big);
      }
    }
  }
  /* More than INT_MAX in all: 2**31 + 16 int8 at np 2, each block far below it. */
  int64_t two[2] = {((int64_t)1 << 30) + 8, ((int64_t)1 << 30) + 8};
  CHECK(mt_reduce_scatter_round(two, 2, 1, big) == MIB256);
  /* int8 over 8 members: 8 rounds of 256 MiB would total 2**31: the round shrinks. */
  chunks(8 * (big + 1), 8, counts);
  CHECK(mt_reduce_scatter_round(counts, 8, 1, big) == big / 8);
  /* Empty and tiny blocks. */
  int64_t none[3] = {0, 0, 0};
  CHECK(mt_reduce_scatter_round(none, 3, 4, big) == 0);
}

static void test_small_limits(void) {
  int64_t counts[5];
  for (int64_t g = 1; g <= 5; ++g) {
    for (int64_t limit = g; limit <= 40; ++limit) { /* INT_MAX is above any group */
      for (int64_t n = 0; n <= 60; ++n) {
        chunks(n, g, counts);
        check_round(counts, g, 8, limit);
      }
    }
  }
  int64_t uneven[3] = {7, 7, 2};
  CHECK(mt_reduce_scatter_round(uneven, 3, 1, 16) == 0);
  CHECK(mt_reduce_scatter_round(uneven, 3, 1, 15) == 5);
}

int main(void) {
  test_transitions_at_int_max();
  test_small_limits();
  return mt_test_exit("test_counts");
}
