/* _C.Mesh: a DeviceMesh's communicators, owned by the core's mt_mesh. */
#include "ext.h"

#include <mpi4py/mpi4py.h>

#include "mpitensor/comm/counters.h"
#include "mpitensor/comm/direct.h"
#include "mpitensor/comm/mesh.h"

typedef struct {
  PyObject_HEAD
  mt_mesh *mesh;
  PyObject *groups; /* tuple of mpi4py communicators, made on first request */
  uint64_t owner;   /* the thread that created the mesh (thread_serial): the only
                       one that may run its collectives */
} MeshObject;

static void mesh_dealloc(MeshObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Py_CLEAR(self->groups);
  mt_mesh_destroy(self->mesh);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static int mesh_traverse(MeshObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->groups);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

/* A number for the calling thread, never given to another one: thread idents are
 * reused once a thread ends, and whether a new thread got a dead creator's ident
 * would differ across ranks. Called with the GIL held, which guards `next`. */
static uint64_t thread_serial(void) {
  static _Thread_local uint64_t mine = 0;
  /* cppcheck-suppress knownConditionTrueFalse ; a thread-local keeps its value */
  if (mine == 0) {
    static uint64_t next = 0;
    mine = ++next;
  }
  return mine;
}

static PyObject *wrap(PyTypeObject *tp, mt_mesh *mesh) {
  MeshObject *self = PyObject_GC_New(MeshObject, tp);
  if (self == NULL) {
    mt_mesh_destroy(mesh);
    return NULL;
  }
  self->mesh = mesh;
  self->groups = NULL;
  self->owner = thread_serial();
  PyObject_GC_Track(self);
  return (PyObject *)self;
}

/* Two threads issuing collectives on one mesh would pair them in whatever order
 * each rank's scheduler ran them: wrong data, then a hang. Which thread created a
 * mesh is decided by the program, the same on every rank, so refusing every other
 * thread raises on the same calls everywhere, before any communication; serialising
 * the threads per mesh would not fix the order across ranks. A mesh whose
 * communicator was freed, or after MPI_Finalize, raises too (mt_mesh_check): a
 * collective there would crash the process. */
int mt_ext_mesh_check_thread(PyObject *obj) {
  if (((MeshObject *)obj)->owner != thread_serial()) {
    PyErr_SetString(PyExc_RuntimeError,
                    "a DeviceMesh's collectives must run on the thread that created it: "
                    "two threads communicating on one mesh would pair different "
                    "operations across ranks (create a mesh in the thread that uses it)");
    return -1;
  }
  mt_error err = {0};
  int rc = mt_mesh_check(((MeshObject *)obj)->mesh, &err);
  if (rc == MT_OK) return 0;
  mt_ext_raise(rc, &err);
  return -1;
}

/* mpi4py's C API is imported on the first mesh, not at module import, so that
 * `import mpitensor` and its layout math do not initialize MPI. Its function table
 * is file-local to this translation unit, as mpi4py.h defines it. */
static int mpi4py_ready(void) {
  static int ready = 0;
  if (!ready && import_mpi4py() < 0) return 0;
  ready = 1;
  return 1;
}

/* Mesh(comm, shape, ranks[, fingerprint, failure]): collective on comm. `ranks` is
 * the flattened mesh; `fingerprint` (an int, mod 2**64) of what else every rank
 * must pass alike, and `failure`, this rank's exception from its own checks or
 * None, are agreed on with the shape and the ranks (mt_mesh_create_agreed). */
static PyObject *mesh_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  PyObject *comm_obj, *shape_obj, *ranks_obj, *fp_obj = NULL, *failure = Py_None;
  if (!PyArg_ParseTuple(args, "OOO|OO:Mesh", &comm_obj, &shape_obj, &ranks_obj, &fp_obj,
                        &failure))
    return NULL;
  unsigned long long fp = fp_obj == NULL ? 0 : PyLong_AsUnsignedLongLongMask(fp_obj);
  if (fp == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  mt_error err = {0};
  int status = MT_OK;
  if (failure != Py_None) {
    PyObject *text = PyObject_Str(failure);
    int bad = text == NULL || mt_ext_set_message(&err, text) < 0;
    Py_XDECREF(text);
    if (bad) return NULL;
    status = mt_ext_status_of((PyObject *)Py_TYPE(failure));
  }
  if (!mpi4py_ready()) return NULL;
  MPI_Comm *comm = PyMPIComm_Get(comm_obj);
  if (comm == NULL) return NULL;
  int64_t shape[MT_MAX_MESH_NDIM];
  int ndim = 0;
  if (mt_ext_int64s(shape_obj, shape, MT_MAX_MESH_NDIM, &ndim, "mesh shape") < 0) {
    return NULL;
  }
  PyArrayObject *ranks = (PyArrayObject *)PyArray_FROMANY(ranks_obj, NPY_INT, 1, 1,
                                                          NPY_ARRAY_IN_ARRAY);
  if (ranks == NULL) return NULL;
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) numel *= shape[d];
  mt_mesh *mesh = NULL;
  if (status == MT_OK && PyArray_SIZE(ranks) != numel) {
    status = mt_error_set(&err, MT_EINVAL, "the mesh has %lld ranks but its shape needs %lld",
                          (long long)PyArray_SIZE(ranks), (long long)numel);
  }
  const int *r = (const int *)PyArray_DATA(ranks);
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_mesh_create_agreed(*comm, ndim, shape, r, status, (uint64_t)fp, &mesh, &err);
  Py_END_ALLOW_THREADS
  Py_DECREF(ranks);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  /* Every mesh (and its slices) counts into the module's counters, which
   * comm_counters() reads; the type keeps the module, and so them, alive. */
  mt_mesh_set_counters(mesh,
                       &((mt_ext_state *)PyType_GetModuleState(tp))->comm_counters);
  return wrap(tp, mesh);
}

static PyObject *mesh_slice(MeshObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (mt_ext_mesh_check_thread((PyObject *)self) < 0) return NULL;
  if (nargs != 1) return PyErr_Format(PyExc_TypeError, "slice(dims) takes 1 argument");
  int64_t dims64[MT_MAX_MESH_NDIM];
  int dims[MT_MAX_MESH_NDIM];
  int n = 0;
  if (mt_ext_int64s(args[0], dims64, MT_MAX_MESH_NDIM, &n, "dims") < 0) return NULL;
  for (int i = 0; i < n; ++i) dims[i] = (int)dims64[i];
  mt_mesh *sub = NULL;
  mt_error err = {0};
  int rc = mt_mesh_slice(self->mesh, n, dims, &sub, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return wrap(Py_TYPE(self), sub);
}

static PyObject *mesh_coordinate(MeshObject *self, PyObject *unused) {
  int64_t coord[MT_MAX_MESH_NDIM];
  if (!mt_mesh_coordinate(self->mesh, coord)) Py_RETURN_NONE;
  return mt_ext_int_tuple(coord, mt_mesh_ndim(self->mesh));
}

/* The mpi4py objects share the mesh's handles; the mesh frees them, so they are
 * made once and kept, never freed by a user's garbage. */
static PyObject *make_groups(mt_mesh *mesh) {
  int ndim = mt_mesh_ndim(mesh);
  PyObject *out = PyTuple_New(ndim);
  for (int d = 0; out != NULL && d < ndim; ++d) {
    PyObject *c = PyMPIComm_New(mt_mesh_dim_comm(mesh, d));
    if (c == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, d, c);
  }
  return out;
}

static PyObject *mesh_groups(MeshObject *self, PyObject *unused) {
  if (mt_ext_mesh_check_thread((PyObject *)self) < 0) return NULL;
  if (self->groups == NULL) self->groups = make_groups(self->mesh);
  Py_XINCREF(self->groups);
  return self->groups;
}

static PyObject *mesh_bcast(MeshObject *self, PyObject *const *args, Py_ssize_t nargs) {
  int dim = 0;
  if (mt_ext_mesh_check_thread((PyObject *)self) < 0) return NULL;
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "bcast(array, dim)");
  PyArrayObject *a = mt_ext_buffer(args[0], 1, "bcast: array");
  if (a == NULL || mt_ext_mesh_dim(args[1], &dim) < 0) return NULL;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_mesh_bcast(self->mesh, dim, PyArray_DATA(a), (int64_t)PyArray_NBYTES(a), &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

static PyObject *mesh_exscan(MeshObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (mt_ext_mesh_check_thread((PyObject *)self) < 0) return NULL;
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "exscan(array, dim, op)");
  PyArrayObject *a = mt_ext_buffer(args[0], 1, "exscan: array");
  int dim = 0;
  if (a == NULL || mt_ext_mesh_dim(args[1], &dim) < 0) return NULL;
  int dtype = mt_ext_dtype(a);
  if (dtype < 0) return PyErr_Format(PyExc_TypeError, "exscan of an unsupported dtype");
  long op = PyLong_AsLong(args[2]);
  if (op == -1 && PyErr_Occurred()) return NULL;
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_mesh_exscan(self->mesh, dim, PyArray_DATA(a), (int64_t)PyArray_SIZE(a), dtype,
                      (int)op, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

/* alltoallv(array, counts, dim): rows of a C-contiguous array, counts[q] of them
 * (in order) to coordinate q of the dim; returns (received rows, counts received). */
static PyObject *mesh_alltoallv(MeshObject *self, PyObject *const *args,
                                Py_ssize_t nargs) {
  if (mt_ext_mesh_check_thread((PyObject *)self) < 0) return NULL;
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "alltoallv(array, counts, dim)");
  PyArrayObject *a = mt_ext_buffer(args[0], 0, "alltoallv: array");
  if (a == NULL) return NULL;
  if (PyArray_NDIM(a) < 1 || PyArray_NDIM(a) > MT_MAX_NDIM)
    return PyErr_Format(PyExc_ValueError, "alltoallv needs an array of at least one dim");
  int dim = 0, got = 0;
  if (mt_ext_mesh_dim(args[2], &dim) < 0) return NULL;
  if (dim < 0 || dim >= mt_mesh_ndim(self->mesh))
    return PyErr_Format(PyExc_IndexError, "mesh dim %R is out of range", args[2]);
  int64_t n = mt_mesh_dim_size(self->mesh, dim), total = 0;
  int64_t *counts = PyMem_Malloc((size_t)n * 2 * sizeof *counts);
  if (counts == NULL) return PyErr_NoMemory();
  int64_t *in = counts + n;
  if (mt_ext_int64s(args[1], counts, (int)n, &got, "alltoallv: counts") < 0) {
    PyMem_Free(counts);
    return NULL;
  }
  for (int64_t q = 0; q < got; ++q) total += counts[q];
  if (got != n || total != PyArray_DIM(a, 0)) {
    PyMem_Free(counts);
    return PyErr_Format(PyExc_ValueError, "alltoallv: %d counts adding up to %lld rows, "
                        "for a mesh dim of size %lld and an array of %lld rows", got,
                        (long long)total, (long long)n, (long long)PyArray_DIM(a, 0));
  }
  int64_t row = PyArray_ITEMSIZE(a);
  npy_intp shape[MT_MAX_NDIM];
  for (int k = 1; k < PyArray_NDIM(a); ++k) row *= shape[k] = PyArray_DIM(a, k);
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_mesh_alltoall_i64(self->mesh, dim, counts, in, &err);
  Py_END_ALLOW_THREADS
  shape[0] = 0;
  for (int64_t q = 0; rc == MT_OK && q < n; ++q) shape[0] += (npy_intp)in[q];
  PyObject *out = NULL;
  if (rc == MT_OK) {
    Py_INCREF(PyArray_DESCR(a));
    out = PyArray_NewFromDescr(&PyArray_Type, PyArray_DESCR(a), PyArray_NDIM(a), shape,
                               NULL, NULL, 0, NULL);
  }
  /* Rows of zero bytes (a dim of size 0) have nothing to move. */
  if (out != NULL && row > 0) {
    Py_BEGIN_ALLOW_THREADS
    rc = mt_mesh_alltoallv(self->mesh, dim, PyArray_DATA(a), counts,
                           PyArray_DATA((PyArrayObject *)out), in, row, &err);
    Py_END_ALLOW_THREADS
  }
  PyObject *res = rc != MT_OK ? mt_ext_raise(rc, &err)
                  : out == NULL ? NULL
                                : Py_BuildValue("(ON)", out, mt_ext_int_tuple(in, (int)n));
  Py_XDECREF(out);
  PyMem_Free(counts);
  return res;
}

static PyObject *mesh_any(MeshObject *self, PyObject *flag) {
  if (mt_ext_mesh_check_thread((PyObject *)self) < 0) return NULL;
  int value = PyObject_IsTrue(flag), result = 0, rc;
  if (value < 0) return NULL;
  mt_error err = {0};
  Py_BEGIN_ALLOW_THREADS
  rc = mt_mesh_any(self->mesh, value, &result, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return PyBool_FromLong(result);
}

static PyObject *mesh_allgather_int(MeshObject *self, PyObject *const *args,
                                    Py_ssize_t nargs) {
  if (mt_ext_mesh_check_thread((PyObject *)self) < 0) return NULL;
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "allgather_int(value, dim)");
  long long value = PyLong_AsLongLong(args[0]);
  if (value == -1 && PyErr_Occurred()) return NULL;
  int dim = 0;
  if (mt_ext_mesh_dim(args[1], &dim) < 0) return NULL;
  int in_range = dim >= 0 && dim < mt_mesh_ndim(self->mesh);
  int64_t n = in_range ? mt_mesh_dim_size(self->mesh, dim) : 1;
  int64_t *out = PyMem_Malloc((size_t)n * sizeof *out);
  if (out == NULL) return PyErr_NoMemory();
  mt_error err = {0};
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_mesh_allgather_i64(self->mesh, dim, (int64_t)value, out, &err);
  Py_END_ALLOW_THREADS
  PyObject *t = rc != MT_OK ? mt_ext_raise(rc, &err) : mt_ext_int_tuple(out, (int)n);
  PyMem_Free(out);
  return t;
}

static PyObject *mesh_get_shape(MeshObject *self, void *closure) {
  int64_t shape[MT_MAX_MESH_NDIM];
  int ndim = mt_mesh_ndim(self->mesh);
  for (int d = 0; d < ndim; ++d) shape[d] = mt_mesh_dim_size(self->mesh, d);
  return mt_ext_int_tuple(shape, ndim);
}

static PyObject *mesh_time_model(MeshObject *self, PyObject *unused) {
  return mt_ext_time_model_tuple(mt_mesh_time_model(self->mesh));
}

/* nodes() -> (kind, count, smallest, largest): how the members lie on nodes
 * (mt_mesh_nodes_of; kind "one", "blocks", "unequal" or "interleaved"). */
static PyObject *mesh_nodes(MeshObject *self, PyObject *unused) {
  static const char *const kinds[] = {"one", "blocks", "unequal", "interleaved"};
  mt_mesh_nodes n;
  mt_mesh_nodes_of(self->mesh, &n);
  return Py_BuildValue("(sLLL)", kinds[n.kind], (long long)n.count,
                       (long long)n.smallest, (long long)n.largest);
}

/* set_time_model(model): the costs of a calibrated table; ranks_per_node stays
 * what the mesh learnt. */
static PyObject *mesh_set_time_model(MeshObject *self, PyObject *arg) {
  mt_time_model m;
  if (mt_ext_time_model(arg, &m) < 0) return NULL;
  mt_error err = {0};
  int rc = mt_mesh_set_time_model(self->mesh, &m, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

static PyObject *mesh_direct_read(MeshObject *self, PyObject *unused) {
  return PyBool_FromLong(mt_mesh_direct_read(self->mesh));
}

static PyMethodDef mesh_methods[] = {
    {"direct_read", (PyCFunction)mesh_direct_read, METH_NOARGS,
     "Whether large steps copy parts straight between the members' arrays "
     "(mt_mesh_direct_read). Local."},
    {"time_model", (PyCFunction)mesh_time_model, METH_NOARGS,
     "(alpha_shm, beta_shm, alpha_net, beta_net, call, copy, reduce, ranks_per_node): "
     "how plans on this mesh are ranked; ranks_per_node from MPI_Comm_split_type (0: one node). Local."},
    {"nodes", (PyCFunction)mesh_nodes, METH_NOARGS,
     "nodes() -> (kind, count, smallest, largest) of the nodes the members lie on, as "
     "the mesh learnt when it was made ('one', 'blocks', 'unequal', 'interleaved'). "
     "Local."},
    {"set_time_model", (PyCFunction)mesh_set_time_model, METH_O,
     "set_time_model(model): the costs of a calibrated table (ValueError when "
     "invalid); ranks_per_node stays. Local."},
    {"slice", (PyCFunction)(void (*)(void))mesh_slice, METH_FASTCALL,
     "slice(dims) -> Mesh over those mesh dims (ascending), sharing communicators. Local."},
    {"coordinate", (PyCFunction)mesh_coordinate, METH_NOARGS,
     "This rank's coordinate as a tuple, or None for a non-member. Local."},
    {"groups", (PyCFunction)mesh_groups, METH_NOARGS,
     "One mpi4py communicator per mesh dim (COMM_NULL on a non-member). Local."},
    {"bcast", (PyCFunction)(void (*)(void))mesh_bcast, METH_FASTCALL,
     "bcast(array, dim): broadcast in place from coordinate 0 of that dim. Collective."},
    {"allgather_int", (PyCFunction)(void (*)(void))mesh_allgather_int, METH_FASTCALL,
     "allgather_int(value, dim) -> tuple of every member's int on that dim, by "
     "coordinate. Collective on the dim; counted as an all-gather."},
    {"exscan", (PyCFunction)(void (*)(void))mesh_exscan, METH_FASTCALL,
     "exscan(array, dim, op): exclusive prefix (MPI_Exscan) of the array by the "
     "reduce op over the ranks before this one on that dim, in place; coordinate 0 "
     "keeps its array. Collective on the dim; counted as an exscan."},
    {"alltoallv", (PyCFunction)(void (*)(void))mesh_alltoallv, METH_FASTCALL,
     "alltoallv(array, counts, dim) -> (rows, counts received): counts[q] rows of the "
     "array (in order) go to coordinate q of that dim. Collective on the dim; counted "
     "as two all-to-alls (the counts, then the rows)."},
    {"any", (PyCFunction)mesh_any, METH_O,
     "any(flag) -> OR of flag over all members. Collective on the mesh."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef mesh_getset[] = {
    {"shape", (getter)mesh_get_shape, NULL, "mesh shape", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot mesh_slots[] = {
    {Py_tp_new, mesh_new},
    {Py_tp_dealloc, mesh_dealloc},
    {Py_tp_traverse, mesh_traverse},
    {Py_tp_methods, mesh_methods},
    {Py_tp_getset, mesh_getset},
    {Py_tp_doc, "Mesh(comm, shape, ranks): the communicators of a device mesh. "
                "Collective on comm."},
    {0, NULL},
};

static PyType_Spec mesh_spec = {
    .name = "mpitensor._C.Mesh",
    .basicsize = sizeof(MeshObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = mesh_slots,
};

static PyObject *library_version(PyObject *module, PyObject *unused) {
  char text[8192];
  mt_error err = {0};
  int rc = mt_mpi_library_version(text, (int)sizeof text, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return PyUnicode_FromString(text);
}

static PyObject *live_comms(PyObject *module, PyObject *unused) {
  return PyLong_FromLongLong(mt_comm_live_count());
}

static PyObject *default_time_model(PyObject *self, PyObject *unused) {
  mt_time_model m = mt_time_model_default();
  return mt_ext_time_model_tuple(&m);
}

static PyObject *direct_fail_next(PyObject *module, PyObject *arg) {
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return NULL;
  return PyLong_FromLong(mt_direct_fail_next((int)n));
}

PyMethodDef mt_ext_mesh_methods[] = {
    {"direct_fail_next", direct_fail_next, METH_O,
     "direct_fail_next(n) -> the failures asked before and not yet taken: for tests, "
     "the next n direct copies of this process fail (mt_direct_fail_next). Local."},
    {"default_time_model", default_time_model, METH_NOARGS,
     "The built-in time model (alpha_shm, beta_shm, alpha_net, beta_net, "
     "call, copy, reduce, ranks_per_node): one node. Local."},
    {"mpi_library_version", library_version, METH_NOARGS,
     "The MPI_Get_library_version string of the libmpi this extension links. Local."},
    {"comm_live_count", live_comms, METH_NOARGS,
     "Communicators mpitensor created and has not freed yet. Local."},
    {NULL, NULL, 0, NULL},
};

mt_mesh *mt_ext_mesh_get_unchecked(PyObject *obj) { return ((MeshObject *)obj)->mesh; }

mt_mesh *mt_ext_mesh_get(PyObject *module, PyObject *obj) {
  if (!PyObject_TypeCheck(obj, mt_ext_state_of(module)->mesh_type)) {
    PyErr_Format(PyExc_TypeError, "expected a _C.Mesh, got %s", Py_TYPE(obj)->tp_name);
    return NULL;
  }
  return ((MeshObject *)obj)->mesh;
}

mt_mesh *mt_ext_mesh_for_collective(PyObject *module, PyObject *obj) {
  mt_mesh *mesh = mt_ext_mesh_get(module, obj);
  return mesh == NULL || mt_ext_mesh_check_thread(obj) < 0 ? NULL : mesh;
}

int mt_ext_mesh_exec(PyObject *module) {
  PyObject *tp = PyType_FromModuleAndSpec(module, &mesh_spec, NULL);
  if (tp == NULL) return -1;
  mt_ext_state_of(module)->mesh_type = (PyTypeObject *)tp;
  return PyModule_AddObjectRef(module, "Mesh", tp);
}
