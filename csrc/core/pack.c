/* Kernels on local buffers: the N-D box copy behind every pack and unpack, the
 * elementwise reductions behind Partial placements (float16 and bfloat16 included) and the
 * division that turns a sum into an average. Nothing here allocates or talks MPI. */
#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/pack.h"
#include "mpitensor/core/status.h"

/* ---- IEEE binary16 <-> binary32, by bit manipulation ---- */

/* Exact: every half is a float. NaN payloads move up unchanged, so a half that
 * goes to float and back keeps its bits. */
static inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (uint32_t)(h >> 10) & 0x1fu;
  uint32_t mant = (uint32_t)h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    /* A subnormal m * 2^-24: shift its leading one up to the implicit bit. */
    uint32_t e = 113u;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* m >> s rounded to nearest, ties to even; 1 <= s <= 31. */
static inline uint32_t shift_round_even(uint32_t m, unsigned s) {
  uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
  return q + (uint32_t)(rem > half || (rem == half && (q & 1u)));
}

/* The magnitude bits of `x` (sign cleared) as a half; a rounding carry may run
 * into the exponent, which is what makes 65520 round up to inf. */
static inline uint32_t half_magnitude(uint32_t x) {
  if (x > 0x7f800000u) {
    /* Keep NaN a NaN even when its payload lives only in the dropped bits. */
    uint32_t payload = (x & 0x7fffffu) >> 13;
    return 0x7c00u | (payload != 0 ? payload : 0x200u);
  }
  if (x >= 0x47800000u) return 0x7c00u; /* >= 65536, or inf */
  if (x >= 0x38800000u) return shift_round_even(x - 0x38000000u, 13);
  /* Below 2^-14 the half is subnormal, in units of 2^-24; 2^-25 and less round
   * to zero (2^-25 itself is a tie that goes to the even zero). */
  if (x <= 0x33000000u) return 0;
  return shift_round_even((x & 0x7fffffu) | 0x800000u, 126u - (x >> 23));
}

static inline uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return (uint16_t)(((x >> 16) & 0x8000u) | half_magnitude(x & 0x7fffffffu));
}

float mt_half_to_float(uint16_t h) { return half_to_float(h); }

uint16_t mt_float_to_half(float f) { return float_to_half(f); }

/* ---- bfloat16 <-> binary32: bfloat16 is a float32's upper 16 bits ---- */

static inline float bf16_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a
 * carry runs into the exponent (the largest finite values round up to inf). A
 * NaN gets the quiet bit, so a payload only in the dropped bits stays a NaN. */
static inline uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float mt_bfloat16_to_float(uint16_t b) { return bf16_to_float(b); }

uint16_t mt_float_to_bfloat16(float f) { return float_to_bf16(f); }

/* ---- N-D box copy ---- */

/* A box copy reduced to its essentials: `ndim` loops with byte strides in both
 * arrays around an innermost stretch of `run` contiguous bytes. */
typedef struct copy_loops {
  int ndim;
  int64_t run;
  int64_t dst_bytes; /* the whole destination array's */
  int64_t shape[MT_MAX_NDIM];
  int64_t sstride[MT_MAX_NDIM];
  int64_t dstride[MT_MAX_NDIM];
} copy_loops;

/* Copies `n` runs of `run` bytes, the i-th at d + i*ds from s + i*ss, into a
 * destination array of `dst_bytes` bytes. */
typedef void (*run_fn)(char *d, const char *s, int64_t n, int64_t ds, int64_t ss,
                       int64_t run, int64_t dst_bytes);

/* Runs of a fixed small size: memcpy with a constant size compiles to one load
 * and one store, where a call would cost more than the copy. */
#define MT__COPY_FIXED(N)                                                    \
  static void copy_runs_##N(char *d, const char *s, int64_t n, int64_t ds,   \
                            int64_t ss, int64_t run, int64_t dst_bytes) {    \
    (void)run, (void)dst_bytes;                                              \
    for (int64_t i = 0; i < n; ++i) memcpy(d + i * ds, s + i * ss, N);       \
  }
MT__COPY_FIXED(1)
MT__COPY_FIXED(2)
MT__COPY_FIXED(4)
MT__COPY_FIXED(8)
MT__COPY_FIXED(16)
#undef MT__COPY_FIXED

static void copy_runs_any(char *d, const char *s, int64_t n, int64_t ds, int64_t ss,
                          int64_t run, int64_t dst_bytes) {
  mt__copy_runs(d, s, n, ds, ss, run, dst_bytes);
}

static run_fn pick_run_fn(int64_t run) {
  switch (run) {
    case 1: return copy_runs_1;
    case 2: return copy_runs_2;
    case 4: return copy_runs_4;
    case 8: return copy_runs_8;
    case 16: return copy_runs_16;
    default: return copy_runs_any;
  }
}

/* Byte strides of a C-contiguous array; returns the byte offset of `off`. */
static int64_t c_strides(int ndim, const int64_t *shape, const int64_t *off,
                         int64_t itemsize, int64_t *stride) {
  int64_t step = itemsize, base = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    stride[d] = step;
    base += off[d] * step;
    step *= shape[d];
  }
  return base;
}

/* Drops dims of extent 1 (they only move the start), merges each dim into the
 * one outside it when the pair is one stretch of memory in both arrays (so a box
 * of whole rows becomes a single run), then peels off the contiguous innermost
 * dim as the run. */
static void simplify(copy_loops *L, int ndim, const int64_t *extent,
                     const int64_t *ss, const int64_t *ds, int64_t itemsize) {
  int k = 0;
  for (int d = 0; d < ndim; ++d) {
    if (extent[d] == 1) continue;
    if (k > 0 && L->sstride[k - 1] == extent[d] * ss[d] &&
        L->dstride[k - 1] == extent[d] * ds[d]) {
      L->shape[k - 1] *= extent[d];
    } else {
      L->shape[k++] = extent[d];
    }
    L->sstride[k - 1] = ss[d];
    L->dstride[k - 1] = ds[d];
  }
  L->run = itemsize;
  if (k > 0 && L->sstride[k - 1] == itemsize && L->dstride[k - 1] == itemsize) {
    L->run *= L->shape[--k];
  }
  L->ndim = k;
}

/* An odometer over all loops but the innermost, which the run function walks.
 * Offsets stay integers so no pointer is ever formed outside the arrays. */
static void run_loops(char *dst, const char *src, const copy_loops *L) {
  run_fn fn = pick_run_fn(L->run);
  if (L->ndim == 0) {
    fn(dst, src, 1, 0, 0, L->run, L->dst_bytes);
    return;
  }
  const int inner = L->ndim - 1;
  int64_t idx[MT_MAX_NDIM] = {0}, so = 0, dof = 0;
  for (;;) {
    fn(dst + dof, src + so, L->shape[inner], L->dstride[inner], L->sstride[inner],
       L->run, L->dst_bytes);
    int d = inner - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < L->shape[d]) {
        so += L->sstride[d];
        dof += L->dstride[d];
        break;
      }
      so -= L->sstride[d] * (L->shape[d] - 1);
      dof -= L->dstride[d] * (L->shape[d] - 1);
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

#ifndef NDEBUG
/* The box lies inside an array of `shape` when placed at `off`. */
static int box_fits(int ndim, const int64_t *extent, const int64_t *shape,
                    const int64_t *off) {
  for (int d = 0; d < ndim; ++d) {
    if (off[d] < 0 || extent[d] > shape[d] - off[d]) return 0;
  }
  return 1;
}
#endif

void mt_copy_box(const void *src, const int64_t *src_shape, const int64_t *src_off,
                 void *dst, const int64_t *dst_shape, const int64_t *dst_off,
                 const mt_box *extent, int64_t itemsize) {
  assert(extent != NULL && extent->ndim >= 0 && extent->ndim <= MT_MAX_NDIM);
  assert(itemsize > 0);
  const int ndim = extent->ndim;
  for (int d = 0; d < ndim; ++d) {
    if (extent->shape[d] == 0) return;
  }
  assert(box_fits(ndim, extent->shape, src_shape, src_off));
  assert(box_fits(ndim, extent->shape, dst_shape, dst_off));
  int64_t ss[MT_MAX_NDIM], ds[MT_MAX_NDIM];
  int64_t sbase = c_strides(ndim, src_shape, src_off, itemsize, ss);
  int64_t dbase = c_strides(ndim, dst_shape, dst_off, itemsize, ds);
  copy_loops L;
  simplify(&L, ndim, extent->shape, ss, ds, itemsize);
  L.dst_bytes = itemsize;
  for (int d = 0; d < ndim; ++d) L.dst_bytes *= dst_shape[d];
  run_loops((char *)dst + dbase, (const char *)src + sbase, &L);
}

/* ---- Elementwise reductions ---- */

typedef void (*reduce_fn)(void *inout, const void *in, int64_t n, int op);

/* Integers wrap like NumPy. The arithmetic is done in an unsigned type at least
 * as wide as int, so narrow operands never promote to int and overflow (UB); the
 * conversion back to a signed type keeps the low bits, as gcc and clang define. */
#define MT__INT_REDUCER(name, T, U)                                           \
  static void reduce_##name(void *inout, const void *in, int64_t n, int op) { \
    T *a = inout;                                                             \
    const T *b = in;                                                          \
    switch (op) {                                                             \
      case MT_REDUCE_SUM:                                                     \
      case MT_REDUCE_AVG:                                                     \
        for (int64_t i = 0; i < n; ++i) a[i] = (T)((U)a[i] + (U)b[i]);        \
        break;                                                                \
      case MT_REDUCE_PRODUCT:                                                 \
        for (int64_t i = 0; i < n; ++i) a[i] = (T)((U)a[i] * (U)b[i]);        \
        break;                                                                \
      case MT_REDUCE_MAX:                                                     \
        for (int64_t i = 0; i < n; ++i) a[i] = a[i] < b[i] ? b[i] : a[i];     \
        break;                                                                \
      default:                                                                \
        for (int64_t i = 0; i < n; ++i) a[i] = b[i] < a[i] ? b[i] : a[i];     \
        break;                                                                \
    }                                                                         \
  }
MT__INT_REDUCER(int8, int8_t, unsigned)
MT__INT_REDUCER(int16, int16_t, unsigned)
MT__INT_REDUCER(int32, int32_t, uint32_t)
MT__INT_REDUCER(int64, int64_t, uint64_t)
MT__INT_REDUCER(uint8, uint8_t, unsigned)
MT__INT_REDUCER(uint16, uint16_t, unsigned)
MT__INT_REDUCER(uint32, uint32_t, uint32_t)
MT__INT_REDUCER(uint64, uint64_t, uint64_t)
#undef MT__INT_REDUCER

/* The binary operation of each op on floats. MAX and MIN are numpy.maximum and
 * numpy.minimum: a NaN in either operand wins (the first one when both are). */
#define MT__ADD(x, y) ((x) + (y))
#define MT__MUL(x, y) ((x) * (y))
#define MT__MAX(x, y) (((x) >= (y) || isnan(x)) ? (x) : (y))
#define MT__MIN(x, y) (((x) <= (y) || isnan(x)) ? (x) : (y))
#define MT__FLOAT_OPS(X) \
  X(MT_REDUCE_SUM, MT__ADD) X(MT_REDUCE_PRODUCT, MT__MUL) \
  X(MT_REDUCE_MAX, MT__MAX) X(MT_REDUCE_MIN, MT__MIN)

#define MT__FLOAT_CASE(OP, F)                                  \
  case OP:                                                     \
    for (int64_t i = 0; i < n; ++i) a[i] = F(a[i], b[i]);      \
    break;
#define MT__FLOAT_REDUCER(name, T)                                            \
  static void reduce_##name(void *inout, const void *in, int64_t n, int op) { \
    T *a = inout;                                                             \
    const T *b = in;                                                          \
    switch (op == MT_REDUCE_AVG ? MT_REDUCE_SUM : op) {                       \
      MT__FLOAT_OPS(MT__FLOAT_CASE)                                           \
    }                                                                         \
  }
MT__FLOAT_REDUCER(float32, float)
MT__FLOAT_REDUCER(float64, double)
#undef MT__FLOAT_REDUCER
#undef MT__FLOAT_CASE

/* float16 as NumPy computes it: both operands widened to float, the operation
 * done in float, the result rounded to nearest even. float's 24 bits are enough
 * for this double rounding to give the correctly rounded half. bfloat16 the
 * same way, which is also how torch's collectives sum it (in float, rounded at
 * each step). */
#define MT__NARROW_CASE(OP, F)                                  \
  case OP:                                                      \
    for (int64_t i = 0; i < n; ++i) {                           \
      const float x = WIDEN(a[i]), y = WIDEN(b[i]);             \
      a[i] = NARROW(F(x, y));                                   \
    }                                                           \
    break;

#define WIDEN half_to_float
#define NARROW float_to_half
static void reduce_float16(void *inout, const void *in, int64_t n, int op) {
  uint16_t *a = inout;
  const uint16_t *b = in;
  switch (op == MT_REDUCE_AVG ? MT_REDUCE_SUM : op) { MT__FLOAT_OPS(MT__NARROW_CASE) }
}
#undef WIDEN
#undef NARROW

#define WIDEN bf16_to_float
#define NARROW float_to_bf16
static void reduce_bfloat16(void *inout, const void *in, int64_t n, int op) {
  uint16_t *a = inout;
  const uint16_t *b = in;
  switch (op == MT_REDUCE_AVG ? MT_REDUCE_SUM : op) { MT__FLOAT_OPS(MT__NARROW_CASE) }
}
#undef WIDEN
#undef NARROW
#undef MT__NARROW_CASE
#undef MT__FLOAT_OPS
#undef MT__ADD
#undef MT__MUL
#undef MT__MAX
#undef MT__MIN

/* Complex numbers are (re, im) pairs. The product is the textbook formula NumPy
 * uses, without C99 Annex G's recovery of infinities. MAX/MIN never get here. */
#define MT__COMPLEX_REDUCER(name, T)                                          \
  static void reduce_##name(void *inout, const void *in, int64_t n, int op) { \
    T *a = inout;                                                             \
    const T *b = in;                                                          \
    if (op != MT_REDUCE_PRODUCT) {                                            \
      for (int64_t i = 0; i < 2 * n; ++i) a[i] += b[i];                       \
      return;                                                                 \
    }                                                                         \
    for (int64_t i = 0; i < n; ++i) {                                         \
      const T ar = a[2 * i], ai = a[2 * i + 1];                               \
      const T br = b[2 * i], bi = b[2 * i + 1];                               \
      a[2 * i] = ar * br - ai * bi;                                           \
      a[2 * i + 1] = ar * bi + ai * br;                                       \
    }                                                                         \
  }
MT__COMPLEX_REDUCER(complex64, float)
MT__COMPLEX_REDUCER(complex128, double)
#undef MT__COMPLEX_REDUCER

/* Any nonzero byte is true; results are 0 or 1, as NumPy stores them. */
static void reduce_bool(void *inout, const void *in, int64_t n, int op) {
  uint8_t *a = inout;
  const uint8_t *b = in;
  if (op == MT_REDUCE_PRODUCT || op == MT_REDUCE_MIN) {
    for (int64_t i = 0; i < n; ++i) a[i] = (uint8_t)((a[i] != 0) & (b[i] != 0));
  } else {
    for (int64_t i = 0; i < n; ++i) a[i] = (uint8_t)((a[i] != 0) | (b[i] != 0));
  }
}

static const reduce_fn reducers[MT_DTYPE_COUNT] = {
    [MT_DTYPE_BOOL] = reduce_bool,           [MT_DTYPE_INT8] = reduce_int8,
    [MT_DTYPE_INT16] = reduce_int16,         [MT_DTYPE_INT32] = reduce_int32,
    [MT_DTYPE_INT64] = reduce_int64,         [MT_DTYPE_UINT8] = reduce_uint8,
    [MT_DTYPE_UINT16] = reduce_uint16,       [MT_DTYPE_UINT32] = reduce_uint32,
    [MT_DTYPE_UINT64] = reduce_uint64,       [MT_DTYPE_FLOAT16] = reduce_float16,
    [MT_DTYPE_FLOAT32] = reduce_float32,     [MT_DTYPE_FLOAT64] = reduce_float64,
    [MT_DTYPE_COMPLEX64] = reduce_complex64, [MT_DTYPE_COMPLEX128] = reduce_complex128,
    [MT_DTYPE_BFLOAT16] = reduce_bfloat16,
};

static int is_complex(int dtype) {
  return dtype == MT_DTYPE_COMPLEX64 || dtype == MT_DTYPE_COMPLEX128;
}

/* Checks the arguments shared by mt_reduce and mt_divide. */
static int check_buffers(const void *a, const void *b, int64_t n, int dtype,
                         mt_error *err) {
  if (n < 0)
    return mt__fail(err, MT_EINVAL, "The element count is %" PRId64 "; it must be >= 0",
                    n);
  if (n > 0 && (a == NULL || b == NULL))
    return mt__fail(err, MT_EINVAL, "A buffer of %" PRId64 " elements is NULL", n);
  if (dtype < 0 || dtype >= MT_DTYPE_COUNT)
    return mt__fail(err, MT_ETYPE, "Unknown dtype code %d", dtype);
  return MT_OK;
}

int mt_reduce(void *inout, const void *in, int64_t n, int dtype, int op,
              mt_error *err) {
  int rc = check_buffers(inout, in, n, dtype, err);
  if (rc != MT_OK) return rc;
  if (op < 0 || op >= MT_REDUCE_COUNT)
    return mt__fail(err, MT_EINVAL, "Unknown reduce op code %d", op);
  if (is_complex(dtype) && (op == MT_REDUCE_MAX || op == MT_REDUCE_MIN))
    return mt__fail(err, MT_ETYPE,
                    "Complex numbers have no order, so %s cannot be reduced with %s",
                    mt_dtype_name(dtype), op == MT_REDUCE_MAX ? "max" : "min");
  if (n > 0) reducers[dtype](inout, in, n, op);
  return MT_OK;
}

/* ---- Division by a positive integer ---- */

typedef void (*divide_fn)(void *buf, int64_t n, int64_t divisor);

/* NumPy's //: C truncates toward zero, so a negative inexact quotient is one too
 * high. The quotient always fits T because |floor(a / d)| <= |a| for d >= 1. */
#define MT__SIGNED_DIVIDER(name, T)                                    \
  static void divide_##name(void *buf, int64_t n, int64_t divisor) {   \
    T *a = buf;                                                        \
    for (int64_t i = 0; i < n; ++i) {                                  \
      const int64_t x = a[i];                                          \
      a[i] = (T)(x / divisor - (x % divisor < 0));                     \
    }                                                                  \
  }
/* int8 values, not characters: the sign extension is the point. */
MT__SIGNED_DIVIDER(int8, int8_t)  /* NOLINT(bugprone-signed-char-misuse,cert-str34-c) */
MT__SIGNED_DIVIDER(int16, int16_t)
MT__SIGNED_DIVIDER(int32, int32_t)
MT__SIGNED_DIVIDER(int64, int64_t)
#undef MT__SIGNED_DIVIDER

#define MT__UNSIGNED_DIVIDER(name, T)                                        \
  static void divide_##name(void *buf, int64_t n, int64_t divisor) {         \
    T *a = buf;                                                              \
    for (int64_t i = 0; i < n; ++i) a[i] = (T)(a[i] / (uint64_t)divisor);    \
  }
MT__UNSIGNED_DIVIDER(uint8, uint8_t)
MT__UNSIGNED_DIVIDER(uint16, uint16_t)
MT__UNSIGNED_DIVIDER(uint32, uint32_t)
MT__UNSIGNED_DIVIDER(uint64, uint64_t)
#undef MT__UNSIGNED_DIVIDER

/* Real and complex floats alike: `count` scalars each divided in double, which
 * for float32 is still correctly rounded (53 >= 2 * 24 + 2 bits). */
#define MT__FLOAT_DIVIDER(name, T, count)                                    \
  static void divide_##name(void *buf, int64_t n, int64_t divisor) {         \
    T *a = buf;                                                              \
    const double d = (double)divisor;                                        \
    for (int64_t i = 0; i < (count); ++i) a[i] = (T)(a[i] / d);              \
  }
MT__FLOAT_DIVIDER(float32, float, n)
MT__FLOAT_DIVIDER(float64, double, n)
MT__FLOAT_DIVIDER(complex64, float, 2 * n)
MT__FLOAT_DIVIDER(complex128, double, 2 * n)
#undef MT__FLOAT_DIVIDER

static void divide_float16(void *buf, int64_t n, int64_t divisor) {
  uint16_t *a = buf;
  const float d = (float)divisor;
  for (int64_t i = 0; i < n; ++i) a[i] = float_to_half(half_to_float(a[i]) / d);
}

static void divide_bfloat16(void *buf, int64_t n, int64_t divisor) {
  uint16_t *a = buf;
  const float d = (float)divisor;
  for (int64_t i = 0; i < n; ++i) a[i] = float_to_bf16(bf16_to_float(a[i]) / d);
}

/* bool has no division (NumPy's bool // int gives int64), so it stays NULL. */
static const divide_fn dividers[MT_DTYPE_COUNT] = {
    [MT_DTYPE_INT8] = divide_int8,           [MT_DTYPE_INT16] = divide_int16,
    [MT_DTYPE_INT32] = divide_int32,         [MT_DTYPE_INT64] = divide_int64,
    [MT_DTYPE_UINT8] = divide_uint8,         [MT_DTYPE_UINT16] = divide_uint16,
    [MT_DTYPE_UINT32] = divide_uint32,       [MT_DTYPE_UINT64] = divide_uint64,
    [MT_DTYPE_FLOAT16] = divide_float16,     [MT_DTYPE_FLOAT32] = divide_float32,
    [MT_DTYPE_FLOAT64] = divide_float64,     [MT_DTYPE_COMPLEX64] = divide_complex64,
    [MT_DTYPE_COMPLEX128] = divide_complex128, [MT_DTYPE_BFLOAT16] = divide_bfloat16,
};

int mt_divide(void *buf, int64_t n, int dtype, int64_t divisor, mt_error *err) {
  int rc = check_buffers(buf, buf, n, dtype, err);
  if (rc != MT_OK) return rc;
  if (dividers[dtype] == NULL)
    return mt__fail(err, MT_ETYPE, "A %s buffer cannot be divided in place",
                    mt_dtype_name(dtype));
  if (divisor < 1)
    return mt__fail(err, MT_EINVAL, "The divisor is %" PRId64 "; it must be >= 1",
                    divisor);
  /* Dividing by one changes nothing, so skip the pass over memory. */
  if (n > 0 && divisor > 1) dividers[dtype](buf, n, divisor);
  return MT_OK;
}
