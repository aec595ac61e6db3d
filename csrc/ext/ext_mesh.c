/* _C.Mesh: a DeviceMesh's communicators, owned by the core's mt_mesh. It makes
 * them (mpi4py's C API), slices them, gives their mpi4py objects and the mt_mesh *
 * the ctypes bindings take, and keeps the creating thread's rule; its collectives
 * are mpitensor._comm.Mesh's, its Python subclass. */
#include "ext.h"

#include <mpi4py/mpi4py.h>

#include "mpitensor/comm/counters.h"
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

/* A _C.Mesh, or an instance of mpitensor._comm.Mesh (its Python subclass, which
 * adds the collectives). */
static PyObject *wrap(PyTypeObject *tp, mt_mesh *mesh) {
  MeshObject *self = (MeshObject *)tp->tp_alloc(tp, 0);
  if (self == NULL) {
    mt_mesh_destroy(mesh);
    return NULL;
  }
  self->mesh = mesh;
  self->owner = thread_serial();
  return (PyObject *)self;
}

/* The module state of _C.Mesh, also when `tp` is a Python subclass of it. */
static mt_ext_state *mesh_state(PyTypeObject *tp) {
  while (((PyHeapTypeObject *)tp)->ht_module == NULL) tp = tp->tp_base;
  return (mt_ext_state *)PyType_GetModuleState(tp);
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

/* Mesh(comm, shape, ranks[, fingerprint, status, message]): collective on comm.
 * `ranks` is the flattened mesh; `fingerprint` (an int, mod 2**64) of what else
 * every rank must pass alike, and this rank's failure from its own checks (an
 * mt_status and its message, bytes; mpitensor._comm.Mesh makes them of an
 * exception), are agreed on with the shape and the ranks (mt_mesh_create_agreed). */
static PyObject *mesh_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  PyObject *comm_obj, *shape_obj, *ranks_obj, *fp_obj = NULL;
  const char *text = "";
  Py_ssize_t len = 0;
  int status = MT_OK;
  if (!PyArg_ParseTuple(args, "OOO|Oiy#:Mesh", &comm_obj, &shape_obj, &ranks_obj, &fp_obj,
                        &status, &text, &len))
    return NULL;
  unsigned long long fp = fp_obj == NULL ? 0 : PyLong_AsUnsignedLongLongMask(fp_obj);
  if (fp == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  mt_error err = {0};
  if (status != MT_OK) mt_error_set(&err, status, "%.*s", (int)len, text);
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
  mt_mesh_set_counters(mesh, &mesh_state(tp)->comm_counters);
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

static PyObject *mesh_check_thread(PyObject *self, PyObject *unused) {
  if (mt_ext_mesh_check_thread(self) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *mesh_get_address(MeshObject *self, void *closure) {
  return PyLong_FromVoidPtr(self->mesh);
}

static PyMethodDef mesh_methods[] = {
    {"check_thread", mesh_check_thread, METH_NOARGS,
     "Raises RuntimeError unless this is the thread that created the mesh, and on a "
     "mesh whose communicator was freed: what a collective checks first. Local."},
    {"slice", (PyCFunction)(void (*)(void))mesh_slice, METH_FASTCALL,
     "slice(dims) -> Mesh over those mesh dims (ascending), sharing communicators. Local."},
    {"groups", (PyCFunction)mesh_groups, METH_NOARGS,
     "One mpi4py communicator per mesh dim (COMM_NULL on a non-member). Local."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef mesh_getset[] = {
    {"address", (getter)mesh_get_address, NULL,
     "The mt_mesh * (an int) the comm functions take (mpitensor._comm)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot mesh_slots[] = {
    {Py_tp_new, mesh_new},
    {Py_tp_dealloc, mesh_dealloc},
    {Py_tp_traverse, mesh_traverse},
    {Py_tp_methods, mesh_methods},
    {Py_tp_getset, mesh_getset},
    {Py_tp_doc, "Mesh(comm, shape, ranks[, fingerprint, status, message]): the "
                "communicators of a device mesh. Collective on comm. Its collectives "
                "are those of mpitensor._comm.Mesh, its Python subclass."},
    {0, NULL},
};

static PyType_Spec mesh_spec = {
    .name = "mpitensor._C.Mesh",
    .basicsize = sizeof(MeshObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .slots = mesh_slots,
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
