/* The dispatch of NumPy operations on DTensors: one walk from the operator slot,
 * __array_ufunc__ or reduction method to the result.
 *
 * mpitensor._ops registers each ufunc and reduction it supports once, at import,
 * with the signature its dim map is built from (core/dimmap.c). A call that the
 * C path takes (DTensors of one mesh this rank belongs to and Python or NumPy
 * scalars, no keywords but a reduction's axis and keepdims, no debugging tool
 * listening, no user rule) looks its decision up in the mesh's memo by the
 * operands' layout ids, or has the core make it on a miss; runs the decision's
 * plans (the collectives run at every call); calls NumPy on the local arrays; and
 * wraps the result. A call that records for autograd is taken only after the
 * plain path declined it, so that recording costs the plain path nothing; it is
 * recorded when its op has a registered backward (ext_autograd.c). Every other call
 * goes to the operation's Python entry, found in the registry
 * (mpitensor._registry), which uses the same memo through _C.decide_ufunc and
 * friends (ext_decision.c). C holds
 * the ground floor's types (to make specs and DTensors) and its registry, never
 * logic callbacks. */
#include "ext.h"
#include "ext_call.h"

#include <string.h>

/* -- registered operations ------------------------------------------------------------ */

/* Indexes sigs[0..nsigs) in a table of `cells` (a power of two). */
static int index_sigs(mt_ext_dispatch *d, size_t cells) {
  int *slots = PyMem_Calloc(cells, sizeof *slots);
  if (slots == NULL) return PyErr_NoMemory(), -1;
  PyMem_Free(d->sig_slots);
  d->sig_slots = slots, d->sig_mask = cells - 1;
  for (int s = 0; s < d->nsigs; ++s) {
    size_t i = mt_ext_sig_home(d, d->sigs[s].func);
    while (slots[i] != 0) i = (i + 1) & d->sig_mask;
    slots[i] = s + 1;
  }
  return 0;
}

/* A new signature for `func`; NULL with an exception. */
static mt_ext_sig *add_sig(mt_ext_dispatch *d, PyObject *func) {
  if (mt_ext_sig_of(d, func) != NULL) {
    PyErr_SetString(PyExc_ValueError, "this function is registered already");
    return NULL;
  }
  if (d->nsigs == d->sig_cap) {
    int cap = d->sig_cap ? 2 * d->sig_cap : 64;
    mt_ext_sig *sigs = PyMem_Realloc(d->sigs, (size_t)cap * sizeof *sigs);
    if (sigs == NULL) return (mt_ext_sig *)PyErr_NoMemory();
    d->sigs = sigs, d->sig_cap = cap;
  }
  int64_t id = mt_ext_op_id(d, func);
  if (id < 0) return NULL;
  /* At most half full, so that a probe for an absent function ends soon. */
  size_t cells = d->sig_slots == NULL ? 128 : d->sig_mask + 1;
  while (cells < 2 * (size_t)(d->nsigs + 1)) cells *= 2;
  if ((d->sig_slots == NULL || cells != d->sig_mask + 1) && index_sigs(d, cells) < 0)
    return NULL;
  mt_ext_sig *sig = &d->sigs[d->nsigs];
  memset(sig, 0, sizeof *sig);
  sig->func = Py_NewRef(func), sig->id = id;
  size_t i = mt_ext_sig_home(d, func);
  while (d->sig_slots[i] != 0) i = (i + 1) & d->sig_mask;
  d->sig_slots[i] = ++d->nsigs;
  return sig;
}

static int int_attr(PyObject *obj, const char *name) {
  PyObject *v = PyObject_GetAttrString(obj, name);
  long n = v == NULL ? -1 : PyLong_AsLong(v);
  Py_XDECREF(v);
  return (int)n;
}

/* register_ufunc(ufunc, family, kind) */
static PyObject *register_ufunc(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *ufunc;
  int family, kind;
  if (!PyArg_ParseTuple(args, "Oii:register_ufunc", &ufunc, &family, &kind)) return NULL;
  if ((family != MT_OP_ELEMENTWISE && family != MT_OP_MATMUL) || kind < 0 ||
      kind >= MT_ELEMENTWISE_COUNT)
    return PyErr_Format(PyExc_ValueError, "unknown ufunc family %d or kind %d", family, kind);
  int nin = int_attr(ufunc, "nin"), nout = int_attr(ufunc, "nout");
  if (nin < 1 || nout < 1) return NULL;
  mt_ext_sig *sig = add_sig(d, ufunc);
  if (sig == NULL) return NULL;
  sig->op.family = family, sig->op.kind = kind, sig->nin = nin, sig->nout = nout;
  Py_RETURN_NONE;
}

/* register_reduction(func, method, reduce_op, partial_rule, partial_ops, even_only):
 * `method` names the DTensorBase reduction method it backs, or is None. */
static PyObject *register_reduction(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func;
  const char *method;
  mt_reduction_rule rule;
  unsigned int ops;
  if (!PyArg_ParseTuple(args, "OziiIp:register_reduction", &func, &method, &rule.reduce_op,
                        &rule.partial_rule, &ops, &rule.even_only))
    return NULL;
  rule.partial_ops = ops;
  int m = 0;
  while (method != NULL && m < MT_EXT_NREDUCTION &&
         strcmp(mt_ext_reduction_names[m], method) != 0)
    ++m;
  if (m == MT_EXT_NREDUCTION) return PyErr_Format(PyExc_ValueError, "no method %s", method);
  mt_ext_sig *sig = add_sig(d, func);
  if (sig == NULL) return NULL;
  sig->op.family = MT_OP_REDUCTION, sig->op.rule = rule;
  if (method == NULL) Py_RETURN_NONE;
  /* ndarray's own method, called as a function: a local array the C path takes is
   * exactly an ndarray, so this is what looking the name up on it would find. */
  sig->method = PyObject_GetAttr((PyObject *)&PyArray_Type, d->reduction_name[m]);
  if (sig->method == NULL) return NULL;
  sig->int_axis = strncmp(method, "arg", 3) == 0;
  d->reduction_sig[m] = (int)(sig - d->sigs);
  Py_RETURN_NONE;
}

/* -- the C path ------------------------------------------------------------------------- */

/* np.asarray of a NumPy call's result (a scalar from 0-d inputs), stealing it. */
static PyObject *as_array(PyObject *res) {
  if (res == NULL || PyArray_CheckExact(res)) return res;
  PyObject *arr = PyArray_FromAny(res, NULL, 0, 0, 0, NULL);
  Py_DECREF(res);
  return arr;
}

/* A DTensor of `spec` around `local` (both stolen). */
static PyObject *new_dtensor(mt_ext_dispatch *d, PyObject *local, PyObject *spec,
                             int64_t id) {
  mt_ext_dtensor *b = local && spec ? (mt_ext_dtensor *)d->dtensor->tp_alloc(d->dtensor, 0)
                                    : NULL;
  if (b == NULL) {
    Py_XDECREF(local);
    Py_XDECREF(spec);
    return NULL;
  }
  b->local = local, b->spec = spec, b->layout_id = id;
  return (PyObject *)b;
}

/* What a call runs on the local arrays: `func(*locals, *extra)`, the last of the
 * `nextra` extra arguments the values of `kwnames` (a ufunc, or ndarray's method
 * of a reduction with the local array first); and what the decision was made
 * from (the registered op, a reduction's axes and keepdims). */
typedef struct target {
  mt_ext_sig *sig;
  uint32_t axes;
  int keepdims;
  PyObject *func;
  PyObject *const *extra;
  Py_ssize_t nextra;
  PyObject *kwnames;
} target;

/* The result as a DTensor: the spec of an input of the output's layout, else one
 * of the mesh and the output's layout. `dec` is the caller's copy of the decision,
 * or NULL when it holds only out_id and out_slot: the decision is then found
 * again, since the NumPy call may have run code that changed the memo (and made
 * again if that code evicted it). Steals `res`. */
static PyObject *wrap(mt_ext_dispatch *d, const mt_ext_call *c, const target *tg,
                      const mt_decision *dec, int64_t out_id, int64_t out_slot,
                      PyObject *res) {
  res = as_array(res);
  if (res == NULL) return NULL;
  PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)res);
  for (int t = 0; out_id != 0 && t < c->ntensors; ++t) {
    PyObject *spec = c->dt[t]->spec;
    if (c->id[t] == out_id && PyTuple_GET_ITEM(spec, 3) == (PyObject *)descr)
      return new_dtensor(d, res, Py_NewRef(spec), out_id);
  }
  int64_t id = out_id;
  PyObject *layout = NULL;
  int known = dec != NULL ? 0 : mt_ext_known_output(d, c->mb, out_id, out_slot, descr, &layout);
  if (known == 0 && dec == NULL) {
    int hit;
    dec = mt_memo_peek(c->mb->memo, &c->key);
    if (dec == NULL) dec = mt_ext_call_decide(d, tg->sig, c, tg->axes, tg->keepdims, &hit);
    if (dec == NULL) known = -1;
  }
  if (known == 0 && mt_ext_decision_output(d, c->mb, &c->key, dec, descr, &id, &layout) < 0)
    known = -1;
  if (known < 0) {
    Py_DECREF(res);
    return NULL;
  }
  PyObject *spec = mt_ext_make_spec(d, (PyObject *)c->mb, layout);
  Py_DECREF(layout);
  return new_dtensor(d, res, spec, id);
}

/* Whether this rank holds zeros for an input partitioned on the mesh dims of
 * `mask` (mt_decision): its coordinate is not 0 on one of them. */
static int zeroed_here(const mt_mesh *mesh, uint32_t mask) {
  int64_t coord[MT_MAX_MESH_NDIM];
  if (mask == 0 || !mt_mesh_coordinate(mesh, coord)) return 0;
  for (int m = 0; m < MT_MAX_MESH_NDIM && (mask >> m) != 0; ++m) {
    if ((mask >> m & 1u) && coord[m] != 0) return 1;
  }
  return 0;
}

/* Zeros of `local`'s shape and dtype, for a partitioned input (steals `local`). */
static PyObject *zeros_like(PyObject *local) {
  if (local == NULL) return NULL;
  PyArrayObject *a = (PyArrayObject *)local;
  PyArray_Descr *descr = PyArray_DESCR(a);
  Py_INCREF(descr);
  PyObject *z = PyArray_Zeros(PyArray_NDIM(a), PyArray_DIMS(a), descr, 0);
  Py_DECREF(local);
  return z;
}

/* The local arrays of the call's operands in `args` (new references), each input
 * moved by its plan first (collective), zeros where it is partitioned away.
 * 0, or -1 with the taken ones released. */
static int locals_of(mt_ext_dispatch *d, const mt_ext_call *c, const mt_decision *dec,
                     PyObject *const *ops, PyObject **args) {
  for (int i = 0, t = 0; i < c->noperands; ++i) {
    if (!(c->tensors >> i & 1u)) {
      args[i] = Py_NewRef(ops[i]);
      continue;
    }
    const mt_plan *plan = dec->plan[t];
    uint32_t part = dec->partition[t];
    PyObject *local = c->dt[t++]->local;
    if (plan == NULL) args[i] = Py_NewRef(local);
    else if (mt_ext_mesh_check_thread(c->mb->handle) < 0) args[i] = NULL;
    else args[i] = mt_ext_run_plan(d->module, mt_ext_mesh_get_unchecked(c->mb->handle),
                                   plan, local);
    if (part != 0 && zeroed_here(mt_ext_mesh_get_unchecked(c->mb->handle), part))
      args[i] = zeros_like(args[i]);
    if (args[i] == NULL) {
      for (int k = 0; k < i; ++k) Py_DECREF(args[k]);
      return -1;
    }
  }
  return 0;
}

/* The decision's plans, owned for a call (the memo may drop them meanwhile). */
static void hold(mt_decision *dec, int own) {
  for (int i = 0; i < dec->ninputs; ++i) {
    if (dec->plan[i] == NULL) continue;
    if (own) mt_plan_retain(dec->plan[i]);
    else mt_plan_destroy(dec->plan[i]);
  }
}

/* Runs a decision: plans, the target's call and the wrap. A decision with plans,
 * or whose output layout is not known yet, is copied and its plans held, for
 * collectives and NumPy may run code that changes the memo; the common one
 * (no plan, output known) is read only before any such code runs. */
static PyObject *run(mt_ext_dispatch *d, const mt_ext_call *c, const target *tg,
                     const mt_decision *found, PyObject *const *ops) {
  /* A partitioned input also gets a new local array (zeros on some ranks). */
  int plans = found->nplans != 0 || found->partitioned != 0;
  mt_decision copy;
  const mt_decision *dec = NULL;
  if (plans || found->out_id == 0) {
    copy = *found;
    hold(&copy, 1);
    dec = &copy;
  }
  int64_t out_id = found->out_id, out_slot = found->out_slot;
  PyObject *args[MT_MEMO_MAX_OPERANDS + 2];
  PyObject *res = NULL;
  /* Without plans the arguments are borrowed: the operands hold them (a DTensor
   * its local array) for the call, and NumPy takes its own references before it
   * runs code that could drop one. Plans make new arrays, owned here. */
  int ok = 1;
  if (plans) {
    ok = locals_of(d, c, dec, ops, args) == 0;
  } else {
    for (int i = 0, t = 0; i < c->noperands; ++i)
      args[i] = c->tensors >> i & 1u ? c->dt[t++]->local : ops[i];
  }
  if (ok) {
    for (Py_ssize_t k = 0; k < tg->nextra; ++k) args[c->noperands + k] = tg->extra[k];
    Py_ssize_t npos = c->noperands + tg->nextra -
                      (tg->kwnames != NULL ? PyTuple_GET_SIZE(tg->kwnames) : 0);
    res = PyObject_Vectorcall(tg->func, args, (size_t)npos, tg->kwnames);
    for (int i = 0; plans && i < c->noperands; ++i) Py_DECREF(args[i]);
  }
  d->c_calls++;
  PyObject *out = res == NULL ? NULL : wrap(d, c, tg, dec, out_id, out_slot, res);
  if (dec != NULL) hold(&copy, 0);
  return out;
}

/* 1 with *out (done), 0 when the C path does not take the call, -1 on error. */
static inline int c_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops, int n,
                          PyObject **out) {
  mt_ext_sig *sig = mt_ext_sig_of(d, ufunc);
  if (sig == NULL || sig->op.family == MT_OP_REDUCTION || sig->nout != 1 || sig->nin != n)
    return 0;
  if (PyDict_GET_SIZE(d->rules) != 0) {
    int has = PyDict_Contains(d->rules, ufunc);
    if (has != 0) return has < 0 ? -1 : 0;
  }
  mt_ext_call c;
  int rc = mt_ext_call_gather_c(d, ops, n, &c);
  if (rc <= 0) return rc;
  c.key.op = sig->id;
  int hit;
  const mt_decision *dec = mt_ext_call_decide(d, sig, &c, 0, 0, &hit);
  if (dec == NULL) return -1;
  target tg = {sig, 0, 0, ufunc, NULL, 0, NULL};
  *out = run(d, &c, &tg, dec, ops);
  return *out != NULL ? 1 : -1;
}

/* f(first, second, args..., **kwnames): the vectorcall of a Python entry. */
static PyObject *call_entry(PyObject *f, PyObject *first, PyObject *second,
                            PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0, lead = second ? 2 : 1;
  PyObject *small[16], **stack = small;
  if (nargs + nkw + lead > 16) {
    stack = PyMem_Malloc((size_t)(nargs + nkw + lead) * sizeof(PyObject *));
    if (stack == NULL) return PyErr_NoMemory();
  }
  stack[0] = first;
  if (second != NULL) stack[1] = second;
  for (Py_ssize_t i = 0; i < nargs + nkw; ++i) stack[lead + i] = args[i];
  PyObject *res = PyObject_Vectorcall(f, stack, (size_t)(nargs + lead), kwnames);
  if (stack != small) PyMem_Free(stack);
  return res;
}

/* The Python entry of `func` in the registry. */
static PyObject *entry_of(mt_ext_dispatch *d, PyObject *func) {
  PyObject *entry = PyDict_GetItemWithError(d->functions, func);
  if (entry == NULL && !PyErr_Occurred())
    PyErr_Format(PyExc_TypeError, "%R has no DTensor version in mpitensor", func);
  return entry;
}

/* An op with no registered backward: a result without gradients (a comparison's,
 * argmax's) is what its Python entry returns too; one with gradients is the
 * entry's to refuse (NotImplementedError), so it is dropped there. 1 or 0. */
static int unrecorded(PyObject **out) {
  if (!mt_ext_has_gradient(*out)) return 1;
  Py_CLEAR(*out);
  return 0;
}

/* A call that records for autograd (grad mode on, an operand requires grad): the
 * forward by the C path as with grad mode off (what the Python entry would run),
 * then its node. 1, 0 or -1 as c_ufunc. */
static int c_ufunc_recorded(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops,
                            int n, PyObject **out) {
  const mt_ext_sig *sig = mt_ext_sig_of(d, ufunc);
  if (sig == NULL || !mt_ext_any_needs_grad(d, ops, n)) return 0;
  d->grad_enabled = 0;
  int rc = c_ufunc(d, ufunc, ops, n, out);
  d->grad_enabled = 1;
  if (rc <= 0) return rc;
  if (sig->grad_backward == NULL) return unrecorded(out);
  *out = mt_ext_record(d, sig, *out, ops, n, NULL);
  return *out != NULL ? 1 : -1;
}

PyObject *mt_ext_array_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *method,
                             PyObject *const *ops, Py_ssize_t n, PyObject *kwnames) {
  if (kwnames == NULL && d->enabled && !d->tracing && n <= MT_MEMO_MAX_OPERANDS &&
      (method == d->s_call || PyUnicode_Compare(method, d->s_call) == 0)) {
    PyObject *out = NULL;
    int rc = c_ufunc(d, ufunc, ops, (int)n, &out);
    if (rc != 0) return out;
    /* Only a call the C path declined can be one that records. */
    if (d->grad_enabled && c_ufunc_recorded(d, ufunc, ops, (int)n, &out) != 0)
      return out;
  }
  PyObject *entry = entry_of(d, d->ufunc_type);
  if (entry == NULL) return NULL;
  d->python_calls++;
  return call_entry(entry, ufunc, method, ops, n, kwnames);
}

PyObject *mt_ext_call_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops,
                            Py_ssize_t n, PyObject *kwnames) {
  return mt_ext_array_ufunc(d, ufunc, d->s_call, ops, n, kwnames);
}

/* (axis, keepdims) of a reduction method's arguments when they are all it has:
 * axis None, an int or (not for argmax) a tuple of ints, keepdims a bool. */
static int reduction_args(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *const *args,
                          Py_ssize_t nargs, PyObject *kwnames, PyObject **axis,
                          PyObject **keepdims) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs > 1) return -1;
  *axis = nargs == 1 ? args[0] : Py_None, *keepdims = Py_False;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject *k = PyTuple_GET_ITEM(kwnames, i);
    if (nargs == 0 && PyUnicode_Compare(k, d->s_axis) == 0) *axis = args[i];
    else if (PyUnicode_Compare(k, d->s_keepdims) == 0) *keepdims = args[nargs + i];
    else return -1;
  }
  if (*keepdims != Py_True && *keepdims != Py_False) return -1;
  if (*axis == Py_None || PyLong_CheckExact(*axis)) return 0;
  return !sig->int_axis && PyTuple_CheckExact(*axis) ? 0 : -1;
}

static int c_reduction(mt_ext_dispatch *d, mt_ext_sig *sig, PyObject *self,
                       PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                       PyObject **out) {
  PyObject *axis, *keepdims;
  mt_ext_call c;
  if (reduction_args(d, sig, args, nargs, kwnames, &axis, &keepdims) < 0) return 0;
  int rc = mt_ext_call_gather_c(d, &self, 1, &c);
  if (rc <= 0) return rc;
  uint32_t axes;
  int ndim = (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(c.dt[0]->spec, 2));
  int64_t aux = mt_ext_reduction_aux(axis, ndim, keepdims == Py_True, &axes);
  if (aux < 0) return 0;
  c.key.op = sig->id, c.key.aux = aux;
  int hit;
  const mt_decision *dec = mt_ext_call_decide(d, sig, &c, axes, keepdims == Py_True, &hit);
  if (dec == NULL) return -1;
  /* A reduction without a reduce op (var, argmax, ...) whose input must move would
   * gather it: its Python entry merges per-rank results instead. */
  if (sig->op.rule.reduce_op < 0 && dec->plan[0] != NULL) return 0;
  /* Max and min move their input when a reduced axis leaves a shard empty (their
   * Partial has nothing to hold there): their Python entry reduces with the
   * dtype's identity instead. Every rank declines alike (the decision is). */
  int op = sig->op.rule.reduce_op;
  if ((op == MT_REDUCE_MAX || op == MT_REDUCE_MIN) && dec->plan[0] != NULL) return 0;
  /* axis is every reduction method's first parameter: positional, it spares
   * NumPy the parsing of keywords. */
  PyObject *extra[2] = {axis, keepdims};
  int keep = keepdims == Py_True;
  target tg = {sig, axes, keep, sig->method, extra, 1 + keep, keep ? d->kw_keepdims : NULL};
  *out = run(d, &c, &tg, dec, &self);
  return *out != NULL ? 1 : -1;
}

/* c_ufunc_recorded for a reduction method; the node's aux is (axis, keepdims). */
static int c_reduction_recorded(mt_ext_dispatch *d, mt_ext_sig *sig, PyObject *self,
                                PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames, PyObject **out) {
  PyObject *axis, *keepdims;
  if (!mt_ext_any_needs_grad(d, &self, 1) ||
      reduction_args(d, sig, args, nargs, kwnames, &axis, &keepdims) < 0)
    return 0;
  d->grad_enabled = 0;
  int rc = c_reduction(d, sig, self, args, nargs, kwnames, out);
  d->grad_enabled = 1;
  if (rc <= 0) return rc;
  if (sig->grad_backward == NULL) return unrecorded(out);
  PyObject *aux = PyTuple_Pack(2, axis, keepdims);
  if (aux == NULL) {
    Py_CLEAR(*out);
    return -1;
  }
  *out = mt_ext_record(d, sig, *out, &self, 1, aux);
  Py_DECREF(aux);
  return *out != NULL ? 1 : -1;
}

PyObject *mt_ext_call_reduction(mt_ext_dispatch *d, int method, PyObject *self,
                                PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
  if (d->reduction_sig[method] < 0)
    return PyErr_Format(PyExc_TypeError, "DTensor.%s has no sharding rule in mpitensor",
                        mt_ext_reduction_names[method]);
  mt_ext_sig *sig = &d->sigs[d->reduction_sig[method]];
  if (d->enabled && !d->tracing) {
    PyObject *out = NULL;
    int rc = c_reduction(d, sig, self, args, nargs, kwnames, &out);
    if (rc != 0) return out;
    if (d->grad_enabled &&
        c_reduction_recorded(d, sig, self, args, nargs, kwnames, &out) != 0)
      return out;
  }
  PyObject *entry = entry_of(d, sig->func);
  if (entry == NULL) return NULL;
  d->python_calls++;
  return call_entry(entry, self, NULL, args, nargs, kwnames);
}

/* -- module functions --------------------------------------------------------------- */

static int get_attr(PyObject *obj, const char *name, PyObject **out) {
  *out = PyObject_GetAttrString(obj, name);
  return *out == NULL ? -1 : 0;
}

/* The operators' ufuncs and NumPy's ufunc type, from NumPy. */
static int load_numpy(mt_ext_dispatch *d) {
  PyObject *np = PyImport_ImportModule("numpy");
  int rc = np == NULL ? -1 : get_attr(np, "ufunc", &d->ufunc_type);
  for (int i = 0; rc == 0 && i < MT_EXT_NBINARY; ++i)
    rc = get_attr(np, mt_ext_binary_names[i], &d->binary[i]);
  for (int i = 0; rc == 0 && i < MT_EXT_NUNARY; ++i)
    rc = get_attr(np, mt_ext_unary_names[i], &d->unary[i]);
  for (int i = 0; rc == 0 && i < MT_EXT_NCOMPARE; ++i)
    rc = get_attr(np, mt_ext_compare_names[i], &d->compare[i]);
  Py_XDECREF(np);
  return rc;
}

/* The placements the dispatch makes, once: placements are interned, so these
 * are the objects Python's own Replicate(), Shard(d), Partial(op) return. */
static int load_placements(mt_ext_dispatch *d, PyObject *replicate, PyObject *shard,
                           PyObject *partial) {
  d->replicate = PyObject_CallNoArgs(replicate);
  for (int i = 0; d->replicate != NULL && i < MT_MAX_NDIM; ++i) {
    PyObject *dim = PyLong_FromLong(i);
    d->shard[i] = dim == NULL ? NULL : PyObject_CallOneArg(shard, dim);
    Py_XDECREF(dim);
    if (d->shard[i] == NULL) return -1;
  }
  for (int op = 0; d->replicate != NULL && op < MT_REDUCE_COUNT; ++op) {
    PyObject *name = PyUnicode_FromString(mt_reduce_op_name(op));
    d->partial[op] = name == NULL ? NULL : PyObject_CallOneArg(partial, name);
    Py_XDECREF(name);
    if (d->partial[op] == NULL) return -1;
  }
  return d->replicate != NULL ? 0 : -1;
}

/* dispatch_init(DTensor, DTensorSpec, Replicate, Shard, Partial, functions, rules) */
static PyObject *dispatch_init(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *dtensor, *spec, *rep, *shard, *partial, *functions, *rules;
  if (!PyArg_ParseTuple(args, "O!O!OOOO!O!:dispatch_init", &PyType_Type, &dtensor,
                        &PyType_Type, &spec, &rep, &shard, &partial, &PyDict_Type,
                        &functions, &PyDict_Type, &rules))
    return NULL;
  if (!PyType_IsSubtype((PyTypeObject *)dtensor, mt_ext_state_of(module)->dtensor_base_type))
    return PyErr_Format(PyExc_TypeError, "dispatch_init needs a DTensorBase subclass");
  if (d->dtensor != NULL)
    return PyErr_Format(PyExc_RuntimeError, "dispatch_init was called already");
  if (load_numpy(d) < 0 || load_placements(d, rep, shard, partial) < 0) return NULL;
  d->spec = (PyTypeObject *)Py_NewRef(spec);
  d->functions = Py_NewRef(functions), d->rules = Py_NewRef(rules);
  d->dtensor = (PyTypeObject *)Py_NewRef(dtensor);
  Py_RETURN_NONE;
}

/* dispatch_enable(flag) -> the previous flag: off, every call takes the Python entry. */
static PyObject *dispatch_enable(PyObject *module, PyObject *flag) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  int was = d->enabled;
  d->enabled = on;
  return PyBool_FromLong(was);
}

static PyObject *dispatch_stats(PyObject *module, PyObject *unused) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  return Py_BuildValue("{sLsLsL}", "c_calls", d->c_calls, "python_calls", d->python_calls,
                       "redistribute_c_calls", d->redistribute_c_calls);
}

/* set_modes(tracing, grad_enabled): what mpitensor._modes says C must honour. */
static PyObject *set_modes(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  int tracing, grad;
  if (!PyArg_ParseTuple(args, "pp:set_modes", &tracing, &grad)) return NULL;
  d->tracing = tracing, d->grad_enabled = grad;
  Py_RETURN_NONE;
}

/* set_cache_limits(decisions, plans, layouts): the bounds of meshes made from now. */
static PyObject *set_cache_limits(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  long long decisions, plans, layouts;
  if (!PyArg_ParseTuple(args, "LLL:set_cache_limits", &decisions, &plans, &layouts))
    return NULL;
  if (decisions < 1 || plans < 1 || layouts < 1)
    return PyErr_Format(PyExc_ValueError, "cache limits are at least 1");
  d->decision_limit = decisions, d->plan_limit = plans, d->layout_limit = layouts;
  Py_RETURN_NONE;
}

PyMethodDef mt_ext_dispatch_methods[] = {
    {"dispatch_init", dispatch_init, METH_VARARGS,
     "dispatch_init(DTensor, DTensorSpec, Replicate, Shard, Partial, functions, rules): "
     "the ground floor's types and registry, once. Local."},
    {"register_ufunc", register_ufunc, METH_VARARGS,
     "register_ufunc(ufunc, family, kind): a ufunc's signature (FAMILY_ELEMENTWISE with "
     "an ELEMENTWISE_* kind, or FAMILY_MATMUL). Local."},
    {"register_reduction", register_reduction, METH_VARARGS,
     "register_reduction(func, method, reduce_op, partial_rule, partial_ops, even_only): "
     "a reduction's signature and the DTensor method it backs (reduce_op -1: the "
     "reduced dims are gathered). Local."},
    {"dispatch_enable", dispatch_enable, METH_O,
     "dispatch_enable(flag) -> previous: the C path on or off (off: every call takes "
     "the Python entry). Local."},
    {"dispatch_stats", dispatch_stats, METH_NOARGS,
     "{c_calls, python_calls, redistribute_c_calls}: calls the C path and the Python "
     "entries ran, and redistributes the C path ran. Local."},
    {"set_modes", set_modes, METH_VARARGS,
     "set_modes(tracing, grad_enabled): the modes of mpitensor._modes C reads. Local."},
    {"set_cache_limits", set_cache_limits, METH_VARARGS,
     "set_cache_limits(decisions, plans, layouts): bounds of meshes made later. Local."},
    {NULL, NULL, 0, NULL},
};

static int intern_names(mt_ext_dispatch *d) {
  for (int m = 0; m < MT_EXT_NREDUCTION; ++m) {
    d->reduction_name[m] = PyUnicode_InternFromString(mt_ext_reduction_names[m]);
    d->reduction_sig[m] = -1;
    if (d->reduction_name[m] == NULL) return -1;
  }
  d->s_call = PyUnicode_InternFromString("__call__");
  d->s_axis = PyUnicode_InternFromString("axis");
  d->s_keepdims = PyUnicode_InternFromString("keepdims");
  d->s_out = PyUnicode_InternFromString("out");
  d->s_redistribute = PyUnicode_InternFromString("_redistribute");
  if (!d->s_call || !d->s_axis || !d->s_keepdims || !d->s_out || !d->s_redistribute)
    return -1;
  d->kw_keepdims = PyTuple_Pack(1, d->s_keepdims);
  return d->kw_keepdims == NULL ? -1 : 0;
}

int mt_ext_dispatch_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  mt_ext_dispatch *d = st->dispatch = PyMem_Calloc(1, sizeof *d);
  if (d == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  d->module = module, d->enabled = 1, d->grad_enabled = 1, d->next_op = 1;
  d->redistribute_op = d->next_op++;
  d->decision_limit = 4096, d->plan_limit = 256, d->layout_limit = 4096;
  d->mesh_base = st->mesh_base_type, d->dtensor_base = st->dtensor_base_type;
  d->node_type = st->node_type;
  d->op_ids = PyDict_New();
  if (d->op_ids == NULL || intern_names(d) < 0) return -1;
  return 0;
}

/* Every object the state holds, for traverse and clear. */
#define MT_EXT_DISPATCH_OBJECTS(X, d)                                                  \
  X(d->dtensor); X(d->spec); X(d->functions); X(d->rules); X(d->ufunc_type);          \
  X(d->replicate); X(d->op_ids); X(d->s_call); X(d->s_axis);                         \
  X(d->s_keepdims); X(d->s_out); X(d->kw_keepdims); X(d->s_redistribute);             \
  for (int i_ = 0; i_ < MT_MAX_NDIM; ++i_) X(d->shard[i_]);                            \
  for (int i_ = 0; i_ < MT_REDUCE_COUNT; ++i_) X(d->partial[i_]);                      \
  for (int i_ = 0; i_ < MT_EXT_NBINARY; ++i_) X(d->binary[i_]);                        \
  for (int i_ = 0; i_ < MT_EXT_NUNARY; ++i_) X(d->unary[i_]);                          \
  for (int i_ = 0; i_ < MT_EXT_NCOMPARE; ++i_) X(d->compare[i_]);                      \
  for (int i_ = 0; i_ < MT_EXT_NREDUCTION; ++i_) X(d->reduction_name[i_]);             \
  for (int i_ = 0; i_ < d->nsigs; ++i_) {                                              \
    X(d->sigs[i_].func);                                                               \
    X(d->sigs[i_].method);                                                             \
    X(d->sigs[i_].grad_name);                                                          \
    X(d->sigs[i_].grad_backward);                                                      \
  }

int mt_ext_dispatch_traverse(mt_ext_state *st, visitproc visit, void *arg) {
  mt_ext_dispatch *d = st->dispatch;
  if (d == NULL) return 0;
#define VISIT_ONE(o) Py_VISIT(o)
  MT_EXT_DISPATCH_OBJECTS(VISIT_ONE, d)
#undef VISIT_ONE
  return 0;
}

void mt_ext_dispatch_clear(mt_ext_state *st) {
  mt_ext_dispatch *d = st->dispatch;
  if (d == NULL) return;
#define CLEAR_ONE(o) Py_CLEAR(o)
  MT_EXT_DISPATCH_OBJECTS(CLEAR_ONE, d)
#undef CLEAR_ONE
  d->nsigs = 0;
  PyMem_Free(d->sig_slots);
  d->sig_slots = NULL;
}

void mt_ext_dispatch_free(mt_ext_state *st) {
  mt_ext_dispatch_clear(st);
  if (st->dispatch != NULL) PyMem_Free(st->dispatch->sigs);
  PyMem_Free(st->dispatch);
  st->dispatch = NULL;
}
