/* _C.agree: the agreement primitive (mpitensor/comm/agree.h) for Python callers, so that
 * a check that fails on some ranks only raises the same exception, with the same
 * message, on every rank of the mesh. */
#include "ext.h"

#include "mpitensor/comm/agree.h"

/* agree(mesh, ok, fingerprint, message[, error]) -> None. Collective on the mesh. */
static PyObject *agree(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4 && nargs != 5) {
    return PyErr_Format(PyExc_TypeError,
                        "agree(mesh, ok, fingerprint, message[, error]) takes 4 or 5 "
                        "arguments");
  }
  mt_mesh *mesh = mt_ext_mesh_for_collective(module, args[0]);
  if (mesh == NULL) return NULL;
  int ok = PyObject_IsTrue(args[1]);
  if (ok < 0) return NULL;
  unsigned long long fp = PyLong_AsUnsignedLongLongMask(args[2]);
  if (fp == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (!PyUnicode_Check(args[3])) {
    return PyErr_Format(PyExc_TypeError, "agree: message must be a str");
  }
  PyObject *kind = nargs == 5 ? args[4] : PyExc_ValueError;
  if (!PyType_Check(kind) ||
      !PyType_IsSubtype((PyTypeObject *)kind, (PyTypeObject *)PyExc_Exception)) {
    return PyErr_Format(PyExc_TypeError, "agree: error must be an exception class");
  }
  mt_error err = {0};
  if (mt_ext_set_message(&err, args[3]) < 0) return NULL;
  int status = ok ? MT_OK : mt_ext_status_of(kind), rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_agree(mesh, status, (uint64_t)fp, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

PyMethodDef mt_ext_agree_methods[] = {
    {"agree", (PyCFunction)(void (*)(void))agree, METH_FASTCALL,
     "agree(mesh, ok, fingerprint, message[, error=ValueError]) -> None. Collective on "
     "the mesh: raises on every member when some member passed ok=False (the first "
     "such member's error, mapped to ValueError, TypeError, IndexError, MemoryError, "
     "NotImplementedError, OverflowError, OSError or else RuntimeError, with its "
     "message) or when the members' fingerprints (ints, taken mod 2**64) differ "
     "(ValueError with the first member's message). Ranks outside the mesh take no "
     "part and raise only their own failure. Example: agree(mesh._handle, buf is not "
     "None, hash(shape), 'no memory', MemoryError)."},
    {NULL, NULL, 0, NULL},
};
