/* Scaled-dot-product attention per head, in blocks of query rows: the block's
 * scores are one gemm against the keys it may see (all of them, or under a causal
 * mask only those up to its last row, so the masked upper triangle costs nothing),
 * an exact softmax per row, and one gemm with the values. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/kernels/kernels.h"

/* Query rows per block: small enough that the causal blocks skip most of the
 * masked half (the diagonal blocks compute 1/2 of a 64-wide band in vain), large
 * enough that each gemm runs near the BLAS's peak. */
#define MT__ATTN_BLOCK 64

/* One head's operands as byte pointers and row strides, and what every head shares. */
typedef struct {
  const mt_blas *blas;
  int dtype;
  size_t itemsize;
  mt_attn_shape sh;
  double scale;
  int causal;
  void *scores; /* MT__ATTN_BLOCK x S elements */
} attn_ctx;

typedef struct {
  const char *q, *k, *v;
  char *o;
  int64_t lq, lk, lv, lo;
} attn_head;

/* The softmax of each score row over its visible keys; the rest of the row 0. */
static void softmax_block(const attn_ctx *c, int64_t i0, int64_t rows, int64_t keys) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t visible = c->causal && i0 + r + 1 < keys ? i0 + r + 1 : keys;
    void *row = (char *)c->scores + (size_t)(r * keys) * c->itemsize;
    if (c->dtype == MT_DTYPE_FLOAT32) {
      mt__softmax_row_f32(row, row, visible, 0);
    } else {
      mt__softmax_row_f64(row, row, visible, 0);
    }
    memset((char *)row + (size_t)visible * c->itemsize, 0,
           (size_t)(keys - visible) * c->itemsize);
  }
}

static void zero_rows(char *o, int64_t rows, int64_t cols, int64_t ld, size_t itemsize) {
  for (int64_t r = 0; r < rows; ++r) {
    memset(o + (size_t)(r * ld) * itemsize, 0, (size_t)cols * itemsize);
  }
}

/* Rows [i0, i0 + rows) of one head's output. */
static int attend_block(const attn_ctx *c, const attn_head *h, int64_t i0, int64_t rows,
                        mt_error *err) {
  const mt_attn_shape *s = &c->sh;
  int64_t keys = c->causal && i0 + rows < s->S ? i0 + rows : s->S;
  char *o = h->o + (size_t)(i0 * h->lo) * c->itemsize;
  if (keys == 0) {
    zero_rows(o, rows, s->Ev, h->lo, c->itemsize);
    return MT_OK;
  }
  int rc = MT_OK;
  if (s->E > 0) {
    rc = mt_gemm(c->blas, c->dtype, 1, rows, keys, s->E, c->scale,
                 h->q + (size_t)(i0 * h->lq) * c->itemsize, h->lq, h->k, h->lk, 0.0,
                 c->scores, keys, err);
  } else {
    memset(c->scores, 0, (size_t)(rows * keys) * c->itemsize);
  }
  if (rc != MT_OK || s->Ev == 0) return rc;
  softmax_block(c, i0, rows, keys);
  return mt_gemm(c->blas, c->dtype, 0, rows, s->Ev, keys, 1.0, c->scores, keys, h->v,
                 h->lv, 0.0, o, h->lo, err);
}

static int attend_head(const attn_ctx *c, const attn_head *h, mt_error *err) {
  int rc = MT_OK;
  for (int64_t i0 = 0; i0 < c->sh.L && rc == MT_OK; i0 += MT__ATTN_BLOCK) {
    int64_t rows = c->sh.L - i0 < MT__ATTN_BLOCK ? c->sh.L - i0 : MT__ATTN_BLOCK;
    rc = attend_block(c, h, i0, rows, err);
  }
  return rc;
}

static const char *at(const mt_attn_operand *a, int64_t b, int64_t h, size_t itemsize) {
  return (const char *)a->data + (b * a->batch_stride + h * a->head_stride) * (int64_t)itemsize;
}

static int check_operand(const mt_attn_operand *a, int64_t rows, int64_t cols,
                         const char *name, mt_error *err) {
  if (a == NULL || (a->data == NULL && rows > 0 && cols > 0)) {
    return mt_error_set(err, MT_EINVAL, "attention: %s has no data", name);
  }
  if (rows > 1 && a->row_stride < cols) {
    return mt_error_set(err, MT_EINVAL,
                        "attention: the rows of %s overlap (row stride %" PRId64
                        " < %" PRId64 " columns)",
                        name, a->row_stride, cols);
  }
  return MT_OK;
}

static int check_attention(const mt_attn_shape *s, const mt_attn_operand *q,
                           const mt_attn_operand *k, const mt_attn_operand *v,
                           const mt_attn_operand *out, mt_error *err) {
  if (s == NULL || s->batch < 0 || s->heads < 0 || s->L < 0 || s->S < 0 || s->E < 0 ||
      s->Ev < 0) {
    return mt_error_set(err, MT_EINVAL, "attention: missing or negative sizes");
  }
  int rc = check_operand(q, s->L, s->E, "q", err);
  if (rc == MT_OK) rc = check_operand(k, s->S, s->E, "k", err);
  if (rc == MT_OK) rc = check_operand(v, s->S, s->Ev, "v", err);
  if (rc == MT_OK) rc = check_operand(out, s->L, s->Ev, "out", err);
  return rc;
}

static int attend_all(attn_ctx *c, const mt_attn_operand *q, const mt_attn_operand *k,
                      const mt_attn_operand *v, const mt_attn_operand *out,
                      mt_error *err) {
  int rc = MT_OK;
  for (int64_t b = 0; b < c->sh.batch && rc == MT_OK; ++b) {
    for (int64_t h = 0; h < c->sh.heads && rc == MT_OK; ++h) {
      attn_head hd = {at(q, b, h, c->itemsize), at(k, b, h, c->itemsize),
                      at(v, b, h, c->itemsize), (char *)at(out, b, h, c->itemsize),
                      q->row_stride, k->row_stride, v->row_stride, out->row_stride};
      rc = attend_head(c, &hd, err);
    }
  }
  return rc;
}

int mt_attention(const mt_blas *blas, int dtype, const mt_attn_shape *shape,
                 const mt_attn_operand *q, const mt_attn_operand *k,
                 const mt_attn_operand *v, const mt_attn_operand *out, double scale,
                 int causal, mt_error *err) {
  int rc = mt__check_float(dtype, "attention", err);
  if (rc == MT_OK) rc = check_attention(shape, q, k, v, out, err);
  if (rc != MT_OK) return rc;
  if (!mt_blas_available(blas)) {
    return mt_error_set(err, MT_ENOTSUP, "attention: no BLAS given (see mt_blas)");
  }
  if (shape->batch == 0 || shape->heads == 0 || shape->L == 0 || shape->Ev == 0) {
    return MT_OK;
  }
  attn_ctx c = {blas, dtype, mt_dtype_size(dtype), *shape, scale, causal != 0, NULL};
  int64_t block = shape->L < MT__ATTN_BLOCK ? shape->L : MT__ATTN_BLOCK;
  /* 64 bytes more than the scores need: some BLAS builds (BLIS 0.9, which a library
   * path may name) read a few elements past the end of an operand in edge-case
   * kernels (flame/blis#635, #824); past this buffer they read our padding. */
  size_t bytes = (size_t)(block * (shape->S > 0 ? shape->S : 1)) * c.itemsize + 64;
  c.scores = malloc(bytes);
  if (c.scores == NULL) {
    return mt_error_set(err, MT_ENOMEM, "attention: no memory for %zu bytes of scores",
                        bytes);
  }
  rc = attend_all(&c, q, k, v, out, err);
  free(c.scores);
  return rc;
}

/* -- backward ----------------------------------------------------------------------
 * Per head and block of query rows, with P the block's weights (recomputed as the
 * forward computes them) and G its rows of the output's gradient:
 * dV += P^T G, dP = G V^T, dS = P (dP - rowsum(dP P)) scale, dQ = dS K,
 * dK += dS^T Q, over the keys the block sees. Both score-sized buffers are one block
 * of rows, so no (L, S) array is ever made. */

typedef struct {
  const char *q, *k, *v, *g;
  char *dq, *dk, *dv;
  int64_t lq, lk, lv, lg, ldq, ldk, ldv;
} attn_grad_head;

/* dP (in place) becomes dS = P (dP - sum_j dP_j P_j) * scale over each row's keys. */
#define MT__SOFTMAX_GRAD_ROW(T, S)                                               \
  static MT__VECTOR_CLONES void softmax_grad_row_##S(const T *p, T *dp, int64_t n, \
                                                     T scale) {                  \
    T acc[8] = {0};                                                              \
    int64_t i = 0;                                                               \
    for (; i + 8 <= n; i += 8) {                                                 \
      for (int j = 0; j < 8; ++j) acc[j] += dp[i + j] * p[i + j];                \
    }                                                                            \
    T dot = 0;                                                                   \
    for (int j = 0; j < 8; ++j) dot += acc[j];                                   \
    for (; i < n; ++i) dot += dp[i] * p[i];                                      \
    for (i = 0; i < n; ++i) dp[i] = p[i] * (dp[i] - dot) * scale;                \
  }

MT__SOFTMAX_GRAD_ROW(float, f32)
MT__SOFTMAX_GRAD_ROW(double, f64)

static int grad_block(const attn_ctx *c, const attn_grad_head *h, void *dp, int64_t i0,
                      int64_t rows, mt_error *err) {
  const mt_attn_shape *s = &c->sh;
  size_t isz = c->itemsize;
  int64_t keys = c->causal && i0 + rows < s->S ? i0 + rows : s->S;
  const char *q = h->q + (size_t)(i0 * h->lq) * isz, *g = h->g + (size_t)(i0 * h->lg) * isz;
  char *dq = h->dq + (size_t)(i0 * h->ldq) * isz;
  if (keys == 0) {
    zero_rows(dq, rows, s->E, h->ldq, isz);
    return MT_OK;
  }
  /* E == 0 leaves zero scores, uniform weights: dV still gets P^T G. */
  int rc = MT_OK;
  if (s->E > 0) {
    rc = mt_gemm(c->blas, c->dtype, 1, rows, keys, s->E, c->scale, q, h->lq, h->k, h->lk,
                 0.0, c->scores, keys, err);
  } else {
    memset(c->scores, 0, (size_t)(rows * keys) * isz);
  }
  if (rc != MT_OK) return rc;
  softmax_block(c, i0, rows, keys);
  /* dV[:keys] += P^T G and dP = G V^T (0 when Ev == 0). */
  if (s->Ev > 0) {
    rc = mt__gemm2(c->blas, c->dtype, 1, 0, keys, s->Ev, rows, 1.0, c->scores, keys, g,
                   h->lg, 1.0, h->dv, h->ldv, err);
    if (rc == MT_OK) {
      rc = mt_gemm(c->blas, c->dtype, 1, rows, keys, s->Ev, 1.0, g, h->lg, h->v, h->lv,
                   0.0, dp, keys, err);
    }
    if (rc != MT_OK) return rc;
  } else {
    memset(dp, 0, (size_t)(rows * keys) * isz);
  }
  if (s->E == 0) return MT_OK; /* dQ and dK have no columns */
  for (int64_t r = 0; r < rows; ++r) {
    size_t off = (size_t)(r * keys);
    if (c->dtype == MT_DTYPE_FLOAT32) {
      softmax_grad_row_f32((const float *)c->scores + off, (float *)dp + off, keys,
                           (float)c->scale);
    } else {
      softmax_grad_row_f64((const double *)c->scores + off, (double *)dp + off, keys,
                           c->scale);
    }
  }
  /* dQ = dS K and dK[:keys] += dS^T Q. */
  rc = mt_gemm(c->blas, c->dtype, 0, rows, s->E, keys, 1.0, dp, keys, h->k, h->lk, 0.0, dq,
               h->ldq, err);
  if (rc != MT_OK) return rc;
  return mt__gemm2(c->blas, c->dtype, 1, 0, keys, s->E, rows, 1.0, dp, keys, q, h->lq, 1.0,
                   h->dk, h->ldk, err);
}

static int grad_head(const attn_ctx *c, const attn_grad_head *h, void *dp, mt_error *err) {
  const mt_attn_shape *s = &c->sh;
  zero_rows(h->dk, s->S, s->E, h->ldk, c->itemsize);
  zero_rows(h->dv, s->S, s->Ev, h->ldv, c->itemsize);
  int rc = MT_OK;
  for (int64_t i0 = 0; i0 < s->L && rc == MT_OK; i0 += MT__ATTN_BLOCK) {
    int64_t rows = s->L - i0 < MT__ATTN_BLOCK ? s->L - i0 : MT__ATTN_BLOCK;
    rc = grad_block(c, h, dp, i0, rows, err);
  }
  return rc;
}

int mt_attention_backward(const mt_blas *blas, int dtype, const mt_attn_shape *shape,
                          const mt_attn_operand *q, const mt_attn_operand *k,
                          const mt_attn_operand *v, const mt_attn_operand *g,
                          const mt_attn_operand *dq, const mt_attn_operand *dk,
                          const mt_attn_operand *dv, double scale, int causal,
                          mt_error *err) {
  int rc = mt__check_float(dtype, "attention_backward", err);
  if (rc == MT_OK) rc = check_attention(shape, q, k, v, g, err);
  if (rc == MT_OK) rc = check_operand(dq, shape->L, shape->E, "dq", err);
  if (rc == MT_OK) rc = check_operand(dk, shape->S, shape->E, "dk", err);
  if (rc == MT_OK) rc = check_operand(dv, shape->S, shape->Ev, "dv", err);
  if (rc != MT_OK) return rc;
  if (!mt_blas_available(blas)) {
    return mt_error_set(err, MT_ENOTSUP, "attention_backward: no BLAS given (see mt_blas)");
  }
  if (shape->batch == 0 || shape->heads == 0) return MT_OK;
  attn_ctx c = {blas, dtype, mt_dtype_size(dtype), *shape, scale, causal != 0, NULL};
  /* At least one row, so that no operand size gives malloc zero bytes. */
  int64_t rows = shape->L < 1 ? 1 : shape->L < MT__ATTN_BLOCK ? shape->L : MT__ATTN_BLOCK;
  /* Two blocks of scores (P and dP/dS), each padded as the forward's (see there). */
  size_t each = (size_t)(rows * (shape->S > 0 ? shape->S : 1)) *
                    c.itemsize + 64;
  c.scores = malloc(2 * each);
  if (c.scores == NULL) {
    return mt_error_set(err, MT_ENOMEM,
                        "attention_backward: no memory for %zu bytes of scores", 2 * each);
  }
  void *dp = (char *)c.scores + each;
  size_t isz = c.itemsize;
  for (int64_t b = 0; b < shape->batch && rc == MT_OK; ++b) {
    for (int64_t h = 0; h < shape->heads && rc == MT_OK; ++h) {
      attn_grad_head hd = {at(q, b, h, isz),          at(k, b, h, isz),
                           at(v, b, h, isz),          at(g, b, h, isz),
                           (char *)at(dq, b, h, isz), (char *)at(dk, b, h, isz),
                           (char *)at(dv, b, h, isz), q->row_stride,
                           k->row_stride,             v->row_stride,
                           g->row_stride,             dq->row_stride,
                           dk->row_stride,            dv->row_stride};
      rc = grad_head(&c, &hd, dp, err);
    }
  }
  free(c.scores);
  return rc;
}
