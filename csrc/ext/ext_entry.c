/* The executor's doors: a ufunc call (operators, in place too, __array_ufunc__)
 * and a reduction method. Each normalises its arguments into one executor call,
 * a ufunc's out= too when the result has the output's layout; what only Python
 * can normalise (other outputs, other keywords, a user's register_sharding rule,
 * an operand it cannot read) it hands, whole, to the Python door of every call
 * written in Python (mpitensor._registry.door, the hook "door"), which agrees on
 * it, unless the C door did, and runs its entry. Beside them, the Python door's
 * first C call (door_enter: the executor's attempt, through the reductions here
 * and the function families of ext_families.c, then the agreement), and what
 * the door asks of C about a call's arguments: whether one is strided or needs
 * a gradient, and a strided operand's expansion. */
#include "ext.h"

#include <string.h>

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

/* The (args, kwargs) of func(*prefix, *args, **kwargs) from a vectorcall whose
 * last keyword arguments kwnames names, into *pos and *kw (new references). 0, or
 * -1 with an exception and nothing made. */
static int call_args(PyObject *const *prefix, Py_ssize_t npre, PyObject *const *args,
                     Py_ssize_t nargs, PyObject *kwnames, PyObject **pos, PyObject **kw) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  *pos = PyTuple_New(npre + nargs), *kw = PyDict_New();
  int rc = *pos != NULL && *kw != NULL ? 0 : -1;
  for (Py_ssize_t i = 0; rc == 0 && i < npre; ++i)
    PyTuple_SET_ITEM(*pos, i, Py_NewRef(prefix[i]));
  for (Py_ssize_t i = 0; rc == 0 && i < nargs; ++i)
    PyTuple_SET_ITEM(*pos, npre + i, Py_NewRef(args[i]));
  for (Py_ssize_t i = 0; rc == 0 && i < nkw; ++i)
    rc = PyDict_SetItem(*kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]);
  if (rc < 0) {
    Py_CLEAR(*pos);
    Py_CLEAR(*kw);
  }
  return rc;
}

/* mt_ext_door_hook, `agreed` a truth value. */
static inline PyObject *door_hook(mt_ext_dispatch *d, PyObject *func, PyObject *pos,
                                  PyObject *kw, int agreed) {
  return mt_ext_door_hook(d, func, pos, kw, agreed ? Py_True : Py_False);
}

/* door_hook of func(*prefix, *args, **kwargs), from a vectorcall whose last
 * keyword arguments kwnames names. */
static PyObject *python_door(mt_ext_dispatch *d, PyObject *func, PyObject *const *prefix,
                             Py_ssize_t npre, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames, int agreed) {
  PyObject *pos, *kw;
  if (call_args(prefix, npre, args, nargs, kwnames, &pos, &kw) < 0) return NULL;
  PyObject *res = door_hook(d, func, pos, kw, agreed);
  Py_DECREF(pos);
  Py_DECREF(kw);
  return res;
}

/* ufunc.method through the Python door (as the registry's numpy.ufunc);
 * `agreed`: the call needs no agreement there. */
static PyObject *ufunc_entry(mt_ext_dispatch *d, PyObject *ufunc, PyObject *method,
                             PyObject *const *ops, Py_ssize_t n, PyObject *kwnames,
                             int agreed) {
  PyObject *prefix[2] = {ufunc, method};
  return python_door(d, d->ufunc_type, prefix, 2, ops, n, kwnames, agreed);
}

/* The registered signature of `ufunc` (NULL: none), the last one's remembered. */
static inline mt_ext_sig *ufunc_sig(mt_ext_dispatch *d, PyObject *ufunc) {
  if (ufunc != d->last_ufunc) {
    mt_ext_sig *sig = mt_ext_sig_of(d, ufunc);
    d->last_ufunc = ufunc, d->last_sig = sig != NULL ? (int)(sig - d->sigs) : -1;
  }
  return d->last_sig >= 0 ? &d->sigs[d->last_sig] : NULL;
}

static PyObject *ufunc_call(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops,
                            Py_ssize_t n, PyObject *kwnames, int agreed);

/* A ufunc call with a strided operand: the executor's plain reading when it has
 * one, else the Python door (which moves the operands to plain layouts). Out of
 * line, off the cached call's path. */
static MT_EXT_COLD PyObject *strided_ufunc(mt_ext_dispatch *d, PyObject *ufunc,
                                           PyObject *const *ops, Py_ssize_t n,
                                           PyObject *kwnames, int agreed) {
  mt_ext_strided_reading r;
  int ok = mt_ext_strided_views(d, ops, n, kwnames, &r);
  PyObject *out =
      ok > 0 ? mt_ext_strided_back(d, &r, ufunc_call(d, ufunc, r.views, n, kwnames, agreed))
             : NULL;
  return out != NULL || PyErr_Occurred()
             ? out
             : ufunc_entry(d, ufunc, d->str[MT_S_CALL], ops, n, kwnames, agreed);
}

/* The agreement of a call that a C door runs, or hands to the Python door
 * agreed, as `label`(*prefix[1:], *args, **kwargs), the call the Python door
 * would agree for func prefix[0] (so the two forms of a call, x.sum(axis=1) and
 * np.sum(x, axis=1), are one call): when a program made it (the frame that
 * called this door is not mpitensor's), wherever the agreement can communicate,
 * on `mb` of more than one rank outside the collective checks. 0, or -1 with the
 * agreed exception. */
static int agree(mt_ext_dispatch *d, const mt_ext_mesh_base *mb, PyObject *label,
                 PyObject *const *prefix, Py_ssize_t npre, PyObject *const *args,
                 Py_ssize_t nargs, PyObject *kwnames) {
  if (d->modes->checks || mb == NULL || !mb->member || mt_ext_mesh_size(mb) < 2) return 0;
  PyFrameObject *frame = PyEval_GetFrame();
  int program = frame == NULL ? 1 : mt_ext_by_program(d, (PyObject *)frame);
  if (program <= 0) return program;
  PyObject *pos, *kw;
  if (call_args(prefix + 1, npre - 1, args, nargs, kwnames, &pos, &kw) < 0) return -1;
  long flags = mt_ext_agree_call(d, label, pos, kw, 1, 0);
  Py_DECREF(pos);
  Py_DECREF(kw);
  return flags < 0 ? -1 : 0;
}

/* ufunc(*ops, out=o) run by the executor itself, when that is all the call is:
 * its operands are DTensors of o's mesh (one at least) and scalars, this rank
 * is a member of the mesh, o's local array is a writable ndarray of a memory
 * without copy-views, and the decided result has o's layout, so the ufunc
 * writes o's local array as the result's; while nothing records a gradient and
 * no tool listens. 1 with *res (NULL: the call's exception), or 0: the Python
 * entry's to judge (mpitensor._ops._elementwise), which takes the same decision
 * and writes the same local array when it fits. */
static int into_layout(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *ufunc,
                       PyObject *const *ops, Py_ssize_t n, PyObject *o, PyObject **res) {
  const mt_ext_modes *m = d->modes;
  mt_ext_dtensor *b = (mt_ext_dtensor *)o;
  if (m->backward || mt_ext_events(m) || mt_ext_wanting(d) || sig->nout != 1 ||
      sig->op.family != MT_OP_ELEMENTWISE || !PyArray_CheckExact(b->local) ||
      !PyArray_ISWRITEABLE((PyArrayObject *)b->local))
    return 0;
  int views = mt_ext_has_copy_views(m, b->local);
  if (views != 0) {
    if (views < 0) PyErr_Clear(); /* the Python door raises what it must */
    return 0;
  }
  mt_ext_call c;
  int rc = mt_ext_gather_fast(d, ops, (int)n, &c, ufunc, 1), done = 0;
  int64_t id;
  if (rc < 0) PyErr_Clear(); /* the Python door raises what it must */
  if (rc <= 0 || c.mixed || c.nmade != 0 || !c.mb->member ||
      mt_ext_spec_mesh(d, b->spec) != c.mb ||
      (mt_ext_grad_wanted(m) && (c.key.grad != 0 || b->requires_grad)))
    goto release;
  if (mt_ext_layout_id(d, c.mb, b, NULL, &id) < 0) {
    PyErr_Clear();
    goto release;
  }
  c.key.op = sig->id;
  mt_ext_op op = {sig, ufunc, NULL, 0, 0, ufunc, &b->local, 1, d->kw_out, 0, NULL, 0};
  int hit;
  const mt_decision *dec = mt_ext_decide(d, &op, &c, &hit);
  if (dec != NULL && dec->out_id != id) goto release;
  done = 1;
  *res = dec != NULL ? mt_ext_run(d, &op, &c, dec, hit, ops) : NULL;
  if (*res != NULL) Py_SETREF(*res, Py_NewRef(o));
release:
  if (rc > 0) mt_ext_call_release(&c);
  return done;
}

/* ufunc(*ops, out=(o,)), its only keyword: agreed as the Python door would agree
 * it (unless `agreed`), then the executor's (into_layout), else the Python
 * door's, agreed. */
static PyObject *ufunc_into(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *ufunc,
                            PyObject *const *ops, Py_ssize_t n, PyObject *kwnames,
                            PyObject *o, int agreed) {
  PyObject *prefix[3] = {d->ufunc_type, ufunc, d->str[MT_S_CALL]}, *res;
  if (!agreed && agree(d, mt_ext_spec_mesh(d, ((mt_ext_dtensor *)o)->spec), sig->label,
                       prefix, 3, ops, n, kwnames) < 0)
    return NULL;
  if (into_layout(d, sig, ufunc, ops, n, o, &res)) return res;
  return python_door(d, d->ufunc_type, prefix + 1, 2, ops, n, kwnames, 1);
}

/* The DTensor that out= names when it is the call's only keyword and names one
 * (NumPy hands out= as a tuple), else NULL. */
static PyObject *only_out(const mt_ext_dispatch *d, PyObject *const *ops, Py_ssize_t n,
                          PyObject *kwnames) {
  if (PyTuple_GET_SIZE(kwnames) != 1 || !PyTuple_CheckExact(ops[n]) ||
      PyTuple_GET_SIZE(ops[n]) != 1)
    return NULL;
  PyObject *o = PyTuple_GET_ITEM(ops[n], 0);
  return Py_TYPE(o) == d->dtensor ? o : NULL;
}

/* Whether power(x, e) of a DTensor x of a bool or integer dtype and a negative
 * integer scalar e must raise NumPy's ValueError: NumPy's integer loop raises it
 * only where it has elements, so that ranks whose blocks are empty would go on
 * while the others raise. Decided here from the global shape and the agreed
 * scalar instead, alike on every rank. (A Python int's negative to an unsigned
 * dtype is NumPy's OverflowError, raised on every rank as it converts it.) */
static int negative_int_power(const mt_ext_dispatch *d, PyObject *x, PyObject *e) {
  if (!mt_ext_is_dtensor(d, x)) return 0;
  PyObject *spec = ((mt_ext_dtensor *)x)->spec;
  PyArray_Descr *descr = (PyArray_Descr *)PyTuple_GET_ITEM(spec, 3);
  int unsigned_ = PyDataType_ISUNSIGNED(descr);
  if (!(PyDataType_ISBOOL(descr) || PyDataType_ISINTEGER(descr))) return 0;
  long long v;
  if (PyLong_CheckExact(e) && !unsigned_) {
    int overflow = 0;
    v = PyLong_AsLongLongAndOverflow(e, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (overflow < 0) v = -1;
  } else if (PyArray_IsScalar(e, SignedInteger)) {
    v = PyLong_AsLongLong(e);
    if (v == -1 && PyErr_Occurred()) return -1;
  } else {
    return 0;
  }
  if (v >= 0) return 0;
  PyObject *shape = PyTuple_GET_ITEM(spec, 2);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); ++i)
    if (PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i)) == 0) return 0;
  PyErr_SetString(PyExc_ValueError, "Integers to negative integer powers are not allowed.");
  return -1;
}

/* Whether the call writes into a bool out=: NumPy refuses to cast an integer
 * power's result into it, on every rank, before its loop could raise. */
static int into_bool(const mt_ext_dispatch *d, PyObject *const *ops, Py_ssize_t n,
                     PyObject *kwnames) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), d->str[MT_S_OUT]) != 0) continue;
    PyObject *o = ops[n + i];
    if (PyTuple_CheckExact(o) && PyTuple_GET_SIZE(o) == 1) o = PyTuple_GET_ITEM(o, 0);
    if (mt_ext_is_dtensor(d, o))
      return PyDataType_ISBOOL((PyArray_Descr *)PyTuple_GET_ITEM(((mt_ext_dtensor *)o)->spec, 3));
    return PyArray_Check(o) && PyArray_ISBOOL((PyArrayObject *)o);
  }
  return 0;
}

/* A ufunc call; `agreed`: it needs no agreement (an operator's). */
static PyObject *ufunc_call(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops,
                            Py_ssize_t n, PyObject *kwnames, int agreed) {
  if (n == 2 && ufunc == d->ufunc[MT_UF_power] && !into_bool(d, ops, n, kwnames) &&
      negative_int_power(d, ops[0], ops[1]) < 0)
    return NULL;
  mt_ext_sig *sig = ufunc_sig(d, ufunc);
  int kw = plain_keywords(d, kwnames), strided = 0, rc = 0;
  mt_ext_call c;
  c.mixed = 0;
  if (sig == NULL || sig->op.family == MT_OP_REDUCTION || sig->nin != n ||
      n > MT_MEMO_MAX_OPERANDS || kw == 0 || sig->user_rule ||
      (ufunc == d->isnan && kw == 1 && mt_ext_may_defer(d, ops[0])))
    return ufunc_entry(d, ufunc, d->str[MT_S_CALL], ops, n, kwnames, agreed);
  if (kw == 2) { /* out=: only operands strided alike run here, on views */
    for (Py_ssize_t i = 0; i < n; ++i) strided |= mt_ext_strided(d, ops[i]);
    PyObject *o = strided ? NULL : only_out(d, ops, n, kwnames);
    if (o != NULL) return ufunc_into(d, sig, ufunc, ops, n, kwnames, o, agreed);
  }
  /* A plain ndarray beside DTensors goes to the Python entry, which agrees that
   * every rank holds the same one before it takes it as replicated. */
  else if ((rc = mt_ext_gather_fast(d, ops, (int)n, &c, ufunc, 1)) == 0)
    strided = c.strided;
  /* Only an elementwise call reads its operands' expansions as they are. */
  if (strided && sig->op.family == MT_OP_ELEMENTWISE)
    return strided_ufunc(d, ufunc, ops, n, kwnames, agreed);
  if (kw == 2 || strided || (rc == 0 && c.mixed))
    return ufunc_entry(d, ufunc, d->str[MT_S_CALL], ops, n, kwnames, agreed);
  if (rc <= 0) return rc < 0 ? NULL : Py_NewRef(Py_NotImplemented);
  c.key.op = sig->id;
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  mt_ext_op op = {sig, ufunc, NULL, 0, 0, ufunc, ops + n, nkw, kwnames, 0, NULL, 0};
  PyObject *out = mt_ext_execute(d, &op, &c, ops);
  mt_ext_call_release(&c);
  return out;
}

PyObject *mt_ext_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops,
                       Py_ssize_t n, PyObject *kwnames) {
  return ufunc_call(d, ufunc, ops, n, kwnames, 0);
}

PyObject *mt_ext_ufunc_in_place(mt_ext_dispatch *d, PyObject *ufunc, PyObject *x,
                                PyObject *y) {
  PyObject *out = PyTuple_Pack(1, x);
  if (out == NULL) return NULL;
  PyObject *ops[3] = {x, y != NULL ? y : out, out};
  PyObject *res = ufunc_call(d, ufunc, ops, y != NULL ? 2 : 1, d->kw_out, 1);
  Py_DECREF(out);
  return res;
}

PyObject *mt_ext_array_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *method,
                             PyObject *const *ops, Py_ssize_t n, PyObject *kwnames) {
  if (method == d->str[MT_S_CALL] || PyUnicode_Compare(method, d->str[MT_S_CALL]) == 0)
    return mt_ext_ufunc(d, ufunc, ops, n, kwnames);
  return ufunc_entry(d, ufunc, method, ops, n, kwnames, 0);
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

/* The method as NumPy's function: func(self, *args, **kwargs), by the Python door. */
static PyObject *reduction_entry(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *self,
                                 PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
  return python_door(d, sig->func, &self, 1, args, nargs, kwnames, 1);
}

static PyObject *reduce(mt_ext_dispatch *d, int method, PyObject *self,
                        PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* A reduction method over every element of a strided DTensor: on its plain
 * expansion when it has one, else the Python door. Out of line, as strided_ufunc. */
static MT_EXT_COLD PyObject *strided_whole(mt_ext_dispatch *d, int method,
                                           const mt_ext_sig *sig, PyObject *self,
                                           PyObject *const *args, Py_ssize_t nargs,
                                           PyObject *kwnames) {
  PyObject *view = mt_ext_strided_whole(d, self), *out = NULL;
  if (view != NULL) out = reduce(d, method, view, args, nargs, kwnames);
  Py_XDECREF(view);
  if (out != NULL || PyErr_Occurred()) return out;
  return reduction_entry(d, sig, self, args, nargs, kwnames);
}

/* A reduction method is a call every rank makes, as NumPy's function is: agreed
 * on before any path is taken, as that function's call. */
static int agree_method(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *self,
                        PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *prefix[2] = {sig->func, self};
  const mt_ext_mesh_base *mb =
      d->modes->checks ? NULL : mt_ext_spec_mesh(d, ((const mt_ext_dtensor *)self)->spec);
  return agree(d, mb, sig->label, prefix, 2, args, nargs, kwnames);
}

PyObject *mt_ext_reduction(mt_ext_dispatch *d, int method, PyObject *self,
                           PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  if (d->reduction_sig[method] < 0)
    return PyErr_Format(PyExc_TypeError, "DTensor.%U has no sharding rule in mpitensor",
                        d->reduction_name[method]);
  if (agree_method(d, &d->sigs[d->reduction_sig[method]], self, args, nargs, kwnames) < 0)
    return NULL;
  return reduce(d, method, self, args, nargs, kwnames);
}

/* The reduction method, agreed. */
static PyObject *reduce(mt_ext_dispatch *d, int method, PyObject *self,
                        PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  mt_ext_sig *sig = &d->sigs[d->reduction_sig[method]];
  PyObject *axis, *keepdims;
  mt_ext_call c;
  /* A waiting selection's reduction may read its operands (mpitensor._ops._deferring). */
  if (sig->user_rule || reduction_args(d, sig, args, nargs, kwnames, &axis, &keepdims) < 0 ||
      (d->deferred != NULL && ((mt_ext_dtensor *)self)->local == d->deferred))
    return reduction_entry(d, sig, self, args, nargs, kwnames);
  int rc = mt_ext_gather_fast(d, &self, 1, &c, sig->func, 0);
  if (rc == 0 && c.strided && axis == Py_None && keepdims == Py_False)
    return strided_whole(d, method, sig, self, args, nargs, kwnames);
  if (rc <= 0) return rc < 0 ? NULL : reduction_entry(d, sig, self, args, nargs, kwnames);
  int keep = keepdims == Py_True, hit;
  int ndim = (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(c.dt[0]->spec, 2));
  mt_ext_op op = {sig, sig->func, NULL, 0, keep, sig->method, NULL, 0, NULL, 0, NULL, 0};
  c.key.op = sig->id;
  c.key.aux = mt_ext_reduction_aux(axis, ndim, keep, &op.axes);
  const mt_decision *dec = c.key.aux < 0 ? NULL : mt_ext_decide(d, &op, &c, &hit);
  /* A reduction without a reduce op (var, argmax, ...) whose input must move, and
   * max or min whose reduced axis leaves a shard empty (their Partial would have
   * nothing to hold), merge per-rank results in their Python entry instead; all
   * and any give their identity on an empty block. */
  int op_code = sig->op.rule.reduce_op;
  int merged = dec != NULL && dec->plan[0] != NULL &&
               (op_code < 0 || ((op_code == MT_REDUCE_MAX || op_code == MT_REDUCE_MIN) &&
                                !sig->op.rule.logical));
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

/* Whether func(x) (or another reduction over every element of one strided x,
 * with dtype= at most) is the call: x's expansion gives it as it is. */
static int whole(const mt_ext_dispatch *d, PyObject *func, PyObject *args, PyObject *kwargs) {
  const mt_ext_sig *sig = mt_ext_sig_of(d, func);
  Py_ssize_t n = PyTuple_GET_SIZE(args), pos = 0;
  PyObject *key, *v;
  if (sig == NULL || sig->op.family != MT_OP_REDUCTION || n < 1 || n > 2 ||
      (n == 2 && PyTuple_GET_ITEM(args, 1) != Py_None) ||
      !mt_ext_strided(d, PyTuple_GET_ITEM(args, 0)))
    return 0;
  while (PyDict_Next(kwargs, &pos, &key, &v))
    if (v != Py_None && v != Py_False && PyUnicode_CompareWithASCIIString(key, "dtype") != 0)
      return 0;
  return 1;
}

/* whole_view(func, args, kwargs): see the method table. */
static PyObject *whole_view(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyTuple_Check(args[1]) || !PyDict_Check(args[2]))
    return PyErr_Format(PyExc_TypeError, "whole_view(func, args: tuple, kwargs: dict)");
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (!whole(d, args[0], args[1], args[2])) Py_RETURN_NONE;
  PyObject *view = mt_ext_strided_whole(d, PyTuple_GET_ITEM(args[1], 0));
  return view != NULL || PyErr_Occurred() ? view : Py_NewRef(Py_None);
}

/* The DTensorBase reduction method `sig` backs (its index), or -1. */
static int method_of(const mt_ext_dispatch *d, const mt_ext_sig *sig) {
  for (int m = 0; sig != NULL && m < MT_EXT_NREDUCTION; ++m)
    if (d->reduction_sig[m] == (int)(sig - d->sigs)) return m;
  return -1;
}


/* np.sum(x, axis=1) and its kin as the DTensor method runs them, when the call is
 * one the method takes: the DTensor itself, then axis and keepdims. */
static PyObject *reduction_call(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                                PyObject *kwargs, PyObject *caller) {
  int m = method_of(d, sig);
  Py_ssize_t nargs = PyTuple_GET_SIZE(args), nkw = PyDict_GET_SIZE(kwargs), pos = 0, k = 0;
  PyObject *key, *v;
  if (m < 0 || nargs < 1 || nargs > 2 || nkw > 2 ||
      Py_TYPE(PyTuple_GET_ITEM(args, 0)) != d->dtensor)
    Py_RETURN_NOTIMPLEMENTED;
  while (PyDict_Next(kwargs, &pos, &key, &v))
    if (!PyUnicode_Check(key) || (PyUnicode_Compare(key, d->str[MT_S_AXIS]) != 0 &&
                                  PyUnicode_Compare(key, d->str[MT_S_KEEPDIMS]) != 0))
      Py_RETURN_NOTIMPLEMENTED;
  if (mt_ext_agree_on(d, sig, args, kwargs, caller) < 0) return NULL;
  PyObject *stack[3], *kwnames = nkw > 0 ? PyTuple_New(nkw) : NULL;
  if (nkw > 0 && kwnames == NULL) return NULL;
  if (nargs == 2) stack[k++] = PyTuple_GET_ITEM(args, 1);
  for (pos = 0; PyDict_Next(kwargs, &pos, &key, &v); ++k) {
    stack[k] = v;
    PyTuple_SET_ITEM(kwnames, k - (nargs - 1), Py_NewRef(key));
  }
  PyObject *out = reduce(d, m, PyTuple_GET_ITEM(args, 0), stack, nargs - 1, kwnames);
  Py_XDECREF(kwnames);
  return out;
}


/* func(*args, **kwargs) run by the executor when it takes the call as it is, else
 * NotImplemented before any agreement (see executor_call's entry in the table). */
static PyObject *executor_take(mt_ext_dispatch *d, PyObject *func, PyObject *args,
                               PyObject *kwargs, PyObject *caller) {
  const mt_ext_sig *sig = mt_ext_sig_of(d, func);
  /* A user's rule is the Python door's to run, before any agreement here. */
  if (sig == NULL || sig->user_rule) Py_RETURN_NOTIMPLEMENTED;
  if (sig->op.family == MT_OP_REDUCTION) return reduction_call(d, sig, args, kwargs, caller);
  /* A ufunc's calls reach the executor through __array_ufunc__. */
  if (sig->ufunc) return Py_NewRef(Py_NotImplemented);
  return mt_ext_family_call(d, sig, args, kwargs, caller);
}

/* executor_call(func, args, kwargs, caller): see the method table. */
static PyObject *executor_call(PyObject *module, PyObject *const *a, Py_ssize_t n) {
  if (n != 4 || !PyTuple_Check(a[1]) || !PyDict_Check(a[2]))
    return PyErr_Format(PyExc_TypeError,
                        "executor_call(func, args: tuple, kwargs: dict, caller)");
  return executor_take(mt_ext_dispatch_module(module), a[0], a[1], a[2], a[3]);
}

/* Whether NEP 18's `types` are all DTensor and ndarrays: any other type is
 * another library's, which answers the call, or NumPy's TypeError. */
static int own_types(const mt_ext_dispatch *d, PyObject *types) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); ++i) {
    PyObject *t = PyTuple_GET_ITEM(types, i);
    if (t != (PyObject *)d->dtensor &&
        !(PyType_Check(t) && PyType_IsSubtype((PyTypeObject *)t, &PyArray_Type)))
      return 0;
  }
  return 1;
}

/* door_enter(func, args, kwargs, caller, name, types): see the method table. */
static PyObject *door_enter(PyObject *module, PyObject *const *a, Py_ssize_t n) {
  if (n != 6 || !PyTuple_Check(a[1]) || !PyDict_Check(a[2]) ||
      (a[4] != Py_None && !PyUnicode_Check(a[4])) || (a[5] != Py_None && !PyTuple_Check(a[5])))
    return PyErr_Format(PyExc_TypeError,
                        "door_enter(func, args: tuple, kwargs: dict, caller, "
                        "name: str | None, types: tuple | None)");
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func = a[0], *args = a[1], *kwargs = a[2], *caller = a[3], *name = a[4];
  if (a[5] != Py_None && !own_types(d, a[5])) Py_RETURN_NOTIMPLEMENTED;
  /* Under DebugMode every call is the Python door's, which traces it whole. */
  if (name == Py_None && d->modes->recorders == 0) {
    PyObject *out = executor_take(d, func, args, kwargs, caller);
    if (out != Py_NotImplemented) return out;
    Py_DECREF(out);
  }
  /* mpitensor's own call (no frame): never agreed. */
  if (caller == Py_None)
    return PyLong_FromLong((long)mt_ext_call_flags(d, args, kwargs) << MT_EXT_AGREED_CALL_FLAGS);
  int program = mt_ext_by_program(d, caller);
  if (program < 0) return NULL;
  if (name == Py_None && program) {
    name = PyDict_GetItemWithError(d->call_names, func);
    if (name == NULL) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
  }
  long flags = mt_ext_agree_call(d, name, args, kwargs, program, 1);
  return flags < 0 ? NULL : PyLong_FromLong(flags);
}

/* set_user_rule(func, has_rule): see the method table. */
static PyObject *set_user_rule(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "set_user_rule(func, has_rule)");
  int yes = PyObject_IsTrue(args[1]);
  if (yes < 0) return NULL;
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  mt_ext_sig *sig = mt_ext_sig_of(d, args[0]);
  if (sig != NULL) sig->user_rule = yes;
  Py_RETURN_NONE;
}

PyMethodDef mt_ext_entry_methods[] = {
    {"whole_view", (PyCFunction)(void (*)(void))whole_view, METH_FASTCALL,
     "whole_view(func, args, kwargs) -> the plain expansion of args[0] (recorded as "
     "a view when it needs a gradient) when the call is the registered reduction "
     "`func` over every element of one strided DTensor, with dtype= at most, and "
     "the expansion exists; else None. Local.\n\n"
     "Example: _C.whole_view(numpy.sum, (dt,), {})"},
    {"executor_call", (PyCFunction)(void (*)(void))executor_call, METH_FASTCALL,
     "executor_call(func, args, kwargs, caller) -> func(*args, **kwargs) run by the "
     "executor in one C call, when the call is one it takes as it is (else "
     "NotImplemented): a reduction the DTensor method takes (a DTensor, then axis= "
     "and keepdims=; not all or any), a function of register_elementwise on "
     "DTensors and scalars, or a cast of register_cast that moves nothing. Agreed first as agree_call agrees on the frame `caller` "
     "(None: not agreed, as mpitensor's own calls). Collective on the mesh when "
     "agreed or when the call moves data.\n\n"
     "Example: _C.executor_call(numpy.sum, (dt,), {'axis': 1}, sys._getframe(1))"},
    {"door_enter", (PyCFunction)(void (*)(void))door_enter, METH_FASTCALL,
     "door_enter(func, args, kwargs, caller, name, types) -> the first steps of the "
     "Python door (mpitensor._registry.door) in one call: NotImplemented when "
     "`types` (NEP 18's; None: not asked) holds a type other than DTensor and "
     "ndarrays; func(*args, **kwargs) run by the executor when `name` is None, no "
     "DebugMode records and executor_call takes the call (agreed on the frame "
     "`caller`); else the flags of agree_call(name, args, kwargs, caller), `name` "
     "None: the one call_names holds for func, or None when it holds none (the door "
     "names the function and asks again); `caller` None: mpitensor's own call, "
     "never agreed, the flags call_flags' bits alone. Collective on the mesh when "
     "agreed or when the executor moves data.\n\n"
     "Example: _C.door_enter(numpy.flip, (dt, 1), {}, sys._getframe(1), None, None)"},
    {"set_user_rule", (PyCFunction)(void (*)(void))set_user_rule, METH_FASTCALL,
     "set_user_rule(func, has_rule): whether the executor's doors hand the ufunc or "
     "reduction `func` to the Python door, where a user's register_sharding rule "
     "runs (mpitensor._registry.set_rule). Local.\n\n"
     "Example: _C.set_user_rule(numpy.add, True)"},
    {NULL, NULL, 0, NULL},
};
