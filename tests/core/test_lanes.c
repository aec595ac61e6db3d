/* Kernels along an axis (lanes.h) against references built one element at a
 * time: running sums and products against mt_reduce applied along each lane (so
 * wrapping, float16 rounding, bool logic and complex products are mt_reduce's,
 * which test_pack checks), with and without init, out and last; first extremes
 * against a plain scan of each lane with NumPy's rules (ties to the first index, a
 * NaN is the extreme), over every dtype (float16 and bfloat16 included) and
 * shapes with empty and one-element extents. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/lanes.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/pack.h"
#include "mpitensor/core/status.h"

static int is_float(int dtype) {
  return dtype == MT_DTYPE_FLOAT16 || dtype == MT_DTYPE_BFLOAT16 ||
         dtype == MT_DTYPE_FLOAT32 || dtype == MT_DTYPE_FLOAT64;
}

static int is_complex(int dtype) {
  return dtype == MT_DTYPE_COMPLEX64 || dtype == MT_DTYPE_COMPLEX128;
}

/* Writes the real number v (a small integer, or NaN) as one scalar of `dtype`. */
static void put_scalar(unsigned char *p, int dtype, double v) {
  switch (dtype) {
    case MT_DTYPE_BOOL: p[0] = (unsigned char)(v != 0); break;
    case MT_DTYPE_INT8: { int8_t x = (int8_t)v; memcpy(p, &x, 1); break; }
    case MT_DTYPE_INT16: { int16_t x = (int16_t)v; memcpy(p, &x, 2); break; }
    case MT_DTYPE_INT32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case MT_DTYPE_INT64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    case MT_DTYPE_UINT8: p[0] = (uint8_t)v; break;
    case MT_DTYPE_UINT16: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
    case MT_DTYPE_UINT32: { uint32_t x = (uint32_t)v; memcpy(p, &x, 4); break; }
    case MT_DTYPE_UINT64: { uint64_t x = (uint64_t)v; memcpy(p, &x, 8); break; }
    case MT_DTYPE_FLOAT16: { uint16_t h = mt_float_to_half((float)v); memcpy(p, &h, 2); break; }
    case MT_DTYPE_BFLOAT16: {
      uint16_t h = mt_float_to_bfloat16((float)v);
      memcpy(p, &h, 2);
      break;
    }
    case MT_DTYPE_FLOAT32: case MT_DTYPE_COMPLEX64: { float f = (float)v; memcpy(p, &f, 4); break; }
    default: memcpy(p, &v, 8); break;
  }
}

/* A value of `dtype` as (real, imaginary) doubles: exact for the small values the
 * tests write. */
static void get_value(const unsigned char *p, int dtype, double *re, double *im) {
  *im = 0;
  switch (dtype) {
    case MT_DTYPE_BOOL: *re = p[0] != 0; break;
    case MT_DTYPE_INT8: { int8_t x; memcpy(&x, p, 1); *re = x; break; }
    case MT_DTYPE_INT16: { int16_t x; memcpy(&x, p, 2); *re = x; break; }
    case MT_DTYPE_INT32: { int32_t x; memcpy(&x, p, 4); *re = x; break; }
    case MT_DTYPE_INT64: { int64_t x; memcpy(&x, p, 8); *re = (double)x; break; }
    case MT_DTYPE_UINT8: *re = p[0]; break;
    case MT_DTYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); *re = x; break; }
    case MT_DTYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); *re = x; break; }
    case MT_DTYPE_UINT64: { uint64_t x; memcpy(&x, p, 8); *re = (double)x; break; }
    case MT_DTYPE_FLOAT16: { uint16_t h; memcpy(&h, p, 2); *re = mt_half_to_float(h); break; }
    case MT_DTYPE_BFLOAT16: { uint16_t h; memcpy(&h, p, 2); *re = mt_bfloat16_to_float(h); break; }
    case MT_DTYPE_FLOAT32: { float f; memcpy(&f, p, 4); *re = f; break; }
    case MT_DTYPE_FLOAT64: memcpy(re, p, 8); break;
    case MT_DTYPE_COMPLEX64: {
      float f[2];
      memcpy(f, p, 8);
      *re = f[0], *im = f[1];
      break;
    }
    default: memcpy(re, p, 8), memcpy(im, p + 8, 8); break;
  }
}

/* `count` random elements: small integers (ties are common), unsigned ones
 * non-negative, and a NaN now and then in float and complex types. */
static void fill(unsigned char *buf, int64_t count, int dtype, uint64_t *rng) {
  size_t size = mt_dtype_size(dtype), part = is_complex(dtype) ? size / 2 : size;
  int parts = is_complex(dtype) ? 2 : 1;
  int unsig = dtype >= MT_DTYPE_UINT8 && dtype <= MT_DTYPE_UINT64;
  for (int64_t k = 0; k < count; ++k) {
    for (int c = 0; c < parts; ++c) {
      double v = (double)(below(rng, 7) - (unsig ? 0 : 3));
      if ((is_float(dtype) || is_complex(dtype)) && below(rng, 20) == 0) v = NAN;
      put_scalar(buf + (size_t)k * size + (size_t)c * part, dtype, v);
    }
  }
}

/* ---- running sums and products ---- */

/* The scan one element at a time with mt_reduce. */
static void ref_scan(unsigned char *out, unsigned char *last, const unsigned char *in,
                     const unsigned char *init, const mt_lanes *l, int dtype, int op) {
  size_t size = mt_dtype_size(dtype);
  mt_error err;
  for (int64_t o = 0; o < l->outer; ++o) {
    for (int64_t j = 0; j < l->inner; ++j) {
      unsigned char acc[16];
      int have = init != NULL;
      if (have) memcpy(acc, init + (size_t)(o * l->inner + j) * size, size);
      for (int64_t i = 0; i < l->n; ++i) {
        size_t at = (size_t)((o * l->n + i) * l->inner + j) * size;
        if (have) {
          mt_reduce(acc, in + at, 1, dtype, op, &err);
        } else {
          memcpy(acc, in + at, size);
          have = 1;
        }
        memcpy(out + at, acc, size);
      }
      if (l->n > 0) memcpy(last + (size_t)(o * l->inner + j) * size, acc, size);
    }
  }
}

/* Bit-for-bit equality, with any NaN equal to any NaN (a NaN's payload is not
 * something NumPy promises). */
static int same(const unsigned char *a, const unsigned char *b, int64_t count, int dtype) {
  size_t size = mt_dtype_size(dtype);
  for (int64_t k = 0; k < count; ++k) {
    const unsigned char *x = a + (size_t)k * size, *y = b + (size_t)k * size;
    if (memcmp(x, y, size) == 0) continue;
    double xr, xi, yr, yi;
    get_value(x, dtype, &xr, &xi);
    get_value(y, dtype, &yr, &yi);
    if (!(is_float(dtype) || is_complex(dtype))) return 0;
    if ((isnan(xr) || isnan(xi)) && (isnan(yr) || isnan(yi))) continue;
    return 0;
  }
  return 1;
}

static void check_scan_case(const mt_lanes *l, int dtype, int op, int with_init,
                            uint64_t *rng) {
  size_t size = mt_dtype_size(dtype);
  int64_t count = l->outer * l->n * l->inner, lanes = l->outer * l->inner;
  size_t all = (size_t)count * size + 1, some = (size_t)lanes * size + 1;
  unsigned char *in = malloc(all), *out = malloc(all), *want = malloc(all);
  unsigned char *init = malloc(some), *last = malloc(some), *want_last = malloc(some);
  unsigned char *totals = malloc(some);
  fill(in, count, dtype, rng);
  fill(init, lanes, dtype, rng);
  ref_scan(want, want_last, in, with_init ? init : NULL, l, dtype, op);
  mt_error err;
  const void *from = with_init ? init : NULL;
  CHECK(mt_cumulate(out, last, in, from, l, dtype, op, &err) == MT_OK);
  CHECK(mt_cumulate(NULL, totals, in, from, l, dtype, op, &err) == MT_OK);
  int ok = same(out, want, count, dtype);
  const unsigned char *end = l->n > 0 ? want_last : with_init ? init : NULL;
  if (end != NULL)
    ok = ok && same(last, end, lanes, dtype) && same(totals, end, lanes, dtype);
  CHECK_MSG(ok, "%s %s, %lld x %lld x %lld, init %d", mt_dtype_name(dtype),
            op == MT_REDUCE_SUM ? "sum" : "product", (long long)l->outer, (long long)l->n,
            (long long)l->inner, with_init);
  free(in), free(init), free(out), free(want), free(last), free(want_last), free(totals);
}

/* Lanes of no element leave the identity in `last`: 0 for sums, 1 for products. */
static void check_empty_identity(int dtype) {
  mt_lanes l = {2, 0, 3};
  size_t size = mt_dtype_size(dtype);
  unsigned char last[6 * 16];
  mt_error err;
  for (int product = 0; product < 2; ++product) {
    memset(last, 0xab, sizeof last);
    CHECK(mt_cumulate(NULL, last, NULL, NULL, &l, dtype, product ? MT_REDUCE_PRODUCT
                                                                  : MT_REDUCE_SUM, &err) == MT_OK);
    for (int k = 0; k < 6; ++k) {
      double re, im;
      get_value(last + (size_t)k * size, dtype, &re, &im);
      CHECK_MSG(re == product && im == 0, "%s identity %d: %g", mt_dtype_name(dtype), product, re);
    }
  }
}

static void test_scans(void) {
  uint64_t rng = 7;
  const mt_lanes shapes[] = {{1, 1, 1}, {1, 9, 1}, {3, 40, 1}, {1, 5, 7}, {2, 6, 3},
                             {4, 3, 2},  {0, 4, 2}, {2, 0, 3},  {2, 4, 0}, {1, 33, 17}};
  for (int dtype = 0; dtype < MT_DTYPE_COUNT; ++dtype) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
      for (int with_init = 0; with_init < 2; ++with_init) {
        check_scan_case(&shapes[s], dtype, MT_REDUCE_SUM, with_init, &rng);
        check_scan_case(&shapes[s], dtype, MT_REDUCE_PRODUCT, with_init, &rng);
      }
    }
    check_empty_identity(dtype);
  }
}

/* ---- first extremes ---- */

/* Whether x replaces the extreme b, by NumPy's rules written out plainly. */
static int ref_better(const unsigned char *x, const unsigned char *b, int dtype, int largest) {
  double xr, xi, br, bi;
  get_value(x, dtype, &xr, &xi);
  get_value(b, dtype, &br, &bi);
  int xnan = isnan(xr) || isnan(xi), bnan = isnan(br) || isnan(bi);
  if (bnan) return 0;
  if (xnan) return 1;
  int cmp = xr != br ? (xr > br ? 1 : -1) : xi != bi ? (xi > bi ? 1 : -1) : 0;
  return largest ? cmp > 0 : cmp < 0;
}

static void check_arg_case(const mt_lanes *l, int dtype, int largest, uint64_t *rng) {
  size_t size = mt_dtype_size(dtype);
  int64_t count = l->outer * l->n * l->inner, lanes = l->outer * l->inner;
  unsigned char *in = malloc((size_t)count * size + 1), *value = malloc((size_t)lanes * size + 1);
  int64_t *index = malloc((size_t)lanes * sizeof *index + 1);
  fill(in, count, dtype, rng);
  mt_error err;
  CHECK(mt_arg_extreme(index, value, in, l, dtype, largest, &err) == MT_OK);
  int ok = 1;
  for (int64_t o = 0; o < l->outer && ok; ++o) {
    for (int64_t j = 0; j < l->inner && ok; ++j) {
      int64_t best = 0;
      for (int64_t i = 1; i < l->n; ++i) {
        const unsigned char *x = in + (size_t)((o * l->n + i) * l->inner + j) * size;
        if (ref_better(x, in + (size_t)((o * l->n + best) * l->inner + j) * size, dtype, largest))
          best = i;
      }
      int64_t k = o * l->inner + j;
      ok = index[k] == best &&
           same(value + (size_t)k * size, in + (size_t)((o * l->n + best) * l->inner + j) * size,
                1, dtype);
    }
  }
  CHECK_MSG(ok, "%s arg%s, %lld x %lld x %lld", mt_dtype_name(dtype), largest ? "max" : "min",
            (long long)l->outer, (long long)l->n, (long long)l->inner);
  free(in), free(value), free(index);
}

static void test_arg_extremes(void) {
  uint64_t rng = 11;
  const mt_lanes shapes[] = {{1, 1, 1}, {1, 9, 1}, {3, 40, 1}, {1, 5, 7},
                             {2, 6, 3}, {0, 4, 2}, {2, 4, 0}, {1, 33, 17}};
  for (int dtype = 0; dtype < MT_DTYPE_COUNT; ++dtype) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; ++s) {
      check_arg_case(&shapes[s], dtype, 1, &rng);
      check_arg_case(&shapes[s], dtype, 0, &rng);
    }
  }
}

static void test_errors(void) {
  mt_error err;
  mt_lanes l = {1, 2, 1}, bad = {1, -1, 1}, empty = {1, 0, 1};
  double x[2] = {1, 2}, y[2], v;
  int64_t k;
  CHECK(mt_cumulate(y, NULL, x, NULL, &l, MT_DTYPE_FLOAT64, MT_REDUCE_MAX, &err) == MT_EINVAL);
  CHECK(mt_cumulate(y, NULL, x, NULL, &l, MT_DTYPE_COUNT, MT_REDUCE_SUM, &err) == MT_ETYPE);
  CHECK(mt_cumulate(y, NULL, x, NULL, &bad, MT_DTYPE_FLOAT64, MT_REDUCE_SUM, &err) == MT_EINVAL);
  CHECK(mt_cumulate(NULL, NULL, x, NULL, &l, MT_DTYPE_FLOAT64, MT_REDUCE_SUM, &err) == MT_EINVAL);
  CHECK(mt_arg_extreme(&k, &v, x, &empty, MT_DTYPE_FLOAT64, 1, &err) == MT_EINVAL);
  CHECK(mt_arg_extreme(&k, &v, x, &l, -1, 1, &err) == MT_ETYPE);
  CHECK(mt_arg_extreme(&k, &v, x, &l, MT_DTYPE_FLOAT64, 1, &err) == MT_OK && k == 1 && v == 2);
  uint16_t b[2] = {0x3f80, 0x4000}, c[2]; /* bfloat16 1, 2 */
  CHECK(mt_cumulate(c, NULL, b, NULL, &l, MT_DTYPE_BFLOAT16, MT_REDUCE_SUM, &err) == MT_OK &&
        c[0] == 0x3f80 && c[1] == 0x4040);
  CHECK(mt_arg_extreme(&k, c, b, &l, MT_DTYPE_BFLOAT16, 1, &err) == MT_OK && k == 1 &&
        c[0] == 0x4000);
}

int main(void) {
  test_scans();
  test_arg_extremes();
  test_errors();
  return mt_test_exit("test_lanes");
}
