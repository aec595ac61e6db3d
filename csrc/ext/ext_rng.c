/* Counter-based random fills of a rank's box of a global tensor. */
#include "ext.h"

/* rng_fill(out, global_shape, offset, seed, stream, dist): fills the C-contiguous
 * float32/float64 array `out`, which is the box at `offset` of a tensor of
 * `global_shape`. Local. */
static PyObject *rng_fill(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyArray_Check(args[0])) {
    return PyErr_Format(PyExc_TypeError,
                        "rng_fill(out: ndarray, global_shape, offset, seed, stream, dist)");
  }
  PyArrayObject *out = (PyArrayObject *)args[0];
  if (!PyArray_IS_C_CONTIGUOUS(out) || !PyArray_ISWRITEABLE(out)) {
    return PyErr_Format(PyExc_ValueError, "rng_fill needs a writable C-contiguous array");
  }
  int dtype = PyArray_TYPE(out) == NPY_FLOAT32   ? MT_DTYPE_FLOAT32
              : PyArray_TYPE(out) == NPY_FLOAT64 ? MT_DTYPE_FLOAT64
                                                 : -1;
  int64_t global[MT_MAX_NDIM];
  mt_box box;
  int ndim = 0, noff = 0;
  if (mt_ext_int64s(args[1], global, MT_MAX_NDIM, &ndim, "global shape") < 0) return NULL;
  if (mt_ext_int64s(args[2], box.offset, MT_MAX_NDIM, &noff, "offset") < 0) return NULL;
  if (noff != ndim || PyArray_NDIM(out) != ndim) {
    return PyErr_Format(PyExc_ValueError, "out, global_shape and offset need equal ndim");
  }
  box.ndim = ndim;
  for (int d = 0; d < ndim; ++d) box.shape[d] = (int64_t)PyArray_DIM(out, d);
  unsigned long long seed = PyLong_AsUnsignedLongLongMask(args[3]);
  unsigned long long stream = PyLong_AsUnsignedLongLongMask(args[4]);
  long dist = PyLong_AsLong(args[5]);
  if (PyErr_Occurred()) return NULL;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_rng_fill_box(PyArray_DATA(out), dtype, (int)dist, seed, stream, global, &box,
                       &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

PyMethodDef mt_ext_rng_methods[] = {
    {"rng_fill", (PyCFunction)(void (*)(void))rng_fill, METH_FASTCALL,
     "rng_fill(out, global_shape, offset, seed, stream, dist): fill `out` with the "
     "Philox values of its box (dist 0 uniform, 1 normal). Local."},
    {NULL, NULL, 0, NULL},
};
