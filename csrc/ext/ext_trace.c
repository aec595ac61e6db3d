/* The executor's "ran" event: what an operation's local function got and gave,
 * for DebugMode's trace (mpitensor._trace.ran). Its arguments are built only
 * while the hook is installed, which is while a DebugMode is entered. */
#include "ext_trace.h"

/* Tensor input t's placements as the local function gets it: its plan's last
 * ones, with Partial(sum) on the mesh dims it is partitioned over (torch's
 * Replicate -> Partial(sum), which mpitensor makes with zeros off coordinate 0). */
static PyObject *target(mt_ext_dispatch *d, const mt_ext_call *c, const mt_decision *dec,
                        int t) {
  mt_layout_key given, key;
  if (mt_ext_spec_key(d, c->mb, c->dt[t]->spec, &given) < 0) return NULL;
  mt_decision_moved_key(dec, t, &given, &key);
  for (int m = 0; m < key.mesh_ndim; ++m)
    if (dec->partition[t] >> m & 1u) {
      key.placements[m].kind = MT_PLACEMENT_PARTIAL;
      key.placements[m].reduce_op = MT_REDUCE_SUM;
    }
  return mt_ext_placement_objects(d, key.placements, key.mesh_ndim);
}

/* Each tensor input's target placements, or None without a decision. */
static PyObject *targets(mt_ext_dispatch *d, const mt_ext_call *c, const mt_decision *dec) {
  if (dec == NULL) return Py_NewRef(Py_None);
  PyObject *out = PyTuple_New(c->ntensors);
  for (int t = 0; out != NULL && t < c->ntensors; ++t) {
    PyObject *p = target(d, c, dec, t);
    if (p == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, t, p);
  }
  return out;
}

/* The operands as the call gave them, a DTensor made of an ndarray in its place. */
static PyObject *operands(const mt_ext_call *c, PyObject *const *ops) {
  PyObject *out = PyTuple_New(c->noperands);
  for (int i = 0, t = 0; out != NULL && i < c->noperands; ++i)
    PyTuple_SET_ITEM(out, i, Py_NewRef(c->tensors >> i & 1u ? (PyObject *)c->dt[t++] : ops[i]));
  return out;
}

/* The local operands, then the op's positional extra arguments. */
static PyObject *local_call(const mt_ext_op *op, const mt_ext_call *c,
                            PyObject *const *locals) {
  Py_ssize_t nkw = op->kwnames != NULL ? PyTuple_GET_SIZE(op->kwnames) : 0;
  Py_ssize_t npos = op->nextra - nkw;
  PyObject *out = PyTuple_New(c->noperands + npos);
  for (Py_ssize_t i = 0; out != NULL && i < c->noperands + npos; ++i)
    PyTuple_SET_ITEM(out, i, Py_NewRef(i < c->noperands ? locals[i] : op->extra[i - c->noperands]));
  return out;
}

int mt_ext_ran_event(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                     const mt_decision *dec, PyObject *const *ops, PyObject *const *locals,
                     PyObject *out) {
  PyObject *fn = PyDict_GetItemString(d->hooks, "ran");
  if (fn == NULL) return 0;
  Py_INCREF(fn); /* the hook may remove itself */
  PyObject *args[5] = {op->key, operands(c, ops), targets(d, c, dec), local_call(op, c, locals),
                       out};
  PyObject *r = args[1] && args[2] && args[3]
                    ? mt_ext_hook(d, MT_HOOK_EVENT, fn, args, 5, NULL)
                    : NULL;
  for (int i = 1; i < 4; ++i) Py_XDECREF(args[i]);
  Py_DECREF(fn);
  Py_XDECREF(r);
  return r == NULL ? -1 : 0;
}
