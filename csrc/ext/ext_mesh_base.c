/* _C.MeshBase: the C base of every mesh (mpitensor.DeviceMesh, and the bare
 * meshes of mpitensor._comm). It owns the mesh's communicators (an mt_mesh of the
 * comm library, adopted once and destroyed with the object) and holds what the
 * dispatch of operations on the mesh remembers: the decision memo and the layout
 * table (core/memo.c, core/layout_table.c), with the Python form of each layout
 * by its slot. The dispatch reaches them from a DTensor's spec by a type check
 * and a field read; ctypes calls of the comm library take the object itself
 * (`_as_parameter_`). Nothing here references a DTensor or the mesh itself, so a
 * dropped mesh is freed at once. */
#include "ext.h"

#include <limits.h>
#include <stddef.h>
#include <string.h>
#include <structmember.h>

#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/mesh.h"

static void drop_py_layouts(mt_ext_mesh_base *mb) {
  for (int64_t s = 0; s < mb->py_cap; ++s) Py_CLEAR(mb->py_layouts[s]);
  PyMem_Free(mb->py_layouts);
  PyMem_Free(mb->py_ids);
  mb->py_layouts = NULL, mb->py_ids = NULL, mb->py_cap = 0;
}

static PyObject *mb_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  PyObject *module = PyType_GetModuleByDef(tp, &mt_ext_module_def);
  if (module == NULL) return NULL;
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)tp->tp_alloc(tp, 0);
  if (mb == NULL) return NULL;
  mt_error err = {0};
  int rc = mt_memo_create(d->decision_limit, d->plan_limit, &mb->memo, &err);
  if (rc == MT_OK) rc = mt_layout_table_create(d->layout_limit, &mb->layouts, &err);
  if (rc != MT_OK) {
    Py_DECREF(mb);
    return mt_ext_raise(rc, &err);
  }
  return (PyObject *)mb;
}

static int mb_traverse(PyObject *self, visitproc visit, void *arg) {
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)self;
  Py_VISIT(Py_TYPE(self));
  for (int64_t s = 0; s < mb->py_cap; ++s) Py_VISIT(mb->py_layouts[s]);
  return 0;
}

static int mb_clear(PyObject *self) {
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)self;
  for (int64_t s = 0; s < mb->py_cap; ++s) Py_CLEAR(mb->py_layouts[s]);
  return 0;
}

static void mb_dealloc(PyObject *self) {
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)self;
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  mb_clear(self);
  drop_py_layouts(mb);
  mt_memo_destroy(mb->memo);
  mt_layout_table_destroy(mb->layouts);
  mt_mesh_destroy(mb->mesh); /* after MPI_Finalize it frees only memory */
  tp->tp_free(self);
  Py_DECREF(tp);
}

/* The memo ranks plans by the mesh's time model: a copy, taken again whenever
 * the model changes. */
static int take_time_model(mt_ext_mesh_base *mb) {
  mt_error err = {0};
  return mt_ext_ok(mt_memo_set_time_model(mb->memo, mt_mesh_time_model(mb->mesh), &err), &err);
}

/* _adopt(pointer): see the method table. */
static PyObject *adopt(PyObject *self, PyObject *arg) {
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)self;
  mt_mesh *mesh = mt_ext_pointer_of(arg);
  if (mesh == NULL) return NULL;
  if (mb->mesh != NULL) {
    mt_mesh_destroy(mesh);
    return PyErr_Format(PyExc_RuntimeError, "the mesh already has its communicators");
  }
  int64_t coord[MT_MAX_MESH_NDIM];
  mb->mesh = mesh;
  mb->mesh_ndim = mt_mesh_ndim(mesh);
  for (int m = 0; m < mb->mesh_ndim; ++m) mb->mesh_shape[m] = mt_mesh_dim_size(mesh, m);
  mb->member = (char)mt_mesh_coordinate(mesh, coord);
  if (take_time_model(mb) < 0) return NULL;
  Py_RETURN_NONE;
}

static PyObject *time_model_changed(PyObject *self, PyObject *unused) {
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)self;
  if (mb->mesh == NULL)
    return PyErr_Format(PyExc_RuntimeError, "the mesh has no communicators");
  if (take_time_model(mb) < 0) return NULL;
  Py_RETURN_NONE;
}

/* What ctypes passes for the object as a `void *` argument (ctypes reads
 * `_as_parameter_`): the mt_mesh, for the comm library's functions. */
static PyObject *as_parameter_get(PyObject *self, void *closure) {
  const mt_ext_mesh_base *mb = (const mt_ext_mesh_base *)self;
  if (mb->mesh == NULL)
    return PyErr_Format(PyExc_RuntimeError, "the mesh has no communicators");
  return PyLong_FromVoidPtr(mb->mesh);
}

int mt_ext_mesh_check(const mt_ext_mesh_base *mb) {
  mt_error err = {0};
  return mt_ext_ok(mt_mesh_check(mb->mesh, &err), &err);
}

/* Empties the memo and the layout table under new bounds; ids go on increasing. */
static int set_limits(mt_ext_mesh_base *mb, int64_t decisions, int64_t plans,
                      int64_t layouts) {
  mt_error err = {0};
  int rc = mt_memo_set_limits(mb->memo, decisions, plans, &err);
  if (rc == MT_OK) rc = mt_layout_table_set_capacity(mb->layouts, layouts, &err);
  drop_py_layouts(mb);
  return mt_ext_ok(rc, &err);
}

static PyObject *set_cache_limits(PyObject *self, PyObject *args) {
  long long decisions, plans, layouts;
  if (!PyArg_ParseTuple(args, "LLL:_set_cache_limits", &decisions, &plans, &layouts))
    return NULL;
  if (set_limits((mt_ext_mesh_base *)self, decisions, plans, layouts) < 0) return NULL;
  Py_RETURN_NONE;
}

/* Capsules of the memo and the layout table: mpitensor._comm.dispatch_stats
 * reads their counts through ctypes while the mesh lives. */
static PyObject *tables_get(PyObject *self, void *closure) {
  const mt_ext_mesh_base *mb = (const mt_ext_mesh_base *)self;
  PyObject *memo = mt_ext_export("mpitensor._C.memo", mb->memo);
  PyObject *layouts = memo == NULL ? NULL
                                   : mt_ext_export("mpitensor._C.layout_table", mb->layouts);
  PyObject *out = layouts == NULL ? NULL : PyTuple_Pack(2, memo, layouts);
  Py_XDECREF(memo);
  Py_XDECREF(layouts);
  return out;
}

static PyGetSetDef mb_getset[] = {
    {"_as_parameter_", as_parameter_get, NULL,
     "The mesh's communicators as a ctypes argument of the comm library. Local.", NULL},
    {"_tables", tables_get, NULL,
     "(memo, layout table): capsules of this mesh's decision memo and layout "
     "table, for mpitensor._comm.dispatch_stats. Local.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef mb_members[] = {
    {"_local", T_BOOL, offsetof(mt_ext_mesh_base, local), 0,
     "mpitensor's local mesh: plain ndarrays mix with its DTensors as Replicate."},
    {"_equal_key", T_ULONGLONG, offsetof(mt_ext_mesh_base, key), 0,
     "A fingerprint of what makes meshes equal: operands on equal meshes mix."},
    {"_call_agreements", T_LONGLONG, offsetof(mt_ext_mesh_base, call_agreements), READONLY,
     "How many of a program's calls the ranks agreed on over this mesh "
     "(mpitensor._call_agreement). Local."},
    {"_ranks_key", T_ULONGLONG, offsetof(mt_ext_mesh_base, ranks_key), 0,
     "A fingerprint of the mesh's communicator and its set of ranks: a Replicate "
     "DTensor mixes into operations on meshes of the same one."},
    {NULL, 0, 0, 0, NULL},
};

/* _agree_call(fingerprint, message): see the method table. The check and the
 * agreement in one call, because a program's every NumPy call on DTensors makes
 * it (mpitensor._call_agreement). */
static PyObject *agree_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  const mt_ext_mesh_base *mb = (const mt_ext_mesh_base *)self;
  if (nargs != 2 || !PyLong_Check(args[0]) || !PyBytes_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "_agree_call(fingerprint: int, message: bytes)");
  unsigned long long fp = PyLong_AsUnsignedLongLongMask(args[0]);
  if (fp == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  if (mt_ext_mesh_agree(mb, (uint64_t)fp, PyBytes_AS_STRING(args[1]),
                        PyBytes_GET_SIZE(args[1])) < 0)
    return NULL;
  Py_RETURN_NONE;
}

int mt_ext_mesh_agree(const mt_ext_mesh_base *mb, uint64_t fp, const char *message,
                      Py_ssize_t len) {
  /* A rank outside the mesh takes no part, and one rank agrees with itself. */
  if (!mb->member || mt_ext_mesh_size(mb) == 1) return 0;
  if (mb->mesh == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "_agree_call: the mesh has no communicators");
    return -1;
  }
  if (mt_ext_mesh_check(mb) < 0) return -1;
  mt_error err = {0};
  if (len > (Py_ssize_t)sizeof err.msg - 1) len = (Py_ssize_t)sizeof err.msg - 1;
  memcpy(err.msg, message, (size_t)len);
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_agree(mb->mesh, MT_OK, fp, &err);
  Py_END_ALLOW_THREADS
  return rc == MT_OK ? 0 : (mt_ext_raise(rc, &err), -1);
}

/* _any_bits(bits): see the method table. The check and the all-reduce in one
 * call: a program's reshape, flip or split makes it (mpitensor._algorithms._views).
 * A rank outside the mesh takes no part, and a mesh of one rank asks only itself:
 * both answer with their own bits, without a call. */
static PyObject *any_bits(PyObject *self, PyObject *arg) {
  const mt_ext_mesh_base *mb = (const mt_ext_mesh_base *)self;
  long bits = PyLong_AsLong(arg);
  if (bits == -1 && PyErr_Occurred()) return NULL;
  if (bits < 0 || bits > INT_MAX)
    return PyErr_Format(PyExc_ValueError, "_any_bits: bits must fit in 31 bits");
  if (mb->mesh != NULL && (!mb->member || mt_ext_mesh_size(mb) == 1))
    return PyLong_FromLong(bits);
  if (mb->mesh == NULL)
    return PyErr_Format(PyExc_RuntimeError, "_any_bits: the mesh has no communicators");
  if (mt_ext_mesh_check(mb) < 0) return NULL;
  mt_error err = {0};
  int result = 0, rc;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_mesh_any(mb->mesh, (int)bits, &result, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return PyLong_FromLong(result);
}

static PyMethodDef mb_methods[] = {
    {"_any_bits", any_bits, METH_O,
     "_any_bits(bits) -> the bitwise OR of every member's bits (an int below 2**31); "
     "first the mesh's own check (its thread, its communicators). Collective on the "
     "mesh; a rank outside it, or a mesh of one rank, gets its own bits back."},
    {"_adopt", adopt, METH_O,
     "_adopt(pointer): the mesh owns the mt_mesh a ctypes.c_void_p points to, from "
     "now until it is freed; once. Local."},
    {"_time_model_changed", time_model_changed, METH_NOARGS,
     "_time_model_changed(): the decisions take the mesh's new time model. Local."},
    {"_set_cache_limits", set_cache_limits, METH_VARARGS,
     "_set_cache_limits(decisions, plans, layouts): new bounds; empties both. Local."},
    {"_agree_call", (PyCFunction)(void (*)(void))agree_call, METH_FASTCALL,
     "_agree_call(fingerprint, message): ValueError with `message` (UTF-8) on every "
     "member when the members' fingerprints (ints, taken mod 2**64) differ; first "
     "the mesh's own check (its thread, its communicators). Collective on the mesh; "
     "nothing on a rank outside it or on a mesh of one rank."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot mb_slots[] = {
    {Py_tp_doc, "The C base of every mesh: its communicators, which it owns, and "
                "the decisions of operations on it. Internal."},
    {Py_tp_new, mb_new},
    {Py_tp_dealloc, mb_dealloc},
    {Py_tp_traverse, mb_traverse},
    {Py_tp_clear, mb_clear},
    {Py_tp_getset, mb_getset},
    {Py_tp_members, mb_members},
    {Py_tp_methods, mb_methods},
    {0, NULL},
};

static PyType_Spec mb_spec = {
    .name = "mpitensor._C.MeshBase",
    .basicsize = sizeof(mt_ext_mesh_base),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = mb_slots,
};

int mt_ext_mesh_base_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->mesh_base_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &mb_spec, NULL);
  if (st->mesh_base_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "MeshBase", (PyObject *)st->mesh_base_type);
}
