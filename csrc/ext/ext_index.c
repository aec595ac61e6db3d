/* Basic keys (ints, slices, None and ...) of DTensors: the stand-in by which the
 * mesh keeps each key's plan (mpitensor._ops._indexing), and the view that a kept
 * plan which moves nothing makes, run here: a program repeats such keys, and the
 * plan's Python steps cost more than NumPy's own slicing. */
#include "ext.h"

/* A slice bound as a basic key caches it: None or an exact int. */
static inline int key_bound(PyObject *b) { return b == Py_None || PyLong_CheckExact(b); }

/* index_key(key): see the method table. */
static PyObject *index_key(PyObject *module, PyObject *key) {
  (void)module;
  int parts = PyTuple_CheckExact(key);
  Py_ssize_t n = parts ? PyTuple_GET_SIZE(key) : 1;
  PyObject *out = PyTuple_New(n);
  for (Py_ssize_t i = 0; out != NULL && i < n; ++i) {
    PyObject *k = parts ? PyTuple_GET_ITEM(key, i) : key, *item = NULL;
    if (PySlice_Check(k)) {
      PySliceObject *s = (PySliceObject *)k;
      if (!key_bound(s->start) || !key_bound(s->stop) || !key_bound(s->step)) break;
      item = PyTuple_Pack(3, s->start, s->stop, s->step);
    } else if (PyLong_CheckExact(k) || k == Py_None || k == Py_Ellipsis) {
      item = Py_NewRef(k);
    } else if (PyArray_IsScalar(k, Integer)) { /* a loop over np.arange's ints */
      item = PyNumber_Index(k);
    } else {
      break;
    }
    if (item == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, i, item);
  }
  if (out != NULL && n > 0 && PyTuple_GET_ITEM(out, n - 1) == NULL) { /* a key it refuses */
    Py_DECREF(out);
    Py_RETURN_NONE;
  }
  return out;
}

/* The plan's view, kept by the mesh for `key` of `b` (a new reference: the tuple
 * (fingerprint, cut, local shape, spec, message) of mpitensor._ops._indexing's
 * _Plan), else NULL without an exception. */
static PyObject *kept_view(mt_ext_dispatch *d, PyObject *module, mt_ext_dtensor *b,
                           PyObject *key) {
  PyObject *ck = index_key(module, key);
  if (ck == NULL || ck == Py_None) {
    Py_XDECREF(ck);
    PyErr_Clear(); /* the Python path reports a bad key */
    return NULL;
  }
  PyObject *spec = b->spec, *view = NULL;
  PyObject *plans = PyObject_GetAttr(PyTuple_GET_ITEM(spec, 0), d->str[MT_S_INDEX_KEYS]);
  PyObject *cache_key = plans == NULL || !PyDict_CheckExact(plans) ? NULL :
      PyTuple_Pack(4, ck, PyTuple_GET_ITEM(spec, 1), PyTuple_GET_ITEM(spec, 2),
                   PyTuple_GET_ITEM(spec, 3));
  PyObject *plan = cache_key == NULL ? NULL : PyDict_GetItemWithError(plans, cache_key);
  if (plan != NULL) view = PyObject_GetAttr(plan, d->str[MT_S_VIEW]);
  Py_DECREF(ck);
  Py_XDECREF(cache_key);
  Py_XDECREF(plans);
  if (view != NULL && PyTuple_CheckExact(view) && PyTuple_GET_SIZE(view) == 5 &&
      PyLong_CheckExact(PyTuple_GET_ITEM(view, 0)) && PyBytes_CheckExact(PyTuple_GET_ITEM(view, 4)))
    return view;
  Py_XDECREF(view);
  PyErr_Clear(); /* the Python path makes the plan, or raises what it must */
  return NULL;
}

/* basic_view(dt, key): see the method table. */
static PyObject *basic_view(PyObject *module, PyObject *const *a, Py_ssize_t n) {
  if (n != 2) return PyErr_Format(PyExc_TypeError, "basic_view(dt, key)");
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  mt_ext_dtensor *b = (mt_ext_dtensor *)a[0];
  PyObject *copy_views = d->modes->copy_views;
  /* The Python path's: an operand the door takes (strided, waiting, wanting a
   * gradient), a tool that listens to every index, and copy-views alive (a view
   * of one is written through Python's records). */
  if (Py_TYPE(a[0]) != d->dtensor || mt_ext_door_operand(d, a[0]) ||
      mt_ext_events(d->modes) ||
      (copy_views != NULL && (!PyDict_CheckExact(copy_views) || PyDict_GET_SIZE(copy_views) > 0)))
    Py_RETURN_NOTIMPLEMENTED;
  PyObject *view = kept_view(d, module, b, a[1]);
  if (view == NULL) Py_RETURN_NOTIMPLEMENTED;
  PyObject *message = PyTuple_GET_ITEM(view, 4), *out = NULL;
  uint64_t fp = (uint64_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(view, 0));
  /* Agreed before the local array is read, as the Python path does. */
  if (!PyErr_Occurred() &&
      mt_ext_mesh_agree(mt_ext_spec_mesh(d, b->spec), fp, PyBytes_AS_STRING(message),
                        PyBytes_GET_SIZE(message)) == 0 &&
      mt_ext_complete(d, b) == 0) {
    PyObject *piece = PyObject_GetItem(b->local, PyTuple_GET_ITEM(view, 1));
    if (piece != NULL && !PyArray_Check(piece)) {
      Py_SETREF(piece, NULL);
      PyErr_SetString(PyExc_TypeError, "basic_view: the plan's cut gave no array");
    }
    PyObject *local = piece == NULL ? NULL :
        PyArray_Reshape((PyArrayObject *)piece, PyTuple_GET_ITEM(view, 2));
    Py_XDECREF(piece);
    if (local != NULL)
      out = mt_ext_new_dtensor(d, local, Py_NewRef(PyTuple_GET_ITEM(view, 3)), 0, 0);
  }
  Py_DECREF(view);
  return out;
}

PyMethodDef mt_ext_index_methods[] = {
    {"index_key", index_key, METH_O,
     "index_key(key) -> a hashable stand-in for a basic key of ints, slices of ints, "
     "None and ... (NumPy's integer scalars as ints), else None: such keys take the "
     "uncached path, which also reports bad ones. Local.\n\n"
     "Example: _C.index_key((slice(None, 4), 0)) == ((None, 4, None), 0)"},
    {"basic_view", (PyCFunction)(void (*)(void))basic_view, METH_FASTCALL,
     "basic_view(dt, key) -> dt[key] for a basic key whose plan the mesh keeps and "
     "that moves nothing: the key agreed, then a view of the local array, so that a "
     "write into it reaches dt; else NotImplemented (a key or operand the Python "
     "path takes, which also makes the plan). Collective on the mesh.\n\n"
     "Example: _C.basic_view(dt, (slice(None), slice(None, 4)))"},
    {NULL, NULL, 0, NULL},
};
