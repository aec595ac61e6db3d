/* Philox known answers, the value formula element by element, independence from
 * the box a value is drawn in, distribution sanity, and error paths. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/rng.h"
#include "mpitensor/core/status.h"

static const double two_pi = 6.28318530717958647692528676655900577;

/* Random123 kat_vectors for philox4x32_10. */
static void test_kat(void) {
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
       0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
       0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
  };
  for (int t = 0; t < 3; ++t) {
    uint32_t out[4];
    mt_philox4x32_10(kat[t], kat[t] + 4, out);
    for (int i = 0; i < 4; ++i)
      CHECK_MSG(out[i] == kat[t][6 + i], "vector %d word %d: %08lx", t, i,
                (unsigned long)out[i]);
    /* The output may overwrite the counter. */
    uint32_t inplace[4] = {kat[t][0], kat[t][1], kat[t][2], kat[t][3]};
    mt_philox4x32_10(inplace, kat[t] + 4, inplace);
    CHECK(memcmp(inplace, out, sizeof out) == 0);
  }
}

/* ---- The documented formula, written out per element. ---- */

static void block_of(uint64_t seed, uint64_t stream, uint64_t block, uint32_t x[4]) {
  const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                           (uint32_t)(stream >> 32)};
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  mt_philox4x32_10(ctr, key, x);
}

static double u53(uint32_t a, uint32_t b) {
  return (double)((uint64_t)(a >> 5) * 67108864u + (b >> 6)) / 9007199254740992.0;
}

static double expect(int dtype, int dist, uint64_t seed, uint64_t stream, uint64_t g) {
  uint32_t x[4];
  if (dist == MT_RNG_UNIFORM && dtype == MT_DTYPE_FLOAT32) {
    block_of(seed, stream, g / 4, x);
    return (double)(x[g % 4] >> 8) / 16777216.0;
  }
  block_of(seed, stream, g / 2, x);
  if (dist == MT_RNG_UNIFORM) return g % 2 == 0 ? u53(x[0], x[1]) : u53(x[2], x[3]);
  double r = sqrt(-2.0 * log(1.0 - u53(x[0], x[1])));
  double theta = two_pi * u53(x[2], x[3]);
  double z = g % 2 == 0 ? r * cos(theta) : r * sin(theta);
  return dtype == MT_DTYPE_FLOAT32 ? (double)(float)z : z;
}

static double value_at(const void *buf, int dtype, int64_t i) {
  if (dtype == MT_DTYPE_FLOAT32) return (double)((const float *)buf)[i];
  return ((const double *)buf)[i];
}

static const int dtypes[2] = {MT_DTYPE_FLOAT32, MT_DTYPE_FLOAT64};
static const int dists[2] = {MT_RNG_UNIFORM, MT_RNG_NORMAL};

static mt_box box1(int64_t offset, int64_t size) {
  mt_box b;
  memset(&b, 0, sizeof b);
  b.ndim = 1;
  b.offset[0] = offset;
  b.shape[0] = size;
  return b;
}

/* Windows far into a huge 1-d tensor, so the high counter words, the high key
 * word and the high stream word all take part. */
static void test_formula(void) {
  const uint64_t seed = UINT64_C(0x0123456789abcdef);
  const uint64_t stream = UINT64_C(0xfedcba9876543210);
  const int64_t global = INT64_C(1) << 40;
  const int64_t starts[3] = {0, (INT64_C(1) << 33) + 1, global - 7};
  for (int t = 0; t < 2; ++t) {
    for (int s = 0; s < 2; ++s) {
      for (int w = 0; w < 3; ++w) {
        double buf[7];
        mt_box b = box1(starts[w], 7);
        CHECK(mt_rng_fill_box(buf, dtypes[t], dists[s], seed, stream, &global, &b,
                              NULL) == MT_OK);
        for (int64_t i = 0; i < 7; ++i) {
          uint64_t g = (uint64_t)(starts[w] + i);
          double want = expect(dtypes[t], dists[s], seed, stream, g);
          CHECK_MSG(value_at(buf, dtypes[t], i) == want, "dtype %d dist %d g %lld",
                    dtypes[t], dists[s], (long long)(starts[w] + i));
        }
      }
    }
  }
}

/* ---- A tensor is the same however it is cut into boxes. ---- */

/* Fills every sub-box of a (7, 5) tensor and compares it bit for bit with the
 * matching part of the full fill. */
static void check_all_subboxes(int dtype, int dist) {
  const int64_t shape[2] = {7, 5};
  const size_t item = mt_dtype_size(dtype);
  unsigned char full[7 * 5 * 8], part[7 * 5 * 8];
  mt_box whole;
  memset(&whole, 0, sizeof whole);
  whole.ndim = 2;
  whole.shape[0] = 7, whole.shape[1] = 5;
  CHECK(mt_rng_fill_box(full, dtype, dist, 42, 3, shape, &whole, NULL) == MT_OK);
  int mismatches = 0, boxes = 0;
  mt_box b = whole;
  for (b.offset[0] = 0; b.offset[0] < 7; ++b.offset[0])
    for (b.shape[0] = 1; b.offset[0] + b.shape[0] <= 7; ++b.shape[0])
      for (b.offset[1] = 0; b.offset[1] < 5; ++b.offset[1])
        for (b.shape[1] = 1; b.offset[1] + b.shape[1] <= 5; ++b.shape[1]) {
          ++boxes;
          if (mt_rng_fill_box(part, dtype, dist, 42, 3, shape, &b, NULL) != MT_OK) {
            ++mismatches;
            continue;
          }
          for (int64_t i = 0; i < b.shape[0]; ++i)
            for (int64_t j = 0; j < b.shape[1]; ++j) {
              size_t at = (size_t)((b.offset[0] + i) * 5 + b.offset[1] + j) * item;
              size_t got = (size_t)(i * b.shape[1] + j) * item;
              mismatches += memcmp(full + at, part + got, item) != 0;
            }
        }
  CHECK_MSG(mismatches == 0 && boxes == 28 * 15, "dtype %d dist %d: %d mismatches",
            dtype, dist, mismatches);
}

/* A 3-d tensor cut by a layout: the shards reassemble to the full fill. */
static void check_layout_shards(int dtype, int dist) {
  const int64_t shape[3] = {5, 3, 7}, mesh[2] = {2, 3};
  const size_t item = mt_dtype_size(dtype);
  unsigned char full[5 * 3 * 7 * 8], part[5 * 3 * 7 * 8];
  mt_box whole;
  memset(&whole, 0, sizeof whole);
  whole.ndim = 3;
  memcpy(whole.shape, shape, sizeof shape);
  CHECK(mt_rng_fill_box(full, dtype, dist, 7, 0, shape, &whole, NULL) == MT_OK);
  mt_layout l;
  mt_placement pl[2] = {{MT_PLACEMENT_SHARD, 2, 0, 0}, {MT_PLACEMENT_SHARD, 0, 0, 0}};
  CHECK(mt_layout_init(&l, 3, shape, 2, mesh, pl, NULL) == MT_OK);
  int mismatches = 0;
  for (int64_t c0 = 0; c0 < 2; ++c0)
    for (int64_t c1 = 0; c1 < 3; ++c1) {
      mt_box b;
      CHECK(mt_layout_local_box(&l, (const int64_t[]){c0, c1}, &b, NULL) == MT_OK);
      CHECK(mt_rng_fill_box(part, dtype, dist, 7, 0, shape, &b, NULL) == MT_OK);
      int64_t k = 0;
      for (int64_t i = 0; i < b.shape[0]; ++i)
        for (int64_t j = 0; j < b.shape[1]; ++j)
          for (int64_t m = 0; m < b.shape[2]; ++m, ++k) {
            int64_t g = ((b.offset[0] + i) * 3 + b.offset[1] + j) * 7 + b.offset[2] + m;
            const unsigned char *want = full + (size_t)g * item;
            mismatches += memcmp(want, part + (size_t)k * item, item) != 0;
          }
    }
  CHECK_MSG(mismatches == 0, "dtype %d dist %d: %d mismatches", dtype, dist,
            mismatches);
}

static void test_boxes_agree(void) {
  for (int t = 0; t < 2; ++t)
    for (int s = 0; s < 2; ++s) {
      check_all_subboxes(dtypes[t], dists[s]);
      check_layout_shards(dtypes[t], dists[s]);
    }
}

/* ---- Distributions. ---- */

#define NSAMPLE 100000

static void test_distributions(void) {
  const int64_t n = NSAMPLE;
  mt_box b = box1(0, n);
  double *buf = malloc(NSAMPLE * sizeof(double));
  CHECK(buf != NULL);
  if (buf == NULL) return;
  for (int t = 0; t < 2; ++t) {
    int dtype = dtypes[t];
    CHECK(mt_rng_fill_box(buf, dtype, MT_RNG_UNIFORM, 2024, 1, &n, &b, NULL) == MT_OK);
    int in_range = 1;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      double v = value_at(buf, dtype, i);
      in_range &= v >= 0.0 && v < 1.0;
      sum += v;
    }
    CHECK(in_range);
    CHECK(fabs(sum / (double)n - 0.5) < 0.01);

    CHECK(mt_rng_fill_box(buf, dtype, MT_RNG_NORMAL, 2024, 1, &n, &b, NULL) == MT_OK);
    double s1 = 0, s2 = 0;
    int finite = 1;
    for (int64_t i = 0; i < n; ++i) {
      double v = value_at(buf, dtype, i);
      finite &= isfinite(v) != 0;
      s1 += v;
      s2 += v * v;
    }
    double mean = s1 / (double)n, sd = sqrt(s2 / (double)n - mean * mean);
    CHECK(finite);
    CHECK_MSG(fabs(mean) < 0.02, "mean %g", mean);
    CHECK_MSG(fabs(sd - 1.0) < 0.02, "std %g", sd);
  }
  free(buf);
}

/* Counts equal positions between two 64-element fills. */
static int same_count(int dtype, int dist, uint64_t seed_a, uint64_t stream_a,
                      uint64_t seed_b, uint64_t stream_b) {
  const int64_t n = 64;
  mt_box b = box1(0, n);
  double x[64], y[64];
  CHECK(mt_rng_fill_box(x, dtype, dist, seed_a, stream_a, &n, &b, NULL) == MT_OK);
  CHECK(mt_rng_fill_box(y, dtype, dist, seed_b, stream_b, &n, &b, NULL) == MT_OK);
  size_t item = mt_dtype_size(dtype);
  const char *xb = (const char *)x, *yb = (const char *)y;
  int same = 0;
  for (int64_t i = 0; i < n; ++i)
    same += memcmp(xb + (size_t)i * item, yb + (size_t)i * item, item) == 0;
  return same;
}

static void test_seeds_and_streams(void) {
  for (int t = 0; t < 2; ++t)
    for (int s = 0; s < 2; ++s) {
      CHECK(same_count(dtypes[t], dists[s], 5, 0, 5, 0) == 64);
      CHECK(same_count(dtypes[t], dists[s], 5, 0, 5, 1) == 0);
      CHECK(same_count(dtypes[t], dists[s], 5, 0, 6, 0) == 0);
      CHECK(same_count(dtypes[t], dists[s], 5, 0, 5 | (UINT64_C(1) << 40), 0) == 0);
      CHECK(same_count(dtypes[t], dists[s], 5, 0, 5, UINT64_C(1) << 40) == 0);
    }
}

/* A 0-d tensor is element 0; an empty box writes nothing. */
static void test_scalar_and_empty(void) {
  mt_box scalar;
  memset(&scalar, 0, sizeof scalar);
  const int64_t one = 1;
  mt_box first = box1(0, 1);
  for (int t = 0; t < 2; ++t)
    for (int s = 0; s < 2; ++s) {
      double a[2] = {-7.0, -7.0}, b[2] = {-7.0, -7.0};
      int dtype = dtypes[t], dist = dists[s];
      CHECK(mt_rng_fill_box(a, dtype, dist, 9, 4, NULL, &scalar, NULL) == MT_OK);
      CHECK(mt_rng_fill_box(b, dtype, dist, 9, 4, &one, &first, NULL) == MT_OK);
      CHECK(memcmp(a, b, sizeof a) == 0 && a[1] == -7.0);
    }

  const int64_t shape[2] = {4, 0}, shape2[2] = {4, 6};
  mt_box e;
  memset(&e, 0, sizeof e);
  e.ndim = 2;
  e.shape[0] = 4;
  e.offset[1] = 0;
  double sentinel[4] = {-1, -2, -3, -4}, buf[4];
  memcpy(buf, sentinel, sizeof buf);
  CHECK(mt_rng_fill_box(buf, MT_DTYPE_FLOAT64, MT_RNG_NORMAL, 1, 0, shape, &e, NULL) ==
        MT_OK);
  e.offset[0] = 2, e.shape[0] = 0, e.offset[1] = 6, e.shape[1] = 0;
  const int f32 = MT_DTYPE_FLOAT32, uni = MT_RNG_UNIFORM;
  CHECK(mt_rng_fill_box(buf, f32, uni, 1, 0, shape2, &e, NULL) == MT_OK);
  CHECK(mt_rng_fill_box(NULL, f32, uni, 1, 0, shape2, &e, NULL) == MT_OK);
  CHECK(memcmp(buf, sentinel, sizeof buf) == 0);
}

/* The call fails with `want`, says why, and writes nothing. */
static void check_fails(int want, void *out, int dtype, int dist, const int64_t *shape,
                        const mt_box *box) {
  double before[4];
  if (out != NULL) memcpy(before, out, sizeof before);
  mt_error err = {0, ""};
  int rc = mt_rng_fill_box(out, dtype, dist, 1, 2, shape, box, &err);
  CHECK_MSG(rc == want, "got %s, want %s", mt_status_name(rc), mt_status_name(want));
  CHECK(err.code == want && err.msg[0] != '\0');
  if (out != NULL) CHECK(memcmp(before, out, sizeof before) == 0);
  CHECK(mt_rng_fill_box(out, dtype, dist, 1, 2, shape, box, NULL) == want);
}

static void test_errors(void) {
  double buf[4] = {1, 2, 3, 4};
  const int64_t n = 4, neg = -1;
  mt_box ok = box1(1, 2);
  check_fails(MT_ETYPE, buf, MT_DTYPE_INT32, MT_RNG_UNIFORM, &n, &ok);
  check_fails(MT_ETYPE, buf, MT_DTYPE_FLOAT16, MT_RNG_NORMAL, &n, &ok);
  check_fails(MT_ETYPE, buf, 99, 5, &n, &ok);
  check_fails(MT_EINVAL, buf, MT_DTYPE_FLOAT64, 2, &n, &ok);
  check_fails(MT_EINVAL, buf, MT_DTYPE_FLOAT64, -1, &n, &ok);
  mt_box past = box1(3, 2), before = box1(-1, 2), wide = box1(0, 5);
  check_fails(MT_EINDEX, buf, MT_DTYPE_FLOAT64, MT_RNG_UNIFORM, &n, &past);
  check_fails(MT_EINDEX, buf, MT_DTYPE_FLOAT32, MT_RNG_UNIFORM, &n, &before);
  check_fails(MT_EINDEX, buf, MT_DTYPE_FLOAT32, MT_RNG_NORMAL, &n, &wide);
  mt_box outside_empty = box1(5, 0);
  check_fails(MT_EINDEX, buf, MT_DTYPE_FLOAT32, MT_RNG_NORMAL, &n, &outside_empty);
  mt_box negative = box1(1, -1);
  check_fails(MT_EINDEX, buf, MT_DTYPE_FLOAT32, MT_RNG_NORMAL, &n, &negative);
  check_fails(MT_EINVAL, buf, MT_DTYPE_FLOAT64, MT_RNG_UNIFORM, &neg, &ok);
  check_fails(MT_EINVAL, buf, MT_DTYPE_FLOAT64, MT_RNG_UNIFORM, NULL, &ok);
  check_fails(MT_EINVAL, buf, MT_DTYPE_FLOAT64, MT_RNG_UNIFORM, &n, NULL);
  check_fails(MT_EINVAL, NULL, MT_DTYPE_FLOAT64, MT_RNG_UNIFORM, &n, &ok);
  mt_box deep = box1(0, 1);
  deep.ndim = MT_MAX_NDIM + 1;
  check_fails(MT_EINVAL, buf, MT_DTYPE_FLOAT64, MT_RNG_UNIFORM, &n, &deep);
  /* Global indices of a tensor this large do not fit in int64. */
  const int64_t huge[2] = {INT64_C(1) << 32, INT64_C(1) << 31};
  mt_box corner;
  memset(&corner, 0, sizeof corner);
  corner.ndim = 2;
  corner.shape[0] = corner.shape[1] = 1;
  check_fails(MT_EOVERFLOW, buf, MT_DTYPE_FLOAT64, MT_RNG_UNIFORM, huge, &corner);
}

int main(void) {
  test_kat();
  test_formula();
  test_boxes_agree();
  test_distributions();
  test_seeds_and_streams();
  test_scalar_and_empty();
  test_errors();
  return mt_test_exit("test_rng");
}
