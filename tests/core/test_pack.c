/* Box copies against a naive per-element copy over random shapes, reductions and
 * divisions for every dtype against straightforward references, and float16 and
 * bfloat16 conversions checked exhaustively against independent models. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rng.h"
#include "core-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/pack.h"
#include "mpitensor/core/status.h"

/* ---- float16: an independent model built from ldexp ---- */

static double ref_half_value(uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double mag = exp == 0 ? ldexp(mant, -24) : ldexp(1024 + mant, exp - 25);
  if (exp == 0x1f) mag = mant == 0 ? INFINITY : NAN;
  return (h & 0x8000) ? -mag : mag;
}

static int half_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

/* For rounding, the pattern after the largest finite half (inf) stands at 2^16. */
static double rounding_value(uint16_t h) {
  return h == 0x7c00 ? 65536.0 : ref_half_value(h);
}

/* The nearest half to `f`, ties to the even pattern, found by binary search over
 * the positive patterns (whose values increase with the pattern). */
static uint16_t ref_float_to_half(float f) {
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  if (isnan(f)) return 0x7e00;
  double a = fabs((double)f);
  if (a >= 65536.0) return (uint16_t)(sign | 0x7c00);
  unsigned lo = 0, hi = 0x7c00; /* value(lo) <= a < value(hi) */
  while (hi - lo > 1) {
    unsigned mid = (lo + hi) / 2;
    if (rounding_value((uint16_t)mid) <= a) lo = mid; else hi = mid;
  }
  double dlo = a - rounding_value((uint16_t)lo), dhi = rounding_value((uint16_t)hi) - a;
  unsigned pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return (uint16_t)(sign | pick);
}

static void test_half_exhaustive(void) {
  int bad_value = 0, bad_trip = 0;
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    float f = mt_half_to_float((uint16_t)h);
    double want = ref_half_value((uint16_t)h);
    if (isnan(want) ? !isnan(f) : ((double)f != want || !signbit(f) != !signbit(want)))
      ++bad_value;
    /* NaNs too come back bit for bit (payload included), a fortiori still NaN. */
    if (mt_float_to_half(f) != h) ++bad_trip;
  }
  CHECK_MSG(bad_value == 0, "%d halves convert to the wrong float", bad_value);
  CHECK_MSG(bad_trip == 0, "%d halves do not round-trip", bad_trip);
}

static uint16_t f2h_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return mt_float_to_half(f);
}

static void test_half_rounding_cases(void) {
  CHECK(mt_float_to_half(1.0f) == 0x3c00);
  CHECK(mt_float_to_half(1.0f + 0x1p-11f) == 0x3c00);        /* tie, even is down */
  CHECK(mt_float_to_half(1.0f + 3 * 0x1p-11f) == 0x3c02);    /* tie, even is up */
  CHECK(mt_float_to_half(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
  CHECK(mt_float_to_half(-1.0f - 3 * 0x1p-11f) == 0xbc02);
  CHECK(mt_float_to_half(65504.0f) == 0x7bff);
  CHECK(mt_float_to_half(65519.0f) == 0x7bff);
  CHECK(mt_float_to_half(65520.0f) == 0x7c00); /* tie with 2^16 rounds to inf */
  CHECK(mt_float_to_half(-65520.0f) == 0xfc00);
  CHECK(mt_float_to_half(1e10f) == 0x7c00);
  CHECK(mt_float_to_half(INFINITY) == 0x7c00 && mt_float_to_half(-INFINITY) == 0xfc00);
  CHECK(mt_float_to_half(0.0f) == 0 && mt_float_to_half(-0.0f) == 0x8000);
  CHECK(mt_float_to_half(0x1p-24f) == 0x0001);   /* smallest subnormal */
  CHECK(mt_float_to_half(0x1p-25f) == 0x0000);   /* tie with zero */
  CHECK(mt_float_to_half(-0x1p-25f) == 0x8000);
  CHECK(mt_float_to_half(0x1.000002p-25f) == 0x0001);
  CHECK(mt_float_to_half(3 * 0x1p-25f) == 0x0002);   /* tie between 1 and 2 */
  CHECK(mt_float_to_half(5 * 0x1p-25f) == 0x0002);   /* tie between 2 and 3 */
  CHECK(mt_float_to_half(0x1p-14f) == 0x0400);       /* smallest normal */
  CHECK(mt_float_to_half(0x1p-14f - 0x1p-25f) == 0x0400); /* tie 0x3ff/0x400 */
  CHECK(mt_float_to_half(0x1p-14f - 3 * 0x1p-25f) == 0x03fe);
  CHECK(mt_float_to_half(1e-45f) == 0x0000);         /* float subnormal */
  CHECK(mt_float_to_half(0.1f) == 0x2e66);
  CHECK(half_is_nan(mt_float_to_half(NAN)));
  CHECK(half_is_nan(f2h_bits(0x7f800001u)));         /* payload below half's bits */
  CHECK(half_is_nan(f2h_bits(0xff800001u)) && (f2h_bits(0xff800001u) & 0x8000));
  CHECK(isnan(mt_half_to_float(0x7c01)) && isinf(mt_half_to_float(0x7c00)));
  CHECK(mt_half_to_float(0x0001) == 0x1p-24f && mt_half_to_float(0x03ff) == 0x3ffp-24f);
  CHECK(mt_half_to_float(0x7bff) == 65504.0f && mt_half_to_float(0xc000) == -2.0f);
}

static int check_f2h(float f) {
  uint16_t got = mt_float_to_half(f), want = ref_float_to_half(f);
  if (isnan(f)) return half_is_nan(got) && (!signbit(f) == !(got & 0x8000));
  return got == want;
}

/* Every midpoint between adjacent halves and its two float neighbours (where
 * ties and carries live), then a sweep over all float bit patterns. */
static void test_half_rounding_sweep(void) {
  int bad = 0;
  for (uint16_t h = 0; h < 0x7c00; ++h) {
    float mid = (float)((rounding_value(h) + rounding_value((uint16_t)(h + 1))) / 2);
    const float probes[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
    for (int i = 0; i < 3; ++i) bad += !check_f2h(probes[i]) + !check_f2h(-probes[i]);
  }
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4099) {
    float f;
    uint32_t b = (uint32_t)bits;
    memcpy(&f, &b, sizeof f);
    bad += !check_f2h(f);
  }
  CHECK_MSG(bad == 0, "%d floats round to the wrong half", bad);
}

/* ---- bfloat16: a float's upper half, rounded by comparing distances in double ---- */

static float bf16_value(uint32_t pattern) {
  uint32_t bits = pattern << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* The nearest bfloat16 to a non-NaN `f`: one of the two patterns around it (the
 * one above may be inf, which stands at 2^128 for rounding), ties to even. */
static uint16_t ref_float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = x & 0x80000000u, lo = (x & 0x7fffffffu) >> 16, hi = lo + 1;
  double a = fabs((double)f), vlo = bf16_value(lo);
  double vhi = hi == 0x7f80u ? ldexp(1.0, 128) : (double)bf16_value(hi);
  if (a == vlo || lo == 0x7f80u) return (uint16_t)((sign >> 16) | lo);
  double dlo = a - vlo, dhi = vhi - a;
  uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return (uint16_t)((sign >> 16) | pick);
}

static void test_bf16_conversions(void) {
  int bad_trip = 0, bad_round = 0;
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    float f = mt_bfloat16_to_float((uint16_t)b);
    if (isnan(f)) {
      bad_trip += !isnan(mt_bfloat16_to_float(mt_float_to_bfloat16(f)));
      continue;
    }
    bad_trip += mt_float_to_bfloat16(f) != b;
  }
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 997) {
    float f;
    uint32_t x = (uint32_t)bits;
    memcpy(&f, &x, sizeof f);
    uint16_t got = mt_float_to_bfloat16(f);
    if (isnan(f)) bad_round += !isnan(mt_bfloat16_to_float(got)) || (got >> 15) != (x >> 31);
    else bad_round += got != ref_float_to_bf16(f);
  }
  CHECK_MSG(bad_trip == 0, "%d bfloat16 values do not round-trip", bad_trip);
  CHECK_MSG(bad_round == 0, "%d floats round to the wrong bfloat16", bad_round);
  CHECK(mt_float_to_bfloat16(1.0f) == 0x3f80);
  CHECK(mt_float_to_bfloat16(1.0f + 0x1p-8f) == 0x3f80);       /* tie, even is down */
  CHECK(mt_float_to_bfloat16(1.0f + 3 * 0x1p-8f) == 0x3f82);   /* tie, even is up */
  CHECK(mt_float_to_bfloat16(0x1.ffp127f) == 0x7f80);         /* rounds up to inf */
  CHECK(mt_float_to_bfloat16(-INFINITY) == 0xff80);
  uint32_t nan_bits = 0x7f800001u; /* a payload only in the dropped bits */
  float nan_low;
  memcpy(&nan_low, &nan_bits, sizeof nan_low);
  CHECK(isnan(mt_bfloat16_to_float(mt_float_to_bfloat16(nan_low))));
}

/* ---- Box copies ---- */

/* Copies element by element, each one located by its own index arithmetic. */
static void naive_copy(const char *src, const int64_t *sshape, const int64_t *soff,
                       char *dst, const int64_t *dshape, const int64_t *doff,
                       const mt_box *box, int64_t itemsize) {
  int64_t numel = mt_box_numel(box);
  for (int64_t e = 0; e < numel; ++e) {
    int64_t rest = e, si = 0, di = 0, sstride = 1, dstride = 1;
    for (int d = box->ndim - 1; d >= 0; --d) {
      int64_t i = rest % box->shape[d];
      rest /= box->shape[d];
      si += (soff[d] + i) * sstride;
      di += (doff[d] + i) * dstride;
      sstride *= sshape[d];
      dstride *= dshape[d];
    }
    memcpy(dst + di * itemsize, src + si * itemsize, (size_t)itemsize);
  }
}

static int64_t numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

static void fill_random(char *p, int64_t bytes, uint64_t *rng) {
  for (int64_t i = 0; i < bytes; ++i) p[i] = (char)(next_u64(rng) & 0x7f);
}

/* One dim of a random case: whole (mergeable), a single index, or a general
 * slice of both arrays; 0 extents are rare so most cases move data. */
static void random_dim(uint64_t *rng, int64_t *box, int64_t *s, int64_t *so,
                       int64_t *dd, int64_t *dof) {
  int64_t mode = below(rng, 8);
  if (mode < 3) {
    *box = *s = *dd = 1 + below(rng, 5);
    *so = *dof = 0;
    return;
  }
  *box = mode == 3 ? 1 : (below(rng, 40) == 0 ? 0 : 1 + below(rng, 5));
  *s = *box + below(rng, 4);
  *dd = *box + below(rng, 4);
  *so = below(rng, *s - *box + 1);
  *dof = below(rng, *dd - *box + 1);
}

/* Returns 1 when mt_copy_box and the naive copy leave identical destinations
 * (the whole array is compared, so stray writes outside the box show up). */
static int random_copy_case(uint64_t *rng, int64_t itemsize) {
  mt_box box;
  memset(&box, 0, sizeof box);
  box.ndim = (int)below(rng, 5);
  int64_t ss[MT_MAX_NDIM], so[MT_MAX_NDIM], ds[MT_MAX_NDIM], dof[MT_MAX_NDIM];
  for (int d = 0; d < box.ndim; ++d)
    random_dim(rng, &box.shape[d], &ss[d], &so[d], &ds[d], &dof[d]);
  int64_t sbytes = numel_of(box.ndim, ss) * itemsize;
  int64_t dbytes = numel_of(box.ndim, ds) * itemsize;
  /* Exact sizes, so valgrind sees any access past either array. */
  char *src = malloc(sbytes > 0 ? (size_t)sbytes : 1);
  char *dst = malloc(dbytes > 0 ? (size_t)dbytes : 1);
  char *ref = malloc(dbytes > 0 ? (size_t)dbytes : 1);
  if (src == NULL || dst == NULL || ref == NULL) {
    free(src);
    free(dst);
    free(ref);
    return 0;
  }
  fill_random(src, sbytes, rng);
  fill_random(dst, dbytes, rng);
  memcpy(ref, dst, (size_t)dbytes);
  mt_copy_box(src, ss, so, dst, ds, dof, &box, itemsize);
  naive_copy(src, ss, so, ref, ds, dof, &box, itemsize);
  int same = memcmp(dst, ref, (size_t)dbytes) == 0;
  free(src);
  free(dst);
  free(ref);
  return same;
}

static void test_copy_random(void) {
  static const int64_t itemsizes[] = {1, 2, 4, 8, 16, 3, 12};
  uint64_t rng = 12345;
  for (int c = 0; c < 6000; ++c) {
    int64_t itemsize = itemsizes[c % 7];
    CHECK_MSG(random_copy_case(&rng, itemsize), "case %d (itemsize %lld)", c,
              (long long)itemsize);
  }
}

/* A 2-d copy of int32s through mt_copy_box, checked against naive_copy. */
static int copy_2d(int64_t r, int64_t c, const int64_t *sshape, const int64_t *soff,
                   const int64_t *dshape, const int64_t *doff) {
  mt_box box = {.ndim = 2, .shape = {r, c}};
  int32_t src[64], dst[64], ref[64];
  for (int i = 0; i < 64; ++i) src[i] = i, dst[i] = ref[i] = -1;
  mt_copy_box(src, sshape, soff, dst, dshape, doff, &box, 4);
  naive_copy((const char *)src, sshape, soff, (char *)ref, dshape, doff, &box, 4);
  return memcmp(dst, ref, sizeof dst) == 0;
}

static void test_copy_cases(void) {
  /* Whole rows: rows 2..4 of an 8x8 array into a 3x8 one. */
  CHECK(copy_2d(3, 8, (const int64_t[]){8, 8}, (const int64_t[]){2, 0},
                (const int64_t[]){3, 8}, (const int64_t[]){0, 0}));
  /* A column block, as in a gather along the inner dim, and back. */
  CHECK(copy_2d(8, 2, (const int64_t[]){8, 8}, (const int64_t[]){0, 4},
                (const int64_t[]){8, 2}, (const int64_t[]){0, 0}));
  CHECK(copy_2d(8, 2, (const int64_t[]){8, 2}, (const int64_t[]){0, 0},
                (const int64_t[]){8, 8}, (const int64_t[]){0, 6}));
  /* A single column (one-element runs) and a single element. */
  CHECK(copy_2d(8, 1, (const int64_t[]){8, 8}, (const int64_t[]){0, 3},
                (const int64_t[]){8, 4}, (const int64_t[]){0, 1}));
  CHECK(copy_2d(1, 1, (const int64_t[]){8, 8}, (const int64_t[]){7, 7},
                (const int64_t[]){2, 2}, (const int64_t[]){0, 1}));

  /* 0-d: one element. */
  mt_box scalar = {.ndim = 0};
  double x = 2.5, y = 0.0;
  mt_copy_box(&x, NULL, NULL, &y, NULL, NULL, &scalar, sizeof x);
  CHECK(y == 2.5);

  /* A 0 extent copies nothing, even with NULL buffers. */
  mt_box empty = {.ndim = 2, .shape = {0, 3}};
  const int64_t shape[2] = {0, 3}, off[2] = {0, 0};
  mt_copy_box(NULL, shape, off, NULL, shape, off, &empty, 8);
  CHECK(1);

  /* extent->offset is ignored. */
  mt_box shifted = {.ndim = 1, .offset = {1000}, .shape = {2}};
  int16_t a[4] = {1, 2, 3, 4}, b[2] = {0, 0};
  mt_copy_box(a, (const int64_t[]){4}, (const int64_t[]){1}, b, (const int64_t[]){2},
              (const int64_t[]){0}, &shifted, 2);
  CHECK(b[0] == 2 && b[1] == 3);
}

/* mt_copy_bytes around every size where its method changes (memcpy's own paths,
 * streaming stores from 16 MiB) and at every alignment of source and
 * destination; the bytes around the destination stay untouched. */
static void test_copy_bytes_sizes(void) {
  static const int64_t sizes[] = {0,    1,    15,   63,   64,    127,   128,
                                  255,  256,  1023, 1024, 1025,  1151,  4095,  4096,
                                  4133, 65536, 65599, ((int64_t)16 << 20) - 1,
                                  (int64_t)16 << 20, ((int64_t)16 << 20) + 77};
  static const int64_t shifts[][2] = {{0, 0}, {1, 0}, {0, 1}, {3, 17}, {31, 5}, {16, 32}};
  const int64_t guard = 64, most = ((int64_t)16 << 20) + 77 + 64;
  char *src = malloc((size_t)most), *dst = malloc((size_t)(most + 2 * guard));
  char *ref = malloc((size_t)(most + 2 * guard));
  uint64_t rng = 777;
  if (src == NULL || dst == NULL || ref == NULL) {
    CHECK(0);
  } else {
    fill_random(src, most, &rng);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; ++i) {
      for (size_t k = 0; k < sizeof shifts / sizeof *shifts; ++k) {
        int64_t n = sizes[i], at = guard + shifts[k][1], span = at + n + guard;
        memset(dst, 0x5a, (size_t)span);
        memset(ref, 0x5a, (size_t)span);
        mt_copy_bytes(dst + at, src + shifts[k][0], n);
        if (n > 0) memcpy(ref + at, src + shifts[k][0], (size_t)n);
        CHECK_MSG(memcmp(dst, ref, (size_t)span) == 0,
                  "%lld bytes, shifts %lld/%lld", (long long)n, (long long)shifts[k][0],
                  (long long)shifts[k][1]);
      }
    }
  }
  free(src);
  free(dst);
  free(ref);
}

/* The streaming loop, where the CPU has AVX2, at every size around its 128-byte
 * turns and every alignment of the destination: the library picks it on AMD CPUs
 * only. */
static void test_copy_loop(void) {
  static const int64_t sizes[] = {1, 15, 63, 64, 65, 127, 128, 129, 255, 1000, 4099, 65537};
  static const int64_t shifts[][2] = {{0, 0}, {0, 1}, {5, 15}, {0, 16}, {3, 31}, {0, 33}};
  enum { GUARD = 64, MOST = 65537 + 64 };
  static char src[MOST], dst[MOST + 2 * GUARD], ref[MOST + 2 * GUARD];
  uint64_t rng = 99;
  fill_random(src, MOST, &rng);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  int avx2 = __builtin_cpu_supports("avx2");
#else
  int avx2 = 1; /* memcpy there */
#endif
  for (size_t i = 0; avx2 && i < sizeof sizes / sizeof *sizes; ++i) {
    for (size_t k = 0; k < sizeof shifts / sizeof *shifts; ++k) {
      int64_t n = sizes[i], at = GUARD + shifts[k][1];
      memset(dst, 0x33, sizeof dst);
      memset(ref, 0x33, sizeof ref);
      mt__copy_run_stream(dst + at, src + shifts[k][0], n);
      memcpy(ref + at, src + shifts[k][0], (size_t)n);
      CHECK_MSG(memcmp(dst, ref, sizeof dst) == 0, "%lld bytes, shifts %lld/%lld",
                (long long)n, (long long)shifts[k][0], (long long)shifts[k][1]);
    }
  }
}

/* A column block of `rows` rows of `cols` elements placed into a destination of
 * `dcols` columns at column `at`, as an all-gather along an inner dim does:
 * whole destinations from 16 MiB are written with streaming stores, in runs
 * that suit them, or not. */
static int column_block_case(int64_t rows, int64_t cols, int64_t dcols, int64_t at,
                             int64_t itemsize, uint64_t *rng) {
  int64_t sbytes = rows * cols * itemsize, dbytes = rows * dcols * itemsize;
  /* The destination starts on a page, so that `at` alone decides its alignment. */
  size_t page = 4096, dalloc = ((size_t)dbytes + page - 1) / page * page;
  char *src = malloc((size_t)sbytes), *dst = aligned_alloc(page, dalloc);
  char *ref = malloc((size_t)dbytes);
  int same = 0;
  if (src != NULL && dst != NULL && ref != NULL) {
    fill_random(src, sbytes, rng);
    fill_random(dst, dbytes, rng);
    memcpy(ref, dst, (size_t)dbytes);
    mt_box box = {.ndim = 2, .shape = {rows, cols}};
    const int64_t sshape[2] = {rows, cols}, soff[2] = {0, 0};
    const int64_t dshape[2] = {rows, dcols}, doff[2] = {0, at};
    mt_copy_box(src, sshape, soff, dst, dshape, doff, &box, itemsize);
    naive_copy(src, sshape, soff, ref, dshape, doff, &box, itemsize);
    same = memcmp(dst, ref, (size_t)dbytes) == 0;
  }
  free(src);
  free(dst);
  free(ref);
  return same;
}

static void test_copy_column_blocks(void) {
  uint64_t rng = 4242;
  /* {rows, cols, dcols, at, itemsize}, into 16+ MiB unless said: 1 KiB runs of
   * whole aligned vectors (streamed), the same into 4 MiB (not streamed), 4 KiB
   * runs of whole aligned vectors (not streamed), odd 300-byte and 100-byte runs
   * (not streamed), 2 KiB runs into 2 MiB, 4 KiB+ runs off any 32-byte boundary
   * (too short to stream there), 64 KiB runs and a little longer off any 32-byte
   * boundary (streamed), 1 MiB+ runs there (not streamed), and runs that start
   * off any 32-byte boundary. */
  static const int64_t cases[][5] = {
      {8192, 128, 256, 128, 8},  {2048, 128, 256, 128, 8},  {2048, 512, 1024, 512, 8},
      {8192, 75, 700, 3, 4},     {41944, 25, 100, 50, 4},   {512, 256, 512, 256, 8},
      {16411, 33, 130, 97, 8},   {2048, 520, 1100, 3, 8},   {128, 8192, 16400, 3, 8},
      {130, 8193, 16500, 1, 8},  {17, 131073, 131100, 1, 8}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
    const int64_t *c = cases[i];
    CHECK_MSG(column_block_case(c[0], c[1], c[2], c[3], c[4], &rng), "case %zu", i);
  }
}

/* ---- Reductions ---- */

static int is_signed_int(int dtype) {
  return dtype >= MT_DTYPE_INT8 && dtype <= MT_DTYPE_INT64;
}

/* An integer element as 64 bits: sign-extended for signed types, zero-extended
 * for unsigned ones. */
static uint64_t get_int(const void *p, int dtype, int64_t i) {
  switch (dtype) {
    case MT_DTYPE_INT8: return (uint64_t)(int64_t)((const int8_t *)p)[i];
    case MT_DTYPE_INT16: return (uint64_t)(int64_t)((const int16_t *)p)[i];
    case MT_DTYPE_INT32: return (uint64_t)(int64_t)((const int32_t *)p)[i];
    case MT_DTYPE_INT64: return (uint64_t)((const int64_t *)p)[i];
    case MT_DTYPE_UINT8: return ((const uint8_t *)p)[i];
    case MT_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case MT_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    default: return ((const uint64_t *)p)[i];
  }
}

/* Stores the low bits of `v` (conversion to a signed type keeps them on every
 * compiler we target). */
static void set_int(void *p, int dtype, int64_t i, uint64_t v) {
  switch (dtype) {
    case MT_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case MT_DTYPE_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
    case MT_DTYPE_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case MT_DTYPE_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case MT_DTYPE_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case MT_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; break;
    case MT_DTYPE_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    default: ((uint64_t *)p)[i] = v; break;
  }
}

/* The value `v` takes once wrapped into `dtype`. */
static uint64_t wrap(int dtype, uint64_t v) {
  uint64_t tmp = 0;
  set_int(&tmp, dtype, 0, v);
  return get_int(&tmp, dtype, 0);
}

static uint64_t ref_int(int dtype, int op, uint64_t x, uint64_t y) {
  int lt = is_signed_int(dtype) ? (int64_t)x < (int64_t)y : x < y;
  switch (op) {
    case MT_REDUCE_SUM:
    case MT_REDUCE_AVG: return wrap(dtype, x + y);
    case MT_REDUCE_PRODUCT: return wrap(dtype, x * y);
    case MT_REDUCE_MAX: return lt ? y : x;
    default: return lt ? x : y;
  }
}

/* An edge value (0, +-1, the extremes) or a random one, wrapped into `dtype`. */
static uint64_t random_int(uint64_t *rng, int dtype) {
  int bits = (int)mt_dtype_size(dtype) * 8;
  uint64_t top = (uint64_t)1 << (bits - 1);
  const uint64_t edges[6] = {0, 1, (uint64_t)-1, top, top - 1, 2};
  int64_t pick = below(rng, 10);
  return wrap(dtype, pick < 6 ? edges[pick] : next_u64(rng));
}

static void test_reduce_ints_random(void) {
  uint64_t rng = 777;
  enum { N = 257 };
  for (int dtype = MT_DTYPE_INT8; dtype <= MT_DTYPE_UINT64; ++dtype) {
    for (int op = 0; op < MT_REDUCE_COUNT; ++op) {
      uint64_t a[N], b[N], want[N]; /* 8 bytes per element is room for any */
      for (int64_t i = 0; i < N; ++i) {
        uint64_t x = random_int(&rng, dtype), y = random_int(&rng, dtype);
        set_int(a, dtype, i, x);
        set_int(b, dtype, i, y);
        want[i] = ref_int(dtype, op, x, y);
      }
      CHECK(mt_reduce(a, b, N, dtype, op, NULL) == MT_OK);
      int bad = 0;
      for (int64_t i = 0; i < N; ++i) bad += get_int(a, dtype, i) != want[i];
      CHECK_MSG(bad == 0, "%s op %d: %d wrong", mt_dtype_name(dtype), op, bad);
    }
  }
}

/* One element `x (op) y` through mt_reduce, as raw 64-bit. */
static uint64_t reduce1(int dtype, int op, uint64_t x, uint64_t y) {
  uint64_t a = 0, b = 0;
  set_int(&a, dtype, 0, x);
  set_int(&b, dtype, 0, y);
  if (mt_reduce(&a, &b, 1, dtype, op, NULL) != MT_OK) return 0xdeadbeef;
  return get_int(&a, dtype, 0);
}

static void test_reduce_ints_wrap(void) {
  const int S = MT_REDUCE_SUM, P = MT_REDUCE_PRODUCT;
  CHECK((int64_t)reduce1(MT_DTYPE_INT8, S, 100, 100) == -56);
  CHECK((int64_t)reduce1(MT_DTYPE_INT8, S, (uint64_t)-128, (uint64_t)-1) == 127);
  CHECK((int64_t)reduce1(MT_DTYPE_INT8, P, 16, 16) == 0);
  CHECK((int64_t)reduce1(MT_DTYPE_INT8, P, 11, 13) == -113);
  CHECK((int64_t)reduce1(MT_DTYPE_INT8, P, (uint64_t)-128, (uint64_t)-1) == -128);
  CHECK(reduce1(MT_DTYPE_UINT8, S, 200, 100) == 44);
  CHECK((int64_t)reduce1(MT_DTYPE_INT16, P, 300, 300) == 24464);
  CHECK(reduce1(MT_DTYPE_UINT16, P, 65535, 65535) == 1);
  CHECK((int64_t)reduce1(MT_DTYPE_INT32, S, INT32_MAX, 1) == INT32_MIN);
  CHECK((int64_t)reduce1(MT_DTYPE_INT32, P, 65536, 65536) == 0);
  CHECK(reduce1(MT_DTYPE_UINT32, P, UINT32_MAX, UINT32_MAX) == 1);
  CHECK((int64_t)reduce1(MT_DTYPE_INT64, S, INT64_MAX, 1) == INT64_MIN);
  CHECK((int64_t)reduce1(MT_DTYPE_INT64, P, INT64_MAX, 2) == -2);
  CHECK((int64_t)reduce1(MT_DTYPE_INT64, P, (uint64_t)INT64_MIN, (uint64_t)-1) ==
        INT64_MIN);
  CHECK(reduce1(MT_DTYPE_UINT64, P, UINT64_MAX, UINT64_MAX) == 1);
  CHECK(reduce1(MT_DTYPE_UINT64, MT_REDUCE_MAX, UINT64_MAX, 1) == UINT64_MAX);
  CHECK((int64_t)reduce1(MT_DTYPE_INT64, MT_REDUCE_MIN, (uint64_t)-5, 3) == -5);
  CHECK((int64_t)reduce1(MT_DTYPE_INT8, MT_REDUCE_MAX, (uint64_t)-5, 3) == 3);
}

static const double specials[] = {0.0, -0.0, 1.0, -1.5, 3.25, 1e30, -1e-30,
                                  INFINITY, -INFINITY, NAN, 7.0, -2.0};

static double random_double(uint64_t *rng) {
  int64_t pick = below(rng, 16);
  if (pick < 12) return specials[pick];
  return ((double)below(rng, 2000001) - 1e6) / 1024.0;
}

/* The reference outcome of `x (op) y`: NaN whenever either side is, for max and
 * min too (numpy.maximum, not fmax). */
static double ref_real(int op, double x, double y) {
  switch (op) {
    case MT_REDUCE_SUM:
    case MT_REDUCE_AVG: return x + y;
    case MT_REDUCE_PRODUCT: return x * y;
    default:
      if (isnan(x) || isnan(y)) return NAN;
      return op == MT_REDUCE_MAX ? (x > y ? x : y) : (x < y ? x : y);
  }
}

static int same_real(double got, double want) {
  return isnan(want) ? isnan(got) : got == want;
}

static void test_reduce_floats(void) {
  uint64_t rng = 99;
  enum { N = 300 };
  for (int op = 0; op < MT_REDUCE_COUNT; ++op) {
    float a32[N], b32[N], w32[N];
    double a64[N], b64[N], w64[N];
    for (int i = 0; i < N; ++i) {
      a64[i] = random_double(&rng);
      b64[i] = random_double(&rng);
      a32[i] = (float)a64[i];
      b32[i] = (float)b64[i];
      w64[i] = ref_real(op, a64[i], b64[i]);
      /* float arithmetic, not double rounded to float. */
      w32[i] = op == MT_REDUCE_PRODUCT ? a32[i] * b32[i]
               : op <= MT_REDUCE_AVG   ? a32[i] + b32[i]
                                       : (float)ref_real(op, a32[i], b32[i]);
    }
    CHECK(mt_reduce(a32, b32, N, MT_DTYPE_FLOAT32, op, NULL) == MT_OK);
    CHECK(mt_reduce(a64, b64, N, MT_DTYPE_FLOAT64, op, NULL) == MT_OK);
    int bad = 0;
    for (int i = 0; i < N; ++i)
      bad += !same_real(a32[i], w32[i]) + !same_real(a64[i], w64[i]);
    CHECK_MSG(bad == 0, "float op %d: %d wrong", op, bad);
  }
  /* NaN in either position wins, like numpy.maximum(1, nan). */
  double x[2] = {1.0, NAN}, y[2] = {NAN, 1.0};
  CHECK(mt_reduce(x, y, 2, MT_DTYPE_FLOAT64, MT_REDUCE_MAX, NULL) == MT_OK);
  CHECK(isnan(x[0]) && isnan(x[1]));
  float u[2] = {1.0f, NAN}, v[2] = {NAN, 1.0f};
  CHECK(mt_reduce(u, v, 2, MT_DTYPE_FLOAT32, MT_REDUCE_MIN, NULL) == MT_OK);
  CHECK(isnan(u[0]) && isnan(u[1]));
}

/* A 2-byte float type's every reduce op on random bit patterns (NaN and inf
 * included) against the reference: both operands widened to float, the result
 * rounded back by `narrow`. */
static void sweep_narrow(int dtype, const char *name, uint64_t seed,
                         float (*widen)(uint16_t), uint16_t (*narrow)(float)) {
  enum { N = 5000 };
  static uint16_t a[N], b[N], want[N];
  for (int op = 0; op < MT_REDUCE_COUNT; ++op) {
    for (int i = 0; i < N; ++i) {
      a[i] = (uint16_t)next_u64(&seed);
      b[i] = i % 3 == 0 ? (uint16_t)(a[i] ^ 0x8000) : (uint16_t)next_u64(&seed);
      float x = widen(a[i]), y = widen(b[i]);
      float r = op == MT_REDUCE_PRODUCT ? x * y
                : op <= MT_REDUCE_AVG   ? x + y
                                        : (float)ref_real(op, x, y);
      want[i] = narrow(r);
    }
    CHECK(mt_reduce(a, b, N, dtype, op, NULL) == MT_OK);
    int bad = 0;
    for (int i = 0; i < N; ++i) {
      float got = widen(a[i]), w = widen(want[i]);
      if (isnan(w)) bad += !isnan(got);
      else if (op >= MT_REDUCE_MAX) bad += got != w;
      else bad += a[i] != want[i];
    }
    CHECK_MSG(bad == 0, "%s op %d: %d wrong", name, op, bad);
  }
}

static uint16_t ref_bf16_or_nan(float f) { return isnan(f) ? 0x7fc0 : ref_float_to_bf16(f); }

static void test_reduce_half(void) {
  sweep_narrow(MT_DTYPE_FLOAT16, "float16", 4242, mt_half_to_float, mt_float_to_half);
  /* 2048 + 1 is a tie in float16 and stays 2048; 2048 + 3 rounds up to 2052. */
  uint16_t s[2] = {mt_float_to_half(2048.0f), mt_float_to_half(2048.0f)};
  uint16_t t[2] = {mt_float_to_half(1.0f), mt_float_to_half(3.0f)};
  CHECK(mt_reduce(s, t, 2, MT_DTYPE_FLOAT16, MT_REDUCE_SUM, NULL) == MT_OK);
  CHECK(mt_half_to_float(s[0]) == 2048.0f && mt_half_to_float(s[1]) == 2052.0f);
  uint16_t big = mt_float_to_half(60000.0f), two = mt_float_to_half(2.0f);
  CHECK(mt_reduce(&big, &two, 1, MT_DTYPE_FLOAT16, MT_REDUCE_PRODUCT, NULL) == MT_OK);
  CHECK(big == 0x7c00);
}

/* Sums as torch's collectives make them: in float, rounded at each step. */
static void test_reduce_bf16(void) {
  sweep_narrow(MT_DTYPE_BFLOAT16, "bfloat16", 77, mt_bfloat16_to_float, ref_bf16_or_nan);
  /* 256 + 1 is a tie in bfloat16 and stays 256; 256 + 3 rounds up to 260. */
  uint16_t s[2] = {mt_float_to_bfloat16(256.0f), mt_float_to_bfloat16(256.0f)};
  uint16_t t[2] = {mt_float_to_bfloat16(1.0f), mt_float_to_bfloat16(3.0f)};
  CHECK(mt_reduce(s, t, 2, MT_DTYPE_BFLOAT16, MT_REDUCE_SUM, NULL) == MT_OK);
  CHECK(mt_bfloat16_to_float(s[0]) == 256.0f && mt_bfloat16_to_float(s[1]) == 260.0f);
  uint16_t d[2] = {mt_float_to_bfloat16(1.0f), mt_float_to_bfloat16(-6.0f)};
  CHECK(mt_divide(d, 2, MT_DTYPE_BFLOAT16, 3, NULL) == MT_OK);
  CHECK(d[0] == mt_float_to_bfloat16(1.0f / 3.0f) && mt_bfloat16_to_float(d[1]) == -2.0f);
}

static void test_reduce_complex(void) {
  double a[6] = {1, 2, -3, 0.5, 0, 1}, b[6] = {3, -4, 2, 2, 0, 1};
  double want_prod[6] = {1 * 3 - 2 * -4, 1 * -4 + 2 * 3, -3 * 2 - 0.5 * 2,
                         -3 * 2 + 0.5 * 2, -1, 0};
  double c[6];
  memcpy(c, a, sizeof c);
  CHECK(mt_reduce(c, b, 3, MT_DTYPE_COMPLEX128, MT_REDUCE_PRODUCT, NULL) == MT_OK);
  CHECK(memcmp(c, want_prod, sizeof c) == 0);
  memcpy(c, a, sizeof c);
  CHECK(mt_reduce(c, b, 3, MT_DTYPE_COMPLEX128, MT_REDUCE_SUM, NULL) == MT_OK);
  for (int i = 0; i < 6; ++i) CHECK(c[i] == a[i] + b[i]);

  float f[4] = {1.5f, -2, 0.25f, 4}, g[4] = {2, 3, -1, 0.5f};
  float want_f[4] = {1.5f * 2 - -2.0f * 3, 1.5f * 3 + -2.0f * 2, 0.25f * -1 - 4 * 0.5f,
                     0.25f * 0.5f + 4 * -1.0f};
  CHECK(mt_reduce(f, g, 2, MT_DTYPE_COMPLEX64, MT_REDUCE_PRODUCT, NULL) == MT_OK);
  CHECK(memcmp(f, want_f, sizeof f) == 0);
  CHECK(mt_reduce(f, g, 2, MT_DTYPE_COMPLEX64, MT_REDUCE_AVG, NULL) == MT_OK);
  CHECK(f[0] == want_f[0] + 2 && f[3] == want_f[3] + 0.5f);

  /* No order on complex numbers: an error with a sentence, buffer untouched. */
  for (int op = MT_REDUCE_MAX; op <= MT_REDUCE_MIN; ++op) {
    for (int dt = MT_DTYPE_COMPLEX64; dt <= MT_DTYPE_COMPLEX128; ++dt) {
      mt_error err = {0, ""};
      memcpy(c, a, sizeof c);
      CHECK(mt_reduce(c, b, 1, dt, op, &err) == MT_ETYPE);
      CHECK(err.code == MT_ETYPE && strlen(err.msg) > 10);
      CHECK(memcmp(c, a, sizeof c) == 0);
    }
  }
}

static void test_reduce_bool(void) {
  const uint8_t x[6] = {0, 0, 1, 1, 2, 0}, y[6] = {0, 1, 0, 1, 255, 7};
  const uint8_t or_[6] = {0, 1, 1, 1, 1, 1}, and_[6] = {0, 0, 0, 1, 1, 0};
  for (int op = 0; op < MT_REDUCE_COUNT; ++op) {
    uint8_t a[6];
    memcpy(a, x, sizeof a);
    CHECK(mt_reduce(a, y, 6, MT_DTYPE_BOOL, op, NULL) == MT_OK);
    int is_and = op == MT_REDUCE_PRODUCT || op == MT_REDUCE_MIN;
    CHECK_MSG(memcmp(a, is_and ? and_ : or_, sizeof a) == 0, "bool op %d", op);
  }
}

static void test_reduce_errors(void) {
  double a[2] = {1, 2}, b[2] = {3, 4};
  mt_error err = {0, ""};
  CHECK(mt_reduce(a, b, 2, MT_DTYPE_COUNT, MT_REDUCE_SUM, &err) == MT_ETYPE);
  CHECK(err.code == MT_ETYPE && err.msg[0] != '\0');
  CHECK(mt_reduce(a, b, 2, -1, MT_REDUCE_SUM, &err) == MT_ETYPE);
  CHECK(mt_reduce(a, b, 2, MT_DTYPE_FLOAT64, MT_REDUCE_COUNT, &err) == MT_EINVAL);
  CHECK(mt_reduce(a, b, 2, MT_DTYPE_FLOAT64, -1, &err) == MT_EINVAL);
  CHECK(mt_reduce(a, b, -1, MT_DTYPE_FLOAT64, MT_REDUCE_SUM, &err) == MT_EINVAL);
  CHECK(mt_reduce(NULL, b, 2, MT_DTYPE_FLOAT64, MT_REDUCE_SUM, NULL) == MT_EINVAL);
  CHECK(a[0] == 1 && a[1] == 2);
  CHECK(mt_reduce(NULL, NULL, 0, MT_DTYPE_FLOAT64, MT_REDUCE_SUM, &err) == MT_OK);
}

/* ---- Division ---- */

static void test_divide(void) {
  int8_t i8[7] = {-7, 7, -6, 0, -128, 127, -1};
  const int8_t i8_want[7] = {-4, 3, -3, 0, -64, 63, -1};
  CHECK(mt_divide(i8, 7, MT_DTYPE_INT8, 2, NULL) == MT_OK);
  CHECK(memcmp(i8, i8_want, sizeof i8) == 0);
  int64_t i64[4] = {INT64_MIN, INT64_MAX, -3, -4};
  CHECK(mt_divide(i64, 4, MT_DTYPE_INT64, 3, NULL) == MT_OK);
  CHECK(i64[0] == INT64_MIN / 3 - 1 && i64[1] == INT64_MAX / 3);
  CHECK(i64[2] == -1 && i64[3] == -2);
  int32_t i32[3] = {-1, -2147483647 - 1, 5};
  CHECK(mt_divide(i32, 3, MT_DTYPE_INT32, 4, NULL) == MT_OK);
  CHECK(i32[0] == -1 && i32[1] == -536870912 && i32[2] == 1);
  uint8_t u8[3] = {255, 7, 0};
  CHECK(mt_divide(u8, 3, MT_DTYPE_UINT8, 2, NULL) == MT_OK);
  CHECK(u8[0] == 127 && u8[1] == 3 && u8[2] == 0);
  uint64_t u64 = UINT64_MAX;
  CHECK(mt_divide(&u64, 1, MT_DTYPE_UINT64, 3, NULL) == MT_OK);
  CHECK(u64 == UINT64_MAX / 3);

  float f32[2] = {1.0f, -7.0f};
  CHECK(mt_divide(f32, 2, MT_DTYPE_FLOAT32, 3, NULL) == MT_OK);
  CHECK(f32[0] == 1.0f / 3.0f && f32[1] == -7.0f / 3.0f);
  double f64[2] = {1.0, NAN};
  CHECK(mt_divide(f64, 2, MT_DTYPE_FLOAT64, 3, NULL) == MT_OK);
  CHECK(f64[0] == 1.0 / 3.0 && isnan(f64[1]));
  uint16_t h[3] = {mt_float_to_half(1.0f), mt_float_to_half(-6.0f), 0x7c00};
  CHECK(mt_divide(h, 3, MT_DTYPE_FLOAT16, 3, NULL) == MT_OK);
  CHECK(h[0] == mt_float_to_half(1.0f / 3.0f) && h[0] == 0x3555);
  CHECK(mt_half_to_float(h[1]) == -2.0f && h[2] == 0x7c00);
  float c64[2] = {3.0f, -1.5f};
  double c128[2] = {1.0, -9.0};
  CHECK(mt_divide(c64, 1, MT_DTYPE_COMPLEX64, 2, NULL) == MT_OK);
  CHECK(c64[0] == 1.5f && c64[1] == -0.75f);
  CHECK(mt_divide(c128, 1, MT_DTYPE_COMPLEX128, 3, NULL) == MT_OK);
  CHECK(c128[0] == 1.0 / 3.0 && c128[1] == -3.0);

  int64_t one[2] = {-5, 5};
  CHECK(mt_divide(one, 2, MT_DTYPE_INT64, 1, NULL) == MT_OK);
  CHECK(one[0] == -5 && one[1] == 5);
}

static void test_divide_errors(void) {
  mt_error err = {0, ""};
  uint8_t flags[2] = {1, 0};
  CHECK(mt_divide(flags, 2, MT_DTYPE_BOOL, 2, &err) == MT_ETYPE);
  CHECK(err.code == MT_ETYPE && err.msg[0] != '\0');
  CHECK(flags[0] == 1 && flags[1] == 0);
  double d[1] = {4.0};
  CHECK(mt_divide(d, 1, MT_DTYPE_FLOAT64, 0, &err) == MT_EINVAL);
  CHECK(mt_divide(d, 1, MT_DTYPE_FLOAT64, -2, &err) == MT_EINVAL);
  CHECK(err.code == MT_EINVAL && d[0] == 4.0);
  CHECK(mt_divide(d, 1, MT_DTYPE_COUNT, 2, &err) == MT_ETYPE);
  CHECK(mt_divide(d, -1, MT_DTYPE_FLOAT64, 2, &err) == MT_EINVAL);
  CHECK(mt_divide(NULL, 1, MT_DTYPE_FLOAT64, 2, NULL) == MT_EINVAL);
  CHECK(mt_divide(NULL, 0, MT_DTYPE_FLOAT64, 2, NULL) == MT_OK);
}

int main(void) {
  test_half_exhaustive();
  test_half_rounding_cases();
  test_half_rounding_sweep();
  test_copy_random();
  test_copy_cases();
  test_copy_bytes_sizes();
  test_copy_loop();
  test_copy_column_blocks();
  test_reduce_ints_random();
  test_reduce_ints_wrap();
  test_reduce_floats();
  test_reduce_half();
  test_bf16_conversions();
  test_reduce_bf16();
  test_reduce_complex();
  test_reduce_bool();
  test_reduce_errors();
  test_divide();
  test_divide_errors();
  return mt_test_exit("test_pack");
}
