/* DTensorSpec <-> the core's layouts: a spec's fields as a layout key, its
 * layout id on its mesh, and the Python form of a layout made from core data
 * (placements as the ground floor's Placement objects, shape and stride tuples),
 * kept per mesh by layout slot so that an output of a known layout gets its spec
 * without building tuples. */
#include "ext.h"

#include <string.h>

#include "mpitensor/core/layout.h"

int mt_ext_interned_code(const mt_ext_dispatch *d, const PyObject *p, mt_placement *out) {
  if (p == d->replicate) return *out = (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0}, 1;
  for (int i = 0; i < MT_MAX_NDIM; ++i)
    if (p == d->shard[i]) return *out = (mt_placement){MT_PLACEMENT_SHARD, i, 0, 0}, 1;
  for (int op = 0; op < MT_REDUCE_COUNT; ++op)
    if (p == d->partial[op]) return *out = (mt_placement){MT_PLACEMENT_PARTIAL, 0, op, 0}, 1;
  return 0;
}

int mt_ext_placement_code(const mt_ext_dispatch *d, PyObject *p, mt_placement *out) {
  if (mt_ext_interned_code(d, p, out)) return 0;
  PyObject *code = PyObject_GetAttrString(p, "_code");
  *out = (mt_placement){0, 0, 0, 0};
  int ok = code != NULL && PyTuple_Check(code) &&
           PyArg_ParseTuple(code, "iii|i", &out->kind, &out->dim, &out->reduce_op,
                            &out->split_factor);
  if (code != NULL && !PyTuple_Check(code))
    PyErr_SetString(PyExc_TypeError, "a placement's _code is a (kind, dim, reduce_op) tuple");
  Py_XDECREF(code);
  return ok ? 0 : -1;
}

int mt_ext_dtype_key(PyArray_Descr *descr) {
  return descr->type_num + (PyArray_ISNBO(descr->byteorder) ? 0 : (1 << 16));
}

static int int64s_of(PyObject *tuple, int64_t *out, int cap, int *n) {
  if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > cap) {
    PyErr_SetString(PyExc_TypeError, "a DTensorSpec's shape and stride are tuples of ints");
    return -1;
  }
  *n = (int)PyTuple_GET_SIZE(tuple);
  for (int i = 0; i < *n; ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (out[i] == -1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

int mt_ext_spec_key(mt_ext_dispatch *d, const mt_ext_mesh_base *mb, PyObject *spec,
                    mt_layout_key *key) {
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) {
    PyErr_SetString(PyExc_TypeError, "a DTensor's spec is a DTensorSpec");
    return -1;
  }
  PyObject *pl = PyTuple_GET_ITEM(spec, 1), *dtype = PyTuple_GET_ITEM(spec, 3);
  if (!PyTuple_Check(pl) || PyTuple_GET_SIZE(pl) != mb->mesh_ndim ||
      !PyArray_DescrCheck(dtype)) {
    PyErr_SetString(PyExc_TypeError, "a DTensorSpec holds a placement per mesh dim and a "
                    "NumPy dtype");
    return -1;
  }
  key->mesh_ndim = mb->mesh_ndim;
  for (int m = 0; m < mb->mesh_ndim; ++m)
    if (mt_ext_placement_code(d, PyTuple_GET_ITEM(pl, m), &key->placements[m]) < 0)
      return -1;
  int nstride = 0;
  if (int64s_of(PyTuple_GET_ITEM(spec, 2), key->shape, MT_MAX_NDIM, &key->ndim) < 0 ||
      int64s_of(PyTuple_GET_ITEM(spec, 4), key->stride, MT_MAX_NDIM, &nstride) < 0)
    return -1;
  if (nstride != key->ndim) {
    PyErr_SetString(PyExc_ValueError, "a DTensorSpec's stride has one entry per dim");
    return -1;
  }
  PyArray_Descr *descr = (PyArray_Descr *)dtype;
  key->dtype = mt_ext_dtype_key(descr);
  key->itemsize = (int64_t)PyDataType_ELSIZE(descr);
  return 0;
}

int mt_ext_placement_strided(const mt_ext_dispatch *d, PyObject *p) {
  mt_placement c;
  if (mt_ext_placement_code(d, p, &c) == 0) return c.kind == MT_PLACEMENT_STRIDED;
  return PyErr_Clear(), 0;
}

int mt_ext_strided(const mt_ext_dispatch *d, PyObject *o) {
  if (!mt_ext_is_dtensor(d, o)) return 0;
  PyObject *spec = ((mt_ext_dtensor *)o)->spec;
  if (spec == NULL || !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) return 0;
  PyObject *pl = PyTuple_GET_ITEM(spec, 1);
  if (!PyTuple_Check(pl)) return 0;
  for (Py_ssize_t m = 0; m < PyTuple_GET_SIZE(pl); ++m)
    if (mt_ext_placement_strided(d, PyTuple_GET_ITEM(pl, m))) return 1;
  return 0;
}

static int item_strided(const mt_ext_dispatch *d, PyObject *a) {
  if (mt_ext_strided(d, a)) return 1;
  if (!PyTuple_CheckExact(a) && !PyList_CheckExact(a)) return 0;
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(a); ++k)
    if (mt_ext_strided(d, PySequence_Fast_ITEMS(a)[k])) return 1;
  return 0;
}

int mt_ext_args_strided(const mt_ext_dispatch *d, PyObject *args, PyObject *kwargs) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i)
    if (item_strided(d, PyTuple_GET_ITEM(args, i))) return 1;
  Py_ssize_t pos = 0;
  PyObject *key, *a;
  while (kwargs != NULL && PyDict_Next(kwargs, &pos, &key, &a))
    if (item_strided(d, a)) return 1;
  return 0;
}

mt_ext_mesh_base *mt_ext_spec_mesh(mt_ext_dispatch *d, PyObject *spec) {
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) return NULL;
  PyObject *mesh = PyTuple_GET_ITEM(spec, 0);
  return PyObject_TypeCheck(mesh, d->mesh_base) ? (mt_ext_mesh_base *)mesh : NULL;
}

int mt_ext_layout_id(mt_ext_dispatch *d, mt_ext_mesh_base *mb, mt_ext_dtensor *dt,
                     mt_layout_key *key, int64_t *id) {
  int own = PyTuple_Check(dt->spec) && PyTuple_GET_SIZE(dt->spec) == 5 &&
            PyTuple_GET_ITEM(dt->spec, 0) == (PyObject *)mb;
  if (own && dt->layout_id != 0 && key == NULL) {
    *id = dt->layout_id;
    return 0;
  }
  mt_layout_key local;
  if (key == NULL) key = &local;
  if (mt_ext_spec_key(d, mb, dt->spec, key) < 0) return -1;
  int64_t slot;
  mt_error err = {0};
  if (mt_ext_ok(mt_layout_table_intern(mb->layouts, key, id, &slot, &err), &err) < 0)
    return -1;
  if (own) dt->layout_id = *id;
  return 0;
}

/* The _StridedShard of code `p`, made by the placements hook's maker (interned
 * there, so equal codes give one object). */
static PyObject *strided_object(mt_ext_dispatch *d, const mt_placement *p) {
  PyObject *args[2] = {PyLong_FromLong(p->dim), PyLong_FromLong(p->split_factor)};
  PyObject *out = args[0] && args[1] ? mt_ext_hook(d, MT_HOOK_PLACEMENTS, d->strided, args, 2,
                                                   NULL)
                                     : NULL;
  Py_XDECREF(args[0]);
  Py_XDECREF(args[1]);
  return out;
}

PyObject *mt_ext_placement_objects(mt_ext_dispatch *d, const mt_placement *p, int n) {
  PyObject *out = PyTuple_New(n);
  for (int m = 0; out != NULL && m < n; ++m) {
    PyObject *obj = p[m].kind == MT_PLACEMENT_SHARD && p[m].dim >= 0 &&
                            p[m].dim < MT_MAX_NDIM
                        ? Py_NewRef(d->shard[p[m].dim])
                    : p[m].kind == MT_PLACEMENT_PARTIAL && p[m].reduce_op >= 0 &&
                            p[m].reduce_op < MT_REDUCE_COUNT
                        ? Py_NewRef(d->partial[p[m].reduce_op])
                    : p[m].kind == MT_PLACEMENT_STRIDED ? strided_object(d, &p[m])
                                                        : Py_NewRef(d->replicate);
    if (obj == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, m, obj);
  }
  return out;
}

/* (placements, shape, dtype, stride) of `key` with the dtype object `dtype`. */
static PyObject *layout_tuple(mt_ext_dispatch *d, const mt_layout_key *key,
                              PyObject *dtype) {
  PyObject *pl = mt_ext_placement_objects(d, key->placements, key->mesh_ndim);
  PyObject *shape = mt_ext_int_tuple(key->shape, key->ndim);
  PyObject *stride = mt_ext_int_tuple(key->stride, key->ndim);
  PyObject *out = pl && shape && stride ? PyTuple_Pack(4, pl, shape, dtype, stride) : NULL;
  Py_XDECREF(pl);
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  return out;
}

/* Room for the Python layout of `slot`: the arrays grow by doubling, as the
 * layout table's slots do, so a mesh that holds few layouts costs little. */
static int py_room(mt_ext_mesh_base *mb, int64_t slot) {
  if (slot < mb->py_cap) return 0;
  int64_t cap = mb->py_cap ? mb->py_cap : 16;
  while (cap <= slot) cap *= 2;
  PyObject **layouts = PyMem_Realloc(mb->py_layouts, (size_t)cap * sizeof(PyObject *));
  if (layouts != NULL) mb->py_layouts = layouts;
  int64_t *ids = PyMem_Realloc(mb->py_ids, (size_t)cap * sizeof *ids);
  if (ids != NULL) mb->py_ids = ids;
  if (layouts == NULL || ids == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  memset(layouts + mb->py_cap, 0, (size_t)(cap - mb->py_cap) * sizeof(PyObject *));
  memset(ids + mb->py_cap, 0, (size_t)(cap - mb->py_cap) * sizeof *ids);
  mb->py_cap = cap;
  return 0;
}

PyObject *mt_ext_py_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb, int64_t id,
                           int64_t slot, const mt_layout_key *key, PyObject *dtype) {
  if (slot < 0 || py_room(mb, slot) < 0) return NULL;
  PyObject *have = mb->py_layouts[slot];
  if (have != NULL && mb->py_ids[slot] == id) return Py_NewRef(have);
  if (key == NULL) return NULL; /* unknown, and nothing to make it from */
  PyObject *made = layout_tuple(d, key, dtype);
  if (made == NULL) return NULL;
  Py_XSETREF(mb->py_layouts[slot], Py_NewRef(made));
  mb->py_ids[slot] = id;
  return made;
}

PyObject *mt_ext_spec_new(mt_ext_dispatch *d, PyObject *const *items) {
  PyObject *spec = d->spec->tp_alloc(d->spec, 5);
  for (Py_ssize_t i = 0; spec != NULL && i < 5; ++i)
    PyTuple_SET_ITEM(spec, i, Py_NewRef(items[i]));
  return spec;
}

PyObject *mt_ext_make_spec(mt_ext_dispatch *d, PyObject *mesh, PyObject *layout) {
  PyObject *items[5] = {mesh, PyTuple_GET_ITEM(layout, 0), PyTuple_GET_ITEM(layout, 1),
                        PyTuple_GET_ITEM(layout, 2), PyTuple_GET_ITEM(layout, 3)};
  return mt_ext_spec_new(d, items);
}

/* A new DTensor of type d->dtensor, its fields zero, tracked by the GC: the memory
 * of a freed one (from the free list ext_dtensor.c's dealloc fills) when there
 * is one. NULL with an exception. */
static PyObject *dtensor_alloc(mt_ext_dispatch *d) {
  PyTypeObject *tp = d->dtensor;
  if (d->nfree_dtensors == 0) return tp->tp_alloc(tp, 0);
  PyObject *o = d->free_dtensors[--d->nfree_dtensors];
  /* As PyType_GenericAlloc leaves it: zero past the header (a size the compiler
   * knows, so a few stores; any slots a Python class adds CPython has cleared),
   * a new reference to the type, tracked. */
  memset((char *)o + sizeof(PyObject), 0, sizeof(mt_ext_dtensor) - sizeof(PyObject));
  PyObject_Init(o, tp);
  PyObject_GC_Track(o);
  return o;
}

void mt_ext_dtensor_free_all(mt_ext_dispatch *d) {
  while (d->nfree_dtensors > 0) PyObject_GC_Del(d->free_dtensors[--d->nfree_dtensors]);
}

PyObject *mt_ext_new_dtensor(mt_ext_dispatch *d, PyObject *local, PyObject *spec, int64_t id,
                             int fresh) {
  mt_ext_dtensor *b = local && spec ? (mt_ext_dtensor *)dtensor_alloc(d) : NULL;
  if (b == NULL) {
    Py_XDECREF(local);
    Py_XDECREF(spec);
    return NULL;
  }
  b->local = local, b->spec = spec, b->layout_id = id, b->fresh = (char)fresh;
  return (PyObject *)b;
}

/* contiguous_strides(shape): see the method table. */
static PyObject *contiguous_strides(PyObject *Py_UNUSED(module), PyObject *shape) {
  PyObject *seq = PySequence_Fast(shape, "contiguous_strides: shape must be a sequence of ints");
  if (seq == NULL) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int64_t sh[MT_MAX_NDIM], st[MT_MAX_NDIM];
  if (n > MT_MAX_NDIM) {
    Py_DECREF(seq);
    return PyErr_Format(PyExc_ValueError, "contiguous_strides: more than %d dims", MT_MAX_NDIM);
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *v = PyNumber_Index(PySequence_Fast_GET_ITEM(seq, i));
    sh[i] = v == NULL ? -1 : PyLong_AsLongLong(v);
    Py_XDECREF(v);
    if (sh[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return NULL;
    }
  }
  Py_DECREF(seq);
  mt_layout_contiguous_strides((int)n, sh, st);
  return mt_ext_int_tuple(st, (int)n);
}

/* The fields of a DTensorSpec, in order. */
static const char *const spec_fields[5] = {"mesh", "placements", "shape", "dtype", "stride"};

/* new_spec(cls, mesh, placements, shape, dtype, stride): see the method table. */
static PyObject *new_spec(PyObject *Py_UNUSED(module), PyObject *const *a, Py_ssize_t n,
                          PyObject *kwnames) {
  if (n < 1 || !PyType_Check(a[0]) || !PyType_IsSubtype((PyTypeObject *)a[0], &PyTuple_Type))
    return PyErr_Format(PyExc_TypeError, "DTensorSpec.__new__(cls): cls must be a tuple type");
  if (n > 6)
    return PyErr_Format(PyExc_TypeError,
                        "DTensorSpec() takes 5 positional arguments but %zd were given", n - 1);
  PyObject *items[5] = {NULL};
  for (Py_ssize_t i = 1; i < n; ++i) items[i - 1] = a[i];
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject *key = PyTuple_GET_ITEM(kwnames, k);
    int j = 0;
    while (j < 5 && PyUnicode_CompareWithASCIIString(key, spec_fields[j]) != 0) ++j;
    if (j == 5)
      return PyErr_Format(PyExc_TypeError,
                          "DTensorSpec() got an unexpected keyword argument '%U'", key);
    if (items[j] != NULL)
      return PyErr_Format(PyExc_TypeError,
                          "DTensorSpec() got multiple values for argument '%s'", spec_fields[j]);
    items[j] = a[n + k];
  }
  for (int j = 0; j < 5; ++j)
    if (items[j] == NULL)
      return PyErr_Format(PyExc_TypeError,
                          "DTensorSpec() missing required argument: '%s'", spec_fields[j]);
  PyTypeObject *tp = (PyTypeObject *)a[0];
  PyObject *spec = tp->tp_alloc(tp, 5);
  for (Py_ssize_t i = 0; spec != NULL && i < 5; ++i)
    PyTuple_SET_ITEM(spec, i, Py_NewRef(items[i]));
  return spec;
}

/* inexact(dtype): see the method table. */
static PyObject *inexact(PyObject *Py_UNUSED(module), PyObject *dtype) {
  if (!PyArray_DescrCheck(dtype))
    return PyErr_Format(PyExc_TypeError, "inexact(dtype: numpy.dtype), got %R", dtype);
  return PyBool_FromLong(mt_ext_inexact((PyArray_Descr *)dtype));
}

PyMethodDef mt_ext_spec_methods[] = {
    {"inexact", inexact, METH_O,
     "inexact(dtype) -> whether values of `dtype` carry gradients: floating point, "
     "complex or ml_dtypes' bfloat16 (the executor's rule). Local.\n\n"
     "Example: _C.inexact(numpy.dtype(numpy.float32)) and not "
     "_C.inexact(numpy.dtype(numpy.int64))"},
    {"new_spec", (PyCFunction)(void (*)(void))new_spec, METH_FASTCALL | METH_KEYWORDS,
     "new_spec(cls, mesh, placements, shape, dtype, stride) -> a new `cls` (a "
     "NamedTuple of those fields, DTensorSpec) holding them: DTensorSpec's __new__, "
     "since every operation's output is given a spec. Local.\n\n"
     "Example: _C.new_spec(DTensorSpec, mesh, (Shard(0),), (4, 2), dtype, (2, 1))"},
    {"contiguous_strides", contiguous_strides, METH_O,
     "contiguous_strides(shape) -> torch's strides of a contiguous tensor of `shape` "
     "(a dim of size 0 counts as 1; mt_layout_contiguous_strides), as a tuple. "
     "Local.\n\n"
     "Example: _C.contiguous_strides((4, 0)) == (1, 1)"},
    {NULL, NULL, 0, NULL},
};
