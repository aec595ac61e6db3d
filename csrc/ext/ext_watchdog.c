/* _C.set_collective_timeout / _C.collective_timeout: the collective watchdog
 * (mpitensor/comm/watchdog.h) for Python, which sets it from MPITENSOR_TIMEOUT when the
 * first mesh is made. */
#include "ext.h"

#include <stdio.h>

#include "mpitensor/comm/mesh.h"
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

/* watchdog_listen(mesh) -> bool: whether this process listens for ranks that
 * leave, after the mesh's creation. Collective on the mesh when it holds every
 * rank of MPI_COMM_WORLD. */
static PyObject *watchdog_listen(PyObject *module, PyObject *arg) {
  mt_mesh *mesh = mt_ext_mesh_get(module, arg);
  if (mesh == NULL) return NULL;
  MPI_Comm comm = MPI_COMM_NULL;
  mt_error err = {0};
  int64_t coord[MT_MAX_MESH_NDIM];
  if (mt_mesh_coordinate(mesh, coord) == 0 || mt_mesh_comm(mesh, &comm, &err) != MT_OK)
    Py_RETURN_FALSE; /* not a member: the mesh does not hold every rank */
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_watchdog_listen(comm, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return PyBool_FromLong(mt_watchdog_listening());
}

/* watchdog_leave(reason or None) -> None: this process leaves the job. */
static PyObject *watchdog_leave(PyObject *module, PyObject *arg) {
  (void)module;
  char reason[256] = "";
  if (arg != Py_None) {
    const char *text = PyUnicode_AsUTF8(arg);
    if (text == NULL) return NULL;
    snprintf(reason, sizeof reason, "%s", text);
  }
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_watchdog_leave(arg == Py_None ? NULL : reason, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

/* watchdog_work(tag) -> None: the tag of the work (a cell) this process runs. */
static PyObject *watchdog_work(PyObject *module, PyObject *arg) {
  (void)module;
  long long tag = PyLong_AsLongLong(arg);
  if (tag == -1 && PyErr_Occurred()) return NULL;
  mt_watchdog_set_work((int64_t)tag);
  Py_RETURN_NONE;
}

/* watchdog_tell(reason, tag) -> None: this process failed in work `tag`. */
static PyObject *watchdog_tell(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  (void)module;
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "watchdog_tell(reason, tag)");
  const char *text = PyUnicode_AsUTF8(args[0]);
  long long tag = text == NULL ? -1 : PyLong_AsLongLong(args[1]);
  if (text == NULL || (tag == -1 && PyErr_Occurred())) return NULL;
  char reason[256];
  snprintf(reason, sizeof reason, "%s", text);
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_watchdog_tell(reason, (int64_t)tag, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

/* watchdog_failed(tag) -> int: how many other processes failed in work `tag`. */
static PyObject *watchdog_failed(PyObject *module, PyObject *arg) {
  (void)module;
  long long tag = PyLong_AsLongLong(arg);
  if (tag == -1 && PyErr_Occurred()) return NULL;
  int n;
  Py_BEGIN_ALLOW_THREADS
  n = mt_watchdog_failed((int64_t)tag);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(n);
}

PyMethodDef mt_ext_watchdog_methods[] = {
    {"watchdog_work", watchdog_work, METH_O,
     "watchdog_work(tag) -> None. Local: the tag of the work (an engine's cell) this "
     "process runs now; notices of failures in the same work count. Example: "
     "watchdog_work(7)."},
    {"watchdog_tell", (PyCFunction)(void (*)(void))watchdog_tell, METH_FASTCALL,
     "watchdog_tell(reason, tag) -> None. Tells every other process that this one "
     "failed in work `tag` (an engine's cell), without leaving. Example: "
     "watchdog_tell('raised ValueError: x', 7)."},
    {"watchdog_failed", watchdog_failed, METH_O,
     "watchdog_failed(tag) -> int. Local: how many other processes said they failed in "
     "work `tag`. Example: watchdog_failed(7) -> 0."},
    {"watchdog_listen", watchdog_listen, METH_O,
     "watchdog_listen(mesh) -> bool. Collective on the mesh when it holds every rank "
     "of MPI_COMM_WORLD, else Local: starts listening for ranks that leave the job "
     "(mpitensor/watchdog.h); whether this process listens. Example: "
     "watchdog_listen(mesh._handle) -> True."},
    {"watchdog_leave", watchdog_leave, METH_O,
     "watchdog_leave(reason) -> None. This process leaves the job, for `reason` (None: "
     "only stop listening): waits up to a second for the others to leave too, else "
     "tells them and waits for them. Example: watchdog_leave('it raised ValueError')."},
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
