/* Deferred locals (mpitensor._deferred.Deferred): a DTensor whose local slot holds
 * a computation not run yet, which the next reduction may read through without
 * making its result. Its operands are arrays only their DTensors hold, made
 * read-only while it waits; at most one waits at a time (d->deferred), and it is
 * settled (computed if still held, its operands writable again) by every
 * completion (mt_ext_complete, so before any operation reads or writes a DTensor's
 * data), by every read of a `_local_tensor`, and before the next one waits. A
 * reduction that reads it takes it out first (claim_deferred) and puts it back. */
#include "ext.h"

int mt_ext_settle(mt_ext_dispatch *d) {
  PyObject *p = d->deferred;
  if (p == NULL) return 0;
  d->deferred = NULL;
  /* Held only here: no DTensor can read the result, so it is not computed. */
  PyObject *args[2] = {p, Py_REFCNT(p) > 1 ? Py_True : Py_False};
  PyObject *r = mt_ext_hook_method(d, MT_HOOK_DEFERRED, d->str[MT_S_SETTLE], args, 2);
  Py_DECREF(p);
  Py_XDECREF(r);
  return r == NULL ? -1 : 0;
}

int mt_ext_complete_deferred(mt_ext_dispatch *d, mt_ext_dtensor *b) {
  PyObject *p = Py_NewRef(b->local);
  PyObject *args[1] = {p};
  PyObject *done = mt_ext_hook_method(d, MT_HOOK_DEFERRED, d->str[MT_S_RESULT], args, 1);
  Py_DECREF(p);
  if (done == NULL) return -1;
  Py_XSETREF(b->local, done);
  return 0;
}

/* Whether copy-views made of the memory `local` lies in (the last ndarray of its
 * chain of bases, as mpitensor._registry.memory_of finds it) have records: then
 * a write into it must reach those views, or learn on every rank that none
 * lives, which only Python's write does. -1 with an exception. */
int mt_ext_has_copy_views(const mt_ext_modes *m, PyObject *local) {
  if (m->copy_views == NULL || PyDict_GET_SIZE(m->copy_views) == 0) return 0;
  PyObject *memory = local, *base;
  while ((base = PyArray_BASE((PyArrayObject *)memory)) != NULL &&
         Py_IS_TYPE(base, &PyArray_Type))
    memory = base;
  PyObject *key = PyLong_FromVoidPtr(memory); /* its id() */
  PyObject *records = key != NULL ? PyDict_GetItemWithError(m->copy_views, key) : NULL;
  Py_XDECREF(key);
  if (records == NULL) return PyErr_Occurred() ? -1 : 0;
  return !PyList_Check(records) || PyList_GET_SIZE(records) > 0;
}

static mt_ext_dtensor *dtensor_arg(mt_ext_dispatch *d, PyObject *o) {
  if (d->dtensor == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "mpitensor._C.dispatch_init was not called");
    return NULL;
  }
  if (!mt_ext_is_dtensor(d, o)) {
    PyErr_Format(PyExc_TypeError, "expected a DTensor, got %s", Py_TYPE(o)->tp_name);
    return NULL;
  }
  return (mt_ext_dtensor *)o;
}

static PyObject *defer(PyObject *module, PyObject *p) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (d->deferred_type == NULL || Py_TYPE(p) != d->deferred_type)
    return PyErr_Format(PyExc_TypeError, "defer: expected a Deferred");
  if (mt_ext_settle(d) < 0) return NULL;
  d->deferred = Py_NewRef(p);
  Py_RETURN_NONE;
}

static PyObject *settle_deferred(PyObject *module, PyObject *unused) {
  if (mt_ext_settle(mt_ext_dispatch_module(module)) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *claim_deferred(PyObject *module, PyObject *o) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  mt_ext_dtensor *b = dtensor_arg(d, o);
  if (b == NULL) return NULL;
  if (d->deferred == NULL || b->local != d->deferred) Py_RETURN_NONE;
  PyObject *p = d->deferred;
  d->deferred = NULL;
  return p;
}

/* Whether `o`'s local array is one no other object can write: an ndarray that owns
 * its writable, C-contiguous memory, referenced by the DTensor alone (a view of it
 * would hold a reference), without copy-views (whose writes reach it). */
static PyObject *exclusive(PyObject *module, PyObject *o) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  mt_ext_dtensor *b = dtensor_arg(d, o);
  if (b == NULL) return NULL;
  PyObject *local = b->local;
  int flags = local != NULL && PyArray_CheckExact(local)
                  ? PyArray_FLAGS((PyArrayObject *)local)
                  : 0;
  int need = NPY_ARRAY_OWNDATA | NPY_ARRAY_WRITEABLE | NPY_ARRAY_C_CONTIGUOUS;
  if ((flags & need) != need || Py_REFCNT(local) != 1 ||
      PyArray_BASE((PyArrayObject *)local) != NULL)
    Py_RETURN_FALSE;
  int views = mt_ext_has_copy_views(d->modes, local);
  return views < 0 ? NULL : PyBool_FromLong(!views);
}

/* Whether `o` is large enough that its blocks may wait for the reduction that
 * reads them (mpitensor._ops._deferring, whose Python entry decides on each rank).
 * By the global size, so that every rank takes the same door and agrees alike. */
int mt_ext_may_defer(const mt_ext_dispatch *d, PyObject *o) {
  if (!mt_ext_is_dtensor(d, o) || mt_ext_events(d->modes)) return 0;
  PyObject *spec = ((mt_ext_dtensor *)o)->spec;
  if (spec == NULL || !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) return 0;
  PyObject *shape = PyTuple_GET_ITEM(spec, 2);
  if (!PyTuple_Check(shape)) return 0;
  long long size = 1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape) && size < MT_EXT_DEFER_MIN_SIZE; ++i) {
    long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (n < 0) return PyErr_Clear(), 0;
    size *= n;
  }
  return size >= MT_EXT_DEFER_MIN_SIZE;
}

PyMethodDef mt_ext_deferred_methods[] = {
    {"defer", defer, METH_O,
     "defer(deferred): makes `deferred` (whose operands it froze) the one that waits, "
     "settling the one before. Local."},
    {"settle_deferred", settle_deferred, METH_NOARGS,
     "settle_deferred(): computes the waiting Deferred if a DTensor holds it and gives "
     "its operands their writes back. Local."},
    {"claim_deferred", claim_deferred, METH_O,
     "claim_deferred(dtensor): the Deferred in the DTensor's local slot if it is the "
     "one waiting, which stops waiting (the caller defers it again), else None. "
     "Local."},
    {"exclusive", exclusive, METH_O,
     "exclusive(dtensor): whether its local array owns its writable, C-contiguous "
     "memory, nothing but the DTensor references it and it has no copy-views. Local."},
    {NULL, NULL, 0, NULL},
};
