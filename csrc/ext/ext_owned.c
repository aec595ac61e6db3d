/* Capsules that own what the C libraries made for Python: a plan (one reference
 * of an mt_plan, "mpitensor.plan") or an exchange in flight (an mt_pending,
 * "mpitensor.pending", with what it reads and writes). The capsule's deleter
 * frees it, so Python holds no address as an int and no __del__ has to run, nor
 * find its binding gone at interpreter exit. ctypes calls read the pointer back
 * by the capsule's name (mpitensor._clib.capsule_pointer). */
#include "ext.h"

#include <string.h>

#include "mpitensor/comm/pending.h"
#include "mpitensor/core/plan.h"

static const char PLAN[] = "mpitensor.plan";
static const char PENDING[] = "mpitensor.pending";

static void free_plan(PyObject *capsule) { mt_plan_destroy(PyCapsule_GetPointer(capsule, PLAN)); }

/* An unwaited exchange completes first, so MPI never writes into memory freed
 * meanwhile; only then are its buffers let go. */
static void free_pending(PyObject *capsule) {
  mt_pending *pending = PyCapsule_GetPointer(capsule, PENDING);
  PyObject *keep = PyCapsule_GetContext(capsule);
  Py_BEGIN_ALLOW_THREADS
  mt_pending_destroy(pending);
  Py_END_ALLOW_THREADS
  Py_XDECREF(keep);
}

PyObject *mt_ext_plan_wrap(mt_plan *plan) {
  PyObject *capsule = PyCapsule_New(plan, PLAN, free_plan);
  if (capsule != NULL) mt_plan_retain(plan);
  return capsule;
}

PyObject *mt_ext_pending_own(mt_pending *pending, PyObject *keep) {
  PyObject *capsule = PyCapsule_New(pending, PENDING, NULL);
  if (capsule != NULL && keep != NULL && PyCapsule_SetContext(capsule, Py_NewRef(keep)) < 0) {
    Py_DECREF(keep);
    Py_CLEAR(capsule);
  }
  if (capsule == NULL || PyCapsule_SetDestructor(capsule, free_pending) < 0) {
    /* Owned by no capsule: the exchange completes here, unwaited. */
    Py_XDECREF(capsule);
    Py_BEGIN_ALLOW_THREADS
    mt_pending_destroy(pending);
    Py_END_ALLOW_THREADS
    return NULL;
  }
  return capsule;
}

mt_pending *mt_ext_pending_of(PyObject *capsule) {
  return PyCapsule_GetPointer(capsule, PENDING);
}

void *mt_ext_pointer_of(PyObject *pointer) {
  Py_buffer view;
  if (PyObject_GetBuffer(pointer, &view, PyBUF_SIMPLE) < 0) return NULL;
  void *p = NULL;
  if (view.len == (Py_ssize_t)sizeof(void *)) memcpy(&p, view.buf, sizeof(void *));
  PyBuffer_Release(&view);
  if (p == NULL) PyErr_SetString(PyExc_TypeError, "expected a filled ctypes.c_void_p");
  return p;
}

/* adopt(pointer, kind, keep=None): see the method table. */
static PyObject *adopt(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 2 || nargs > 3 || !PyUnicode_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "adopt(pointer, kind: str, keep=None)");
  void *p = mt_ext_pointer_of(args[0]);
  if (p == NULL) return NULL;
  PyObject *keep = nargs == 3 && args[2] != Py_None ? args[2] : NULL;
  if (PyUnicode_CompareWithASCIIString(args[1], "pending") == 0) return mt_ext_pending_own(p, keep);
  if (PyUnicode_CompareWithASCIIString(args[1], "plan") == 0 && keep == NULL) {
    PyObject *capsule = PyCapsule_New(p, PLAN, free_plan);
    if (capsule == NULL) mt_plan_destroy(p);
    return capsule;
  }
  return PyErr_Format(PyExc_ValueError, "adopt: kind is 'plan' (no keep) or 'pending'");
}

PyMethodDef mt_ext_owned_methods[] = {
    {"adopt", (PyCFunction)(void (*)(void))adopt, METH_FASTCALL,
     "adopt(pointer, kind, keep=None) -> a capsule that owns what the ctypes.c_void_p "
     "`pointer` points to: 'plan', one reference of an mt_plan (\"mpitensor.plan\"); "
     "'pending', an exchange in flight (\"mpitensor.pending\"), completed before it "
     "is freed and `keep` let go. Frees it at once if no capsule can be made. "
     "Local.\n\nExample: _C.adopt(made, 'plan')"},
    {NULL, NULL, 0, NULL},
};
