/* The executor's side of mpitensor._comm.Request, the Python owner of an exchange
 * in flight: an asynchronous redistribute makes one, and an operation on its
 * DTensor (or DTensor._data) completes it. The exchange is a capsule that owns it
 * (ext_owned.c); the slots are set and read as attributes: Request defines no
 * __setattr__ or __getattr__, so no Python code runs. */
#include "ext.h"

PyObject *mt_ext_request_new(mt_ext_dispatch *d, mt_request *req, PyObject *keep,
                             PyObject *result) {
  mt_pending *pending = NULL;
  mt_error err = {0};
  int rc = mt_pending_create(req, NULL, &pending, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  PyObject *owner = mt_ext_pending_own(pending, keep);
  PyObject *obj = owner != NULL ? d->request_type->tp_alloc(d->request_type, 0) : NULL;
  if (obj != NULL && (PyObject_GenericSetAttr(obj, d->str[MT_S_REQUEST], owner) < 0 ||
                      PyObject_GenericSetAttr(obj, d->str[MT_S_REQUEST_RESULT], result) < 0))
    Py_CLEAR(obj);
  Py_XDECREF(owner);
  return obj;
}

int mt_ext_complete(mt_ext_dispatch *d, mt_ext_dtensor *b) {
  if (d->deferred != NULL && mt_ext_settle(d) < 0) return -1;
  PyObject *obj = b->local;
  if (obj == NULL || PyArray_Check(obj)) return 0;
  if (Py_TYPE(obj) == d->deferred_type) return mt_ext_complete_deferred(d, b);
  if (Py_TYPE(obj) != d->request_type) {
    PyErr_Format(PyExc_TypeError, "a DTensor's local data is an ndarray, got %s",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  /* Held while the GIL is released: another thread completing the same DTensor
   * meanwhile replaces its slot and drops the slot's reference. */
  Py_INCREF(obj);
  PyObject *owner = PyObject_GenericGetAttr(obj, d->str[MT_S_REQUEST]);
  mt_pending *pending = owner != NULL ? mt_ext_pending_of(owner) : NULL;
  mt_error err = {0};
  int rc = MT_OK;
  if (pending != NULL && !mt_pending_done(pending)) {
    Py_BEGIN_ALLOW_THREADS
    rc = mt_pending_wait(pending, &err);
    Py_END_ALLOW_THREADS
  }
  PyObject *done = NULL;
  if (pending != NULL && rc != MT_OK) mt_ext_raise(rc, &err);
  else if (pending != NULL) done = PyObject_GenericGetAttr(obj, d->str[MT_S_REQUEST_RESULT]);
  Py_XDECREF(owner);
  Py_DECREF(obj);
  if (done == NULL) return -1;
  Py_XSETREF(b->local, done);
  return 0;
}
