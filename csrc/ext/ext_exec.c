/* The one executor. Every operation on DTensors runs here, whichever door it
 * came in by (an operator, __array_ufunc__, a reduction method, an op entry's
 * _C.execute, a backward rule's operations):
 *
 *   decision (memo hit, or the dim map on a miss)   ext_decide.c
 *   -> each input's plan (collective), or zeros where it is partitioned away
 *   -> the local function on the local arrays (a hook: ufunc, method, compute)
 *   -> wrap: a DTensor of the decision's output layout
 *   -> autograd record (grad mode on, an input that requires grad)
 *   -> trace events (only while a debugging tool listens)
 *
 * A rank outside the mesh runs the local function on stand-ins (one element per
 * input) to learn the output's dtype, and holds an empty local array. */
#include "ext.h"
#include "ext_trace.h"

#include <string.h>

#include "mpitensor/comm/agree.h"

/* np.asarray of a NumPy call's result (a scalar from 0-d inputs), stealing it. */
static PyObject *as_array(PyObject *res) {
  if (res == NULL || PyArray_CheckExact(res)) return res;
  PyObject *arr = PyArray_FromAny(res, NULL, 0, 0, 0, NULL);
  Py_DECREF(res);
  return arr;
}

/* The local array of a rank outside the mesh: empty, or a 0-d zero. */
static PyObject *outside_local(int ndim, PyArray_Descr *descr) {
  npy_intp zero = 0;
  Py_INCREF(descr);
  return ndim == 0 ? PyArray_Zeros(0, NULL, descr, 0) : PyArray_Empty(1, &zero, descr, 0);
}

/* What a run holds between the decision and the wrap: the decision's output
 * (its copy, when plans are held, or only its out_id and slot), the local
 * arguments, and whether they are the run's own (moved) arrays. */
typedef struct run_state {
  mt_decision copy;
  const mt_decision *dec; /* &copy, or NULL: only out_id/out_slot are valid */
  int64_t out_id, out_slot;
  int owned; /* args[0..noperands) are new references */
  PyObject *args[MT_MEMO_MAX_OPERANDS + 20];
} run_state;

/* The result as a DTensor: the spec of an input of the output's layout, else one
 * made from the decision's output layout (found again when the local function
 * may have changed the memo). Steals `res`. */
static PyObject *wrap(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                      const run_state *rs, PyObject *res) {
  res = as_array(res);
  if (res == NULL) return NULL;
  PyArrayObject *r = (PyArrayObject *)res;
  PyArray_Descr *descr = PyArray_DESCR(r);
  /* Only while a backward runs: the engine may write into what is fresh then. */
  int fresh = d->modes->backward && PyArray_BASE(r) == NULL &&
              PyArray_CHKFLAGS(r, NPY_ARRAY_OWNDATA);
  for (int i = 0; fresh && i < c->noperands; ++i) fresh = rs->args[i] != res;
  if (!c->mb->member) {
    Py_SETREF(res, outside_local(rs->dec ? rs->dec->out_ndim : PyArray_NDIM(r), descr));
    if (res == NULL) return NULL;
    descr = PyArray_DESCR((PyArrayObject *)res);
  }
  /* An input's spec is the result's only when it is on the call's mesh object:
   * an equal mesh has its own table of layout ids, in which out_id names another
   * layout (the result would carry a spec and an id that disagree). */
  for (int t = 0; rs->out_id != 0 && t < c->ntensors; ++t) {
    PyObject *spec = c->dt[t]->spec;
    if (c->id[t] == rs->out_id && PyTuple_GET_ITEM(spec, 3) == (PyObject *)descr &&
        PyTuple_GET_ITEM(spec, 0) == (PyObject *)c->mb)
      return mt_ext_new_dtensor(d, res, Py_NewRef(spec), rs->out_id, fresh);
  }
  const mt_decision *dec = rs->dec;
  PyObject *layout = NULL;
  int64_t id = rs->out_id;
  if (dec == NULL) {
    layout = mt_ext_py_layout(d, c->mb, rs->out_id, rs->out_slot, NULL, NULL);
    if (layout != NULL && PyTuple_GET_ITEM(layout, 2) != (PyObject *)descr) Py_CLEAR(layout);
  }
  if (layout == NULL && !PyErr_Occurred()) {
    int hit;
    if (dec == NULL) dec = mt_ext_decide(d, op, c, &hit);
    if (dec == NULL || mt_ext_decision_output(d, c->mb, &c->key, dec, descr, &id, &layout) < 0)
      layout = NULL;
  }
  if (layout == NULL) {
    Py_DECREF(res);
    return NULL;
  }
  PyObject *spec = mt_ext_make_spec(d, (PyObject *)c->mb, layout);
  Py_DECREF(layout);
  return mt_ext_new_dtensor(d, res, spec, id, fresh);
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

/* One element of the input's dtype per dim: a rank outside the mesh learns the
 * output's dtype from these. */
static PyObject *stand_in(const mt_ext_dtensor *b) {
  PyObject *spec = b->spec;
  npy_intp ones[MT_MAX_NDIM];
  int n = (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 2));
  for (int i = 0; i < n; ++i) ones[i] = 1;
  PyArray_Descr *descr = (PyArray_Descr *)PyTuple_GET_ITEM(spec, 3);
  Py_INCREF(descr);
  return PyArray_Zeros(n, ones, descr, 0);
}

/* The operand index of tensor input k. */
static int operand_of(const mt_ext_call *c, int k) {
  for (int i = 0, t = 0; i < c->noperands; ++i)
    if (c->tensors >> i & 1u && t++ == k) return i;
  return -1;
}

/* The local arguments (new references): each input moved by its plan first (an
 * input that is the same DTensor as an earlier one moving to the same layout
 * takes that move's result), zeros where it is partitioned away, stand-ins
 * outside the mesh. */
static int local_args(mt_ext_dispatch *d, const mt_ext_call *c, const mt_decision *dec,
                      PyObject *const *ops, run_state *rs) {
  mt_mesh *mesh = c->mb->member ? c->mb->mesh : NULL;
  int64_t coord[MT_MAX_MESH_NDIM];
  for (int i = 0, t = 0; i < c->noperands; ++i) {
    PyObject *a;
    int alias = c->tensors >> i & 1u ? mt_ext_alias_of(c, t) : -1;
    if (!(c->tensors >> i & 1u)) {
      a = Py_NewRef(ops[i]);
    } else if (mesh == NULL) {
      a = stand_in(c->dt[t++]);
    } else if (alias >= 0 && mt_decision_same_move(dec, t, alias)) {
      a = Py_NewRef(rs->args[operand_of(c, alias)]);
      ++t;
    } else {
      mt_plan *plan = dec->plan[t];
      PyObject *local = c->dt[t]->local;
      if (plan == NULL) a = Py_NewRef(local);
      else if ((mt_ext_events(d->modes) && mt_ext_move_event(d, c->dt[t]->spec, plan, 0, Py_None, Py_None) < 0) ||
               mt_ext_mesh_check(c->mb) < 0)
        a = NULL;
      else a = mt_ext_run_plan(d->module, mesh, plan, local);
      if (dec->partition[t] != 0 && mt_mesh_coordinate(mesh, coord) &&
          mt_decision_zeroed(dec, t, coord))
        a = zeros_like(a);
      ++t;
    }
    if ((rs->args[i] = a) == NULL) {
      for (int k = 0; k < i; ++k) Py_DECREF(rs->args[k]);
      return -1;
    }
  }
  rs->owned = 1;
  return 0;
}

/* The "decision" event: op key, the inputs' specs, output placements and shape
 * (None, None unless debug logging wants them: building them would sit on every
 * traced op), hit. Specs, not the DTensors: a listener keeps them, and no local
 * array. */
static int decision_event(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                          const mt_decision *dec, int hit) {
  PyObject *specs = PyTuple_New(c->ntensors);
  if (specs == NULL) return -1;
  for (int t = 0; t < c->ntensors; ++t)
    PyTuple_SET_ITEM(specs, t, Py_NewRef(c->dt[t]->spec));
  PyObject *out = d->modes->log_debug ? mt_ext_decision_out(d, dec) : NULL;
  int rc = -1;
  if (out != NULL || !d->modes->log_debug) {
    PyObject *args[5] = {op->key, specs, out ? PyTuple_GET_ITEM(out, 0) : Py_None,
                         out ? PyTuple_GET_ITEM(out, 1) : Py_None,
                         hit ? Py_True : Py_False};
    rc = mt_ext_event(d, MT_EVENT_DECISION, args, 5);
  }
  Py_DECREF(specs);
  Py_XDECREF(out);
  return rc;
}

/* This rank's box of the output (ones outside the mesh, as the stand-ins). */
static PyObject *out_box(const mt_ext_call *c, const mt_decision *dec) {
  int64_t coord[MT_MAX_MESH_NDIM];
  mt_mesh *mesh = c->mb->member ? c->mb->mesh : NULL;
  int member = mesh != NULL && mt_mesh_coordinate(mesh, coord);
  mt_box box;
  mt_error err = {0};
  int rc = mt_decision_out_box(dec, c->mb->mesh_shape, member ? coord : NULL, &box, &err);
  return rc == MT_OK ? mt_ext_int_tuple(box.shape, box.ndim) : mt_ext_raise(rc, &err);
}

/* The local function's result `res` (NULL: its exception), raised on every member
 * when it failed on one, where NumPy's error state raises on floating-point
 * errors: NumPy raises for the whole array, and the elements that divide by zero
 * or overflow lie on some ranks only. Elsewhere each rank keeps its own warning,
 * without a collective. Ranks whose error states differ get mt_agree_float_errors's
 * ValueError. */
static PyObject *agreed_local(mt_ext_dispatch *d, const mt_ext_call *c, PyObject *res) {
  /* The local function's exception waits while the error state is asked. */
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  if (res == NULL) PyErr_Fetch(&type, &value, &tb);
  int raises = mt_ext_errstate_raises(d);
  if (raises == 0) {
    if (type != NULL) PyErr_Restore(type, value, tb);
    return res;
  }
  mt_error err = {0};
  int status = MT_OK, rc;
  if (raises < 0 || type != NULL) {
    /* The hook's own failure counts as the call's: every rank still agrees. */
    Py_CLEAR(res);
    if (type != NULL) {
      if (raises < 0) PyErr_Clear();
      PyErr_Restore(type, value, tb);
    }
    status = mt_ext_fetch_status(&err);
  }
  Py_BEGIN_ALLOW_THREADS
  rc = mt_agree_float_errors(c->mb->mesh, status, &err);
  Py_END_ALLOW_THREADS
  if (rc == MT_OK) return res;
  Py_XDECREF(res);
  return mt_ext_raise(rc, &err);
}

/* The local function on rs->args, with the op's extra arguments (and box). */
static PyObject *call_local(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                            const mt_decision *dec, run_state *rs) {
  Py_ssize_t n = c->noperands;
  for (Py_ssize_t k = 0; k < op->nextra; ++k) rs->args[n + k] = op->extra[k];
  n += op->nextra;
  PyObject *box = NULL;
  if (op->pass_box) {
    if ((box = out_box(c, dec)) == NULL) return NULL;
    rs->args[n++] = box;
  }
  Py_ssize_t nkw = op->kwnames != NULL ? PyTuple_GET_SIZE(op->kwnames) : 0;
  PyObject *func = op->func;
  const mt_ext_sig *sig = op->sig;
  if (sig != NULL && sig->small != NULL && func == sig->method && PyArray_Check(rs->args[0]) &&
      PyArray_SIZE((PyArrayObject *)rs->args[0]) < sig->small_size)
    func = sig->small; /* a block the registered local would hand to it anyway */
  PyObject *allocator = mt_ext_pool_enter(d->module, rs->args, c->noperands);
  PyObject *res = mt_ext_hook(d, MT_HOOK_LOCAL, func, rs->args, (size_t)(n - nkw),
                              op->kwnames);
  mt_ext_pool_leave(allocator);
  Py_XDECREF(box);
  return c->mb->member && mt_ext_mesh_size(c->mb) > 1 ? agreed_local(d, c, res) : res;
}

/* Each result of the local function wrapped (a tuple for several). */
static PyObject *wrap_all(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                          const run_state *rs, PyObject *res) {
  if (res == NULL || !PyTuple_CheckExact(res)) return wrap(d, op, c, rs, res);
  Py_ssize_t n = PyTuple_GET_SIZE(res);
  PyObject *out = PyTuple_New(n);
  for (Py_ssize_t i = 0; out != NULL && i < n; ++i) {
    PyObject *w = wrap(d, op, c, rs, Py_NewRef(PyTuple_GET_ITEM(res, i)));
    if (w == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, i, w);
  }
  Py_DECREF(res);
  return out;
}

/* Input t as its plan left it (mt_decision_moved_key): a DTensor of its global
 * shape and dtype around the moved local array (outside the mesh: an empty one). */
static PyObject *moved_input(mt_ext_dispatch *d, const mt_ext_call *c, int t,
                             const mt_decision *dec, PyObject *local) {
  mt_layout_key given, key;
  if (mt_ext_spec_key(d, c->mb, c->dt[t]->spec, &given) < 0) return NULL;
  mt_decision_moved_key(dec, t, &given, &key);
  local = c->mb->member ? Py_NewRef(local)
                        : outside_local(key.ndim, PyArray_DESCR((PyArrayObject *)local));
  if (local == NULL) return NULL;
  int64_t id, slot;
  mt_error err = {0};
  int rc = mt_layout_table_intern(c->mb->layouts, &key, &id, &slot, &err);
  if (rc != MT_OK) {
    Py_DECREF(local);
    return mt_ext_raise(rc, &err);
  }
  PyObject *layout = mt_ext_py_layout(d, c->mb, id, slot, &key,
                                      PyTuple_GET_ITEM(c->dt[t]->spec, 3));
  PyObject *spec = layout ? mt_ext_make_spec(d, (PyObject *)c->mb, layout) : NULL;
  Py_XDECREF(layout);
  return mt_ext_new_dtensor(d, local, spec, id, 0);
}

/* What a node keeps of the operands (NULL: them as given, or an error). */
static PyObject *saved_operands(mt_ext_dispatch *d, const mt_ext_call *c,
                                const run_state *rs, PyObject *const *inputs, int *err) {
  PyObject *saved = NULL;
  *err = 0;
  for (int i = 0, t = 0; rs->dec != NULL && i < c->noperands; ++i) {
    if (!(c->tensors >> i & 1u)) continue;
    if (rs->owned && PyArray_Check(rs->args[i]) && mt_decision_keeps_moved(rs->dec, t)) {
      if (saved == NULL && (saved = PyTuple_New(c->noperands)) != NULL)
        for (int k = 0; k < c->noperands; ++k)
          PyTuple_SET_ITEM(saved, k, Py_NewRef(inputs[k]));
      PyObject *m = saved ? moved_input(d, c, t, rs->dec, rs->args[i]) : NULL;
      if (m == NULL) {
        Py_XDECREF(saved);
        *err = 1;
        return NULL;
      }
      Py_SETREF(PyTuple_GET_ITEM(saved, i), m);
    }
    ++t;
  }
  return saved;
}

/* Grad mode on and an input requires grad: `out` recorded with the op's backward;
 * without one, a floating-point result is an error rather than a lost gradient. */
static PyObject *record(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                        const run_state *rs, PyObject *const *ops, PyObject *out) {
  PyObject *first = PyTuple_Check(out) ? PyTuple_GET_ITEM(out, 0) : out;
  if (!mt_ext_inexact(PyArray_DESCR((PyArrayObject *)((mt_ext_dtensor *)first)->local)))
    return out;
  if (op->sig == NULL || op->sig->grad_backward == NULL) {
    Py_DECREF(out);
    return mt_ext_error(d, "no_backward", op->key, NULL);
  }
  PyObject *inputs[MT_MEMO_MAX_OPERANDS];
  for (int i = 0, t = 0; i < c->noperands; ++i)
    inputs[i] = c->tensors >> i & 1u ? (PyObject *)c->dt[t++] : ops[i];
  int err;
  PyObject *saved = saved_operands(d, c, rs, inputs, &err);
  if (err) {
    Py_DECREF(out);
    return NULL;
  }
  out = mt_ext_record(d, op->sig->grad_name, op->sig->grad_backward, out, inputs,
                      c->noperands, saved, op->aux);
  Py_XDECREF(saved);
  return out;
}

PyObject *mt_ext_run(mt_ext_dispatch *d, const mt_ext_op *op, mt_ext_call *c,
                     const mt_decision *found, int hit, PyObject *const *ops) {
  run_state rs;
  rs.dec = NULL, rs.owned = 0;
  rs.out_id = found->out_id, rs.out_slot = found->out_slot;
  /* A decision with plans or zeros, or one whose output is not known yet, or one
   * read outside the mesh, is copied and its plans held: collectives and NumPy
   * may run code that changes the memo. The common one is read before any runs. */
  int moves = found->nplans != 0 || found->partitioned != 0 || !c->mb->member;
  if (moves || found->out_id == 0 || op->pass_box || mt_ext_events(d->modes)) {
    mt_decision_hold(found, &rs.copy);
    rs.dec = &rs.copy;
  }
  PyObject *out = NULL;
  if (mt_ext_events(d->modes) && decision_event(d, op, c, rs.dec, hit) < 0) goto done;
  if (moves) {
    if (local_args(d, c, rs.dec, ops, &rs) < 0) goto done;
  } else {
    for (int i = 0, t = 0; i < c->noperands; ++i)
      rs.args[i] = c->tensors >> i & 1u ? c->dt[t++]->local : ops[i];
  }
  out = wrap_all(d, op, c, &rs, call_local(d, op, c, rs.dec, &rs));
  d->hook_calls[MT_HOOK_RUNS]++;
  /* key.grad: the operands that require grad, read while grad was wanted. */
  if (out != NULL && d->modes->grad_enabled && c->key.grad != 0)
    out = record(d, op, c, &rs, ops, out);
  if (out != NULL && d->modes->listeners > 0 &&
      mt_ext_ran_event(d, op, c, rs.dec, ops, rs.args, out) < 0)
    Py_CLEAR(out);
done:
  for (int i = 0; rs.owned && i < c->noperands; ++i) Py_DECREF(rs.args[i]);
  if (rs.dec != NULL) mt_decision_drop(&rs.copy);
  return out;
}

/* What the op's dtype= keyword adds to its memo key (0 without one): the result's
 * dtype decides which Partials the op keeps (mt_dimmap_dtypes, on a miss), so
 * calls of different dtypes are decided apart. NumPy's type number, above the
 * bits a reduction's axes and keepdims take. */
static int64_t dtype_word(const mt_ext_op *op) {
  if (op->kwnames == NULL) return 0; /* the common call: no keyword to look for */
  PyArray_Descr *descr = mt_ext_keyword_dtype(op);
  int64_t word = descr != NULL ? (int64_t)(descr->type_num + 1) << 40 : 0;
  Py_XDECREF(descr);
  return word;
}

const mt_decision *mt_ext_decide_typed(mt_ext_dispatch *d, const mt_ext_op *op,
                                       mt_ext_call *c, int *hit) {
  c->key.aux |= dtype_word(op);
  return mt_ext_decide(d, op, c, hit);
}

PyObject *mt_ext_execute(mt_ext_dispatch *d, const mt_ext_op *op, mt_ext_call *c,
                         PyObject *const *ops) {
  int hit;
  const mt_decision *dec = mt_ext_decide_typed(d, op, c, &hit);
  return dec == NULL ? NULL : mt_ext_run(d, op, c, dec, hit, ops);
}

/* An execute call's arguments, as execute() parses them: the operands and the
 * local function's extra arguments as tuples, its keyword arguments' names for
 * the last of them (NULL: none). */
typedef struct exec_args {
  PyObject *key, *ops, *build, *local, *extra, *kwnames, *axis;
  int box, keepdims;
} exec_args;

static PyObject *run_execute(mt_ext_dispatch *d, const exec_args *x) {
  mt_ext_op op = {0};
  op.sig = mt_ext_sig_of(d, x->key);
  op.key = x->key, op.build = x->build, op.func = x->local;
  op.pass_box = x->box;
  if (op.func == Py_None && op.sig == NULL)
    return PyErr_Format(PyExc_TypeError, "execute: a local function is needed");
  if (op.func == Py_None) op.func = op.sig->method ? op.sig->method : op.sig->func;
  Py_ssize_t n = PyTuple_GET_SIZE(x->ops);
  mt_ext_call c;
  int rc = mt_ext_gather(d, &PyTuple_GET_ITEM(x->ops, 0), (int)n, &c, x->key, 0);
  if (rc <= 0)
    return rc < 0      ? NULL
           : c.strided ? PyErr_Format(PyExc_TypeError, "%R: a strided-shard operand reached "
                                      "the executor; its entry must take it first", x->key)
                       : PyErr_Format(PyExc_TypeError, "%R: expected DTensor operands "
                                      "(and scalars)", x->key);
  c.key.op = op.sig != NULL ? op.sig->id : mt_ext_op_id(d, x->key);
  /* A reduction's local call is method(local, axis, *extra); its memo key holds
   * the reduced axes and keepdims. */
  PyObject *stack[16], *out = NULL;
  Py_ssize_t nextra = PyTuple_GET_SIZE(x->extra);
  int reduction = op.sig != NULL && op.sig->op.family == MT_OP_REDUCTION;
  /* A join's local call is local(*blocks, axis); its memo key holds the axis. */
  int join = op.sig != NULL && op.sig->join;
  if (join) {
    long ax = PyLong_Check(x->axis) ? PyLong_AsLong(x->axis) : -1;
    if (ax < 0 || ax >= MT_MAX_NDIM) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "execute: a join needs a normalised axis, got %R",
                     x->axis);
      goto done;
    }
    c.key.aux = ax, op.axes = 1u << ax;
  }
  if (reduction) {
    int ndim = (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(c.dt[0]->spec, 2));
    c.key.aux = mt_ext_reduction_aux(x->axis, ndim, x->keepdims, &op.axes);
    op.keepdims = x->keepdims;
    if (c.key.aux < 0) {
      PyErr_Format(PyExc_ValueError, "invalid axis %R", x->axis);
      goto done;
    }
    op.aux = PyTuple_Pack(2, x->axis, x->keepdims ? Py_True : Py_False);
    if (op.aux == NULL) goto done;
  }
  int first = reduction || join; /* the axis comes first */
  if (nextra + first > 16 || c.key.op < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "execute: too many arguments");
    goto done;
  }
  if (first) stack[0] = x->axis;
  for (Py_ssize_t i = 0; i < nextra; ++i) stack[first + i] = PyTuple_GET_ITEM(x->extra, i);
  op.extra = stack, op.nextra = nextra + first;
  op.kwnames = x->kwnames;
  out = mt_ext_execute(d, &op, &c, &PyTuple_GET_ITEM(x->ops, 0));
done:
  Py_XDECREF(op.aux);
  mt_ext_call_release(&c);
  return out;
}

/* The local function's extra arguments of execute(): `extra`, then the values of
 * `kwargs` (and keepdims=True with keepdims), whose names go to *kwnames (NULL:
 * none). New references; -1 with an exception. */
static int local_arguments(PyObject *extra, PyObject *kwargs, int keepdims, PyObject **out,
                           PyObject **kwnames) {
  *out = *kwnames = NULL;
  if (kwargs != Py_None && !PyDict_Check(kwargs)) {
    PyErr_SetString(PyExc_TypeError, "execute: kwargs must be a dict or None");
    return -1;
  }
  Py_ssize_t nkw = kwargs == Py_None ? 0 : PyDict_GET_SIZE(kwargs);
  PyObject *pos = PySequence_Tuple(extra);
  if (pos == NULL) return -1;
  if (nkw == 0 && !keepdims) {
    *out = pos;
    return 0;
  }
  PyObject *kw = nkw > 0 ? PyDict_Copy(kwargs) : PyDict_New();
  if (kw == NULL || (keepdims && PyDict_SetItemString(kw, "keepdims", Py_True) < 0)) {
    Py_XDECREF(kw);
    Py_DECREF(pos);
    return -1;
  }
  Py_ssize_t npos = PyTuple_GET_SIZE(pos);
  *out = PyTuple_New(npos + PyDict_GET_SIZE(kw));
  *kwnames = PyTuple_New(PyDict_GET_SIZE(kw));
  if (*out != NULL && *kwnames != NULL) {
    for (Py_ssize_t i = 0; i < npos; ++i)
      PyTuple_SET_ITEM(*out, i, Py_NewRef(PyTuple_GET_ITEM(pos, i)));
    PyObject *k, *v;
    Py_ssize_t at = 0;
    for (Py_ssize_t p = 0; PyDict_Next(kw, &p, &k, &v); ++at) {
      PyTuple_SET_ITEM(*out, npos + at, Py_NewRef(v));
      PyTuple_SET_ITEM(*kwnames, at, Py_NewRef(k));
    }
  }
  Py_DECREF(kw);
  Py_DECREF(pos);
  if (*out == NULL || *kwnames == NULL) {
    Py_CLEAR(*out);
    Py_CLEAR(*kwnames);
    return -1;
  }
  return 0;
}

/* execute(key, operands, build=None, local=None, *, extra=(), kwargs=None,
 * box=False, axis=None, keepdims=False): see the method table. */
static PyObject *execute(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames) {
  static const char *const names[] = {"key", "operands", "build", "local", "extra",
                                      "kwargs", "box", "axis", "keepdims"};
  enum { KEY, OPERANDS, BUILD, LOCAL, EXTRA, KWARGS, BOX, AXIS, KEEPDIMS, NARGS };
  PyObject *v[NARGS] = {NULL};
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs < 2 || nargs > LOCAL + 1)
    return PyErr_Format(PyExc_TypeError, "execute(key, operands, build=None, local=None, *, "
                        "extra=(), kwargs=None, box=False, axis=None, keepdims=False)");
  for (Py_ssize_t i = 0; i < nargs; ++i) v[i] = args[i];
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, k);
    int j = BUILD;
    while (j < NARGS && PyUnicode_CompareWithASCIIString(name, names[j]) != 0) ++j;
    if (j == NARGS || v[j] != NULL)
      return PyErr_Format(PyExc_TypeError, "execute: unexpected or repeated argument '%U'",
                          name);
    v[j] = args[nargs + k];
  }
  int box = v[BOX] != NULL ? PyObject_IsTrue(v[BOX]) : 0;
  int keepdims = v[KEEPDIMS] != NULL ? PyObject_IsTrue(v[KEEPDIMS]) : 0;
  if (box < 0 || keepdims < 0) return NULL;
  exec_args x = {v[KEY], NULL, v[BUILD] ? v[BUILD] : Py_None, v[LOCAL] ? v[LOCAL] : Py_None,
                 NULL, NULL, v[AXIS] ? v[AXIS] : Py_None, box, keepdims};
  PyObject *out = NULL;
  x.ops = PyTuple_CheckExact(v[OPERANDS]) ? Py_NewRef(v[OPERANDS])
                                          : PySequence_Tuple(v[OPERANDS]);
  if (x.ops == NULL) return NULL;
  if (v[EXTRA] == NULL && (v[KWARGS] == NULL || v[KWARGS] == Py_None) && !keepdims) {
    x.extra = PyTuple_New(0); /* CPython's one empty tuple */
  } else if (v[EXTRA] == NULL) {
    PyObject *none = PyTuple_New(0);
    if (none != NULL)
      local_arguments(none, v[KWARGS] ? v[KWARGS] : Py_None, keepdims, &x.extra, &x.kwnames);
    Py_XDECREF(none);
  } else {
    local_arguments(v[EXTRA], v[KWARGS] ? v[KWARGS] : Py_None, keepdims, &x.extra,
                    &x.kwnames);
  }
  if (x.extra == NULL) {
    Py_DECREF(x.ops);
    return NULL;
  }
  out = run_execute(mt_ext_dispatch_module(module), &x);
  Py_DECREF(x.ops);
  Py_DECREF(x.extra);
  Py_XDECREF(x.kwnames);
  return out;
}

/* outside_local(shape, dtype): see the method table. */
static PyObject *outside_local_of(PyObject *Py_UNUSED(module), PyObject *const *a,
                                  Py_ssize_t n) {
  PyArray_Descr *descr = NULL;
  Py_ssize_t ndim = n == 2 ? PyObject_Length(a[0]) : -1;
  if (ndim < 0 || !PyArray_DescrConverter(a[1], &descr))
    return PyErr_Occurred() ? NULL
                            : PyErr_Format(PyExc_TypeError, "outside_local(shape, dtype)");
  PyObject *out = outside_local(ndim > 0, descr);
  Py_DECREF(descr);
  return out;
}

PyMethodDef mt_ext_exec_methods[] = {
    {"outside_local", (PyCFunction)(void (*)(void))outside_local_of, METH_FASTCALL,
     "outside_local(shape, dtype) -> the local array of a rank outside the mesh for a "
     "result of global `shape` (a sequence): empty, and a 0-d zero for a 0-d result, "
     "as torch's op on an empty local gives (the executor's own). Local.\n\n"
     "Example: _C.outside_local((), numpy.float64).shape == ()"},
    {"execute", (PyCFunction)(void (*)(void))execute, METH_FASTCALL | METH_KEYWORDS,
     "execute(key, operands, build=None, local=None, *, extra=(), kwargs=None, "
     "box=False, axis=None, keepdims=False) -> DTensor (or a tuple of them): runs an "
     "operation through the executor. `key` is a registered ufunc or reduction (its "
     "dim map is the core's) or a hashable key naming the operation and its static "
     "arguments, whose dim map build() gives on a memo miss; `operands` are DTensors "
     "of one mesh and scalars (ndarrays under implicit replication). "
     "local(*local_operands, *extra, **kwargs) computes on this rank's arrays (the "
     "registered ufunc, or the reduction's ndarray method, called with `axis` first, "
     "when None); `box` appends this rank's output shape; `keepdims` passes "
     "keepdims=True and keys the reduction by it. Collective on the mesh when an "
     "input moves.\n\n"
     "Example: execute(('squeeze', (0,)), (a,), build, lambda x: np.squeeze(x, 0))"},
    {NULL, NULL, 0, NULL},
};
