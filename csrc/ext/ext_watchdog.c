/* _C.set_collective_timeout / _C.collective_timeout: the collective watchdog
 * (mpitensor/comm/watchdog.h) for Python, which sets it from MPITENSOR_TIMEOUT when the
 * first mesh is made. */
#include "ext.h"

#include "mpitensor/comm/watchdog.h"

static PyObject *set_collective_timeout(PyObject *module, PyObject *arg) {
  (void)module;
  double seconds = arg == Py_None ? MT_WATCHDOG_DEFAULT_SECONDS : PyFloat_AsDouble(arg);
  if (seconds == -1.0 && PyErr_Occurred()) return NULL;
  mt_error err = {0};
  int rc = mt_watchdog_set_timeout(seconds, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

static PyObject *collective_timeout(PyObject *module, PyObject *unused) {
  (void)module;
  (void)unused;
  return PyFloat_FromDouble(mt_watchdog_timeout());
}

PyMethodDef mt_ext_watchdog_methods[] = {
    {"set_collective_timeout", set_collective_timeout, METH_O,
     "set_collective_timeout(seconds) -> None. Local. None: the default, 1800 s. A process that waits in one of "
     "mpitensor's blocking collectives for this long, with no other call entered, "
     "prints where it waits and aborts the job; 0 turns the watchdog off. MPI must be "
     "initialised. Example: set_collective_timeout(600.0)."},
    {"collective_timeout", collective_timeout, METH_NOARGS,
     "collective_timeout() -> float. The watchdog's timeout in seconds, 0.0 when off. "
     "Example: collective_timeout() -> 1800.0."},
    {NULL, NULL, 0, NULL},
};
