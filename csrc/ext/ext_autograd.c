/* Autograd's node (mpitensor.autograd.Node) and mt_ext_record, the one way a
 * node is made: by the executor for the operations it runs (its node holds the
 * op's registered backward, the call's operands in `saved` and the rest of the
 * call in `aux`; the engine calls backward_fn(grad, node, output)), and through
 * _C.record for the differentiable functions written in Python
 * (autograd.Function, DTensor.from_local/to_local), whose node holds a closure,
 * backward_fn(grad), and no `saved`. */
#include "ext.h"

#include <stddef.h>
#include <structmember.h>

typedef struct mt_ext_node {
  PyObject_HEAD
  PyObject *name;
  PyObject *inputs;      /* per operand: itself when it needs a gradient, or None */
  PyObject *backward_fn; /* None once released (by a backward without retain_graph) */
  PyObject *saved;       /* the operands (C-recorded), or None: backward_fn(grad) */
  PyObject *aux;
} mt_ext_node;

static int node_traverse(PyObject *self, visitproc visit, void *arg) {
  mt_ext_node *n = (mt_ext_node *)self;
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(n->name);
  Py_VISIT(n->inputs);
  Py_VISIT(n->backward_fn);
  Py_VISIT(n->saved);
  Py_VISIT(n->aux);
  return 0;
}

static int node_clear(PyObject *self) {
  mt_ext_node *n = (mt_ext_node *)self;
  Py_CLEAR(n->name);
  Py_CLEAR(n->inputs);
  Py_CLEAR(n->backward_fn);
  Py_CLEAR(n->saved);
  Py_CLEAR(n->aux);
  return 0;
}

/* A long chain of operations frees node by node; the depth is bounded by the
 * trashcans of the tuples and DTensors between the nodes. */
static void node_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  node_clear(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static PyObject *node_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"name", "inputs", "backward_fn", "saved", "aux", NULL};
  PyObject *name, *inputs, *backward_fn, *saved = Py_None, *aux = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|OO:Node", kwlist, &name, &inputs,
                                   &backward_fn, &saved, &aux))
    return NULL;
  mt_ext_node *n = (mt_ext_node *)type->tp_alloc(type, 0);
  if (n == NULL) return NULL;
  n->name = Py_NewRef(name), n->inputs = Py_NewRef(inputs);
  n->backward_fn = Py_NewRef(backward_fn), n->saved = Py_NewRef(saved);
  n->aux = Py_NewRef(aux);
  return (PyObject *)n;
}

static PyObject *node_repr(PyObject *self) {
  return PyUnicode_FromFormat("<%S backward>", ((mt_ext_node *)self)->name);
}

static PyMemberDef node_members[] = {
    {"name", T_OBJECT, offsetof(mt_ext_node, name), 0, "The operation's name."},
    {"inputs", T_OBJECT, offsetof(mt_ext_node, inputs), 0,
     "One entry per operand: the DTensor when it needs a gradient, else None."},
    {"backward_fn", T_OBJECT, offsetof(mt_ext_node, backward_fn), 0,
     "backward_fn(grad) -> one gradient per input (None for none); with `saved` "
     "set, backward_fn(grad, node, output). None once the graph is freed."},
    {"saved", T_OBJECT, offsetof(mt_ext_node, saved), 0,
     "The operands the call was made with (an operand the forward all-reduced, as "
     "that reduced value), or None (a closure's node)."},
    {"aux", T_OBJECT, offsetof(mt_ext_node, aux), 0,
     "What else the call was made with (a reduction's (axis, keepdims), a "
     "function's keyword arguments), or None."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot node_slots[] = {
    {Py_tp_doc,
     "Node(name, inputs, backward_fn, saved=None, aux=None): what recorded one "
     "operation: its name, the inputs that need a gradient (None for the others, in "
     "operand order) and backward_fn(grad) -> one gradient per input (None for no "
     "gradient). A node the executor made holds its operands in `saved` instead of "
     "a closure; its backward_fn takes (grad, node, output). Local.\n\n"
     "Example: (w * 2).grad_fn.name == 'multiply'"},
    {Py_tp_new, node_new},
    {Py_tp_dealloc, node_dealloc},
    {Py_tp_traverse, node_traverse},
    {Py_tp_clear, node_clear},
    {Py_tp_repr, node_repr},
    {Py_tp_members, node_members},
    {0, NULL},
};

static PyType_Spec node_spec = {
    .name = "mpitensor.autograd.Node",
    .basicsize = sizeof(mt_ext_node),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = node_slots,
};

PyObject *mt_ext_no_backward(PyObject *key) {
  PyObject *name = mt_ext_op_label(key);
  if (name != NULL)
    PyErr_Format(PyExc_NotImplementedError,
                 "%U has no backward rule in mpitensor.autograd yet; run it under "
                 "mpitensor.no_grad() or on .detach()ed DTensors (the gradient through "
                 "it would be lost)", name);
  Py_XDECREF(name);
  return NULL;
}

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
  mt_ext_node *node = ins != NULL && saved != NULL
                          ? PyObject_GC_New(mt_ext_node, d->node_type) : NULL;
  if (node == NULL) {
    Py_XDECREF(ins);
    Py_XDECREF(own);
    Py_DECREF(out);
    return NULL;
  }
  node->name = Py_NewRef(name), node->inputs = ins;
  node->backward_fn = Py_NewRef(backward), node->saved = Py_NewRef(saved);
  node->aux = Py_NewRef(aux != NULL ? aux : Py_None);
  Py_XDECREF(own);
  PyObject_GC_Track(node);
  mt_ext_dtensor *o = (mt_ext_dtensor *)out;
  o->requires_grad = 1;
  Py_XSETREF(o->grad_fn, (PyObject *)node);
  return out;
}

/* record(name, out, inputs, backward_fn): see the method table. */
static PyObject *record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 4) return PyErr_Format(PyExc_TypeError, "record takes 4 arguments");
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
  if (inexact)
    res = mt_ext_record(d, args[0], args[3], res, items, n, Py_None, NULL);
  Py_DECREF(seq);
  return res;
}

PyMethodDef mt_ext_autograd_methods[] = {
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(name, out, inputs, backward_fn) -> out: makes `out` the result of a "
     "recorded operation when one of `inputs` requires grad (grad mode is the "
     "caller's check) and `out` is a floating-point or complex DTensor: "
     "out.grad_fn = Node(name, inputs needing a gradient (None for the others), "
     "backward_fn). Local.\n\n"
     "Example: record('double', y, (x,), lambda g: (g * 2,))"},
    {NULL, NULL, 0, NULL},
};

int mt_ext_autograd_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->node_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &node_spec, NULL);
  if (st->node_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "Node", (PyObject *)st->node_type);
}
