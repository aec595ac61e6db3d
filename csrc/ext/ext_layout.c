/* Layout math for Python: local boxes and even-sharding global shapes. */
#include "ext.h"

/* local_box(global_shape, mesh_shape, coordinate, placements) -> (shape, offset) */
static PyObject *local_box(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4) {
    return PyErr_Format(PyExc_TypeError,
                        "local_box(global_shape, mesh_shape, coordinate, placements)");
  }
  mt_layout layout;
  if (mt_ext_layout(args[0], args[1], args[3], &layout) < 0) return NULL;
  int64_t coord[MT_MAX_MESH_NDIM];
  int ncoord = 0;
  if (mt_ext_int64s(args[2], coord, MT_MAX_MESH_NDIM, &ncoord, "coordinate") < 0)
    return NULL;
  if (ncoord != layout.mesh_ndim) {
    return PyErr_Format(PyExc_ValueError, "a coordinate of %d entries on a %d-D mesh",
                        ncoord, layout.mesh_ndim);
  }
  mt_box box;
  mt_error err = {0};
  int rc = mt_layout_local_box(&layout, coord, &box, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  PyObject *shape = mt_ext_int_tuple(box.shape, box.ndim);
  PyObject *offset = mt_ext_int_tuple(box.offset, box.ndim);
  PyObject *out = (shape && offset) ? PyTuple_Pack(2, shape, offset) : NULL;
  Py_XDECREF(shape);
  Py_XDECREF(offset);
  return out;
}

/* even_global_shape(local_shape, mesh_shape, placements) -> global shape */
static PyObject *even_global_shape(PyObject *module, PyObject *const *args,
                                   Py_ssize_t nargs) {
  if (nargs != 3) {
    return PyErr_Format(PyExc_TypeError,
                        "even_global_shape(local_shape, mesh_shape, placements)");
  }
  int64_t local[MT_MAX_NDIM], mesh_shape[MT_MAX_MESH_NDIM], global[MT_MAX_NDIM];
  mt_placement pl[MT_MAX_MESH_NDIM];
  int ndim = 0, mesh_ndim = 0, npl = 0;
  if (mt_ext_int64s(args[0], local, MT_MAX_NDIM, &ndim, "local shape") < 0) return NULL;
  if (mt_ext_int64s(args[1], mesh_shape, MT_MAX_MESH_NDIM, &mesh_ndim, "mesh shape") < 0)
    return NULL;
  if (mt_ext_placements(args[2], pl, &npl) < 0) return NULL;
  if (npl != mesh_ndim) {
    return PyErr_Format(PyExc_ValueError, "%d placements were given for a %d-D mesh", npl,
                        mesh_ndim);
  }
  mt_error err = {0};
  int rc = mt_layout_even_global_shape(ndim, local, mesh_ndim, mesh_shape, pl, global, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return mt_ext_int_tuple(global, ndim);
}

/* chunk_sizes(n, k) -> the k sizes torch.chunk cuts n items into (mt_chunk). */
static PyObject *chunk_sizes(PyObject *module, PyObject *args) {
  long long n, k;
  if (!PyArg_ParseTuple(args, "LL:chunk_sizes", &n, &k)) return NULL;
  if (n < 0 || k < 1 || k > (1 << 24))
    return PyErr_Format(PyExc_ValueError, "chunk_sizes(n, k) needs n >= 0 and k >= 1");
  PyObject *out = PyTuple_New((Py_ssize_t)k);
  for (int64_t i = 0; out != NULL && i < k; ++i) {
    int64_t size, offset;
    mt_chunk(n, k, i, &size, &offset);
    PyObject *v = PyLong_FromLongLong(size);
    if (v == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, (Py_ssize_t)i, v);
  }
  return out;
}

static PyObject *contiguous_strides(PyObject *module, PyObject *shape) {
  int64_t sh[MT_MAX_NDIM], st[MT_MAX_NDIM];
  int n = 0;
  if (mt_ext_int64s(shape, sh, MT_MAX_NDIM, &n, "shape") < 0) return NULL;
  mt_layout_contiguous_strides(n, sh, st);
  return mt_ext_int_tuple(st, n);
}

PyMethodDef mt_ext_layout_methods[] = {
    {"contiguous_strides", contiguous_strides, METH_O,
     "contiguous_strides(shape) -> torch's strides of a contiguous tensor (a dim of "
     "size 0 counts as 1). Local."},
    {"chunk_sizes", chunk_sizes, METH_VARARGS,
     "chunk_sizes(n, k) -> the sizes of the k chunks torch.chunk cuts n items into "
     "(the shards of a dim of n over k ranks). Local."},
    {"local_box", (PyCFunction)(void (*)(void))local_box, METH_FASTCALL,
     "local_box(global_shape, mesh_shape, coordinate, placements) -> (shape, offset)."
     " Placements are (kind, dim, reduce_op) triples. Local."},
    {"even_global_shape", (PyCFunction)(void (*)(void))even_global_shape, METH_FASTCALL,
     "even_global_shape(local_shape, mesh_shape, placements) -> global shape of an "
     "evenly sharded tensor. Local."},
    {NULL, NULL, 0, NULL},
};
