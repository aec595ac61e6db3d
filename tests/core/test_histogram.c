/* Equal-bin counts (histogram.h) against the edges' rule applied by a bisection
 * of the edges, one element at a time: random floats, every value that is an
 * edge, values one float above and below each edge, NaN, out-of-range values,
 * narrow and wide ranges, one bin and the most bins, and the argument checks;
 * per-value counts (mt_bincount) against a plain loop. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/histogram.h"
#include "mpitensor/core/status.h"

/* The bin of v by the rule alone: edges[i] <= v < edges[i + 1], the last bin
 * closed; -1 outside or NaN. A bisection for the last edge <= v, so that the
 * most-bins case stays cheap under valgrind. */
static int64_t reference_bin(double v, const double *edges, int64_t bins) {
  if (!(v >= edges[0] && v <= edges[bins])) return -1;
  int64_t lo = 0, hi = bins;  /* edges[lo] <= v, and v < edges[hi] or hi == bins */
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (edges[mid] <= v) lo = mid;
    else hi = mid;
  }
  return lo;
}

/* linspace(lo, hi, bins + 1) as NumPy computes it for float64, rounded to
 * float when `single` (NumPy's float32 edges). */
static void make_edges(double lo, double hi, int64_t bins, int single, double *edges) {
  double step = (hi - lo) / (double)bins;
  for (int64_t i = 0; i <= bins; ++i) edges[i] = lo + (double)i * step;
  edges[bins] = hi;
  if (single) {
    for (int64_t i = 0; i <= bins; ++i) edges[i] = (double)(float)edges[i];
  }
}

static void check_case(uint64_t *rng, double lo, double hi, int64_t bins, int single) {
  double *edges = malloc((size_t)(bins + 1) * sizeof *edges);
  make_edges(lo, hi, bins, single, edges);
  int64_t n = 3 * (bins + 1) + 500;
  double *xd = malloc((size_t)n * sizeof *xd);
  float *xf = malloc((size_t)n * sizeof *xf);
  int64_t k = 0;
  for (int64_t i = 0; i <= bins; ++i) {  /* each edge and its neighbours */
    xd[k++] = edges[i];
    xd[k++] = nextafter(edges[i], -INFINITY);
    xd[k++] = nextafter(edges[i], INFINITY);
  }
  while (k < n - 3) {
    double u = (double)(next_u64(rng) >> 11) / 9007199254740992.0;
    xd[k++] = lo - 0.1 * (hi - lo) + 1.2 * (hi - lo) * u;
  }
  xd[k++] = NAN;
  xd[k++] = INFINITY;
  xd[k++] = -INFINITY;
  for (int64_t i = 0; i < n; ++i) xf[i] = (float)xd[i];
  int64_t *got = calloc((size_t)bins, sizeof *got), *want = calloc((size_t)bins, sizeof *want);
  mt_error err = {0};
  int rc = single ? mt_histogram_uniform(MT_DTYPE_FLOAT32, n, xf, bins, edges, got, &err)
                  : mt_histogram_uniform(MT_DTYPE_FLOAT64, n, xd, bins, edges, got, &err);
  CHECK_MSG(rc == MT_OK, "%s", err.msg);
  for (int64_t i = 0; i < n; ++i) {
    int64_t b = reference_bin(single ? (double)xf[i] : xd[i], edges, bins);
    if (b >= 0) ++want[b];
  }
  CHECK_MSG(memcmp(got, want, (size_t)bins * sizeof *got) == 0,
            "counts differ for [%g, %g] in %lld bins (%s)", lo, hi, (long long)bins,
            single ? "float32" : "float64");
  free(edges), free(xd), free(xf), free(got), free(want);
}

static void check_ints(void) {
  int32_t x[] = {-3, 0, 1, 2, 5, 9, 10, 11, 7, 7};
  double edges[4];
  make_edges(0.0, 10.0, 3, 0, edges);
  int64_t got[3] = {0, 0, 0};
  mt_error err = {0};
  CHECK(mt_histogram_uniform(MT_DTYPE_INT32, 10, x, 3, edges, got, &err) == MT_OK);
  /* edges 0, 3.33, 6.67, 10: {0, 1, 2}, {5}, {7, 7, 9, 10} */
  CHECK(got[0] == 3 && got[1] == 1 && got[2] == 4);
  uint8_t u[] = {0, 255, 128};
  int64_t two[2] = {0, 0};
  double e2[3] = {0.0, 127.5, 255.0};
  CHECK(mt_histogram_uniform(MT_DTYPE_UINT8, 3, u, 2, e2, two, &err) == MT_OK);
  CHECK(two[0] == 1 && two[1] == 2);
}

static void check_arguments(void) {
  double edges[3] = {0.0, 1.0, 2.0}, bad[3] = {0.0, 2.0, 1.0}, inf[3] = {0.0, 1.0, INFINITY};
  int64_t counts[2] = {0, 0};
  double x[1] = {0.5};
  mt_error err = {0};
  CHECK(mt_histogram_uniform(MT_DTYPE_INT64, 1, x, 2, edges, counts, &err) == MT_ETYPE);
  CHECK(mt_histogram_uniform(MT_DTYPE_FLOAT64, 1, x, 0, edges, counts, &err) == MT_EINVAL);
  CHECK(mt_histogram_uniform(MT_DTYPE_FLOAT64, -1, x, 2, edges, counts, &err) == MT_EINVAL);
  CHECK(mt_histogram_uniform(MT_DTYPE_FLOAT64, 1, x, 2, bad, counts, &err) == MT_EINVAL);
  CHECK(mt_histogram_uniform(MT_DTYPE_FLOAT64, 1, x, 2, inf, counts, &err) == MT_EINVAL);
  CHECK(mt_histogram_uniform(MT_DTYPE_FLOAT64, 1, x, MT_HISTOGRAM_MAX_BINS + 1, edges,
                             counts, &err) == MT_EINVAL);
  CHECK(counts[0] == 0 && counts[1] == 0);
  CHECK(mt_histogram_uniform(MT_DTYPE_FLOAT64, 0, NULL, 2, edges, counts, &err) == MT_OK);
}

/* Per-value counts (mt_bincount) against a plain loop: a table grown and the
 * count resumed where a value did not fit, a stop at a negative value, sums of
 * weights in element order, and the argument checks. */
static void check_bincount(uint64_t *rng) {
  enum { N = 1003, TOP = 300 };
  int64_t x[N], want[TOP] = {0}, got[TOP] = {0};
  double w[N], wsum[TOP] = {0}, gsum[TOP] = {0};
  int64_t top = -1;
  for (int i = 0; i < N; ++i) {
    x[i] = (int64_t)(next_u64(rng) % (i < N / 2 ? 40 : TOP));
    w[i] = (double)(next_u64(rng) >> 11) / 9007199254740992.0 - 0.25;
    ++want[x[i]];
    wsum[x[i]] += w[i];
    top = x[i] > top ? x[i] : top;
  }
  mt_error err = {0};
  int64_t pos = 0, max = -1, size = 8, resumed = 0;
  while (pos < N) {  /* a table of 8 first, grown to each value that does not fit */
    CHECK_MSG(mt_bincount(N, x, NULL, size, got, NULL, &pos, &max, &err) == MT_OK, "%s",
              err.msg);
    if (pos < N) {
      size = x[pos] + 1;
      ++resumed;
    }
  }
  CHECK(resumed > 0 && max == top && memcmp(got, want, sizeof got) == 0);
  pos = 0, max = -1;
  CHECK(mt_bincount(N, x, w, TOP, NULL, gsum, &pos, &max, &err) == MT_OK);
  CHECK(pos == N && max == top);
  for (int v = 0; v < TOP; ++v) CHECK(gsum[v] == wsum[v]);  /* the same sums, bit for bit */
  int64_t neg[6] = {1, 2, 3, 0, -5, 1}, small[4] = {0};
  pos = 0, max = -1;
  CHECK(mt_bincount(6, neg, NULL, 4, small, NULL, &pos, &max, &err) == MT_OK);
  CHECK(pos == 4 && max == 3 && small[0] == 1 && small[1] == 1 && small[3] == 1);
  pos = 7;
  CHECK(mt_bincount(6, neg, NULL, 4, small, NULL, &pos, &max, &err) == MT_EINVAL);
  pos = 0;
  CHECK(mt_bincount(-1, neg, NULL, 4, small, NULL, &pos, &max, &err) == MT_EINVAL);
  CHECK(mt_bincount(6, neg, w, 4, small, NULL, &pos, &max, &err) == MT_EINVAL);
  CHECK(mt_bincount(6, NULL, NULL, 4, small, NULL, &pos, &max, &err) == MT_EINVAL);
  CHECK(mt_bincount(0, NULL, NULL, 0, NULL, NULL, &pos, &max, &err) == MT_OK && pos == 0);
}

int main(void) {
  uint64_t rng = 42;
  const double ranges[][2] = {{-4.0, 4.0}, {0.1, 0.9}, {1e-300, 3e-300}, {-1e300, 1e300},
                              {1.0, 1.0 + 1e-12}, {-7.25, 1e6}};
  const int64_t bins[] = {1, 2, 3, 10, 97, 1000, MT_HISTOGRAM_MAX_BINS};
  for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; ++r) {
    for (size_t b = 0; b < sizeof bins / sizeof bins[0]; ++b) {
      for (int single = 0; single < 2; ++single) {
        double lo = ranges[r][0], hi = ranges[r][1];
        /* float32 edges must stay distinct and finite, as NumPy's do when it bins */
        if (single && (fabs(lo) > 1e38 || fabs(hi) > 1e38 || fabs(lo) < 1e-30 ||
                       (hi - lo) / (double)bins[b] < 1e-6 * fabs(hi))) continue;
        if ((hi - lo) / (double)bins[b] < 1e-15 * fabs(hi)) continue;
        check_case(&rng, lo, hi, bins[b], single);
      }
    }
  }
  check_ints();
  check_arguments();
  check_bincount(&rng);
  return mt_test_exit("test_histogram");
}
