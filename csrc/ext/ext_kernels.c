/* The nn kernels (mpitensor/kernels.h) on NumPy arrays. Inputs must already be
 * float32 or float64 of one dtype and laid out as each function says: the Python
 * layer (mpitensor.nn._kernels) checks that and uses NumPy otherwise, so a
 * mismatch here is a TypeError or ValueError, never a silent copy. All Local; the
 * GIL is released while a kernel runs. */
#include "ext.h"
#include "mpitensor/kernels/kernels.h"

/* The array behind args[i], float32/float64 of `dtype` (or any of the two when
 * *dtype < 0, which is then set), C-contiguous and aligned unless `any_layout`. */
static PyArrayObject *float_arg(PyObject *obj, int *dtype, int any_layout,
                                const char *name) {
  if (!PyArray_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be an ndarray, got %s", name,
                 Py_TYPE(obj)->tp_name);
    return NULL;
  }
  PyArrayObject *a = (PyArrayObject *)obj;
  int t = PyArray_TYPE(a);
  int code = t == NPY_FLOAT32 ? MT_DTYPE_FLOAT32 : t == NPY_FLOAT64 ? MT_DTYPE_FLOAT64 : -1;
  if (code < 0 || (*dtype >= 0 && code != *dtype)) {
    PyErr_Format(PyExc_TypeError, "%s: float32 or float64 of one dtype, got %R", name,
                 (PyObject *)PyArray_DESCR(a));
    return NULL;
  }
  if (!PyArray_ISALIGNED(a) || !PyArray_ISNOTSWAPPED(a) ||
      (!any_layout && !PyArray_IS_C_CONTIGUOUS(a))) {
    PyErr_Format(PyExc_ValueError, "%s must be an aligned C-contiguous array", name);
    return NULL;
  }
  *dtype = code;
  return a;
}

/* NULL for None, else the array as float_arg; sets *ok to 0 on error. */
static PyArrayObject *optional_arg(PyObject *obj, int *dtype, npy_intp size,
                                   const char *name, int *ok) {
  if (obj == Py_None) return NULL;
  PyArrayObject *a = float_arg(obj, dtype, 0, name);
  if (a != NULL && PyArray_SIZE(a) != size) {
    PyErr_Format(PyExc_ValueError, "%s has %zd elements, expected %zd", name,
                 (Py_ssize_t)PyArray_SIZE(a), (Py_ssize_t)size);
    a = NULL;
  }
  *ok = a != NULL;
  return a;
}

/* A new array of x's dtype and shape. */
static PyArrayObject *like(PyObject *module, PyArrayObject *x) {
  return mt_ext_new_array(module, PyArray_DESCR(x), PyArray_NDIM(x), PyArray_DIMS(x));
}

static PyObject *kernels_have_blas(PyObject *module, PyObject *unused) {
  return PyBool_FromLong(mt_blas_available(&mt_ext_state_of(module)->blas));
}

/* kernels_set_blas(sgemm, dgemm, ilp64): the CBLAS functions at these addresses
 * (ints, as ctypes gives them from a library it loaded, which keeps it loaded)
 * become the module's BLAS, handed to every gemm and attention; (0, 0, any)
 * removes it. Changed under the GIL, and each call copies it before releasing
 * the GIL, so a kernel running in another thread keeps the one it started with. */
static PyObject *kernels_set_blas(PyObject *module, PyObject *const *args,
                                  Py_ssize_t nargs) {
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "kernels_set_blas(sgemm, dgemm, ilp64)");
  void *s = PyLong_AsVoidPtr(args[0]);
  void *d = s == NULL && PyErr_Occurred() ? NULL : PyLong_AsVoidPtr(args[1]);
  int ilp64 = PyObject_IsTrue(args[2]);
  if (PyErr_Occurred() || ilp64 < 0) return NULL;
  mt_blas blas = {0};
  /* POSIX (dlsym) guarantees that a data pointer holds a function's address. */
  if (ilp64) {
    blas.sgemm64 = (mt_sgemm_ilp64 *)s, blas.dgemm64 = (mt_dgemm_ilp64 *)d;
  } else {
    blas.sgemm = (mt_sgemm_lp64 *)s, blas.dgemm = (mt_dgemm_lp64 *)d;
  }
  mt_error err = {0};
  int rc = mt_blas_check(&blas, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  mt_ext_state_of(module)->blas = blas;
  Py_RETURN_NONE;
}

/* A 2-D gemm operand: its last dim contiguous (or of size <= 1), its row stride in
 * whole elements, returned in elements (the row length when there is no second row
 * or no element: NumPy gives such dims any stride, and they are never used). */
static int gemm_operand(PyArrayObject *a, int64_t *ld, const char *name) {
  npy_intp size = PyArray_ITEMSIZE(a);
  if (PyArray_NDIM(a) != 2) goto bad;
  int64_t cols = PyArray_DIM(a, 1) > 1 ? PyArray_DIM(a, 1) : 1;
  *ld = cols;
  if (PyArray_SIZE(a) == 0) return 0;
  if ((PyArray_DIM(a, 1) > 1 && PyArray_STRIDE(a, 1) != size) || PyArray_STRIDE(a, 0) % size) {
    goto bad;
  }
  if (PyArray_DIM(a, 0) > 1) *ld = PyArray_STRIDE(a, 0) / size;
  return 0;
bad:
  PyErr_Format(PyExc_ValueError, "gemm: %s must be 2-D with a contiguous last dim", name);
  return -1;
}

/* gemm(a, b, c, trans_b, alpha, beta): c = alpha a @ (b.T if trans_b else b) + beta c
 * in place, for 2-D arrays a (m, k), b (k, n) or (n, k), c (m, n). */
static PyObject *gemm(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 6) return PyErr_Format(PyExc_TypeError, "gemm(a, b, c, trans_b, alpha, beta)");
  static const char *names[3] = {"a", "b", "c"};
  int dtype = -1;
  PyArrayObject *x[3];
  int64_t ld[3];
  for (int i = 0; i < 3; ++i) {
    x[i] = float_arg(args[i], &dtype, 1, names[i]);
    if (x[i] == NULL || gemm_operand(x[i], &ld[i], names[i]) < 0) return NULL;
  }
  int tb = PyObject_IsTrue(args[3]);
  double alpha = PyFloat_AsDouble(args[4]), beta = PyFloat_AsDouble(args[5]);
  if (tb < 0 || PyErr_Occurred()) return NULL;
  npy_intp m = PyArray_DIM(x[0], 0), k = PyArray_DIM(x[0], 1);
  npy_intp n = PyArray_DIM(x[2], 1);
  if (PyArray_DIM(x[1], tb ? 1 : 0) != k || PyArray_DIM(x[1], tb ? 0 : 1) != n ||
      PyArray_DIM(x[2], 0) != m) {
    return PyErr_Format(PyExc_ValueError, "gemm: shapes do not match");
  }
  if (!PyArray_ISWRITEABLE(x[2])) return PyErr_Format(PyExc_ValueError, "gemm: c must be writable");
  mt_blas blas = mt_ext_state_of(module)->blas;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_gemm(&blas, dtype, tb, m, n, k, alpha, PyArray_DATA(x[0]), ld[0],
               PyArray_DATA(x[1]), ld[1], beta, PyArray_DATA(x[2]), ld[2], &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

/* A kernel's new output array, or its error (the array is dropped). */
static PyObject *new_result(int rc, PyArrayObject *y, const mt_error *err) {
  if (rc == MT_OK) return (PyObject *)y;
  Py_DECREF(y);
  return mt_ext_raise(rc, err);
}

/* gelu(x, approximate) -> a new array: approximate 0 erf, 1 tanh. */
static PyObject *gelu(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "gelu(x, approximate)");
  int dtype = -1;
  PyArrayObject *x = float_arg(args[0], &dtype, 0, "gelu: x");
  long approx = PyLong_AsLong(args[1]);
  if (x == NULL || (approx == -1 && PyErr_Occurred())) return NULL;
  PyArrayObject *y = like(module, x);
  if (y == NULL) return NULL;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_gelu(dtype, (int)approx, (int64_t)PyArray_SIZE(x), PyArray_DATA(x),
               PyArray_DATA(y), &err);
  Py_END_ALLOW_THREADS
  return new_result(rc, y, &err);
}

/* gelu_backward(x, g, approximate) -> g * gelu'(x) as a new array; x and g of one
 * dtype and size. */
static PyObject *gelu_backward(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "gelu_backward(x, g, approximate)");
  int dtype = -1;
  PyArrayObject *x = float_arg(args[0], &dtype, 0, "gelu_backward: x");
  if (x == NULL) return NULL;
  PyArrayObject *g = float_arg(args[1], &dtype, 0, "gelu_backward: g");
  long approx = PyLong_AsLong(args[2]);
  if (g == NULL || (approx == -1 && PyErr_Occurred())) return NULL;
  if (PyArray_SIZE(g) != PyArray_SIZE(x)) {
    return PyErr_Format(PyExc_ValueError, "gelu_backward: g has %zd elements, x %zd",
                        (Py_ssize_t)PyArray_SIZE(g), (Py_ssize_t)PyArray_SIZE(x));
  }
  PyArrayObject *y = like(module, x);
  if (y == NULL) return NULL;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_gelu_backward(dtype, (int)approx, (int64_t)PyArray_SIZE(x), PyArray_DATA(x),
                        PyArray_DATA(g), PyArray_DATA(y), &err);
  Py_END_ALLOW_THREADS
  return new_result(rc, y, &err);
}

/* adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq or None, decay, l2,
 * beta1, beta2, step_size, bias_correction2_sqrt, eps, maximize) -> None: one Adam
 * step in place on C-contiguous arrays of one dtype and size. */
static PyObject *adam_update(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 13) {
    return PyErr_Format(PyExc_TypeError,
                        "adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, "
                        "decay, l2, beta1, beta2, step_size, bias_correction2_sqrt, eps, "
                        "maximize)");
  }
  static const char *names[] = {"adam_update: param", "adam_update: grad",
                                "adam_update: exp_avg", "adam_update: exp_avg_sq",
                                "adam_update: max_exp_avg_sq"};
  int dtype = -1;
  PyArrayObject *a[5] = {NULL};
  for (int i = 0; i < 5; ++i) {
    if (i == 4 && args[i] == Py_None) break;
    a[i] = float_arg(args[i], &dtype, 0, names[i]);
    if (a[i] == NULL) return NULL;
    if (i > 0 && PyArray_SIZE(a[i]) != PyArray_SIZE(a[0])) {
      return PyErr_Format(PyExc_ValueError, "%s has %zd elements, the parameter %zd",
                          names[i], (Py_ssize_t)PyArray_SIZE(a[i]),
                          (Py_ssize_t)PyArray_SIZE(a[0]));
    }
    if (i != 1 && !PyArray_ISWRITEABLE(a[i])) {
      return PyErr_Format(PyExc_ValueError, "%s is read-only", names[i]);
    }
  }
  mt_adam_hyper h = {0};
  double *fields[] = {&h.decay, &h.l2, &h.beta1, &h.beta2, &h.step_size,
                      &h.bias_correction2_sqrt, &h.eps};
  for (int i = 0; i < 7; ++i) {
    *fields[i] = PyFloat_AsDouble(args[5 + i]);
    if (*fields[i] == -1.0 && PyErr_Occurred()) return NULL;
  }
  h.maximize = PyObject_IsTrue(args[12]);
  if (h.maximize < 0) return NULL;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_adam_update(dtype, (int64_t)PyArray_SIZE(a[0]), PyArray_DATA(a[0]),
                      PyArray_DATA(a[1]), PyArray_DATA(a[2]), PyArray_DATA(a[3]),
                      a[4] == NULL ? NULL : PyArray_DATA(a[4]), &h, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

/* softmax(x, log) -> softmax (log 0) or log_softmax (log 1) along the last dim. */
static PyObject *softmax(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "softmax(x, log)");
  int dtype = -1;
  PyArrayObject *x = float_arg(args[0], &dtype, 0, "softmax: x");
  int log = PyObject_IsTrue(args[1]);
  if (x == NULL || log < 0) return NULL;
  if (PyArray_NDIM(x) < 1) return PyErr_Format(PyExc_ValueError, "softmax: x is 0-d");
  PyArrayObject *y = like(module, x);
  if (y == NULL) return NULL;
  int64_t cols = PyArray_DIM(x, PyArray_NDIM(x) - 1);
  int64_t rows = cols > 0 ? (int64_t)PyArray_SIZE(x) / cols : 0;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_softmax_rows(dtype, log, rows, cols, PyArray_DATA(x), PyArray_DATA(y), &err);
  Py_END_ALLOW_THREADS
  return new_result(rc, y, &err);
}

/* layer_norm(x, cols, weight, bias, eps): over the trailing `cols` elements of
 * each row of x; weight and bias None or `cols` elements. */
static PyObject *layer_norm(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 5) return PyErr_Format(PyExc_TypeError, "layer_norm(x, cols, w, b, eps)");
  int dtype = -1, ok = 1;
  PyArrayObject *x = float_arg(args[0], &dtype, 0, "layer_norm: x");
  Py_ssize_t cols = PyLong_AsSsize_t(args[1]);
  double eps = PyFloat_AsDouble(args[4]);
  if (x == NULL || PyErr_Occurred()) return NULL;
  if (cols <= 0 || PyArray_SIZE(x) % cols != 0) {
    return PyErr_Format(PyExc_ValueError, "layer_norm: %zd columns do not divide x", cols);
  }
  PyArrayObject *w = optional_arg(args[2], &dtype, cols, "layer_norm: weight", &ok);
  PyArrayObject *b = ok ? optional_arg(args[3], &dtype, cols, "layer_norm: bias", &ok) : NULL;
  if (!ok) return NULL;
  PyArrayObject *y = like(module, x);
  if (y == NULL) return NULL;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_layer_norm_rows(dtype, (int64_t)(PyArray_SIZE(x) / cols), cols, PyArray_DATA(x),
                          w ? PyArray_DATA(w) : NULL, b ? PyArray_DATA(b) : NULL, eps,
                          PyArray_DATA(y), &err);
  Py_END_ALLOW_THREADS
  return new_result(rc, y, &err);
}

/* A 4-D (batch, heads, rows, cols) array as an attention operand: its last dim
 * contiguous (or of size <= 1) and its strides whole elements. */
static int attn_operand(PyArrayObject *a, mt_attn_operand *op, const char *name) {
  npy_intp size = PyArray_ITEMSIZE(a);
  npy_intp *st = PyArray_STRIDES(a);
  if (PyArray_NDIM(a) == 4 && PyArray_SIZE(a) == 0) {
    /* NumPy gives empty arrays any strides (often 0); none is ever used. */
    *op = (mt_attn_operand){PyArray_DATA(a), 0, 0, PyArray_DIM(a, 3)};
    return 0;
  }
  if (PyArray_NDIM(a) != 4 || (PyArray_DIM(a, 3) > 1 && st[3] != size) ||
      st[0] % size || st[1] % size || st[2] % size) {
    PyErr_Format(PyExc_ValueError,
                 "attention: %s must be 4-D with a contiguous last dim", name);
    return -1;
  }
  *op = (mt_attn_operand){PyArray_DATA(a), st[0] / size, st[1] / size, st[2] / size};
  return 0;
}

static int attn_shapes(PyArrayObject *const *a, mt_attn_shape *s) {
  npy_intp *q = PyArray_DIMS(a[0]), *k = PyArray_DIMS(a[1]), *v = PyArray_DIMS(a[2]),
           *o = PyArray_DIMS(a[3]);
  *s = (mt_attn_shape){q[0], q[1], q[2], k[2], q[3], v[3]};
  for (int i = 1; i < 4; ++i) {
    npy_intp *d = PyArray_DIMS(a[i]);
    if (d[0] != q[0] || d[1] != q[1]) goto bad;
  }
  if (k[3] != q[3] || v[2] != k[2] || o[2] != q[2] || o[3] != v[3]) goto bad;
  return 0;
bad:
  PyErr_SetString(PyExc_ValueError,
                  "attention: q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev) and out "
                  "(B, H, L, Ev) expected");
  return -1;
}

/* The n array arguments of attention (q, k, v, then the outputs from `first_out`
 * on, which must be writable), followed by scale and causal. */
static int attn_args(PyObject *const *args, int n, int first_out, const char *const *names,
                     PyArrayObject **a, mt_attn_operand *op, int *dtype,
                     mt_attn_shape *shape, double *scale, int *causal) {
  for (int i = 0; i < n; ++i) {
    a[i] = float_arg(args[i], dtype, 1, names[i]);
    if (a[i] == NULL || attn_operand(a[i], &op[i], names[i]) < 0) return -1;
    if (i >= first_out && !PyArray_ISWRITEABLE(a[i])) {
      PyErr_Format(PyExc_ValueError, "%s must be writable", names[i]);
      return -1;
    }
  }
  *scale = PyFloat_AsDouble(args[n]);
  *causal = PyObject_IsTrue(args[n + 1]);
  if (attn_shapes(a, shape) < 0 || PyErr_Occurred() || *causal < 0) return -1;
  return 0;
}

/* attention(q, k, v, out, scale, causal): writes softmax(q k^T scale) v into out. */
static PyObject *attention(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 6) return PyErr_Format(PyExc_TypeError, "attention(q, k, v, out, scale, causal)");
  static const char *names[4] = {"attention: q", "attention: k", "attention: v",
                                 "attention: out"};
  int dtype = -1, causal;
  PyArrayObject *a[4];
  mt_attn_operand op[4];
  mt_attn_shape shape;
  double scale;
  if (attn_args(args, 4, 3, names, a, op, &dtype, &shape, &scale, &causal) < 0) return NULL;
  mt_blas blas = mt_ext_state_of(module)->blas;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_attention(&blas, dtype, &shape, &op[0], &op[1], &op[2], &op[3], scale, causal,
                    &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

/* attention_backward(q, k, v, g, dq, dk, dv, scale, causal): writes attention's
 * gradients in q, k, v for the output's gradient g into dq, dk, dv. */
static PyObject *attention_backward(PyObject *module, PyObject *const *args,
                                    Py_ssize_t nargs) {
  if (nargs != 9) {
    return PyErr_Format(PyExc_TypeError,
                        "attention_backward(q, k, v, g, dq, dk, dv, scale, causal)");
  }
  static const char *names[7] = {
      "attention_backward: q",  "attention_backward: k",  "attention_backward: v",
      "attention_backward: g",  "attention_backward: dq", "attention_backward: dk",
      "attention_backward: dv"};
  int dtype = -1, causal;
  PyArrayObject *a[7];
  mt_attn_operand op[7];
  mt_attn_shape shape;
  double scale;
  if (attn_args(args, 7, 4, names, a, op, &dtype, &shape, &scale, &causal) < 0) return NULL;
  /* The gradients have their operands' shapes: the core's operands carry strides
   * only, so this is the one place their extents are checked. */
  for (int i = 4; i < 7; ++i) {
    if (!PyArray_SAMESHAPE(a[i], a[i - 4])) {
      return PyErr_Format(PyExc_ValueError, "%s must have the shape of %s", names[i],
                          names[i - 4]);
    }
  }
  mt_blas blas = mt_ext_state_of(module)->blas;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_attention_backward(&blas, dtype, &shape, &op[0], &op[1], &op[2], &op[3], &op[4],
                             &op[5], &op[6], scale, causal, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

PyMethodDef mt_ext_kernels_methods[] = {
    {"kernels_have_blas", kernels_have_blas, METH_NOARGS,
     "kernels_have_blas(): whether gemm and attention can run in C (a BLAS is "
     "installed). Local."},
    {"kernels_set_blas", (PyCFunction)(void (*)(void))kernels_set_blas, METH_FASTCALL,
     "kernels_set_blas(sgemm, dgemm, ilp64): install the CBLAS gemms at these "
     "addresses (0, 0: none). Local."},
    {"attention_backward", (PyCFunction)(void (*)(void))attention_backward, METH_FASTCALL,
     "attention_backward(q, k, v, g, dq, dk, dv, scale, causal): attention's gradients "
     "for the output's gradient g written into dq, dk, dv. Local."},
    {"gemm", (PyCFunction)(void (*)(void))gemm, METH_FASTCALL,
     "gemm(a, b, c, trans_b, alpha, beta): c = alpha a @ op(b) + beta c in place. "
     "Local."},
    {"gelu", (PyCFunction)(void (*)(void))gelu, METH_FASTCALL,
     "gelu(x, approximate): GELU as a new array (0 exact, 1 tanh). Local."},
    {"gelu_backward", (PyCFunction)(void (*)(void))gelu_backward, METH_FASTCALL,
     "gelu_backward(x, g, approximate): g * gelu'(x) as a new array. Local."},
    {"adam_update", (PyCFunction)(void (*)(void))adam_update, METH_FASTCALL,
     "adam_update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, l2, beta1, "
     "beta2, step_size, bias_correction2_sqrt, eps, maximize): one Adam step in "
     "place. Local."},
    {"softmax", (PyCFunction)(void (*)(void))softmax, METH_FASTCALL,
     "softmax(x, log): (log_)softmax along the last dim as a new array. Local."},
    {"layer_norm", (PyCFunction)(void (*)(void))layer_norm, METH_FASTCALL,
     "layer_norm(x, cols, weight, bias, eps): layer norm of rows of `cols`. Local."},
    {"attention", (PyCFunction)(void (*)(void))attention, METH_FASTCALL,
     "attention(q, k, v, out, scale, causal): scaled-dot-product attention of 4-D "
     "arrays into out. Local."},
    {NULL, NULL, 0, NULL},
};
