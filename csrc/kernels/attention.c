/* Scaled-dot-product attention per head, in blocks of query rows: the block's
 * scores are one gemm against the keys it may see (all of them, or under a causal
 * mask only those up to its last row, so the masked upper triangle costs nothing),
 * an exact softmax per row, and one gemm with the values. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels-private.h"
#include "mpitensor/dtype.h"
#include "mpitensor/kernels.h"

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
