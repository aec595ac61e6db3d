/* The executor's side of mpitensor._comm.Request, the Python owner of an exchange
 * in flight (an mt_pending of the comm library): an asynchronous redistribute
 * makes one, and an operation on its DTensor (or DTensor._data) completes it. The slots are set and
 * read as attributes: Request defines no __setattr__ or __getattr__, so no Python
 * code runs. */
#include "ext.h"

#include "mpitensor/comm/pending.h"

PyObject *mt_ext_request_new(mt_ext_dispatch *d, mt_request *req, PyObject *keep,
                             PyObject *result) {
  mt_pending *pending = NULL;
  mt_error err = {0};
  int rc = mt_pending_create(req, NULL, &pending, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  PyObject *obj = d->request_type->tp_alloc(d->request_type, 0);
  PyObject *address = obj != NULL ? PyLong_FromVoidPtr(pending) : NULL;
  PyObject *values[3] = {address, keep, result};
  for (int i = 0; address != NULL && i < 3; ++i)
    if (PyObject_GenericSetAttr(obj, d->str[MT_S_REQUEST + i], values[i]) < 0) Py_CLEAR(address);
  if (address == NULL) {
    /* Not owned by a Request yet: the exchange completes here, unwaited. */
    Py_BEGIN_ALLOW_THREADS
    mt_pending_destroy(pending);
    Py_END_ALLOW_THREADS
    if (obj != NULL) PyObject_GenericSetAttr(obj, d->str[MT_S_REQUEST], NULL);
    Py_XDECREF(obj);
    return NULL;
  }
  Py_DECREF(address);
  return obj;
}

int mt_ext_complete(mt_ext_dispatch *d, mt_ext_dtensor *b) {
  PyObject *obj = b->local;
  if (obj == NULL || PyArray_Check(obj)) return 0;
  if (Py_TYPE(obj) != d->request_type) {
    PyErr_Format(PyExc_TypeError, "a DTensor's local data is an ndarray, got %s",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  /* Held while the GIL is released: another thread completing the same DTensor
   * meanwhile replaces its slot and drops the slot's reference. */
  Py_INCREF(obj);
  PyObject *address = PyObject_GenericGetAttr(obj, d->str[MT_S_REQUEST]);
  mt_pending *pending = address != NULL ? PyLong_AsVoidPtr(address) : NULL;
  Py_XDECREF(address);
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
  Py_DECREF(obj);
  if (done == NULL) return -1;
  Py_XSETREF(b->local, done);
  return 0;
}
