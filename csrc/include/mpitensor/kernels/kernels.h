/* Dense compute of the nn layers on one rank's local arrays: GELU, row softmax,
 * layer norm and an Adam step in one pass each, gemm through a CBLAS the caller
 * hands in, and scaled-dot-product attention (two such gemms) that computes only
 * the unmasked blocks of a causal mask. Buffers hold
 * `dtype` elements, MT_DTYPE_FLOAT32 or MT_DTYPE_FLOAT64 (else MT_ETYPE). Every
 * call is Local; none communicates, and only attention allocates (a block of
 * scores, freed before it returns). */
#ifndef MPITENSOR_KERNELS_H
#define MPITENSOR_KERNELS_H

#include <stdint.h>

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* CBLAS's sgemm and dgemm as a BLAS library exports them (cblas_sgemm ...), with
 * the reference CBLAS's enum values for order and transposes: LP64 libraries take
 * int sizes, ILP64 ones (NumPy's bundled OpenBLAS, MKL's *_64) int64_t sizes. */
typedef void mt_sgemm_lp64(int order, int trans_a, int trans_b, int m, int n, int k,
                           float alpha, const float *a, int lda, const float *b, int ldb,
                           float beta, float *c, int ldc);
typedef void mt_dgemm_lp64(int order, int trans_a, int trans_b, int m, int n, int k,
                           double alpha, const double *a, int lda, const double *b,
                           int ldb, double beta, double *c, int ldc);
typedef void mt_sgemm_ilp64(int order, int trans_a, int trans_b, int64_t m, int64_t n,
                            int64_t k, float alpha, const float *a, int64_t lda,
                            const float *b, int64_t ldb, float beta, float *c,
                            int64_t ldc);
typedef void mt_dgemm_ilp64(int order, int trans_a, int trans_b, int64_t m, int64_t n,
                            int64_t k, double alpha, const double *a, int64_t lda,
                            const double *b, int64_t ldb, double beta, double *c,
                            int64_t ldc);

/* The BLAS the kernels call: the LP64 pair or the ILP64 pair, the other NULL. */
typedef struct mt_blas {
  mt_sgemm_lp64 *sgemm;
  mt_dgemm_lp64 *dgemm;
  mt_sgemm_ilp64 *sgemm64;
  mt_dgemm_ilp64 *dgemm64;
} mt_blas;

/* Local. MT_OK for a usable mt_blas: NULL or all four NULL (no BLAS), or exactly one
 * complete pair; MT_EINVAL otherwise (half a pair, or parts of both). Check a
 * struct once when it is made, before handing it to the kernels:
 *
 *   mt_blas blas = {.sgemm = cblas_sgemm, .dgemm = cblas_dgemm};
 *   if (mt_blas_check(&blas, &err) != MT_OK) ...
 */
MT_EXPORT int mt_blas_check(const mt_blas *blas, mt_error *err);

/* Local. 1 when `blas` holds a complete pair, which mt_gemm and mt_attention need
 * (without one they return MT_ENOTSUP); else 0. */
MT_EXPORT int mt_blas_available(const mt_blas *blas);

/* Local. c (m, n) = alpha * a (m, k) @ op(b) + beta * c, row-major, where op(b) is
 * b (k, n) or, with `trans_b`, b^T for b stored (n, k); lda/ldb/ldc are row
 * strides in elements, each at least its row's length (and 1). alpha and beta are
 * converted to `dtype`. m or n == 0 does nothing; k == 0 leaves beta * c (zeros
 * when beta == 0), through `blas`. MT_ENOTSUP when `blas` holds no BLAS;
 * MT_EOVERFLOW when a size or stride exceeds an LP64 BLAS's int.
 *
 *   mt_gemm(&blas, MT_DTYPE_FLOAT64, 0, 2, 2, 3, 1.0, a, 3, b, 2, 0.0, c, 2, &err);
 */
MT_EXPORT int mt_gemm(const mt_blas *blas, int dtype, int trans_b, int64_t m, int64_t n,
                      int64_t k, double alpha, const void *a, int64_t lda,
                      const void *b, int64_t ldb, double beta, void *c, int64_t ldc,
                      mt_error *err);

typedef enum mt_gelu_approx {
  MT_GELU_ERF = 0, /* x * Phi(x), Phi through erfc */
  MT_GELU_TANH = 1 /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
} mt_gelu_approx;

/* Local. y[i] = gelu(x[i]) for n elements; y may be x (in place). */
MT_EXPORT int mt_gelu(int dtype, int approx, int64_t n, const void *x, void *y,
                      mt_error *err);

/* Local. gx[i] = g[i] * gelu'(x[i]) for n elements, in one pass (the backward of
 * mt_gelu with the same `approx`); gx may be g (in place). */
MT_EXPORT int mt_gelu_backward(int dtype, int approx, int64_t n, const void *x,
                               const void *g, void *gx, mt_error *err);

/* Local. Each of `rows` rows of `cols` elements: y = softmax(x) or, with `log`
 * nonzero, log_softmax(x), both with the row maximum subtracted first. y may be x. */
MT_EXPORT int mt_softmax_rows(int dtype, int log, int64_t rows, int64_t cols,
                              const void *x, void *y, mt_error *err);

/* Local. Each of `rows` rows of `cols` elements: y = (x - mean) / sqrt(var + eps)
 * * weight + bias (biased variance, as torch); `weight` and `bias` are NULL or
 * `cols` elements. y may be x. */
MT_EXPORT int mt_layer_norm_rows(int dtype, int64_t rows, int64_t cols, const void *x,
                                 const void *weight, const void *bias, double eps,
                                 void *y, mt_error *err);

/* What one Adam/AdamW step applies to every element (mpitensor.optim.Adam's
 * update): `decay` multiplies the parameter first (AdamW's 1 - lr * weight_decay;
 * 1.0 for none), `l2` adds l2 * p to the gradient (Adam's weight_decay; 0 for
 * none), `maximize` negates the gradient; step_size is lr / (1 - beta1^t) and
 * bias_correction2_sqrt sqrt(1 - beta2^t). */
typedef struct mt_adam_hyper {
  double decay, l2, beta1, beta2, step_size, bias_correction2_sqrt, eps;
  int maximize;
} mt_adam_hyper;

/* Local. One Adam step of n elements in place: the parameter, its first and
 * second moments and, when not NULL (amsgrad), the running maximum of the second
 * moment, from the gradient `grad`. Each element is computed in `dtype` with the
 * operations and order of the NumPy statements it replaces (same bits). */
MT_EXPORT int mt_adam_update(int dtype, int64_t n, void *param, const void *grad,
                             void *exp_avg, void *exp_avg_sq, void *max_exp_avg_sq,
                             const mt_adam_hyper *h, mt_error *err);

/* One operand of mt_attention: a (batch, heads, rows, cols) array whose last dim
 * is contiguous, with its other strides in elements (so a head may be a strided
 * slice of a projection's output, as (batch, rows, heads, cols) is laid out). */
typedef struct mt_attn_operand {
  const void *data;
  int64_t batch_stride, head_stride, row_stride;
} mt_attn_operand;

/* The sizes of an attention: q (batch, heads, L, E), k (.., S, E), v (.., S, Ev),
 * out (.., L, Ev). */
typedef struct mt_attn_shape {
  int64_t batch, heads, L, S, E, Ev;
} mt_attn_shape;

/* Local. out = softmax(q @ k^T * scale [causal: keys j <= i only]) @ v, per head.
 * Queries are taken in blocks; with `causal` a block's scores and its product
 * with v cover only the keys up to its last row (the masked upper triangle is
 * never computed). Each row's softmax is exact (max subtracted). S == 0 gives
 * zeros. `out->data` is written through. The gemms go through `blas`
 * (MT_ENOTSUP when it holds none). */
MT_EXPORT int mt_attention(const mt_blas *blas, int dtype, const mt_attn_shape *shape,
                           const mt_attn_operand *q, const mt_attn_operand *k,
                           const mt_attn_operand *v, const mt_attn_operand *out,
                           double scale, int causal, mt_error *err);

/* Local. The gradients of mt_attention (same shape, scale and causal) in q, k and v
 * for the output's gradient g (batch, heads, L, Ev): dq (.., L, E), dk (.., S, E),
 * dv (.., S, Ev) are written through (overwritten, not accumulated). The weights
 * are recomputed per block of query rows, as the forward computes them, and the
 * masked keys of a causal block cost nothing; no (L, S) array is made. The gemms go
 * through `blas` (MT_ENOTSUP when it holds none). */
MT_EXPORT int mt_attention_backward(const mt_blas *blas, int dtype,
                                    const mt_attn_shape *shape,
                                    const mt_attn_operand *q, const mt_attn_operand *k,
                                    const mt_attn_operand *v, const mt_attn_operand *g,
                                    const mt_attn_operand *dq,
                                    const mt_attn_operand *dk,
                                    const mt_attn_operand *dv, double scale, int causal,
                                    mt_error *err);

#ifdef __cplusplus
}
#endif
#endif
