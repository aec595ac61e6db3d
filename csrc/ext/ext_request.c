/* _C.Request: the Python handle of an exchange in flight (an async redistribute,
 * a ring shift or all-gather of context parallelism), an mt_pending of the comm
 * library, which completes it once whichever threads wait. The handle keeps what
 * the exchange reads and writes alive until then, and gives the exchange's result
 * to every waiter. */
#include "ext.h"

#include "mpitensor/comm/pending.h"

typedef struct {
  PyObject_HEAD
  mt_pending *pending;
  PyObject *keep;   /* what the exchange uses (a tuple) */
  PyObject *result; /* what wait() returns */
} RequestObject;

PyObject *mt_ext_request_new(PyObject *module, mt_request *req, mt_exchange *ex,
                             PyObject *keep, PyObject *result) {
  PyTypeObject *tp = mt_ext_state_of(module)->request_type;
  mt_pending *pending = NULL;
  mt_error err = {0};
  int rc = mt_pending_create(req, ex, &pending, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  RequestObject *self = (RequestObject *)tp->tp_alloc(tp, 0);
  if (self == NULL) {
    mt_pending_destroy(pending);
    return NULL;
  }
  self->pending = pending;
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
  int rc = MT_OK;
  if (!mt_pending_done(self->pending)) {
    Py_BEGIN_ALLOW_THREADS
    rc = mt_pending_wait(self->pending, &err);
    Py_END_ALLOW_THREADS
  }
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
  mt_error err = {0};
  int done = 0, rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_pending_test(self->pending, &done, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return PyBool_FromLong(done);
}

static PyObject *request_done(RequestObject *self, void *c) {
  return PyBool_FromLong(mt_pending_done(self->pending));
}

static void request_dealloc(RequestObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  Py_BEGIN_ALLOW_THREADS
  mt_pending_destroy(self->pending);
  Py_END_ALLOW_THREADS
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
     "Lets MPI progress the exchange (MPI_Test); True once it has completed, so that "
     "wait() no longer blocks. Local. Example: req.test()"},
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
