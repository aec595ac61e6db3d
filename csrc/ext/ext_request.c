/* _C.Request: one handle type for every exchange in flight, a redistribute
 * started with async_op=True (mt_request) or a ring shift or all-gather of
 * context parallelism (mt_exchange). It keeps what the exchange reads and writes
 * alive until it completes, and completes once: threads that wait on it at the
 * same time take turns on its lock, the first completes it, and every one gets
 * the same result. A handle dropped unwaited still completes, so MPI never
 * touches freed memory. */
#include "ext.h"

#include <pythread.h>

typedef struct {
  PyObject_HEAD
  mt_request *req;
  mt_exchange *ex;
  PyObject *keep;   /* what the exchange uses (a tuple) */
  PyObject *result; /* what wait() returns */
  PyThread_type_lock lock;
  char done; /* completed: read without the lock */
} RequestObject;

/* Completes the exchange once, whichever thread comes first; MT_OK after. A
 * thread that finds it taken waits on the lock until the taker has completed it. */
static int finish(RequestObject *self, mt_error *err) {
  if (self->done) return MT_OK;
  int rc = MT_OK;
  Py_BEGIN_ALLOW_THREADS
  PyThread_acquire_lock(self->lock, WAIT_LOCK);
  Py_END_ALLOW_THREADS
  mt_request *req = self->req;
  mt_exchange *ex = self->ex;
  self->req = NULL, self->ex = NULL;
  Py_BEGIN_ALLOW_THREADS
  if (req != NULL) rc = mt_request_wait(req, err);
  else if (ex != NULL) rc = mt_exchange_wait(ex, err);
  PyThread_release_lock(self->lock);
  Py_END_ALLOW_THREADS
  self->done = 1;
  return rc;
}

PyObject *mt_ext_request_new(PyObject *module, mt_request *req, mt_exchange *ex,
                             PyObject *keep, PyObject *result) {
  PyTypeObject *tp = mt_ext_state_of(module)->request_type;
  RequestObject *self = (RequestObject *)tp->tp_alloc(tp, 0);
  PyThread_type_lock lock = self != NULL ? PyThread_allocate_lock() : NULL;
  if (lock == NULL) {
    mt_error err = {0};
    if (req != NULL) mt_request_wait(req, &err);
    if (ex != NULL) mt_exchange_wait(ex, &err);
    Py_XDECREF(self);
    return PyErr_NoMemory();
  }
  self->req = req, self->ex = ex, self->lock = lock;
  self->keep = Py_NewRef(keep), self->result = Py_NewRef(result);
  return (PyObject *)self;
}

/* Request(exchange, keep, result): a ring exchange that mpitensor._comm started
 * through ctypes (the mt_exchange * at address `exchange`, 0 for one already
 * complete), which the handle now owns. */
static PyObject *request_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  PyObject *address, *keep, *result;
  if (!PyArg_ParseTuple(args, "OOO:Request", &address, &keep, &result)) return NULL;
  mt_exchange *ex = PyLong_AsVoidPtr(address);
  if (ex == NULL && PyErr_Occurred()) return NULL;
  return mt_ext_request_new(PyType_GetModule(tp), NULL, ex, keep, result);
}

static PyObject *request_wait(RequestObject *self, PyObject *unused) {
  mt_error err = {0};
  int rc = finish(self, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return Py_NewRef(self->result);
}

PyObject *mt_ext_request_result(PyObject *module, PyObject *obj) {
  if (PyArray_Check(obj)) return Py_NewRef(obj);
  if (!PyObject_TypeCheck(obj, mt_ext_state_of(module)->request_type))
    return PyErr_Format(PyExc_TypeError, "a DTensor's local data is an ndarray, got %s",
                        Py_TYPE(obj)->tp_name);
  return request_wait((RequestObject *)obj, NULL);
}

static PyObject *request_test(RequestObject *self, PyObject *unused) {
  if (self->ex == NULL) return PyBool_FromLong(self->done);
  mt_error err = {0};
  int done = 0, rc;
  Py_BEGIN_ALLOW_THREADS
  PyThread_acquire_lock(self->lock, WAIT_LOCK);
  rc = self->ex == NULL ? MT_OK : mt_exchange_test(self->ex, &done, &err);
  PyThread_release_lock(self->lock);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return PyBool_FromLong(done);
}

static PyObject *request_done(RequestObject *self, void *c) {
  return PyBool_FromLong(self->done);
}

static void request_dealloc(RequestObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  mt_error err = {0};
  finish(self, &err);
  PyThread_free_lock(self->lock);
  Py_XDECREF(self->keep);
  Py_XDECREF(self->result);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static PyMethodDef request_methods[] = {
    {"wait", (PyCFunction)request_wait, METH_NOARGS,
     "Completes the exchange (collective for a redistribute) and returns its result; "
     "safe from several threads at once. Example: req.wait()"},
    {"test", (PyCFunction)request_test, METH_NOARGS,
     "Lets MPI progress a ring exchange; True once it has completed. Local."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef request_getset[] = {
    {"done", (getter)request_done, NULL, "True once wait() has completed it", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot request_slots[] = {
    {Py_tp_new, request_new},
    {Py_tp_dealloc, request_dealloc},
    {Py_tp_methods, request_methods},
    {Py_tp_getset, request_getset},
    {Py_tp_doc, "An exchange in flight (an async redistribute, a ring shift); wait() "
                "returns its result."},
    {0, NULL},
};

static PyType_Spec request_spec = {
    .name = "mpitensor._C.Request",
    .basicsize = sizeof(RequestObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = request_slots,
};

int mt_ext_request_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->request_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &request_spec, NULL);
  if (st->request_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "Request", (PyObject *)st->request_type);
}
