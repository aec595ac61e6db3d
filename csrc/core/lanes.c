/* Kernels along one axis of a local array (lanes.h). Each pass goes row by row,
 * working across a row of `inner` contiguous elements at a time, so it reads the
 * array once and in its own order: NumPy's accumulate walks each lane with the
 * axis's stride instead, and its argmax along an axis that is not the last first
 * copies the array with that axis moved last. Nothing here allocates or talks MPI. */
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/lanes.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/pack.h"

typedef struct c64 {
  float re, im;
} c64;
typedef struct c128 {
  double re, im;
} c128;

/* ---- the operations, per element type ---- */

/* Integers wrap as NumPy's do: the arithmetic is done unsigned, where C defines it. */
#define WRAP_ADD(U, a, b) ((U)(a) + (U)(b))
#define WRAP_MUL(U, a, b) ((U)(a) * (U)(b))
#define ADD(a, b) ((a) + (b))
#define MUL(a, b) ((a) * (b))
#define OR(a, b) ((uint8_t)(((a) != 0) | ((b) != 0)))
#define AND(a, b) ((uint8_t)(((a) != 0) & ((b) != 0)))
#define I8_ADD(a, b) ((int8_t)WRAP_ADD(uint8_t, a, b))
#define I8_MUL(a, b) ((int8_t)WRAP_MUL(unsigned, a, b))
#define I16_ADD(a, b) ((int16_t)WRAP_ADD(uint16_t, a, b))
#define I16_MUL(a, b) ((int16_t)WRAP_MUL(unsigned, a, b))
#define I32_ADD(a, b) ((int32_t)WRAP_ADD(uint32_t, a, b))
#define I32_MUL(a, b) ((int32_t)WRAP_MUL(uint32_t, a, b))
#define I64_ADD(a, b) ((int64_t)WRAP_ADD(uint64_t, a, b))
#define I64_MUL(a, b) ((int64_t)WRAP_MUL(uint64_t, a, b))
#define U8_ADD(a, b) ((uint8_t)WRAP_ADD(unsigned, a, b))
#define U8_MUL(a, b) ((uint8_t)WRAP_MUL(unsigned, a, b))
#define U16_ADD(a, b) ((uint16_t)WRAP_ADD(unsigned, a, b))
#define U16_MUL(a, b) ((uint16_t)WRAP_MUL(unsigned, a, b))

/* float16 as NumPy computes it: widened to float, rounded back each step. */
static inline uint16_t half_add(uint16_t a, uint16_t b) {
  return mt_float_to_half(mt_half_to_float(a) + mt_half_to_float(b));
}
static inline uint16_t half_mul(uint16_t a, uint16_t b) {
  return mt_float_to_half(mt_half_to_float(a) * mt_half_to_float(b));
}
/* bfloat16 alike, as ml_dtypes' ufuncs compute it. */
static inline uint16_t bf16_add(uint16_t a, uint16_t b) {
  return mt_float_to_bfloat16(mt_bfloat16_to_float(a) + mt_bfloat16_to_float(b));
}
static inline uint16_t bf16_mul(uint16_t a, uint16_t b) {
  return mt_float_to_bfloat16(mt_bfloat16_to_float(a) * mt_bfloat16_to_float(b));
}

/* Complex products are the textbook formula NumPy uses, without C99 Annex G's
 * recovery of infinities. */
static inline c64 c64_add(c64 a, c64 b) { return (c64){a.re + b.re, a.im + b.im}; }
static inline c64 c64_mul(c64 a, c64 b) {
  return (c64){a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}
static inline c128 c128_add(c128 a, c128 b) { return (c128){a.re + b.re, a.im + b.im}; }
static inline c128 c128_mul(c128 a, c128 b) {
  return (c128){a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
}

/* ---- running sums and products ---- */

typedef void (*scan_fn)(void *out, void *last, const void *in, const void *init,
                        const mt_lanes *l);

/* Lanes of one element per row (inner == 1) keep the running value in a
 * register, where the row form would wait on its own store every element. */
#define MT__SCAN_SERIAL(name, T, F)                                               \
  static void serial_##name(T *y, T *last, const T *x, const T *prev, int64_t n) { \
    T acc = prev != NULL ? F(*prev, x[0]) : x[0];                                 \
    if (y != NULL) y[0] = acc;                                                    \
    for (int64_t i = 1; i < n; ++i) {                                             \
      acc = F(acc, x[i]);                                                         \
      if (y != NULL) y[i] = acc;                                                  \
    }                                                                             \
    if (last != NULL) *last = acc;                                                \
  }

/* Row i of block o is row i - 1 (or init) op row i of the input. Without `out`,
 * `last` is the running row, updated in place. */
#define MT__SCAN(name, T, F)                                                      \
  MT__SCAN_SERIAL(name, T, F)                                                     \
  static void scan_##name(void *out, void *last, const void *in, const void *init, \
                          const mt_lanes *l) {                                     \
    assert(out != NULL || last != NULL);                                          \
    const int64_t n = l->n, w = l->inner, step = out != NULL ? w : 0;             \
    for (int64_t o = 0; o < l->outer; ++o) {                                      \
      const T *x = (const T *)in + o * n * w;                                     \
      const T *prev = init != NULL ? (const T *)init + o * w : NULL;              \
      T *end = last != NULL ? (T *)last + o * w : NULL;                           \
      T *y = out != NULL ? (T *)out + o * n * w : end;                            \
      if (w == 1 && n > 0) {                                                      \
        serial_##name(out != NULL ? y : NULL, end, x, prev, n);                   \
        continue;                                                                 \
      }                                                                           \
      for (int64_t i = 0; i < n; ++i, x += w) {                                   \
        T *d = y + i * step;                                                      \
        const T *p = i > 0 ? d - step : prev;                                     \
        if (p == NULL) {                                                          \
          memcpy(d, x, (size_t)w * sizeof(T));                                    \
          continue;                                                               \
        }                                                                         \
        for (int64_t j = 0; j < w; ++j) d[j] = F(p[j], x[j]);                     \
      }                                                                           \
      if (out != NULL && end != NULL && n > 0)                                    \
        memcpy(end, y + (n - 1) * w, (size_t)w * sizeof(T));                      \
    }                                                                             \
  }

MT__SCAN(or, uint8_t, OR)
MT__SCAN(and, uint8_t, AND)
MT__SCAN(add_i8, int8_t, I8_ADD)
MT__SCAN(mul_i8, int8_t, I8_MUL)
MT__SCAN(add_i16, int16_t, I16_ADD)
MT__SCAN(mul_i16, int16_t, I16_MUL)
MT__SCAN(add_i32, int32_t, I32_ADD)
MT__SCAN(mul_i32, int32_t, I32_MUL)
MT__SCAN(add_i64, int64_t, I64_ADD)
MT__SCAN(mul_i64, int64_t, I64_MUL)
MT__SCAN(add_u8, uint8_t, U8_ADD)
MT__SCAN(mul_u8, uint8_t, U8_MUL)
MT__SCAN(add_u16, uint16_t, U16_ADD)
MT__SCAN(mul_u16, uint16_t, U16_MUL)
MT__SCAN(add_u32, uint32_t, ADD)
MT__SCAN(mul_u32, uint32_t, MUL)
MT__SCAN(add_u64, uint64_t, ADD)
MT__SCAN(mul_u64, uint64_t, MUL)
MT__SCAN(add_f16, uint16_t, half_add)
MT__SCAN(mul_f16, uint16_t, half_mul)
MT__SCAN(add_bf16, uint16_t, bf16_add)
MT__SCAN(mul_bf16, uint16_t, bf16_mul)
MT__SCAN(add_f32, float, ADD)
MT__SCAN(mul_f32, float, MUL)
MT__SCAN(add_f64, double, ADD)
MT__SCAN(mul_f64, double, MUL)
MT__SCAN(add_c64, c64, c64_add)
MT__SCAN(mul_c64, c64, c64_mul)
MT__SCAN(add_c128, c128, c128_add)
MT__SCAN(mul_c128, c128, c128_mul)
#undef MT__SCAN
#undef MT__SCAN_SERIAL

/* [0]: sums, [1]: products. */
static const scan_fn scans[2][MT_DTYPE_COUNT] = {
    {[MT_DTYPE_BOOL] = scan_or, [MT_DTYPE_INT8] = scan_add_i8, [MT_DTYPE_INT16] = scan_add_i16,
     [MT_DTYPE_INT32] = scan_add_i32, [MT_DTYPE_INT64] = scan_add_i64,
     [MT_DTYPE_UINT8] = scan_add_u8, [MT_DTYPE_UINT16] = scan_add_u16,
     [MT_DTYPE_UINT32] = scan_add_u32, [MT_DTYPE_UINT64] = scan_add_u64,
     [MT_DTYPE_FLOAT16] = scan_add_f16, [MT_DTYPE_BFLOAT16] = scan_add_bf16,
     [MT_DTYPE_FLOAT32] = scan_add_f32,
     [MT_DTYPE_FLOAT64] = scan_add_f64, [MT_DTYPE_COMPLEX64] = scan_add_c64,
     [MT_DTYPE_COMPLEX128] = scan_add_c128},
    {[MT_DTYPE_BOOL] = scan_and, [MT_DTYPE_INT8] = scan_mul_i8, [MT_DTYPE_INT16] = scan_mul_i16,
     [MT_DTYPE_INT32] = scan_mul_i32, [MT_DTYPE_INT64] = scan_mul_i64,
     [MT_DTYPE_UINT8] = scan_mul_u8, [MT_DTYPE_UINT16] = scan_mul_u16,
     [MT_DTYPE_UINT32] = scan_mul_u32, [MT_DTYPE_UINT64] = scan_mul_u64,
     [MT_DTYPE_FLOAT16] = scan_mul_f16, [MT_DTYPE_BFLOAT16] = scan_mul_bf16,
     [MT_DTYPE_FLOAT32] = scan_mul_f32,
     [MT_DTYPE_FLOAT64] = scan_mul_f64, [MT_DTYPE_COMPLEX64] = scan_mul_c64,
     [MT_DTYPE_COMPLEX128] = scan_mul_c128},
};

static int check_lanes(const mt_lanes *l, int dtype, mt_error *err) {
  if (l == NULL || l->outer < 0 || l->n < 0 || l->inner < 0)
    return mt__fail(err, MT_EINVAL, "Lanes need extents >= 0");
  if (dtype < 0 || dtype >= MT_DTYPE_COUNT)
    return mt__fail(err, MT_ETYPE, "Unknown dtype code %d", dtype);
  return MT_OK;
}

/* Writes one `T` of value `v` at `p`. */
#define PUT(T, p, v)   \
  do {                 \
    T one_ = (v);      \
    memcpy(p, &one_, sizeof one_); \
  } while (0)

/* The identity of sums (zero bits) or of products for `dtype`, at `one`
 * (mt_dtype_size bytes). */
static void identity(int dtype, int product, unsigned char *one) {
  memset(one, 0, mt_dtype_size(dtype));
  if (!product) return;
  switch (dtype) {
    case MT_DTYPE_FLOAT16: PUT(uint16_t, one, 0x3c00u); break;
    case MT_DTYPE_BFLOAT16: PUT(uint16_t, one, 0x3f80u); break;
    case MT_DTYPE_FLOAT32: case MT_DTYPE_COMPLEX64: PUT(float, one, 1.0f); break;
    case MT_DTYPE_FLOAT64: case MT_DTYPE_COMPLEX128: PUT(double, one, 1.0); break;
    case MT_DTYPE_INT16: case MT_DTYPE_UINT16: PUT(uint16_t, one, 1u); break;
    case MT_DTYPE_INT32: case MT_DTYPE_UINT32: PUT(uint32_t, one, 1u); break;
    case MT_DTYPE_INT64: case MT_DTYPE_UINT64: PUT(uint64_t, one, 1u); break;
    default: one[0] = 1; break; /* bool, int8, uint8 */
  }
}
#undef PUT

/* Empty lanes (n == 0): `last` is init, or the identity. */
static void empty_lanes(void *last, const void *init, const mt_lanes *l, int dtype,
                        int product) {
  size_t size = mt_dtype_size(dtype), count = (size_t)(l->outer * l->inner);
  if (last == NULL || count == 0) return;
  if (init != NULL) {
    memcpy(last, init, count * size);
    return;
  }
  unsigned char one[16];
  identity(dtype, product, one);
  for (size_t k = 0; k < count; ++k) memcpy((unsigned char *)last + k * size, one, size);
}

int mt_cumulate(void *out, void *last, const void *in, const void *init, const mt_lanes *l,
                int dtype, int op, mt_error *err) {
  int rc = check_lanes(l, dtype, err);
  if (rc != MT_OK) return rc;
  if (op != MT_REDUCE_SUM && op != MT_REDUCE_PRODUCT)
    return mt__fail(err, MT_EINVAL, "Only sums and products accumulate, not op %d", op);
  int product = op == MT_REDUCE_PRODUCT;
  if (scans[product][dtype] == NULL)
    return mt__fail(err, MT_ETYPE, "%s values have no scan kernel", mt_dtype_name(dtype));
  if (l->n == 0) {
    empty_lanes(last, init, l, dtype, product);
    return MT_OK;
  }
  if (l->outer * l->inner > 0 && (in == NULL || (out == NULL && last == NULL)))
    return mt__fail(err, MT_EINVAL, "A scan needs its input and an output or totals");
  if (l->outer * l->inner > 0) scans[product][dtype](out, last, in, init, l);
  return MT_OK;
}

/* ---- the first extreme of each lane ---- */

typedef void (*arg_fn)(int64_t *index, void *value, const void *in, const mt_lanes *l);

/* Whether `x` replaces the extreme `b` found so far, as NumPy's argmax and argmin
 * decide: only a strictly greater (smaller) value does, and a NaN is the extreme
 * (so the first NaN stays). */
#define GT(x, b) ((x) > (b))
#define LT(x, b) ((x) < (b))
#define B_GT(x, b) (((x) != 0) > ((b) != 0))
#define B_LT(x, b) (((x) != 0) < ((b) != 0))
#define F_GT(x, b) (!isnan(b) && ((x) > (b) || isnan(x)))
#define F_LT(x, b) (!isnan(b) && ((x) < (b) || isnan(x)))
#define H_GT(x, b) F_GT(mt_half_to_float(x), mt_half_to_float(b))
#define H_LT(x, b) F_LT(mt_half_to_float(x), mt_half_to_float(b))
#define BF_GT(x, b) F_GT(mt_bfloat16_to_float(x), mt_bfloat16_to_float(b))
#define BF_LT(x, b) F_LT(mt_bfloat16_to_float(x), mt_bfloat16_to_float(b))
#define C_NAN(z) (isnan((z).re) || isnan((z).im))
#define C_GT(x, b) \
  (!C_NAN(b) && ((x).re > (b).re || ((x).re == (b).re && (x).im > (b).im) || C_NAN(x)))
#define C_LT(x, b) \
  (!C_NAN(b) && ((x).re < (b).re || ((x).re == (b).re && (x).im < (b).im) || C_NAN(x)))

/* The row update below vectorizes only with AVX2's 64-bit blends and compares,
 * which SSE2 (the x86-64 baseline) lacks: an AVX2 clone is made and picked at
 * load time on CPUs that have it, the baseline one elsewhere. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define MT__CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MT__CLONES
#endif

/* One row's update of the extremes found so far: a lane takes the row's element
 * where that beats it, as selects (vector blends; the pointers never overlap). */
#define MT__ARG_ROW_UPDATE(name, T, BETTER)                                        \
  MT__CLONES static void update_##name(T *restrict b, int64_t *restrict k, const T *restrict x, \
                            int64_t w, int64_t i) {                                  \
    for (int64_t j = 0; j < w; ++j) {                                               \
      const T v = x[j], cur = b[j];                                                 \
      const int c = BETTER(v, cur);                                                 \
      b[j] = c ? v : cur;                                                           \
      k[j] = c ? i : k[j];                                                          \
    }                                                                               \
  }

/* Row 0 starts each block's extremes; every later row updates them. */
#define MT__ARG(name, T, BETTER)                                                    \
  MT__ARG_ROW_UPDATE(name, T, BETTER)                                               \
  static void arg_##name(int64_t *index, void *value, const void *in,              \
                         const mt_lanes *l) {                                        \
    const int64_t n = l->n, w = l->inner;                                           \
    for (int64_t o = 0; o < l->outer; ++o) {                                        \
      const T *x = (const T *)in + o * n * w;                                       \
      T *b = (T *)value + o * w;                                                    \
      int64_t *k = index + o * w;                                                   \
      memcpy(b, x, (size_t)w * sizeof(T));                                          \
      memset(k, 0, (size_t)w * sizeof *k);                                          \
      for (int64_t i = 1; i < n; ++i) update_##name(b, k, x + i * w, w, i);         \
    }                                                                               \
  }

#define MT__ARGS(name, T, MAX, MIN) MT__ARG(max_##name, T, MAX) MT__ARG(min_##name, T, MIN)
MT__ARGS(bool, uint8_t, B_GT, B_LT)
MT__ARGS(i8, int8_t, GT, LT)
MT__ARGS(i16, int16_t, GT, LT)
MT__ARGS(i32, int32_t, GT, LT)
MT__ARGS(i64, int64_t, GT, LT)
MT__ARGS(u8, uint8_t, GT, LT)
MT__ARGS(u16, uint16_t, GT, LT)
MT__ARGS(u32, uint32_t, GT, LT)
MT__ARGS(u64, uint64_t, GT, LT)
MT__ARGS(f16, uint16_t, H_GT, H_LT)
MT__ARGS(bf16, uint16_t, BF_GT, BF_LT)
MT__ARGS(f32, float, F_GT, F_LT)
MT__ARGS(f64, double, F_GT, F_LT)
MT__ARGS(c64, c64, C_GT, C_LT)
MT__ARGS(c128, c128, C_GT, C_LT)
#undef MT__ARGS
#undef MT__ARG
#undef MT__ARG_ROW_UPDATE
#undef MT__CLONES

/* [0]: argmin, [1]: argmax. */
#define MT__ARG_ROW(m)                                                                   \
  {[MT_DTYPE_BOOL] = arg_##m##_bool, [MT_DTYPE_INT8] = arg_##m##_i8,                     \
   [MT_DTYPE_INT16] = arg_##m##_i16, [MT_DTYPE_INT32] = arg_##m##_i32,                   \
   [MT_DTYPE_INT64] = arg_##m##_i64, [MT_DTYPE_UINT8] = arg_##m##_u8,                    \
   [MT_DTYPE_UINT16] = arg_##m##_u16, [MT_DTYPE_UINT32] = arg_##m##_u32,                 \
   [MT_DTYPE_UINT64] = arg_##m##_u64, [MT_DTYPE_FLOAT16] = arg_##m##_f16,                \
   [MT_DTYPE_BFLOAT16] = arg_##m##_bf16,                                                 \
   [MT_DTYPE_FLOAT32] = arg_##m##_f32, [MT_DTYPE_FLOAT64] = arg_##m##_f64,               \
   [MT_DTYPE_COMPLEX64] = arg_##m##_c64, [MT_DTYPE_COMPLEX128] = arg_##m##_c128}
static const arg_fn args[2][MT_DTYPE_COUNT] = {MT__ARG_ROW(min), MT__ARG_ROW(max)};
#undef MT__ARG_ROW

int mt_arg_extreme(int64_t *index, void *value, const void *in, const mt_lanes *l, int dtype,
                   int largest, mt_error *err) {
  int rc = check_lanes(l, dtype, err);
  if (rc != MT_OK) return rc;
  if (args[largest != 0][dtype] == NULL)
    return mt__fail(err, MT_ETYPE, "%s values have no arg-extreme kernel",
                    mt_dtype_name(dtype));
  if (l->n < 1) return mt__fail(err, MT_EINVAL, "An empty lane has no extreme");
  if (l->outer * l->inner == 0) return MT_OK;
  if (index == NULL || value == NULL || in == NULL)
    return mt__fail(err, MT_EINVAL, "An arg-extreme needs its input, index and value");
  args[largest != 0][dtype](index, value, in, l);
  return MT_OK;
}
