/* The executor's side of mpitensor._comm.Request, the Python owner of an exchange
 * in flight (an mt_pending of the comm library): an asynchronous redistribute
 * makes one, and an operation on its DTensor completes it. The slots are set and
 * read as attributes: Request defines no __setattr__ or __getattr__, so no Python
 * code runs. */
#include "ext.h"

#include "mpitensor/comm/pending.h"

enum { ADDRESS, KEEP, RESULT };

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
    if (PyObject_GenericSetAttr(obj, d->request_fields[i], values[i]) < 0) Py_CLEAR(address);
  if (address == NULL) {
    /* Not owned by a Request yet: the exchange completes here, unwaited. */
    Py_BEGIN_ALLOW_THREADS
    mt_pending_destroy(pending);
    Py_END_ALLOW_THREADS
    if (obj != NULL) PyObject_GenericSetAttr(obj, d->request_fields[ADDRESS], NULL);
    Py_XDECREF(obj);
    return NULL;
  }
  Py_DECREF(address);
  return obj;
}

PyObject *mt_ext_request_result(mt_ext_dispatch *d, PyObject *obj) {
  if (PyArray_Check(obj)) return Py_NewRef(obj);
  if (Py_TYPE(obj) != d->request_type)
    return PyErr_Format(PyExc_TypeError, "a DTensor's local data is an ndarray, got %s",
                        Py_TYPE(obj)->tp_name);
  PyObject *address = PyObject_GenericGetAttr(obj, d->request_fields[ADDRESS]);
  mt_pending *pending = address != NULL ? PyLong_AsVoidPtr(address) : NULL;
  Py_XDECREF(address);
  if (pending == NULL) return NULL;
  mt_error err = {0};
  int rc = MT_OK;
  if (!mt_pending_done(pending)) {
    Py_BEGIN_ALLOW_THREADS
    rc = mt_pending_wait(pending, &err);
    Py_END_ALLOW_THREADS
  }
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return PyObject_GenericGetAttr(obj, d->request_fields[RESULT]);
}
