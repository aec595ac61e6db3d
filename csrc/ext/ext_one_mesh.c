/* Operands on one mesh: which mesh an operation runs on, and which DTensors of
 * another mesh mix into it, for the executor (mt_ext_call_mesh) and for the Python
 * door (one_mesh). A DTensor that is Replicate on every dim of a mesh of the same
 * ranks holds its whole value on every rank of the other mesh too, so it joins an
 * operation there as an implicitly replicated ndarray does, with nothing moved:
 * the array API's clients make their constants on the default mesh while their
 * data lives on the program's. torch refuses every cross-mesh operation; any other
 * DTensor of another mesh is refused here as well. */
#include "ext.h"

#include "mpitensor/core/layout.h"

PyObject *mt_ext_replicated(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *arr) {
  PyArrayObject *a = (PyArrayObject *)arr;
  int64_t shape[MT_MAX_NDIM], stride[MT_MAX_NDIM];
  int n = PyArray_NDIM(a);
  if (n > MT_MAX_NDIM) return PyErr_Format(PyExc_ValueError, "too many dims");
  for (int i = 0; i < n; ++i) shape[i] = PyArray_DIM(a, i);
  mt_layout_contiguous_strides(n, shape, stride);
  PyObject *pl = PyTuple_New(mb->mesh_ndim);
  for (int m = 0; pl != NULL && m < mb->mesh_ndim; ++m)
    PyTuple_SET_ITEM(pl, m, Py_NewRef(d->replicate));
  PyObject *sh = mt_ext_int_tuple(shape, n), *st = mt_ext_int_tuple(stride, n), *spec = NULL;
  if (pl && sh && st) {
    PyObject *items[5] = {(PyObject *)mb, pl, sh, (PyObject *)PyArray_DESCR(a), st};
    spec = mt_ext_spec_new(d, items);
  }
  Py_XDECREF(pl);
  Py_XDECREF(sh);
  Py_XDECREF(st);
  return mt_ext_new_dtensor(d, spec ? Py_NewRef(arr) : NULL, spec, 0, 0);
}

/* Whether `b` is Replicate on every mesh dim and needs no gradient: it may join
 * an operation on another mesh of the same ranks. */
static int movable(const mt_ext_dispatch *d, const mt_ext_dtensor *b) {
  if (b->requires_grad || !PyTuple_Check(b->spec) || PyTuple_GET_SIZE(b->spec) != 5)
    return 0;
  PyObject *pl = PyTuple_GET_ITEM(b->spec, 1);
  if (!PyTuple_Check(pl)) return 0;
  for (Py_ssize_t m = 0; m < PyTuple_GET_SIZE(pl); ++m)
    if (Py_TYPE(PyTuple_GET_ITEM(pl, m)) != Py_TYPE(d->replicate)) return 0;
  return 1;
}

int mt_ext_mixes_in(const mt_ext_dispatch *d, const mt_ext_dtensor *b,
                    const mt_ext_mesh_base *m, const mt_ext_mesh_base *mb) {
  return m->ranks_key != 0 && m->ranks_key == mb->ranks_key && movable(d, b);
}

/* The mesh of DTensor `o`, or NULL (with a TypeError) when its spec names none. */
static mt_ext_mesh_base *mesh_of(mt_ext_dispatch *d, PyObject *o) {
  PyObject *spec = ((mt_ext_dtensor *)o)->spec;
  mt_ext_mesh_base *m = spec == NULL ? NULL : mt_ext_spec_mesh(d, spec);
  if (m == NULL) PyErr_SetString(PyExc_TypeError, "a DTensor's spec must name a DeviceMesh");
  return m;
}

mt_ext_mesh_base *mt_ext_call_mesh(mt_ext_dispatch *d, PyObject *const *ops, int n,
                                   PyObject *key, int *err) {
  mt_ext_mesh_base *mb = NULL;
  int settled = 0; /* mb is the mesh of a DTensor that cannot move */
  for (int i = 0; i < n && !settled; ++i) {
    if (!mt_ext_is_dtensor(d, ops[i])) continue;
    mt_ext_dtensor *b = (mt_ext_dtensor *)ops[i];
    if (mt_ext_complete(d, b) < 0) return *err = 1, NULL;
    mt_ext_mesh_base *m = mesh_of(d, ops[i]);
    if (m == NULL) return *err = 1, NULL;
    settled = !movable(d, b);
    if (mb == NULL || settled) mb = m;
  }
  for (int i = 0; mb != NULL && i < n; ++i) {
    if (!mt_ext_is_dtensor(d, ops[i])) continue;
    mt_ext_dtensor *b = (mt_ext_dtensor *)ops[i];
    if (mt_ext_complete(d, b) < 0) return *err = 1, NULL;
    mt_ext_mesh_base *m = mesh_of(d, ops[i]);
    if (m == NULL) return *err = 1, NULL;
    if (mt_ext_same_mesh(m, mb) || mt_ext_mixes_in(d, b, m, mb)) continue;
    PyObject *pair = PyTuple_Pack(2, (PyObject *)mb, (PyObject *)m);
    if (pair != NULL) mt_ext_error(d, "mesh", key, pair);
    Py_XDECREF(pair);
    return *err = 1, NULL;
  }
  return mb;
}

/* Calls visit(o, ctx) on every DTensor among args, kwargs' values and the items
 * of their lists and tuples, in that order, until it returns nonzero (returned). */
typedef int visit_fn(mt_ext_dispatch *d, PyObject *o, void *ctx);

static int visit_item(mt_ext_dispatch *d, PyObject *a, visit_fn *visit, void *ctx) {
  if (mt_ext_is_dtensor(d, a)) return visit(d, a, ctx);
  if (!PyTuple_CheckExact(a) && !PyList_CheckExact(a)) return 0;
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(a); ++k) {
    PyObject *item = PySequence_Fast_ITEMS(a)[k];
    int rc = mt_ext_is_dtensor(d, item) ? visit(d, item, ctx) : 0;
    if (rc) return rc;
  }
  return 0;
}

static int visit_args(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs,
                      visit_fn *visit, void *ctx) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) {
    int rc = visit_item(d, PyTuple_GET_ITEM(args, i), visit, ctx);
    if (rc) return rc;
  }
  Py_ssize_t pos = 0;
  PyObject *key, *a;
  while (kwargs != NULL && PyDict_Next(kwargs, &pos, &key, &a)) {
    int rc = visit_item(d, a, visit, ctx);
    if (rc) return rc;
  }
  return 0;
}

/* Stops (1) at a DTensor of another mesh than the first one's. */
static int differs(mt_ext_dispatch *d, PyObject *o, void *ctx) {
  mt_ext_mesh_base **first = ctx, *m = mt_ext_spec_mesh(d, ((mt_ext_dtensor *)o)->spec);
  if (m == NULL) return 0;
  if (*first == NULL) *first = m;
  return !mt_ext_same_mesh(m, *first);
}

int mt_ext_args_meshes_differ(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs) {
  mt_ext_mesh_base *first = NULL;
  return visit_args(d, args, kwargs, differs, &first);
}

/* The operation's mesh as mt_ext_call_mesh picks it: the first DTensor's, until
 * one that cannot move settles it (stops, 1). */
typedef struct pick {
  mt_ext_mesh_base *mb;
} pick;

static int settle(mt_ext_dispatch *d, PyObject *o, void *ctx) {
  pick *p = ctx;
  mt_ext_mesh_base *m = mt_ext_spec_mesh(d, ((mt_ext_dtensor *)o)->spec);
  if (m == NULL) return 0;
  int fixed = !movable(d, (mt_ext_dtensor *)o);
  if (p->mb == NULL || fixed) p->mb = m;
  return fixed;
}

/* `a` with each DTensor that mixes into an operation on `mb` made the Replicate
 * DTensor on `mb` around its local array; a new reference. */
static PyObject *moved(mt_ext_dispatch *d, PyObject *a, mt_ext_mesh_base *mb) {
  if (mt_ext_is_dtensor(d, a)) {
    mt_ext_dtensor *b = (mt_ext_dtensor *)a;
    mt_ext_mesh_base *m = mt_ext_spec_mesh(d, b->spec);
    if (m == NULL || mt_ext_same_mesh(m, mb) || !mt_ext_mixes_in(d, b, m, mb))
      return Py_NewRef(a);
    if (mt_ext_complete(d, b) < 0) return NULL;
    return mt_ext_replicated(d, mb, b->local);
  }
  if (!PyTuple_CheckExact(a) && !PyList_CheckExact(a)) return Py_NewRef(a);
  Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
  PyObject *out = PyTuple_CheckExact(a) ? PyTuple_New(n) : PyList_New(n);
  for (Py_ssize_t k = 0; out != NULL && k < n; ++k) {
    PyObject *item = moved(d, PySequence_Fast_ITEMS(a)[k], mb);
    if (item == NULL) Py_CLEAR(out);
    else if (PyTuple_CheckExact(a)) PyTuple_SET_ITEM(out, k, item);
    else PyList_SET_ITEM(out, k, item);
  }
  return out;
}

/* one_mesh(args, kwargs): see the method table. */
static PyObject *one_mesh(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "one_mesh(args: tuple, kwargs: dict)");
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  pick p = {NULL};
  visit_args(d, args[0], args[1], settle, &p);
  if (p.mb == NULL) return PyTuple_Pack(2, args[0], args[1]);
  Py_ssize_t n = PyTuple_GET_SIZE(args[0]), pos = 0;
  PyObject *new_args = PyTuple_New(n), *new_kwargs = PyDict_New(), *key, *v;
  for (Py_ssize_t i = 0; new_args != NULL && i < n; ++i) {
    PyObject *item = moved(d, PyTuple_GET_ITEM(args[0], i), p.mb);
    if (item == NULL) Py_CLEAR(new_args);
    else PyTuple_SET_ITEM(new_args, i, item);
  }
  while (new_kwargs != NULL && PyDict_Next(args[1], &pos, &key, &v)) {
    PyObject *item = moved(d, v, p.mb);
    if (item == NULL || PyDict_SetItem(new_kwargs, key, item) < 0) Py_CLEAR(new_kwargs);
    Py_XDECREF(item);
  }
  PyObject *out = new_args && new_kwargs ? PyTuple_Pack(2, new_args, new_kwargs) : NULL;
  Py_XDECREF(new_args);
  Py_XDECREF(new_kwargs);
  return out;
}

PyMethodDef mt_ext_one_mesh_methods[] = {
    {"one_mesh", (PyCFunction)(void (*)(void))one_mesh, METH_FASTCALL,
     "one_mesh(args, kwargs) -> (args, kwargs): the call's arguments with each "
     "DTensor of another mesh than the operation's that mixes into it (Replicate on "
     "every dim of a mesh of the same ranks, needing no gradient) made the "
     "Replicate DTensor on the operation's mesh around its local array, as the "
     "executor takes it; the others as they are. Local.\n\n"
     "Example: _C.one_mesh((dt, world_constant), {})"},
    {NULL, NULL, 0, NULL},
};
