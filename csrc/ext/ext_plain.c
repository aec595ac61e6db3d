/* A call with a strided operand that no strided reading takes (ext_strided.c):
 * numpy.sum(x) and the other reductions over every element run on x's expansion;
 * any other call gets its strided operands moved to plain layouts first (the
 * core's mt_strided_plain: the strided mesh dims replicated, as torch passes
 * through Replicate), and what it wrote into a plain copy is written back into
 * the strided original. */
#include "ext.h"

#include "mpitensor/core/strided.h"

/* `o`, or each item of a list or tuple `o`, with a strided DTensor moved to its
 * plain layout, each once. A new reference, or NULL. */
static PyObject *plain_copy(mt_ext_dispatch *d, PyObject *o, mt_ext_plain_call *c) {
  if (PyTuple_CheckExact(o) || PyList_CheckExact(o)) {
    Py_ssize_t k = PySequence_Fast_GET_SIZE(o);
    PyObject *out = PyList_New(k);
    for (Py_ssize_t i = 0; out != NULL && i < k; ++i) {
      PyObject *item = plain_copy(d, PySequence_Fast_ITEMS(o)[i], c);
      if (item == NULL) Py_CLEAR(out);
      else PyList_SET_ITEM(out, i, item);
    }
    if (out != NULL && PyTuple_CheckExact(o)) Py_SETREF(out, PyList_AsTuple(out));
    return out;
  }
  if (!mt_ext_strided(d, o)) return Py_NewRef(o);
  for (int i = 0; i < c->n; ++i)
    if (c->from[i] == o) return Py_NewRef(c->to[i]);
  PyObject *spec = ((mt_ext_dtensor *)o)->spec, *pl = NULL, *p = NULL;
  mt_layout l;
  mt_error err = {0};
  if (c->n == (int)(sizeof c->from / sizeof c->from[0]))
    return PyErr_Format(PyExc_ValueError, "a call with more than %d strided operands", c->n);
  if (mt_ext_strided_layout(d, mt_ext_spec_mesh(d, spec), PyTuple_GET_ITEM(spec, 2),
                            PyTuple_GET_ITEM(spec, 1), &l) < 0)
    return NULL;
  if (mt_ext_ok(mt_strided_plain(l.placements, l.mesh_ndim, 0, l.placements, &err), &err) < 0)
    return NULL;
  if ((pl = mt_ext_placement_objects(d, l.placements, l.mesh_ndim)) != NULL)
    p = mt_ext_move(d, o, Py_None, pl, 0, Py_None, Py_None, d->str[MT_S_REDISTRIBUTE]);
  Py_XDECREF(pl);
  if (p != NULL) c->from[c->n] = o, c->to[c->n++] = Py_NewRef(p);
  return p;
}

/* Whether numpy.sum(x) (or another reduction over every element of one strided
 * x, with dtype= at most) is the call: its expansion gives it as it is. */
static int whole(mt_ext_dispatch *d, PyObject *func, PyObject *args, PyObject *kwargs) {
  const mt_ext_sig *sig = mt_ext_sig_of(d, func);
  Py_ssize_t n = PyTuple_GET_SIZE(args), pos = 0;
  PyObject *key, *v;
  if (sig == NULL || sig->op.family != MT_OP_REDUCTION || n < 1 || n > 2 ||
      (n == 2 && PyTuple_GET_ITEM(args, 1) != Py_None) ||
      !mt_ext_strided(d, PyTuple_GET_ITEM(args, 0)))
    return 0;
  while (kwargs != NULL && PyDict_Next(kwargs, &pos, &key, &v))
    if (v != Py_None && v != Py_False && PyUnicode_CompareWithASCIIString(key, "dtype") != 0)
      return 0;
  return 1;
}

int mt_ext_plain_args(mt_ext_dispatch *d, PyObject *func, PyObject *args, PyObject *kwargs,
                      mt_ext_plain_call *c) {
  c->n = 0, c->args = NULL, c->kwargs = kwargs != NULL ? PyDict_New() : NULL;
  if (kwargs != NULL && c->kwargs == NULL) return -1;
  PyObject *key, *v, *view = NULL;
  if (whole(d, func, args, kwargs) &&
      (view = mt_ext_strided_whole(d, PyTuple_GET_ITEM(args, 0))) != NULL) {
    c->args = PyTuple_Pack(1, view);
    Py_DECREF(view);
    if (kwargs != NULL && PyDict_Update(c->kwargs, kwargs) < 0) Py_CLEAR(c->args);
    return c->args != NULL ? 0 : (mt_ext_plain_back(d, NULL, NULL, c, NULL), -1);
  }
  int ok = !PyErr_Occurred() && (c->args = plain_copy(d, args, c)) != NULL;
  for (Py_ssize_t pos = 0; ok && kwargs != NULL && PyDict_Next(kwargs, &pos, &key, &v);) {
    PyObject *p = plain_copy(d, v, c);
    ok = p != NULL && PyDict_SetItem(c->kwargs, key, p) == 0;
    Py_XDECREF(p);
  }
  return ok ? 0 : (mt_ext_plain_back(d, NULL, NULL, c, NULL), -1);
}

/* Whether the call writes into `o`, one of its arguments: as out= (`out`, the
 * plain call's), or as the first argument of ufunc.at or of a function autograd
 * registers as a writer (its backward None); `p` is `o`'s plain copy. */
static int written(mt_ext_dispatch *d, PyObject *func, PyObject *args, PyObject *out,
                   const PyObject *o, const PyObject *p) {
  for (Py_ssize_t i = 0; out != NULL && PyTuple_Check(out) && i < PyTuple_GET_SIZE(out); ++i)
    if (PyTuple_GET_ITEM(out, i) == p) return 1;
  PyObject *bw = PyDict_GetItem(d->backwards, func), *method;
  Py_ssize_t first = func == d->ufunc_type ? 2 : 0, n = PyTuple_GET_SIZE(args);
  int writer = first ? n > 2 && PyUnicode_Check(method = PyTuple_GET_ITEM(args, 1)) &&
                           PyUnicode_CompareWithASCIIString(method, "at") == 0
                     : bw != NULL && PyTuple_GET_ITEM(bw, 1) == Py_None;
  return out == p || (writer && n > first && PyTuple_GET_ITEM(args, first) == o);
}

/* What the call wrote into `plain` copied into `orig`, its strided original; `res`
 * (stolen) with `plain` in it (itself, or an item of a tuple) given as `orig`. */
static PyObject *write_back(mt_ext_dispatch *d, PyObject *orig, PyObject *plain,
                            PyObject *res) {
  mt_ext_dtensor *o = (mt_ext_dtensor *)orig;
  PyObject *back = mt_ext_move(d, plain, Py_None, PyTuple_GET_ITEM(o->spec, 1), 0, Py_None,
                               Py_None, d->str[MT_S_REDISTRIBUTE]);
  if (back == NULL || PyArray_CopyInto((PyArrayObject *)o->local,
                                       (PyArrayObject *)((mt_ext_dtensor *)back)->local) < 0)
    Py_CLEAR(res);
  Py_XDECREF(back);
  if (res == plain) Py_SETREF(res, Py_NewRef(orig));
  if (res == NULL || !PyTuple_CheckExact(res)) return res;
  PyObject *items = PySequence_List(res);
  for (Py_ssize_t i = 0; items != NULL && i < PyList_GET_SIZE(items); ++i)
    if (PyList_GET_ITEM(items, i) == plain) PyList_SetItem(items, i, Py_NewRef(orig));
  Py_SETREF(res, items != NULL ? PyList_AsTuple(items) : NULL);
  Py_XDECREF(items);
  return res;
}

PyObject *mt_ext_plain_back(mt_ext_dispatch *d, PyObject *func, PyObject *args,
                            mt_ext_plain_call *c, PyObject *res) {
  PyObject *out = c->kwargs != NULL ? PyDict_GetItem(c->kwargs, d->str[MT_S_OUT]) : NULL;
  for (int i = 0; i < c->n; ++i) {
    if (res != NULL && written(d, func, args, out, c->from[i], c->to[i]))
      res = write_back(d, c->from[i], c->to[i], res);
    Py_DECREF(c->to[i]);
  }
  c->n = 0;
  Py_CLEAR(c->args);
  Py_CLEAR(c->kwargs);
  return res;
}
