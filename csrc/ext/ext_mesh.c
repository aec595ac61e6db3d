/* _C.Mesh: a DeviceMesh's communicators, owned by the comm library's mt_mesh,
 * which mpitensor._comm.Mesh (its Python subclass) makes, slices and calls
 * through ctypes. The type owns the mesh and keeps the creating thread's rule,
 * which the executor checks before each collective. */
#include "ext.h"

#include "mpitensor/comm/mesh.h"

typedef struct {
  PyObject_HEAD
  mt_mesh *mesh;
  uint64_t owner; /* the thread that created the mesh (thread_serial): the only
                     one that may run its collectives */
} MeshObject;

static void mesh_dealloc(MeshObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  mt_mesh_destroy(self->mesh);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static int mesh_traverse(MeshObject *self, visitproc visit, void *arg) {
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

/* Mesh(address): takes over the mt_mesh at `address`, which mpitensor._comm.Mesh
 * made through ctypes (mt_mesh_create_agreed, collective, or mt_mesh_slice); the
 * calling thread becomes the one that may run its collectives. Local. */
static PyObject *mesh_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  PyObject *address;
  if (!PyArg_ParseTuple(args, "O:Mesh", &address)) return NULL;
  mt_mesh *mesh = PyLong_AsVoidPtr(address);
  if (mesh == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Mesh(address): no mesh");
    return NULL;
  }
  return wrap(tp, mesh);
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
    {Py_tp_doc, "Mesh(address): the communicators of a device mesh, taking over the "
                "mt_mesh * that mpitensor._comm.Mesh, its Python subclass, made. "
                "Local."},
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
