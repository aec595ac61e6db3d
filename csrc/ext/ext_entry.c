/* The executor's doors: a ufunc call (operators, __array_ufunc__), a reduction
 * method, and a registered NumPy function (__array_function__, DTensor methods
 * through mpitensor._registry.call). Each normalises its arguments into one
 * executor call; what only Python can normalise (out=, other keywords, a user's
 * register_sharding rule, an operation without a dim map) is the Python entry of
 * the function, called through the hook table, which runs its steps through the
 * executor again. A registered function's call is recorded here, once, with the
 * backward registered for it. */
#include "ext.h"

#include <string.h>

/* The common operand: exactly a DTensor with an ndarray and a layout id, on the
 * call's mesh. Adds it as operand i: 1, or 0 for mt_ext_gather to judge. */
static inline int known_tensor(const mt_ext_dispatch *d, PyObject *o, int i,
                               mt_ext_call *c) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)o;
  if (Py_TYPE(o) != d->dtensor || b->layout_id == 0 || !PyArray_CheckExact(b->local))
    return 0;
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)PyTuple_GET_ITEM(b->spec, 0);
  if (mb != c->mb && c->mb != NULL) return 0;
  c->mb = mb;
  mt_ext_call_add(d, c, i, b, b->layout_id);
  return 1;
}

/* mt_ext_gather of operands that are all known DTensors, inline: the call of a
 * cached operation. */
static inline int gather_fast(mt_ext_dispatch *d, PyObject *const *ops, int n,
                              mt_ext_call *c, PyObject *key, int defer_mixed) {
  mt_ext_call_init(c, n);
  for (int i = 0; i < n; ++i)
    if (!known_tensor(d, ops[i], i, c)) return mt_ext_gather(d, ops, n, c, key, defer_mixed);
  return mt_ext_wanting(d) ? mt_ext_call_want(d, c) : 1;
}

/* fn(args, kwargs) as hook `kind`, kwargs a dict (empty for NULL). */
static PyObject *args_kwargs_hook(mt_ext_dispatch *d, int kind, PyObject *fn, PyObject *args,
                                  PyObject *kwargs) {
  PyObject *kw = kwargs != NULL ? Py_NewRef(kwargs) : PyDict_New();
  PyObject *stack[2] = {args, kw};
  PyObject *r = kw ? mt_ext_hook(d, kind, fn, stack, 2, NULL) : NULL;
  Py_XDECREF(kw);
  return r;
}

/* The registry entry of `func` (a user's rule first, as rule(args, kwargs)). */
static PyObject *call_entry(mt_ext_dispatch *d, PyObject *func, PyObject *args,
                            PyObject *kwargs) {
  PyObject *rule = PyDict_GET_SIZE(d->rules) ? PyDict_GetItemWithError(d->rules, func) : NULL;
  if (rule != NULL) return args_kwargs_hook(d, MT_HOOK_ENTRY, rule, args, kwargs);
  if (PyErr_Occurred()) return NULL;
  PyObject *entry = PyDict_GetItemWithError(d->functions, func);
  if (entry == NULL)
    return PyErr_Occurred() ? NULL : mt_ext_error(d, "no_rule", func, NULL);
  return mt_ext_hook_call(d, MT_HOOK_ENTRY, entry, args, kwargs);
}

/* Whether `a`, or an item of it when it is a list or tuple, is a DTensor that
 * needs a gradient. */
static int item_needs_grad(mt_ext_dispatch *d, PyObject *a) {
  if (mt_ext_needs_grad(d, a)) return 1;
  if (PyTuple_CheckExact(a) || PyList_CheckExact(a))
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(a); ++k)
      if (mt_ext_needs_grad(d, PySequence_Fast_ITEMS(a)[k])) return 1;
  return 0;
}

/* The first keyword but out= (a write, refused as such) whose argument needs a
 * gradient (borrowed), or NULL. */
static PyObject *grad_keyword(mt_ext_dispatch *d, PyObject *kwargs) {
  Py_ssize_t pos = 0;
  PyObject *key, *a;
  while (kwargs != NULL && PyDict_Next(kwargs, &pos, &key, &a))
    if (item_needs_grad(d, a) && PyUnicode_Compare(key, d->str[MT_S_OUT]) != 0) return key;
  return NULL;
}

/* Whether an argument, or an item of a list or tuple argument, needs a gradient. */
static int args_need_grad(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i)
    if (item_needs_grad(d, PyTuple_GET_ITEM(args, i))) return 1;
  return grad_keyword(d, kwargs) != NULL;
}

/* The positional arguments with lists and tuples among them flattened once: the
 * inputs of a registered function's node, in the order its backward returns. */
static PyObject *flat_args(PyObject *args) {
  PyObject *flat = PyList_New(0);
  for (Py_ssize_t i = 0; flat != NULL && i < PyTuple_GET_SIZE(args); ++i) {
    PyObject *a = PyTuple_GET_ITEM(args, i);
    int rc = PyTuple_CheckExact(a) || PyList_CheckExact(a)
                 ? PyList_SetSlice(flat, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, a)
                 : PyList_Append(flat, a);
    if (rc < 0) Py_CLEAR(flat);
  }
  return flat;
}

/* Several outputs (a list or tuple, as np.split gives): each floating-point
 * DTensor among them gets a node of its own, whose aux is (kwargs, its index),
 * so the backward knows which output's gradient it gets. 0, or -1. */
static int record_each(mt_ext_dispatch *d, PyObject *name, PyObject *backward,
                       PyObject *res, PyObject *flat, PyObject *args, PyObject *kwargs) {
  Py_ssize_t n = PySequence_Fast_GET_SIZE(res);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *item = PySequence_Fast_ITEMS(res)[i];
    if (Py_TYPE(item) != d->dtensor) continue;
    if (!mt_ext_inexact(PyArray_DESCR((PyArrayObject *)((mt_ext_dtensor *)item)->local)))
      continue;
    PyObject *aux = Py_BuildValue("(On)", kwargs ? kwargs : Py_None, i);
    PyObject *r = aux ? mt_ext_record(d, name, backward, Py_NewRef(item),
                                      PySequence_Fast_ITEMS(flat),
                                      PyList_GET_SIZE(flat), args, aux)
                      : NULL;
    Py_XDECREF(aux);
    if (r == NULL) return -1;
    Py_DECREF(r);
  }
  return 0;
}

/* The registered function `func` with grad mode on and an input that needs a
 * gradient: its entry with grad mode off, then one node with its backward (one
 * per output when it gives several). */
static PyObject *recorded_call(mt_ext_dispatch *d, PyObject *func, PyObject *args,
                               PyObject *kwargs) {
  PyObject *bw = PyDict_GetItemWithError(d->backwards, func);
  if (bw == NULL && PyErr_Occurred()) return NULL;
  PyObject *name = bw != NULL ? PyTuple_GET_ITEM(bw, 0) : NULL;
  PyObject *backward = bw != NULL ? PyTuple_GET_ITEM(bw, 1) : Py_None;
  /* True: the entry is composed of operations that record themselves, so it runs
   * with grad mode on and needs no node of its own. */
  if (backward == Py_True) return call_entry(d, func, args, kwargs);
  /* A node's inputs are the positional arguments (flat_args): a keyword one would
   * get no gradient. */
  PyObject *kw = grad_keyword(d, kwargs);
  if (kw != NULL) return mt_ext_error(d, "keyword_grad", func, kw);
  /* An optional third entry says whether this call has a rule (a diagonal einsum
   * or an advanced index do not). */
  if (bw != NULL && backward != Py_None && PyTuple_GET_SIZE(bw) > 2) {
    PyObject *ok = args_kwargs_hook(d, MT_HOOK_BACKWARD, PyTuple_GET_ITEM(bw, 2), args,
                                    kwargs);
    int yes = ok == NULL ? -1 : PyObject_IsTrue(ok);
    Py_XDECREF(ok);
    if (yes < 0) return NULL;
    if (!yes) backward = Py_None, bw = NULL;
  }
  PyObject *out_kw = kwargs != NULL ? PyDict_GetItemWithError(kwargs, d->str[MT_S_OUT]) : NULL;
  if (bw != NULL && backward == Py_None)  /* a function that writes in place */
    return mt_ext_error(d, "in_place_grad", name, NULL);
  if (out_kw != NULL && out_kw != Py_None) return mt_ext_error(d, "out_grad", func, NULL);
  bool priced = d->modes->grad_priced;
  d->modes->grad_enabled = 0, d->modes->grad_priced = 1;
  PyObject *res = call_entry(d, func, args, kwargs);
  d->modes->grad_enabled = 1, d->modes->grad_priced = priced;
  if (res == NULL) return NULL;
  /* None from a function with no backward: it can only have written into an
   * argument, unrecorded. A writer missing from autograd's table of writes is
   * refused here, after the fact, rather than losing the gradient silently. */
  if (res == Py_None && bw == NULL) {
    Py_DECREF(res);
    return mt_ext_error(d, "in_place_grad", func, NULL);
  }
  int several = (PyTuple_Check(res) || PyList_Check(res)) && PySequence_Fast_GET_SIZE(res);
  PyObject *first = several ? PySequence_Fast_ITEMS(res)[0] : res;
  if (Py_TYPE(first) != d->dtensor ||
      !mt_ext_inexact(PyArray_DESCR((PyArrayObject *)((mt_ext_dtensor *)first)->local)))
    return res;
  if (backward == Py_None) {
    Py_DECREF(res);
    return mt_ext_error(d, "no_backward",
                        func == d->ufunc_type && PyTuple_GET_SIZE(args) > 0
                            ? PyTuple_GET_ITEM(args, 0) : func, NULL);
  }
  PyObject *flat = flat_args(args);
  if (flat == NULL) {
    Py_DECREF(res);
    return NULL;
  }
  PyObject *out = res;
  if (several) {
    if (record_each(d, name, backward, res, flat, args, kwargs) < 0) Py_CLEAR(out);
  } else {
    out = mt_ext_record(d, name, backward, res, PySequence_Fast_ITEMS(flat),
                        PyList_GET_SIZE(flat), args, kwargs ? kwargs : Py_None);
  }
  Py_DECREF(flat);
  return out;
}

/* Whether the entry of `func` reads strided operands itself (its takes_strided). */
static int takes_strided(mt_ext_dispatch *d, PyObject *func) {
  PyObject *entry = PyDict_GetItemWithError(d->functions, func);
  return entry != NULL && PyObject_HasAttrString(entry, "takes_strided");
}

/* A registered function's call: its entry, recorded with its backward. */
static PyObject *registered_call(mt_ext_dispatch *d, PyObject *func, PyObject *args,
                                 PyObject *kwargs) {
  if (kwargs != NULL && PyDict_GET_SIZE(kwargs) == 0) kwargs = NULL;
  if (mt_ext_args_strided(d, args, kwargs) && !takes_strided(d, func)) {
    mt_ext_plain_call c;
    if (mt_ext_plain_args(d, func, args, kwargs, &c) < 0) return NULL;
    return mt_ext_plain_back(d, func, args, &c, registered_call(d, func, c.args, c.kwargs));
  }
  if (d->modes->grad_enabled && args_need_grad(d, args, kwargs))
    return recorded_call(d, func, args, kwargs);
  return call_entry(d, func, args, kwargs);
}

/* Whether a ufunc call's keywords are those it takes straight to NumPy (1), or
 * those and out= (2): the others (where=, ...) and out= are its Python entry's to
 * handle or refuse, but for operands strided alike. */
static int plain_keywords(const mt_ext_dispatch *d, PyObject *kwnames) {
  Py_ssize_t n = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  int out = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const char *k = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, i));
    out |= k != NULL && strcmp(k, "out") == 0;
    if (k == NULL || (strcmp(k, "dtype") != 0 && strcmp(k, "casting") != 0 &&
                      strcmp(k, "out") != 0)) {
      PyErr_Clear();
      return 0;
    }
  }
  return 1 + out;
}

/* func(*prefix, *args, **kwargs) as a registered function's call, from a vectorcall
 * whose last keyword arguments kwnames names. */
static PyObject *function_call(mt_ext_dispatch *d, PyObject *func, PyObject *const *prefix,
                               Py_ssize_t npre, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject *pos = PyTuple_New(npre + nargs), *kw = nkw ? PyDict_New() : NULL, *res = NULL;
  if (pos != NULL && (nkw == 0 || kw != NULL)) {
    for (Py_ssize_t i = 0; i < npre; ++i) PyTuple_SET_ITEM(pos, i, Py_NewRef(prefix[i]));
    for (Py_ssize_t i = 0; i < nargs; ++i)
      PyTuple_SET_ITEM(pos, npre + i, Py_NewRef(args[i]));
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < nkw; ++i)
      rc = PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]);
    if (rc == 0) res = registered_call(d, func, pos, kw);
  }
  Py_XDECREF(pos);
  Py_XDECREF(kw);
  return res;
}

/* ufunc.method through its Python entry (the registry's np.ufunc). */
static PyObject *ufunc_entry(mt_ext_dispatch *d, PyObject *ufunc, PyObject *method,
                             PyObject *const *ops, Py_ssize_t n, PyObject *kwnames) {
  PyObject *prefix[2] = {ufunc, method};
  return function_call(d, d->ufunc_type, prefix, 2, ops, n, kwnames);
}

/* The registered signature of `ufunc` (NULL: none), the last one's remembered. */
static inline mt_ext_sig *ufunc_sig(mt_ext_dispatch *d, PyObject *ufunc) {
  if (ufunc != d->last_ufunc) {
    mt_ext_sig *sig = mt_ext_sig_of(d, ufunc);
    d->last_ufunc = ufunc, d->last_sig = sig != NULL ? (int)(sig - d->sigs) : -1;
  }
  return d->last_sig >= 0 ? &d->sigs[d->last_sig] : NULL;
}

/* A ufunc call with a strided operand: the executor's plain reading when it has
 * one, else the Python entry (whose call moves the operands to plain layouts,
 * ext_plain.c). Out of line, off the cached call's path. */
static MT_EXT_COLD PyObject *strided_ufunc(mt_ext_dispatch *d, PyObject *ufunc,
                                           PyObject *const *ops, Py_ssize_t n,
                                           PyObject *kwnames) {
  mt_ext_strided_reading r;
  int ok = mt_ext_strided_views(d, ops, n, kwnames, &r);
  PyObject *out = ok > 0 ? mt_ext_strided_back(d, &r, mt_ext_ufunc(d, ufunc, r.views, n, kwnames))
                         : NULL;
  return out != NULL || PyErr_Occurred() ? out
                                         : ufunc_entry(d, ufunc, d->str[MT_S_CALL], ops, n, kwnames);
}

PyObject *mt_ext_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops,
                       Py_ssize_t n, PyObject *kwnames) {
  mt_ext_sig *sig = ufunc_sig(d, ufunc);
  int kw = plain_keywords(d, kwnames), strided = 0, rc = 0;
  mt_ext_call c;
  c.mixed = 0;
  if (sig == NULL || sig->op.family == MT_OP_REDUCTION || sig->nin != n ||
      n > MT_MEMO_MAX_OPERANDS || kw == 0 ||
      (PyDict_GET_SIZE(d->rules) != 0 && PyDict_Contains(d->rules, ufunc)))
    return ufunc_entry(d, ufunc, d->str[MT_S_CALL], ops, n, kwnames);
  if (kw == 2) /* out=: only operands strided alike run here, on views */
    for (Py_ssize_t i = 0; i < n; ++i) strided |= mt_ext_strided(d, ops[i]);
  /* A plain ndarray beside DTensors goes to the Python entry, which agrees that
   * every rank holds the same one before it takes it as replicated. */
  else if ((rc = gather_fast(d, ops, (int)n, &c, ufunc, 1)) == 0)
    strided = c.strided;
  /* Only an elementwise call reads its operands' expansions as they are. */
  if (strided && sig->op.family == MT_OP_ELEMENTWISE)
    return strided_ufunc(d, ufunc, ops, n, kwnames);
  if (kw == 2 || strided || (rc == 0 && c.mixed))
    return ufunc_entry(d, ufunc, d->str[MT_S_CALL], ops, n, kwnames);
  if (rc <= 0) return rc < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  c.key.op = sig->id;
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  mt_ext_op op = {sig, ufunc, NULL, 0, 0, ufunc, ops + n, nkw, kwnames, 0, NULL};
  PyObject *out = mt_ext_execute(d, &op, &c, ops);
  mt_ext_call_release(&c);
  return out;
}

PyObject *mt_ext_array_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *method,
                             PyObject *const *ops, Py_ssize_t n, PyObject *kwnames) {
  if (method == d->str[MT_S_CALL] || PyUnicode_Compare(method, d->str[MT_S_CALL]) == 0)
    return mt_ext_ufunc(d, ufunc, ops, n, kwnames);
  return ufunc_entry(d, ufunc, method, ops, n, kwnames);
}

/* (axis, keepdims) of a reduction method's arguments when they are all it has:
 * axis None, an int or (not for argmax) a tuple of ints, keepdims a bool. */
static int reduction_args(const mt_ext_dispatch *d, const mt_ext_sig *sig,
                          PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                          PyObject **axis, PyObject **keepdims) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs > 1) return -1;
  *axis = nargs == 1 ? args[0] : Py_None, *keepdims = Py_False;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject *k = PyTuple_GET_ITEM(kwnames, i);
    if (nargs == 0 && PyUnicode_Compare(k, d->str[MT_S_AXIS]) == 0) *axis = args[i];
    else if (PyUnicode_Compare(k, d->str[MT_S_KEEPDIMS]) == 0) *keepdims = args[nargs + i];
    else return -1;
  }
  if (*keepdims != Py_True && *keepdims != Py_False) return -1;
  if (*axis == Py_None || PyLong_CheckExact(*axis)) return 0;
  return !sig->int_axis && PyTuple_CheckExact(*axis) ? 0 : -1;
}

/* The method as NumPy's function: func(self, *args, **kwargs), by its entry. */
static PyObject *reduction_entry(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *self,
                                 PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
  return function_call(d, sig->func, &self, 1, args, nargs, kwnames);
}

/* A reduction method over every element of a strided DTensor: on its plain
 * expansion when it has one, else the Python entry. Out of line, as strided_ufunc. */
static MT_EXT_COLD PyObject *strided_whole(mt_ext_dispatch *d, int method,
                                           const mt_ext_sig *sig, PyObject *self,
                                           PyObject *const *args, Py_ssize_t nargs,
                                           PyObject *kwnames) {
  PyObject *view = mt_ext_strided_whole(d, self), *out = NULL;
  if (view != NULL) out = mt_ext_reduction(d, method, view, args, nargs, kwnames);
  Py_XDECREF(view);
  if (out != NULL || PyErr_Occurred()) return out;
  return reduction_entry(d, sig, self, args, nargs, kwnames);
}

PyObject *mt_ext_reduction(mt_ext_dispatch *d, int method, PyObject *self,
                           PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  if (d->reduction_sig[method] < 0)
    return PyErr_Format(PyExc_TypeError, "DTensor.%U has no sharding rule in mpitensor",
                        d->reduction_name[method]);
  mt_ext_sig *sig = &d->sigs[d->reduction_sig[method]];
  PyObject *axis, *keepdims;
  mt_ext_call c;
  if (reduction_args(d, sig, args, nargs, kwnames, &axis, &keepdims) < 0)
    return reduction_entry(d, sig, self, args, nargs, kwnames);
  int rc = gather_fast(d, &self, 1, &c, sig->func, 0);
  if (rc == 0 && c.strided && axis == Py_None && keepdims == Py_False)
    return strided_whole(d, method, sig, self, args, nargs, kwnames);
  if (rc <= 0) return rc < 0 ? NULL : reduction_entry(d, sig, self, args, nargs, kwnames);
  int keep = keepdims == Py_True, hit;
  int ndim = (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(c.dt[0]->spec, 2));
  mt_ext_op op = {sig, sig->func, NULL, 0, keep, sig->method, NULL, 0, NULL, 0, NULL};
  c.key.op = sig->id;
  c.key.aux = mt_ext_reduction_aux(axis, ndim, keep, &op.axes);
  const mt_decision *dec = c.key.aux < 0 ? NULL : mt_ext_decide(d, &op, &c, &hit);
  /* A reduction without a reduce op (var, argmax, ...) whose input must move, and
   * max or min whose reduced axis leaves a shard empty (their Partial would have
   * nothing to hold), merge per-rank results in their Python entry instead. */
  int op_code = sig->op.rule.reduce_op;
  int merged = dec != NULL && dec->plan[0] != NULL &&
               (op_code < 0 || op_code == MT_REDUCE_MAX || op_code == MT_REDUCE_MIN);
  PyObject *out = NULL;
  if (c.key.aux < 0 || merged) {
    mt_ext_call_release(&c);
    return reduction_entry(d, sig, self, args, nargs, kwnames);
  }
  if (dec != NULL && (op.aux = PyTuple_Pack(2, axis, keepdims)) != NULL) {
    PyObject *extra[2] = {axis, keepdims};
    op.extra = extra, op.nextra = 1 + keep, op.kwnames = keep ? d->kw_keepdims : NULL;
    out = mt_ext_run(d, &op, &c, dec, hit, &self);
  }
  Py_XDECREF(op.aux);
  mt_ext_call_release(&c);
  return out;
}

/* call(func, args, kwargs): see the method table. */
static PyObject *call(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[1]) || (args[2] != Py_None && !PyDict_Check(args[2])))
    return PyErr_Format(PyExc_TypeError, "call(func, args: tuple, kwargs: dict|None)");
  return registered_call(mt_ext_dispatch_module(module), args[0], args[1],
                         args[2] == Py_None ? NULL : args[2]);
}

PyMethodDef mt_ext_entry_methods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL,
     "call(func, args, kwargs) -> the registered NumPy function `func` on DTensors: "
     "its entry (a user's register_sharding rule first), recorded for autograd with "
     "its backward when grad mode is on and an argument requires grad. Collective "
     "on the mesh when the operation moves data.\n\n"
     "Example: _C.call(numpy.reshape, (dt, (2, -1)), None)"},
    {NULL, NULL, 0, NULL},
};
