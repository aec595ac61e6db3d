/* Strided shards in the executor: a strided DTensor's local array is, reshaped, the
 * local array of its plain expansion (mpitensor/core/strided.h), so the executor
 * runs it as that plain DTensor and reads the result back: moves (ext_move.c),
 * elementwise ufuncs on operands strided alike or replicated, and reductions over
 * every element. A call with no plain reading here moves its strided operands to
 * plain layouts (the Python door, mpitensor._registry). */
#include "ext.h"

#include "mpitensor/core/reshape.h"
#include "mpitensor/core/strided.h"

int mt_ext_strided_layout(mt_ext_dispatch *d, const mt_ext_mesh_base *mb, PyObject *shape,
                          PyObject *placements, mt_layout *out) {
  mt_placement codes[MT_MAX_MESH_NDIM];
  int64_t sh[MT_MAX_NDIM];
  Py_ssize_t ndim = PyTuple_GET_SIZE(shape);
  if (ndim > MT_MAX_NDIM || PyTuple_GET_SIZE(placements) != mb->mesh_ndim)
    return PyErr_SetString(PyExc_ValueError, "a layout too large for the core"), -1;
  for (Py_ssize_t i = 0; i < ndim; ++i)
    if ((sh[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i))) == -1 && PyErr_Occurred())
      return -1;
  for (int m = 0; m < mb->mesh_ndim; ++m)
    if (mt_ext_placement_code(d, PyTuple_GET_ITEM(placements, m), &codes[m]) < 0) return -1;
  mt_error err = {0};
  return mt_ext_ok(mt_strided_init(out, (int)ndim, sh, mb->mesh_ndim, mb->mesh_shape, codes,
                                   &err), &err);
}

PyObject *mt_ext_as_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *like,
                           PyObject *local, const mt_layout *l, PyObject *pl) {
  int64_t coord[MT_MAX_MESH_NDIM], stride[MT_MAX_NDIM];
  PyObject *shaped = NULL;
  if (mb->member && mt_mesh_coordinate(mb->mesh, coord)) {
    mt_box box;
    mt_error err = {0};
    if (mt_ext_ok(mt_strided_local_box(l, coord, &box, &err), &err) < 0) return NULL;
    npy_intp dims[MT_MAX_NDIM];
    for (int i = 0; i < box.ndim; ++i) dims[i] = (npy_intp)box.shape[i];
    PyArray_Dims newshape = {dims, box.ndim};
    shaped = PyArray_Newshape((PyArrayObject *)local, &newshape, NPY_CORDER);
  } else {
    shaped = Py_NewRef(local);
  }
  mt_layout_contiguous_strides(l->ndim, l->shape, stride);
  PyObject *items[5] = {PyTuple_GET_ITEM(like, 0),
                        pl != NULL ? Py_NewRef(pl)
                                   : mt_ext_placement_objects(d, l->placements, l->mesh_ndim),
                        mt_ext_int_tuple(l->shape, l->ndim), PyTuple_GET_ITEM(like, 3),
                        mt_ext_int_tuple(stride, l->ndim)};
  PyObject *spec = shaped && items[1] && items[2] && items[4] ? mt_ext_spec_new(d, items) : NULL;
  Py_XDECREF(items[1]);
  Py_XDECREF(items[2]);
  Py_XDECREF(items[4]);
  return mt_ext_new_dtensor(d, shaped, spec, 0, 0);
}

/* The strided layout `l` and plain expansion `e` of DTensor `b`, when its spec has
 * one; 1, 0 when not, -1 with an exception. */
static int plain_reading(mt_ext_dispatch *d, mt_ext_mesh_base *mb, const mt_ext_dtensor *b,
                         mt_layout *l, mt_layout *e) {
  PyObject *spec = b->spec;
  if (mt_ext_strided_layout(d, mb, PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(spec, 1), l) < 0)
    return -1;
  int group[MT_MAX_NDIM + 1];
  mt_error err = {0};
  return mt_strided_expand(l, e, group, &err) == MT_OK;
}

/* Whether `o` is a DTensor of `ref`'s mesh, shape and placements (1), or of its
 * mesh and shape, replicated (3); else whether it is a Python or NumPy scalar or
 * a 0-d DTensor replicated on that mesh (2), which broadcasts over any layout. */
static int alike(const mt_ext_dispatch *d, PyObject *o, const mt_ext_dtensor *ref) {
  if (Py_TYPE(o) == d->dtensor) {
    PyObject *a = ((mt_ext_dtensor *)o)->spec, *b = ref->spec, *pl = PyTuple_GET_ITEM(a, 1);
    if (PyTuple_GET_ITEM(a, 0) != PyTuple_GET_ITEM(b, 0)) return 0;
    int scalar = PyTuple_GET_SIZE(PyTuple_GET_ITEM(a, 2)) == 0;
    for (int i = 2; i >= 1; --i) {
      int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(a, i), PyTuple_GET_ITEM(b, i), Py_EQ);
      if (eq < 0) return PyErr_Clear(), 0;
      if (eq == 0 && i == 2 && !scalar) return 0;
      if (eq == 0 && i == 1) {
        for (Py_ssize_t m = 0; m < PyTuple_GET_SIZE(pl); ++m)
          if (PyTuple_GET_ITEM(pl, m) != d->replicate) return 0;
        return scalar ? 2 : 3;
      }
    }
    return 1;
  }
  return PyFloat_CheckExact(o) || PyLong_CheckExact(o) || PyBool_Check(o) ||
                 PyComplex_CheckExact(o) || PyArray_IsScalar(o, Generic)
             ? 2
             : 0;
}

/* `view` (stolen), a DTensor read from `from` as another layout of its local
 * elements, recorded as restride records (register_grad's "view": its backward
 * reads the gradient back as `from`), when `from` wants a gradient. */
static PyObject *recorded(mt_ext_dispatch *d, PyObject *from, PyObject *view) {
  if (view == NULL || !d->modes->grad_enabled || !mt_ext_needs_grad(d, from)) return view;
  PyObject *bw = d->view_grad;
  PyObject *spec = ((mt_ext_dtensor *)view)->spec, *out = NULL;
  PyObject *aux = bw != NULL ? Py_BuildValue("{s(OO)sO}", "layout", PyTuple_GET_ITEM(spec, 2),
                                             PyTuple_GET_ITEM(spec, 1), "copy", Py_False)
                             : NULL;
  PyObject *saved = aux != NULL ? PyTuple_Pack(1, from) : NULL;
  if (saved != NULL)
    out = mt_ext_record(d, PyTuple_GET_ITEM(bw, 0), PyTuple_GET_ITEM(bw, 1), view, &from, 1,
                        saved, aux);
  else if (!PyErr_Occurred())
    PyErr_SetString(PyExc_RuntimeError, "no view backward: import mpitensor");
  if (saved == NULL) Py_DECREF(view);
  Py_XDECREF(aux);
  Py_XDECREF(saved);
  return out;
}

/* Each DTensor result of `res` (one, or a tuple) read back from the plain layout
 * `e` as `l` with the placements `pl`, or, where the plain rule moved it (a
 * Partial reduced), as torch's view of its layout in `l`'s shape; NULL without an
 * exception when it has none. `res` is stolen. */
static PyObject *read_back(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *res,
                           const mt_layout *e, const mt_layout *l, PyObject *pl) {
  int several = PyTuple_Check(res);
  Py_ssize_t n = several ? PyTuple_GET_SIZE(res) : 1;
  PyObject *eps = mt_ext_placement_objects(d, e->placements, e->mesh_ndim);
  PyObject *out = eps != NULL && several ? PyTuple_New(n) : NULL, *one = NULL;
  for (Py_ssize_t i = 0; eps != NULL && (out != NULL || !several) && i < n; ++i) {
    PyObject *r = several ? PyTuple_GET_ITEM(res, i) : res;
    const mt_ext_dtensor *t = (const mt_ext_dtensor *)r;
    int same = Py_TYPE(r) == d->dtensor &&
               PyObject_RichCompareBool(PyTuple_GET_ITEM(t->spec, 1), eps, Py_EQ) == 1;
    mt_layout moved, view;
    mt_error err = {0};
    int viewed = !same && Py_TYPE(r) == d->dtensor &&
                 mt_ext_strided_layout(d, mb, PyTuple_GET_ITEM(t->spec, 2),
                                       PyTuple_GET_ITEM(t->spec, 1), &moved) == 0 &&
                 mt_reshape_view(&moved, l->ndim, l->shape, &view, &err) == MT_OK;
    PyObject *back = NULL;
    if (same)
      back = recorded(d, r, mt_ext_as_layout(d, mb, t->spec, t->local, l, pl));
    else if (viewed)
      back = recorded(d, r, mt_ext_as_layout(d, mb, t->spec, t->local, &view, NULL));
    else
      PyErr_Clear();
    if (back == NULL) {
      Py_CLEAR(out);
      break;
    }
    if (several) PyTuple_SET_ITEM(out, i, back);
    else one = back;
  }
  Py_XDECREF(eps);
  Py_DECREF(res);
  return several ? out : one;
}

/* out=, a tuple of DTensors strided as `ref` that want no gradient (NumPy's
 * ufuncs pass it so), as views of their local arrays in the expansion; NULL
 * without an exception when it is no such one. */
static PyObject *out_views(mt_ext_dispatch *d, mt_ext_strided_reading *r, PyObject *out,
                           const mt_ext_dtensor *ref) {
  Py_ssize_t k = PyTuple_Check(out) ? PyTuple_GET_SIZE(out) : 0;
  PyObject *views = k > 0 ? PyTuple_New(k) : NULL;
  for (Py_ssize_t i = 0; views != NULL && i < k; ++i) {
    const mt_ext_dtensor *t = (const mt_ext_dtensor *)PyTuple_GET_ITEM(out, i);
    PyObject *v = alike(d, (PyObject *)t, ref) == 1 && !mt_ext_needs_grad(d, (PyObject *)t)
                      ? mt_ext_as_layout(d, r->mb, t->spec, t->local, &r->e, NULL)
                      : NULL;
    if (v == NULL) Py_CLEAR(views);
    else PyTuple_SET_ITEM(views, i, v);
  }
  return views;
}

int mt_ext_strided_views(mt_ext_dispatch *d, PyObject *const *ops, Py_ssize_t n,
                         PyObject *kwnames, mt_ext_strided_reading *r) {
  const mt_ext_dtensor *ref = NULL;
  for (Py_ssize_t i = 0; i < n && ref == NULL; ++i)
    if (mt_ext_strided(d, ops[i])) ref = (const mt_ext_dtensor *)ops[i];
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  Py_ssize_t room = (Py_ssize_t)(sizeof r->views / sizeof r->views[0]);
  r->nviews = 0;
  if (ref == NULL || n > MT_MEMO_MAX_OPERANDS || n + nkw > room) return 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    int kind = alike(d, ops[i], ref);
    if (kind == 0) return 0;
  }
  r->mb = mt_ext_spec_mesh(d, ref->spec), r->placements = PyTuple_GET_ITEM(ref->spec, 1);
  int ok = r->mb != NULL ? plain_reading(d, r->mb, ref, &r->l, &r->e) : 0;
  if (ok <= 0) return ok < 0 ? -1 : (PyErr_Clear(), 0);
  mt_layout rep = r->e; /* a replicated operand's reading: the expansion's shape */
  for (int m = 0; m < rep.mesh_ndim; ++m)
    rep.placements[m] = (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0};
  r->out = NULL;
  for (; r->nviews < n + nkw; ++r->nviews) {
    PyObject *o = ops[r->nviews], **v = &r->views[r->nviews];
    const mt_ext_dtensor *t = (const mt_ext_dtensor *)o;
    int kind = r->nviews < n ? alike(d, o, ref) : 0;
    if (r->nviews >= n && PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, r->nviews - n), d->str[MT_S_OUT]) == 0)
      *v = out_views(d, r, r->out = o, ref);
    else
      *v = kind == 1 || kind == 3
               ? recorded(d, o, mt_ext_as_layout(d, r->mb, t->spec, t->local,
                                                 kind == 1 ? &r->e : &rep, NULL))
               : Py_NewRef(o);
    if (*v == NULL) return mt_ext_strided_back(d, r, NULL), PyErr_Occurred() ? -1 : 0;
  }
  return 1;
}

PyObject *mt_ext_strided_back(mt_ext_dispatch *d, mt_ext_strided_reading *r, PyObject *res) {
  for (Py_ssize_t i = 0; i < r->nviews; ++i) Py_DECREF(r->views[i]);
  r->nviews = 0;
  /* Written through views of their local arrays: the outputs are the results. */
  if (res != NULL && r->out != NULL) {
    Py_DECREF(res);
    return Py_NewRef(PyTuple_GET_SIZE(r->out) == 1 ? PyTuple_GET_ITEM(r->out, 0) : r->out);
  }
  /* NULL without an exception: a result has no view in `l`'s shape, and the call
   * runs again on plain layouts (the Python door). */
  return res != NULL ? read_back(d, r->mb, res, &r->e, &r->l, r->placements) : NULL;
}

PyObject *mt_ext_strided_whole(mt_ext_dispatch *d, PyObject *self) {
  const mt_ext_dtensor *b = (const mt_ext_dtensor *)self;
  mt_ext_mesh_base *mb = mt_ext_spec_mesh(d, b->spec);
  if (mb == NULL) return NULL;
  mt_layout l, e;
  int ok = plain_reading(d, mb, b, &l, &e);
  if (ok <= 0) return ok < 0 ? NULL : (PyErr_Clear(), NULL);
  return recorded(d, self, mt_ext_as_layout(d, mb, b->spec, b->local, &e, NULL));
}
