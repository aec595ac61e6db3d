/* The views C makes from what a mesh keeps, for the calls a program repeats, whose
 * Python steps cost more than NumPy's own: a basic key (ints, slices, None and
 * ...) whose plan moves nothing (mpitensor._ops._indexing), and a reshape of each
 * rank's block in place (mpitensor._ops._shape). Python makes what the mesh keeps
 * on the first call; C reads it. */
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

/* What the mesh of `b` keeps in its dict `attr` for `first` and `b`'s layout,
 * under the key (first, placements, shape, dtype) both Python caches use (a new
 * reference), else NULL without an exception: the Python path makes it. */
static PyObject *kept(mt_ext_dispatch *d, mt_ext_dtensor *b, int attr, PyObject *first) {
  PyObject *spec = b->spec, *found = NULL;
  PyObject *dict = PyObject_GetAttr(PyTuple_GET_ITEM(spec, 0), d->str[attr]);
  PyObject *key = dict == NULL || !PyDict_CheckExact(dict) ? NULL :
      PyTuple_Pack(4, first, PyTuple_GET_ITEM(spec, 1), PyTuple_GET_ITEM(spec, 2),
                   PyTuple_GET_ITEM(spec, 3));
  if (key != NULL) found = PyDict_GetItemWithError(dict, key);
  Py_XINCREF(found);
  Py_XDECREF(key);
  Py_XDECREF(dict);
  PyErr_Clear();
  return found;
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
  PyObject *plan = kept(d, b, MT_S_INDEX_KEYS, ck);
  Py_DECREF(ck);
  PyObject *view = plan == NULL ? NULL : PyObject_GetAttr(plan, d->str[MT_S_VIEW]);
  Py_XDECREF(plan);
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
  /* The Python path's: an operand the door takes (strided, waiting, wanting a
   * gradient) and a tool that listens to every index. Copy-views alive change
   * nothing here: a write into the view, not its making, looks for them. */
  if (Py_TYPE(a[0]) != d->dtensor || mt_ext_door_operand(d, a[0]) ||
      mt_ext_events(d->modes))
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

/* basic_write(dt, key, value): see the method table. */
static PyObject *basic_write(PyObject *module, PyObject *const *a, Py_ssize_t n) {
  if (n != 3) return PyErr_Format(PyExc_TypeError, "basic_write(dt, key, value)");
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  mt_ext_dtensor *b = (mt_ext_dtensor *)a[0];
  PyTypeObject *vt = Py_TYPE(a[2]);
  /* The Python path's, besides basic_view's: a value that is no Python number, a
   * Partial, a local array a write must reach others through (a read-only view,
   * copy-views of its memory). Each is alike on every rank, and either path
   * agrees once on the same fingerprint. */
  if (Py_TYPE(a[0]) != d->dtensor || mt_ext_door_operand(d, a[0]) ||
      mt_ext_events(d->modes) ||
      (vt != &PyFloat_Type && vt != &PyLong_Type && vt != &PyBool_Type) ||
      !mt_ext_whole_along(d, b->spec, -1) ||
      !PyArray_ISWRITEABLE((PyArrayObject *)b->local) ||
      mt_ext_has_copy_views(d->modes, b->local))
    Py_RETURN_NOTIMPLEMENTED;
  PyObject *ck = index_key(module, a[1]);
  PyObject *plan = ck == NULL || ck == Py_None ? NULL : kept(d, b, MT_S_INDEX_KEYS, ck);
  Py_XDECREF(ck);
  PyObject *write = plan == NULL ? NULL : PyObject_GetAttr(plan, d->str[MT_S_WRITE]);
  Py_XDECREF(plan);
  PyErr_Clear(); /* the Python path makes the plan, or raises what it must */
  if (write == NULL || !PyTuple_CheckExact(write) || PyTuple_GET_SIZE(write) != 3 ||
      !PyLong_CheckExact(PyTuple_GET_ITEM(write, 0)) ||
      !PyBytes_CheckExact(PyTuple_GET_ITEM(write, 2))) {
    Py_XDECREF(write);
    Py_RETURN_NOTIMPLEMENTED;
  }
  /* Agreed as the Python path agrees (_indexing.write_number), before the write. */
  PyObject *what = PyTuple_Pack(2, PyTuple_GET_ITEM(write, 0), a[2]), *kwargs = PyDict_New();
  PyObject *message = PyTuple_GET_ITEM(write, 2), *out = NULL;
  uint64_t fp = 0;
  if (what != NULL && kwargs != NULL &&
      mt_ext_fingerprint(d, d->str[MT_S_SETITEM], what, kwargs, &fp) == 0 &&
      mt_ext_mesh_agree(mt_ext_spec_mesh(d, b->spec), fp, PyBytes_AS_STRING(message),
                        PyBytes_GET_SIZE(message)) == 0 &&
      mt_ext_complete(d, b) == 0 &&
      PyObject_SetItem(b->local, PyTuple_GET_ITEM(write, 1), a[2]) == 0)
    out = Py_NewRef(Py_None);
  Py_XDECREF(what);
  Py_XDECREF(kwargs);
  Py_DECREF(write);
  return out;
}

/* Whether `shape` is a tuple of ints, as the reshape cache keys it. */
static int int_tuple(PyObject *shape) {
  if (!PyTuple_CheckExact(shape)) return 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); ++i)
    if (!PyLong_CheckExact(PyTuple_GET_ITEM(shape, i))) return 0;
  return 1;
}

/* The reshape to `shape` of `b`'s layout that reshaped each rank's block in place
 * before, as the mesh keeps it (a new reference: the tuple (spec, local shape,
 * the input's local shape, the call's name) of mpitensor._ops._shape), when this
 * rank's block has that input shape; else NULL without an exception. */
static PyObject *kept_reshape(mt_ext_dispatch *d, mt_ext_dtensor *b, PyObject *shape) {
  PyObject *hit = kept(d, b, MT_S_BLOCK_RESHAPES, shape);
  int same = hit != NULL && PyTuple_CheckExact(hit) && PyTuple_GET_SIZE(hit) == 4 &&
             PyUnicode_CheckExact(PyTuple_GET_ITEM(hit, 3));
  PyArrayObject *local = (PyArrayObject *)b->local;
  PyObject *in = same ? PyTuple_GET_ITEM(hit, 2) : NULL;
  same = same && PyTuple_CheckExact(in) && PyTuple_GET_SIZE(in) == PyArray_NDIM(local);
  for (int i = 0; same && i < PyArray_NDIM(local); ++i)
    same = PyLong_AsSsize_t(PyTuple_GET_ITEM(in, i)) == PyArray_DIM(local, i);
  PyErr_Clear(); /* the Python path raises what it must */
  if (!same) Py_CLEAR(hit);
  return hit;
}

/* block_reshape(func, dt, shape, order, caller): see the method table. */
static PyObject *block_reshape(PyObject *module, PyObject *const *a, Py_ssize_t n) {
  if (n != 5) return PyErr_Format(PyExc_TypeError, "block_reshape(func, dt, shape, order, caller)");
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  mt_ext_dtensor *b = (mt_ext_dtensor *)a[1];
  /* The Python path's: an operand the door takes, a tool that listens, an order
   * or a shape the kept reshapes do not key. */
  if (Py_TYPE(a[1]) != d->dtensor || mt_ext_door_operand(d, a[1]) ||
      mt_ext_events(d->modes) || !PyUnicode_CheckExact(a[3]) ||
      PyUnicode_Compare(a[3], d->str[MT_S_ORDER_C]) != 0 || !int_tuple(a[2]))
    Py_RETURN_NOTIMPLEMENTED;
  PyObject *hit = kept_reshape(d, b, a[2]);
  if (hit == NULL) Py_RETURN_NOTIMPLEMENTED;
  /* Only a program's call is agreed, and an error state that raises agrees on
   * the call's errors after it: both the Python door's. */
  int program = mt_ext_by_program(d, a[4]);
  int raises = program > 0 ? mt_ext_errstate_raises(d) : 0;
  if (program <= 0 || raises != 0) {
    PyErr_Clear();
    Py_DECREF(hit);
    Py_RETURN_NOTIMPLEMENTED;
  }
  PyObject *args = PyTuple_Pack(3, a[1], a[2], a[3]), *kwargs = PyDict_New(), *out = NULL;
  long flags = args == NULL || kwargs == NULL ? -1 :
      mt_ext_agree_call(d, PyTuple_GET_ITEM(hit, 3), args, kwargs, program, 1);
  if (flags >= 0 && (flags & MT_EXT_AGREED_CONTIGUOUS) != 0) {
    /* Every rank's block is C-contiguous (agreed): NumPy's reshape of each is the
     * view it was before. */
    if (mt_ext_complete(d, b) == 0) {
      PyObject *local = PyArray_Reshape((PyArrayObject *)b->local, PyTuple_GET_ITEM(hit, 1));
      if (local != NULL)
        out = mt_ext_new_dtensor(d, local, Py_NewRef(PyTuple_GET_ITEM(hit, 0)), 0, 0);
    }
  } else if (flags >= 0) {
    /* Some rank's block is not: the Python door goes on from this agreement. */
    PyObject *agreed = PyLong_FromLong(flags);
    if (agreed != NULL) out = mt_ext_door_hook(d, a[0], args, kwargs, agreed);
    Py_XDECREF(agreed);
  }
  Py_XDECREF(args);
  Py_XDECREF(kwargs);
  Py_DECREF(hit);
  return out;
}

PyMethodDef mt_ext_views_methods[] = {
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
    {"basic_write", (PyCFunction)(void (*)(void))basic_write, METH_FASTCALL,
     "basic_write(dt, key, value) -> None, having made dt[key] = value, for a basic key "
     "whose plan the mesh keeps, a Python number value and a dt without Partials "
     "whose local array takes the write itself: the write agreed as the Python path "
     "agrees it, then each rank's cut of the key written; else NotImplemented, "
     "nothing done (a key, value or operand the Python path takes, which also makes "
     "the plan). Collective on the mesh.\n\n"
     "Example: _C.basic_write(dt, (0, slice(1, 3)), 0.0)"},
    {"block_reshape", (PyCFunction)(void (*)(void))block_reshape, METH_FASTCALL,
     "block_reshape(func, dt, shape, order, caller) -> dt.reshape(shape) as the "
     "method `func` (numpy.reshape) gives it, when the mesh keeps this layout's "
     "reshape to `shape` (a tuple of ints, order 'C') as one of each rank's block in "
     "place and the frame `caller` is a program's: the call agreed, then a view of "
     "the local array where every rank's block is C-contiguous, else the Python "
     "door from that agreement; else NotImplemented, before any agreement. "
     "Collective on the mesh.\n\n"
     "Example: _C.block_reshape(numpy.reshape, dt, (-1, 2), 'C', sys._getframe(1))"},
    {NULL, NULL, 0, NULL},
};
