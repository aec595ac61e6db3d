/* Philox4x32-10 and the box fills built on it. Every value is a pure function of
 * (seed, stream, global flat index), so each rank can draw exactly its own shard
 * and the assembled tensor is the same for every mesh and every placement. */
#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/rng.h"
#include "mpitensor/core/status.h"

#define PHILOX_M0 UINT32_C(0xD2511F53)
#define PHILOX_M1 UINT32_C(0xCD9E8D57)
#define PHILOX_W0 UINT32_C(0x9E3779B9)
#define PHILOX_W1 UINT32_C(0xBB67AE85)

/* M_PI is POSIX, not C11. */
static const double two_pi = 6.28318530717958647692528676655900577;

/* One Philox round: two 32x32->64 multiplies whose halves are mixed with the
 * other two words and the round key. */
static void philox_round(uint32_t c[4], const uint32_t k[2]) {
  uint64_t p0 = (uint64_t)PHILOX_M0 * c[0];
  uint64_t p1 = (uint64_t)PHILOX_M1 * c[2];
  uint32_t c1 = c[1];
  uint32_t c3 = c[3];
  c[0] = (uint32_t)(p1 >> 32) ^ c1 ^ k[0];
  c[1] = (uint32_t)p1;
  c[2] = (uint32_t)(p0 >> 32) ^ c3 ^ k[1];
  c[3] = (uint32_t)p0;
}

void mt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  /* Work on copies so `out` may alias `ctr`. */
  uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
  uint32_t k[2] = {key[0], key[1]};
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += PHILOX_W0;
      k[1] += PHILOX_W1;
    }
    philox_round(c, k);
  }
  for (int i = 0; i < 4; ++i) out[i] = c[i];
}

/* The Philox stream of one fill: key and the stream half of the counter are
 * fixed, the block half follows the element index. Neighbouring elements share
 * a block, so the last one is cached, with its Box-Muller pair for NORMAL. */
typedef struct gen {
  uint32_t key[2];
  uint32_t stream[2];
  uint64_t block;
  int valid;
  uint32_t x[4];
  double z[2];
} gen;

static void gen_init(gen *s, uint64_t seed, uint64_t stream) {
  s->key[0] = (uint32_t)seed;
  s->key[1] = (uint32_t)(seed >> 32);
  s->stream[0] = (uint32_t)stream;
  s->stream[1] = (uint32_t)(stream >> 32);
  s->block = 0;
  s->valid = 0;
  memset(s->x, 0, sizeof s->x);
}

/* Makes `s->x` the output of `block`; returns 1 when it had to run Philox. */
static int gen_load(gen *s, uint64_t block) {
  if (s->valid && s->block == block) return 0;
  uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), s->stream[0],
                     s->stream[1]};
  mt_philox4x32_10(ctr, s->key, s->x);
  s->block = block;
  s->valid = 1;
  return 1;
}

/* 27 + 26 random bits make the 53 of a double's significand, so every value is
 * a multiple of 2^-53 in [0, 1). */
static double uniform53(uint32_t a, uint32_t b) {
  uint64_t bits = (uint64_t)(a >> 5) * UINT64_C(67108864) + (b >> 6);
  return (double)bits * 0x1p-53;
}

/* The Box-Muller pair of `block`. u1 is taken as 1 - u so it lies in (0, 1] and
 * log(u1) is finite. */
static const double *normal_pair(gen *s, uint64_t block) {
  if (gen_load(s, block)) {
    double u1 = 1.0 - uniform53(s->x[0], s->x[1]);
    double u2 = uniform53(s->x[2], s->x[3]);
    double r = sqrt(-2.0 * log(u1));
    s->z[0] = r * cos(two_pi * u2);
    s->z[1] = r * sin(two_pi * u2);
  }
  return s->z;
}

/* A row fill writes `n` consecutive elements starting at global index `g`. */
typedef void row_fn(gen *s, uint64_t g, int64_t n, void *out);

static void row_uniform_f64(gen *s, uint64_t g, int64_t n, void *out) {
  double *o = out;
  for (int64_t j = 0; j < n; ++j, ++g) {
    gen_load(s, g >> 1);
    const uint32_t *x = s->x + 2 * (g & 1);
    o[j] = uniform53(x[0], x[1]);
  }
}

static void row_uniform_f32(gen *s, uint64_t g, int64_t n, void *out) {
  float *o = out;
  for (int64_t j = 0; j < n; ++j, ++g) {
    gen_load(s, g >> 2);
    o[j] = (float)(s->x[g & 3] >> 8) * 0x1p-24f;
  }
}

static void row_normal_f64(gen *s, uint64_t g, int64_t n, void *out) {
  double *o = out;
  for (int64_t j = 0; j < n; ++j, ++g) o[j] = normal_pair(s, g >> 1)[g & 1];
}

static void row_normal_f32(gen *s, uint64_t g, int64_t n, void *out) {
  float *o = out;
  for (int64_t j = 0; j < n; ++j, ++g) o[j] = (float)normal_pair(s, g >> 1)[g & 1];
}

/* Checks the box against the global shape; the box must lie inside it. */
static int check_box(const int64_t *global_shape, const mt_box *box, mt_error *err) {
  if (box->ndim < 0 || box->ndim > MT_MAX_NDIM)
    return mt__fail(err, MT_EINVAL, "A tensor may have 0 to %d dims, got %d",
                    MT_MAX_NDIM, box->ndim);
  if (box->ndim > 0 && global_shape == NULL)
    return mt__fail(err, MT_EINVAL, "The global shape is missing (NULL)");
  for (int d = 0; d < box->ndim; ++d) {
    int64_t n = global_shape[d];
    if (n < 0)
      return mt__fail(err, MT_EINVAL,
                      "Tensor dim %d has size %" PRId64 "; sizes must be >= 0", d, n);
    int64_t off = box->offset[d];
    int64_t len = box->shape[d];
    if (off < 0 || len < 0 || off > n || len > n - off)
      return mt__fail(err, MT_EINDEX,
                      "Box [%" PRId64 ", %" PRId64 " + %" PRId64
                      ") on dim %d is outside the tensor's size %" PRId64,
                      off, off, len, d, n);
  }
  return MT_OK;
}

/* Row-major strides of the global tensor; every global flat index must fit in
 * int64. Only called for non-empty tensors. */
static int global_strides(int ndim, const int64_t *shape, int64_t *stride,
                          mt_error *err) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    assert(shape[d] > 0);
    stride[d] = s;
    if (s > INT64_MAX / shape[d])
      return mt__fail(err, MT_EOVERFLOW,
                      "The tensor has more than %" PRId64 " elements", INT64_MAX);
    s *= shape[d];
  }
  return MT_OK;
}

/* Walks the box row by row (the innermost dim is contiguous in both the global
 * index and `out`), odometer-style over the outer dims. */
static void fill_rows(gen *s, row_fn *row, size_t itemsize, const mt_box *box,
                      const int64_t *stride, char *out) {
  int nd = box->ndim;
  if (nd == 0) {
    row(s, 0, 1, out);
    return;
  }
  int64_t idx[MT_MAX_NDIM] = {0};
  int64_t inner = box->shape[nd - 1];
  int64_t rows = mt_box_numel(box) / inner;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t g = 0;
    for (int d = 0; d < nd; ++d) g += (box->offset[d] + idx[d]) * stride[d];
    row(s, (uint64_t)g, inner, out);
    out += (size_t)inner * itemsize;
    for (int d = nd - 2; d >= 0 && ++idx[d] == box->shape[d]; --d) idx[d] = 0;
  }
}

/* The row fill for (dtype, dist), or NULL with `*rc` set when either is unknown. */
static row_fn *pick_row(int dtype, int dist, int *rc, mt_error *err) {
  if (dtype != MT_DTYPE_FLOAT32 && dtype != MT_DTYPE_FLOAT64) {
    *rc = mt__fail(err, MT_ETYPE, "Random fills support float32 and float64, not %s",
                   mt_dtype_name(dtype));
    return NULL;
  }
  int f64 = dtype == MT_DTYPE_FLOAT64;
  if (dist == MT_RNG_UNIFORM) return f64 ? row_uniform_f64 : row_uniform_f32;
  if (dist == MT_RNG_NORMAL) return f64 ? row_normal_f64 : row_normal_f32;
  *rc = mt__fail(err, MT_EINVAL,
                 "Unknown random distribution %d; expected uniform (0) or normal (1)",
                 dist);
  return NULL;
}

int mt_rng_fill_box(void *out, int dtype, int dist, uint64_t seed, uint64_t stream,
                    const int64_t *global_shape, const mt_box *box, mt_error *err) {
  if (box == NULL) return mt__fail(err, MT_EINVAL, "The box to fill is NULL");
  int rc = MT_OK;
  row_fn *row = pick_row(dtype, dist, &rc, err);
  if (row == NULL) return rc;
  rc = check_box(global_shape, box, err);
  if (rc != MT_OK) return rc;
  if (mt_box_numel(box) == 0) return MT_OK;
  int64_t stride[MT_MAX_NDIM];
  rc = global_strides(box->ndim, global_shape, stride, err);
  if (rc != MT_OK) return rc;
  if (out == NULL) return mt__fail(err, MT_EINVAL, "The output buffer is NULL");
  gen s;
  gen_init(&s, seed, stream);
  fill_rows(&s, row, mt_dtype_size(dtype), box, stride, out);
  return MT_OK;
}
