/* mt_ext_record, the one way a node (mpitensor._node.Node) is made: by the
 * executor for the operations it runs (its node holds the op's registered
 * backward, the call's operands in `saved` and the rest of the call in `aux`), and
 * through _C.record for what is written in Python: the registered functions the
 * Python door records (their positional arguments in `saved`, their keywords in
 * `aux`) and autograd.Function and DTensor.from_local/to_local, whose node holds a
 * closure and no `saved`. The engine calls every node's backward_fn(grad, node,
 * output). */
#include "ext.h"

PyObject *mt_ext_record(mt_ext_dispatch *d, PyObject *name, PyObject *backward,
                        PyObject *out, PyObject *const *inputs, Py_ssize_t n,
                        PyObject *saved, PyObject *aux) {
  if (Py_TYPE(out) != d->dtensor) {
    Py_DECREF(out);
    return PyErr_Format(PyExc_NotImplementedError, "%S records one DTensor output; it "
                        "gave several (the gradient would be lost)", name);
  }
  PyObject *ins = PyTuple_New(n), *own = NULL;
  for (Py_ssize_t i = 0; ins != NULL && i < n; ++i)
    PyTuple_SET_ITEM(ins, i, Py_NewRef(mt_ext_needs_grad(d, inputs[i]) ? inputs[i] : Py_None));
  if (ins != NULL && saved == NULL && (own = PyTuple_New(n)) != NULL) {
    for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(own, i, Py_NewRef(inputs[i]));
    saved = own;
  }
  /* The node's slots are set as attributes: Node defines no __setattr__, so no
   * Python code runs. */
  PyObject *node = ins != NULL && saved != NULL ? d->node_type->tp_alloc(d->node_type, 0)
                                                : NULL;
  PyObject *values[5] = {name, ins, backward, saved, aux != NULL ? aux : Py_None};
  for (int i = 0; node != NULL && i < 5; ++i)
    if (PyObject_GenericSetAttr(node, d->str[MT_S_NODE + i], values[i]) < 0) Py_CLEAR(node);
  Py_XDECREF(ins);
  Py_XDECREF(own);
  if (node == NULL) {
    Py_DECREF(out);
    return NULL;
  }
  mt_ext_dtensor *o = (mt_ext_dtensor *)out;
  o->requires_grad = 1;
  Py_XSETREF(o->grad_fn, node);
  return out;
}

/* record(name, out, inputs, backward_fn, always=False, saved=None, aux=None): see
 * the method table. */
static PyObject *record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs < 4 || nargs > 7)
    return PyErr_Format(PyExc_TypeError, "record takes 4 to 7 arguments");
  int always = nargs >= 5 ? PyObject_IsTrue(args[4]) : 0;
  PyObject *saved = nargs >= 6 ? args[5] : Py_None, *aux = nargs == 7 ? args[6] : NULL;
  if (always < 0) return NULL;
  PyObject *out = args[1];
  PyObject *seq = PySequence_Fast(args[2], "record: inputs must be a sequence");
  if (seq == NULL) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject *const *items = PySequence_Fast_ITEMS(seq);
  int any = 0;
  for (Py_ssize_t i = 0; i < n; ++i) any |= mt_ext_needs_grad(d, items[i]);
  const mt_ext_dtensor *o = (const mt_ext_dtensor *)out;
  PyObject *dtype = any && Py_TYPE(out) == d->dtensor && PyTuple_Check(o->spec)
                        ? PyTuple_GET_ITEM(o->spec, 3) : NULL;
  int inexact = dtype != NULL && PyArray_DescrCheck(dtype) &&
                mt_ext_inexact((PyArray_Descr *)dtype);
  PyObject *res = Py_NewRef(out);
  if (inexact || always)
    res = mt_ext_record(d, args[0], args[3], res, items, n, saved, aux);
  Py_DECREF(seq);
  return res;
}

PyMethodDef mt_ext_autograd_methods[] = {
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(name, out, inputs, backward_fn, always=False, saved=None, aux=None) -> "
     "out: makes `out` the "
     "result of a recorded operation when one of `inputs` requires grad (grad mode "
     "is the caller's check) and `out` is a floating-point or complex DTensor, or "
     "`always` (a node run for what its backward does, as activation "
     "checkpointing's recomputation): "
     "out.grad_fn = Node(name, inputs needing a gradient (None for the others), "
     "backward_fn, saved, aux), which the engine calls as backward_fn(grad, node, "
     "out). "
     "Local.\n\n"
     "Example: record('double', y, (x,), lambda g, node, out: (g * 2,))"},
    {NULL, NULL, 0, NULL},
};
