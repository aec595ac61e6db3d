/* Adam's and AdamW's update of one parameter in one pass over its elements. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>

#include "kernels-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/kernels/kernels.h"

/* Each element as the NumPy statements of mpitensor.optim.Adam compute it, in the
 * same order and in the parameter's dtype (the scalars converted to it first, as
 * NumPy does with Python floats), so the results are the same bits:
 *   g = -g (maximize);  p *= decay;  g = g + l2 * p (l2 != 0);
 *   m += (1 - beta1) * (g - m);  v *= beta2;  v += (1 - beta2) * g * g;
 *   vmax = max(vmax, v) (amsgrad, then used as v);
 *   p -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)).
 * NumPy's maximum propagates a NaN of either operand; so does the select here. */
#define MT__ADAM_LOOP(T, SQRT, AMS)                                              \
  for (int64_t i = 0; i < n; ++i) {                                              \
    T gi = maximize ? -g[i] : g[i];                                              \
    T pi = p[i] * decay; /* times 1.0 (none): the same bits */                   \
    gi = coupled ? gi + l2 * pi : gi;                                            \
    T mi = m[i] + one_minus_b1 * (gi - m[i]);                                    \
    T vi = v[i] * b2;                                                            \
    vi = vi + (one_minus_b2 * gi) * gi;                                          \
    m[i] = mi;                                                                   \
    v[i] = vi;                                                                   \
    if (AMS) {                                                                   \
      T w = vmax[i];                                                             \
      vi = (w != w || w >= vi) && vi == vi ? w : vi;                             \
      vmax[i] = vi;                                                              \
    }                                                                            \
    p[i] = pi - step * (mi / (SQRT(vi) / bc2 + eps_));                           \
  }

/* The loops with and without amsgrad's maximum (a store under a condition would
 * keep the loop from vectorizing); the flags become selects. */
#define MT__ADAM_FUNCS(NAME, T, SQRT)                                                   \
  MT__VECTOR_CLONES static void NAME(                                                   \
      int64_t n, T *restrict p, const T *restrict g, T *restrict m, T *restrict v,      \
      T *restrict vmax, int maximize, int coupled, T decay, T l2, T one_minus_b1, T b2, \
      T one_minus_b2, T step, T bc2, T eps_) {                                          \
    if (vmax != NULL) {                                                                 \
      MT__ADAM_LOOP(T, SQRT, 1)                                                         \
    } else {                                                                            \
      MT__ADAM_LOOP(T, SQRT, 0)                                                         \
    }                                                                                   \
  }

MT__ADAM_FUNCS(adam_f32, float, sqrtf)
MT__ADAM_FUNCS(adam_f64, double, sqrt)

int mt_adam_update(int dtype, int64_t n, void *param, const void *grad, void *exp_avg,
                   void *exp_avg_sq, void *max_exp_avg_sq, const mt_adam_hyper *h,
                   mt_error *err) {
  int rc = mt__check_float(dtype, "adam_update", err);
  if (rc != MT_OK) return rc;
  if (n < 0) return mt_error_set(err, MT_EINVAL, "adam_update: negative size %" PRId64, n);
  if (h == NULL || (n > 0 && (param == NULL || grad == NULL || exp_avg == NULL ||
                              exp_avg_sq == NULL))) {
    return mt_error_set(err, MT_EINVAL, "adam_update: NULL buffer");
  }
  int coupled = h->l2 != 0.0;
  if (dtype == MT_DTYPE_FLOAT32) {
    adam_f32(n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h->maximize, coupled,
             (float)h->decay, (float)h->l2, (float)(1.0 - h->beta1),
             (float)h->beta2, (float)(1.0 - h->beta2), (float)h->step_size,
             (float)h->bias_correction2_sqrt, (float)h->eps);
  } else {
    adam_f64(n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h->maximize, coupled,
             h->decay, h->l2, 1.0 - h->beta1, h->beta2, 1.0 - h->beta2,
             h->step_size, h->bias_correction2_sqrt, h->eps);
  }
  return MT_OK;
}
