/* The ring entry points behind context parallelism: a shift to the next rank, an
 * uneven all-gather (both started, as a _C.Request), and the metadata all-gather. */
#include "ext.h"

#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/ring.h"

/* A _C.Request for a started exchange: `mesh` and `send` stay referenced until
 * it completes, and wait() returns `recv`. An exchange that failed to start was
 * never made. */
static PyObject *new_exchange(PyObject *module, PyObject *mesh, PyObject *send,
                              PyObject *recv, mt_exchange *ex) {
  PyObject *keep = PyTuple_Pack(3, mesh, send, recv);
  PyObject *out = keep != NULL ? mt_ext_request_new(module, NULL, ex, keep, recv) : NULL;
  if (keep == NULL) {
    mt_error err = {0};
    mt_exchange_wait(ex, &err);
  }
  Py_XDECREF(keep);
  return out;
}

/* ---- entry points ---------------------------------------------------------------- */

/* Up to MT_RING_MAX_BLOCKS arrays from a tuple or list, checked as contiguous_arg. */
static int block_args(PyObject *seq, int writable, const char *what, PyArrayObject **out,
                      int *n) {
  PyObject *fast = PySequence_Fast(seq, "expected a sequence of arrays");
  if (fast == NULL) return -1;
  Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
  int rc = 0;
  if (len < 1 || len > MT_RING_MAX_BLOCKS) {
    PyErr_Format(PyExc_ValueError, "a shift moves 1 to %d arrays, got %zd",
                 MT_RING_MAX_BLOCKS, len);
    rc = -1;
  }
  for (Py_ssize_t i = 0; rc == 0 && i < len; ++i) {
    out[i] = mt_ext_buffer(PySequence_Fast_GET_ITEM(fast, i), writable, what);
    if (out[i] == NULL) rc = -1;
  }
  Py_DECREF(fast);
  *n = (int)len;
  return rc;
}

/* ring_shift_start(mesh, dim, sends, recvs) -> Request: the arrays of `sends` go to
 * the next rank on mesh dim `dim`, those of `recvs` are filled from the previous
 * one, pairwise. Collective on the dim. */
static PyObject *ring_shift_start(PyObject *module, PyObject *const *args,
                                  Py_ssize_t nargs) {
  if (nargs != 4) return PyErr_Format(PyExc_TypeError, "ring_shift_start(mesh, dim, sends, recvs)");
  int dim = 0, ns = 0, nr = 0;
  PyArrayObject *send[MT_RING_MAX_BLOCKS], *recv[MT_RING_MAX_BLOCKS];
  mt_mesh *mesh = mt_ext_mesh_for_collective(module, args[0]);
  if (mesh == NULL || mt_ext_mesh_dim(args[1], &dim) < 0 ||
      block_args(args[2], 0, "every send", send, &ns) < 0 ||
      block_args(args[3], 1, "every recv", recv, &nr) < 0)
    return NULL;
  if (ns != nr) return PyErr_Format(PyExc_ValueError, "%d sends but %d recvs", ns, nr);
  const void *sp[MT_RING_MAX_BLOCKS];
  void *rp[MT_RING_MAX_BLOCKS];
  int64_t sb[MT_RING_MAX_BLOCKS], rb[MT_RING_MAX_BLOCKS];
  for (int i = 0; i < ns; ++i) {
    sp[i] = PyArray_DATA(send[i]), sb[i] = (int64_t)PyArray_NBYTES(send[i]);
    rp[i] = PyArray_DATA(recv[i]), rb[i] = (int64_t)PyArray_NBYTES(recv[i]);
  }
  /* Tuples, so the arrays MPI is reading and writing cannot leave them meanwhile. */
  PyObject *sends = PySequence_Tuple(args[2]);
  PyObject *recvs = sends == NULL ? NULL : PySequence_Tuple(args[3]), *out = NULL;
  mt_exchange *ex = NULL;
  mt_error err = {0};
  if (recvs != NULL) {
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = mt_ring_shift_start(mesh, dim, ns, sp, sb, rp, rb, &ex, &err);
    Py_END_ALLOW_THREADS
    if (rc != MT_OK) mt_ext_raise(rc, &err);
    else out = new_exchange(module, args[0], sends, recvs, ex);
  }
  Py_XDECREF(sends);
  Py_XDECREF(recvs);
  return out;
}

/* ring_allgatherv_start(mesh, dim, send, recv, byte_counts) -> Request. Collective
 * on the dim: `recv` receives every rank's block in coordinate order. */
static PyObject *ring_allgatherv_start(PyObject *module, PyObject *const *args,
                                       Py_ssize_t nargs) {
  if (nargs != 5) {
    return PyErr_Format(PyExc_TypeError, "ring_allgatherv_start(mesh, dim, send, recv, bytes)");
  }
  int dim = 0, n = 0;
  int64_t bytes[1024];
  mt_mesh *mesh = mt_ext_mesh_for_collective(module, args[0]);
  if (mesh == NULL || mt_ext_mesh_dim(args[1], &dim) < 0) return NULL;
  PyArrayObject *send = mt_ext_buffer(args[2], 0, "send");
  PyArrayObject *recv = send == NULL ? NULL : mt_ext_buffer(args[3], 1, "recv");
  if (recv == NULL || mt_ext_int64s(args[4], bytes, 1024, &n, "byte counts") < 0)
    return NULL;
  mt_exchange *ex = NULL;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_ring_allgatherv_start(mesh, dim, PyArray_DATA(send), PyArray_NBYTES(send),
                                PyArray_DATA(recv), PyArray_NBYTES(recv), bytes, n, &ex,
                                &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return new_exchange(module, args[0], (PyObject *)send, (PyObject *)recv, ex);
}

/* ring_allgather_int64(mesh, dim, values) -> tuple of len(values) * dim size ints,
 * in coordinate order. Collective on the dim. */
static PyObject *ring_allgather_int64(PyObject *module, PyObject *const *args,
                                      Py_ssize_t nargs) {
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "ring_allgather_int64(mesh, dim, values)");
  mt_mesh *mesh = mt_ext_mesh_for_collective(module, args[0]);
  int dim = 0, n = 0;
  int64_t values[64];
  if (mesh == NULL || mt_ext_mesh_dim(args[1], &dim) < 0 ||
      mt_ext_int64s(args[2], values, 64, &n, "values") < 0)
    return NULL;
  int64_t size = mt_mesh_dim_size(mesh, dim);
  int64_t *out = PyMem_Calloc((size_t)(size > 0 ? size : 1) * (size_t)(n > 0 ? n : 1),
                              sizeof *out);
  if (out == NULL) return PyErr_NoMemory();
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_ring_allgather_int64(mesh, dim, values, n, out, &err);
  Py_END_ALLOW_THREADS
  PyObject *result = rc == MT_OK ? mt_ext_int_tuple(out, (int)(size * n))
                                  : mt_ext_raise(rc, &err);
  PyMem_Free(out);
  return result;
}

PyMethodDef mt_ext_ring_methods[] = {
    {"ring_shift_start", (PyCFunction)(void (*)(void))ring_shift_start, METH_FASTCALL,
     "ring_shift_start(mesh, dim, sends, recvs) -> Request. Collective on the mesh dim."},
    {"ring_allgatherv_start", (PyCFunction)(void (*)(void))ring_allgatherv_start,
     METH_FASTCALL,
     "ring_allgatherv_start(mesh, dim, send, recv, byte_counts) -> Request. "
     "Collective on the mesh dim."},
    {"ring_allgather_int64", (PyCFunction)(void (*)(void))ring_allgather_int64,
     METH_FASTCALL,
     "ring_allgather_int64(mesh, dim, values) -> tuple of every rank's values. "
     "Collective on the mesh dim."},
    {NULL, NULL, 0, NULL},
};
