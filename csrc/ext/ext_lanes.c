/* The kernels along an axis (mpitensor/core/lanes.h) on NumPy arrays: cumulate for
 * cumsum and cumprod along a sharded axis, arg_extreme for argmax and argmin. */
#include "ext.h"

#include "mpitensor/core/lanes.h"

/* The lanes of C-contiguous `a` along `axis`, and the shape without that axis
 * (its ndim - 1 dims in `rest`); -1 with an exception. */
static int lanes_of(PyArrayObject *a, PyObject *axis_obj, mt_lanes *l, npy_intp *rest) {
  if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISNOTSWAPPED(a) || mt_ext_dtype(a) < 0) {
    PyErr_SetString(PyExc_TypeError, "expected a C-contiguous array of a numeric dtype "
                    "in native byte order");
    return -1;
  }
  long axis = PyLong_AsLong(axis_obj);
  if (axis == -1 && PyErr_Occurred()) return -1;
  int nd = PyArray_NDIM(a);
  if (axis < 0 || axis >= nd) {
    PyErr_Format(PyExc_ValueError, "axis %ld is out of range for %d dims", axis, nd);
    return -1;
  }
  const npy_intp *dims = PyArray_DIMS(a);
  *l = (mt_lanes){1, dims[axis], 1};
  for (int d = 0, k = 0; d < nd; ++d) {
    if (d == axis) continue;
    rest[k++] = dims[d];
    if (d < axis) l->outer *= dims[d];
    if (d > axis) l->inner *= dims[d];
  }
  return 0;
}

/* cumulate(x, axis, op, init, scan) -> (out or None, last). */
static PyObject *cumulate(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyArray_Check(args[0]) || (args[3] != Py_None && !PyArray_Check(args[3])))
    return PyErr_Format(PyExc_TypeError, "cumulate(x, axis, op, init, scan)");
  PyArrayObject *x = (PyArrayObject *)args[0], *init = NULL;
  mt_lanes l;
  npy_intp rest[NPY_MAXDIMS];
  if (lanes_of(x, args[1], &l, rest) < 0) return NULL;
  long op = PyLong_AsLong(args[2]);
  int scan = PyObject_IsTrue(args[4]);
  if ((op == -1 && PyErr_Occurred()) || scan < 0) return NULL;
  if (args[3] != Py_None) {
    init = (PyArrayObject *)args[3];
    if (!PyArray_IS_C_CONTIGUOUS(init) ||
        !PyArray_EquivTypes(PyArray_DESCR(init), PyArray_DESCR(x)) ||
        PyArray_SIZE(init) != l.outer * l.inner)
      return PyErr_Format(PyExc_ValueError, "init must be a C-contiguous array of one "
                          "element per lane, of the input's dtype");
  }
  PyArray_Descr *descr = PyArray_DESCR(x);
  int nd = PyArray_NDIM(x);
  PyArrayObject *out = scan ? mt_ext_new_array(module, descr, nd, PyArray_DIMS(x)) : NULL;
  PyArrayObject *last = mt_ext_new_array(module, descr, nd - 1, rest);
  if ((scan && out == NULL) || last == NULL) goto fail;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_cumulate(out ? PyArray_DATA(out) : NULL, PyArray_DATA(last), PyArray_DATA(x),
                   init ? PyArray_DATA(init) : NULL, &l, mt_ext_dtype(x), (int)op, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) {
    mt_ext_raise(rc, &err);
    goto fail;
  }
  return Py_BuildValue("(NN)", out ? (PyObject *)out : Py_NewRef(Py_None), (PyObject *)last);
fail:
  Py_XDECREF(out);
  Py_XDECREF(last);
  return NULL;
}

/* arg_extreme(x, axis, largest) -> (int64 index, value), without the axis. */
static PyObject *arg_extreme(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyArray_Check(args[0]))
    return PyErr_Format(PyExc_TypeError, "arg_extreme(x, axis, largest)");
  PyArrayObject *x = (PyArrayObject *)args[0];
  mt_lanes l;
  npy_intp rest[NPY_MAXDIMS];
  if (lanes_of(x, args[1], &l, rest) < 0) return NULL;
  int largest = PyObject_IsTrue(args[2]);
  if (largest < 0) return NULL;
  int nd = PyArray_NDIM(x) - 1;
  PyArray_Descr *int64 = PyArray_DescrFromType(NPY_INT64);
  PyArrayObject *index = mt_ext_new_array(module, int64, nd, rest);
  Py_DECREF(int64);
  PyArrayObject *value = mt_ext_new_array(module, PyArray_DESCR(x), nd, rest);
  if (index == NULL || value == NULL) goto fail;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_arg_extreme(PyArray_DATA(index), PyArray_DATA(value), PyArray_DATA(x), &l,
                      mt_ext_dtype(x), largest, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) {
    mt_ext_raise(rc, &err);
    goto fail;
  }
  return Py_BuildValue("(NN)", (PyObject *)index, (PyObject *)value);
fail:
  Py_XDECREF(index);
  Py_XDECREF(value);
  return NULL;
}

PyMethodDef mt_ext_lanes_methods[] = {
    {"cumulate", (PyCFunction)(void (*)(void))cumulate, METH_FASTCALL,
     "cumulate(x, axis, op, init, scan) -> (out, last): running sums (REDUCE_SUM) or "
     "products (REDUCE_PRODUCT) of C-contiguous x along axis, each lane starting from "
     "init (None: from its first element); out is None unless scan; last holds each "
     "lane's final value (mt_cumulate). Local."},
    {"arg_extreme", (PyCFunction)(void (*)(void))arg_extreme, METH_FASTCALL,
     "arg_extreme(x, axis, largest) -> (index, value): numpy.argmax (largest) or argmin "
     "of C-contiguous x along axis, as int64, and the extremes (mt_arg_extreme). Local."},
    {NULL, NULL, 0, NULL},
};
