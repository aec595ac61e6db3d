/* Autograd's node (mpitensor.autograd.Node) and the recording of the calls the
 * C path takes while grad mode is on.
 *
 * A node made in Python holds a closure, backward_fn(grad). The C path records
 * without making one: its node holds the op's registered backward (one Python
 * function per op, given once by mpitensor.autograd._rules through register_grad),
 * the call's operands (`saved`) and what else the call was made with (`aux`: a
 * reduction's axis and keepdims); the engine calls backward_fn(grad, node, output).
 * So a recorded call costs the forward, two tuples and a node, and no Python. */
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
     "The operands a C-recorded call was made with, or None."},
    {"aux", T_OBJECT, offsetof(mt_ext_node, aux), 0,
     "What else a C-recorded call was made with (a reduction's (axis, keepdims)), "
     "or None."},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot node_slots[] = {
    {Py_tp_doc,
     "Node(name, inputs, backward_fn, saved=None, aux=None): what recorded one "
     "operation: its name, the inputs that need a gradient (None for the others, in "
     "operand order) and backward_fn(grad) -> one gradient per input (None for no "
     "gradient). An operation the C dispatch records holds its operands in `saved` "
     "instead of a closure; its backward_fn takes (grad, node, output). Local.\n\n"
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

/* Whether operand `o` needs a gradient (the Python entry's test: exactly a
 * DTensor, requiring grad). */
static inline int needs_grad(const mt_ext_dispatch *d, PyObject *o) {
  return Py_TYPE(o) == d->dtensor && ((const mt_ext_dtensor *)o)->requires_grad;
}

int mt_ext_any_needs_grad(const mt_ext_dispatch *d, PyObject *const *ops,
                          Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i)
    if (needs_grad(d, ops[i])) return 1;
  return 0;
}

int mt_ext_has_gradient(PyObject *out) {
  char kind = PyArray_DESCR((PyArrayObject *)((mt_ext_dtensor *)out)->local)->kind;
  return kind == 'f' || kind == 'c';
}

PyObject *mt_ext_record(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *out,
                        PyObject *const *ops, int n, PyObject *aux) {
  mt_ext_dtensor *o = (mt_ext_dtensor *)out;
  if (!mt_ext_has_gradient(out)) return out;
  PyObject *saved = PyTuple_New(n), *inputs = NULL;
  int all = 1;
  for (int i = 0; saved != NULL && i < n; ++i) {
    PyTuple_SET_ITEM(saved, i, Py_NewRef(ops[i]));
    all &= needs_grad(d, ops[i]);
  }
  if (saved != NULL && all) {
    inputs = Py_NewRef(saved);
  } else if (saved != NULL && (inputs = PyTuple_New(n)) != NULL) {
    for (int i = 0; i < n; ++i)
      PyTuple_SET_ITEM(inputs, i, Py_NewRef(needs_grad(d, ops[i]) ? ops[i] : Py_None));
  }
  mt_ext_node *node =
      inputs != NULL ? PyObject_GC_New(mt_ext_node, d->node_type) : NULL;
  if (node == NULL) {
    Py_XDECREF(saved);
    Py_XDECREF(inputs);
    Py_DECREF(out);
    return NULL;
  }
  node->name = Py_NewRef(sig->grad_name), node->inputs = inputs;
  node->backward_fn = Py_NewRef(sig->grad_backward), node->saved = saved;
  node->aux = Py_NewRef(aux != NULL ? aux : Py_None);
  PyObject_GC_Track(node);
  o->requires_grad = 1;
  Py_XSETREF(o->grad_fn, (PyObject *)node);
  return out;
}

/* A new Node of a Python-recorded operation (no saved operands). */
static PyObject *python_node(mt_ext_dispatch *d, PyObject *name, PyObject *inputs,
                             PyObject *backward_fn) {
  mt_ext_node *node = PyObject_GC_New(mt_ext_node, d->node_type);
  if (node == NULL) return NULL;
  node->name = Py_NewRef(name), node->inputs = Py_NewRef(inputs);
  node->backward_fn = Py_NewRef(backward_fn), node->saved = Py_NewRef(Py_None);
  node->aux = Py_NewRef(Py_None);
  PyObject_GC_Track(node);
  return (PyObject *)node;
}

/* record(name, out, inputs, backward_fn): see the method table. */
static PyObject *record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 4) return PyErr_Format(PyExc_TypeError, "record takes 4 arguments");
  PyObject *out = args[1];
  PyObject *seq = PySequence_Fast(args[2], "record: inputs must be a sequence");
  if (seq == NULL) return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject **items = PySequence_Fast_ITEMS(seq);
  PyObject *need = PyTuple_New(n);
  int any = 0;
  for (Py_ssize_t i = 0; need != NULL && i < n; ++i) {
    int g = needs_grad(d, items[i]);
    any |= g;
    PyTuple_SET_ITEM(need, i, Py_NewRef(g ? items[i] : Py_None));
  }
  Py_DECREF(seq);
  if (need == NULL) return NULL;
  mt_ext_dtensor *o = (mt_ext_dtensor *)out;
  PyObject *dtype = any && Py_TYPE(out) == d->dtensor && o->spec != NULL &&
                            PyTuple_Check(o->spec) && PyTuple_GET_SIZE(o->spec) > 3
                        ? PyTuple_GET_ITEM(o->spec, 3) : NULL;
  const PyArray_Descr *descr =
      dtype != NULL && PyArray_DescrCheck(dtype) ? (PyArray_Descr *)dtype : NULL;
  if (descr != NULL && (descr->kind == 'f' || descr->kind == 'c')) {
    PyObject *node = python_node(d, args[0], need, args[3]);
    if (node == NULL) {
      Py_DECREF(need);
      return NULL;
    }
    o->requires_grad = 1;
    Py_XSETREF(o->grad_fn, node);
  }
  Py_DECREF(need);
  return Py_NewRef(out);
}

/* needs_grad(args, kwargs): see the method table. */
static PyObject *needs_grad_py(PyObject *module, PyObject *const *args,
                               Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "needs_grad(args: tuple, kwargs: dict)");
  Py_ssize_t n = PyTuple_GET_SIZE(args[0]), pos = 0;
  PyObject *key, *a;
  for (Py_ssize_t i = 0;; ++i) {
    if (i < n) a = PyTuple_GET_ITEM(args[0], i);
    else if (!PyDict_Next(args[1], &pos, &key, &a)) break;
    if (needs_grad(d, a)) Py_RETURN_TRUE;
    if (PyTuple_CheckExact(a) || PyList_CheckExact(a)) {
      PyObject *seq = PySequence_Fast(a, "");
      if (seq == NULL) return NULL;
      int any = mt_ext_any_needs_grad(d, PySequence_Fast_ITEMS(seq),
                                      PySequence_Fast_GET_SIZE(seq));
      Py_DECREF(seq);
      if (any) Py_RETURN_TRUE;
    }
  }
  Py_RETURN_FALSE;
}

/* register_grad(func, name, backward): the C path records the calls of the
 * registered ufunc or reduction `func` under `name`, with backward(grad, node,
 * output) as their backward. */
static PyObject *register_grad(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *name, *backward;
  if (!PyArg_ParseTuple(args, "OUO:register_grad", &func, &name, &backward))
    return NULL;
  mt_ext_sig *sig = mt_ext_sig_of(d, func);
  if (sig == NULL) return PyErr_Format(PyExc_ValueError, "%R is not registered", func);
  if (!PyCallable_Check(backward))
    return PyErr_Format(PyExc_TypeError, "backward must be callable");
  Py_XSETREF(sig->grad_name, Py_NewRef(name));
  Py_XSETREF(sig->grad_backward, Py_NewRef(backward));
  Py_RETURN_NONE;
}

/* The ownership proof of the gradients the engine writes into or stores without
 * a copy (mpitensor.autograd._engine; docs/design.md, "Autograd"). A DTensor is
 * the caller's own when nothing outside the caller reaches it or its memory: it
 * is referenced only where the caller counts, and weakly nowhere; its local data
 * is an exact, writeable ndarray that only this DTensor references and that owns
 * its memory, or views the memory of an exact ndarray (NumPy points a view at the
 * array owning the memory) referenced by nothing but views that are the caller's
 * own and tile it: a reshape or transpose of a fresh array, or the parts of one
 * buffer handed out as several gradients (a reduce-scatter's output split per
 * parameter, a concatenation's gradient). Any other holder (a user's array, another DTensor
 * over the same array, another view, a memoryview) holds a reference that these
 * counts see; memory with another kind of base is never claimed. */
static int weakly_referenced(PyObject *o) {
  Py_ssize_t off = Py_TYPE(o)->tp_weaklistoffset;
  return off != 0 && *(PyObject **)((char *)o + off) != NULL;
}

static int owns_memory(PyArrayObject *a) {
  return PyArray_BASE(a) == NULL && PyArray_CHKFLAGS(a, NPY_ARRAY_OWNDATA);
}

/* What the proof needs of one candidate: its base when it is a view (NULL when it
 * owns its memory) and the byte range it spans. */
typedef struct {
  PyObject *base;
  char *lo, *hi;
  npy_intp nbytes;
} mt_claim;

/* Whether `o`, referenced `refs` times, passes the proof but for its base's
 * other views (then c->base is set). */
static int candidate(const mt_ext_dispatch *d, PyObject *o, Py_ssize_t refs, mt_claim *c) {
  if (Py_TYPE(o) != d->dtensor || Py_REFCNT(o) != refs || weakly_referenced(o))
    return 0;
  PyObject *local = ((mt_ext_dtensor *)o)->local;
  if (local == NULL || !PyArray_CheckExact(local) || Py_REFCNT(local) != 1 ||
      weakly_referenced(local) || !PyArray_ISWRITEABLE((PyArrayObject *)local))
    return 0;
  PyArrayObject *a = (PyArrayObject *)local;
  c->base = NULL;
  if (owns_memory(a)) return 1;
  PyObject *base = PyArray_BASE(a);
  if (base == NULL || !PyArray_CheckExact(base) || weakly_referenced(base) ||
      !owns_memory((PyArrayObject *)base))
    return 0;
  c->base = base;
  c->nbytes = PyArray_NBYTES(a);
  c->lo = c->hi = PyArray_BYTES(a);
  if (PyArray_SIZE(a) == 0) return 1;
  for (int k = 0; k < PyArray_NDIM(a); ++k) {
    npy_intp span = (PyArray_DIM(a, k) - 1) * PyArray_STRIDE(a, k);
    if (span < 0) c->lo += span;
    else c->hi += span;
  }
  c->hi += PyArray_ITEMSIZE(a);
  return 1;
}

/* ok[i] for each of the n objects, each referenced `refs` times by the caller:
 * whether it is the caller's own. */
static int prove(const mt_ext_dispatch *d, PyObject *const *objs, Py_ssize_t n,
                 Py_ssize_t refs, char *ok) {
  mt_claim *c = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(mt_claim));
  if (c == NULL) return PyErr_NoMemory(), -1;
  for (Py_ssize_t i = 0; i < n; ++i) ok[i] = (char)candidate(d, objs[i], refs, &c[i]);
  /* A base's views are all claimed or none: all its references must be views
   * that passed (a view that did not pass still counts), in disjoint ranges that
   * add up to the whole base, so a claimed part never keeps more memory alive
   * than it shows (a shard sliced from a replicated gradient is copied). */
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!ok[i] || c[i].base == NULL) continue;
    Py_ssize_t views = 0;
    npy_intp bytes = 0;
    int disjoint = 1;
    for (Py_ssize_t j = 0; j < n; ++j) {
      if (j < i && ok[j] && c[j].base == c[i].base) break; /* decided with j */
      if (!ok[j] || c[j].base != c[i].base) continue;
      ++views;
      bytes += c[j].nbytes;
      for (Py_ssize_t k = j + 1; k < n; ++k)
        if (ok[k] && c[k].base == c[i].base && c[k].lo < c[j].hi && c[j].lo < c[k].hi)
          disjoint = 0;
    }
    if (views == 0) continue; /* decided with an earlier view of the base */
    int mine = disjoint && Py_REFCNT(c[i].base) == views &&
               bytes == PyArray_NBYTES((PyArrayObject *)c[i].base);
    for (Py_ssize_t j = i; j < n; ++j)
      if (ok[j] && c[j].base == c[i].base) ok[j] = (char)(mine ? 2 : 0);
  }
  for (Py_ssize_t i = 0; i < n; ++i) ok[i] = (char)(ok[i] != 0);
  PyMem_Free(c);
  return 0;
}

/* call_owned(f, args): see the method table. */
static PyObject *call_owned(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 2 || !PyList_CheckExact(args[1]))
    return PyErr_Format(PyExc_TypeError, "call_owned(f, args: list)");
  PyObject *call_args = PyList_AsTuple(args[1]);
  if (call_args == NULL || PyList_SetSlice(args[1], 0, PY_SSIZE_T_MAX, NULL) < 0) {
    Py_XDECREF(call_args);
    return NULL;
  }
  PyObject *r = PyObject_Call(args[0], call_args, NULL);
  Py_DECREF(call_args); /* the caller's references to the arguments end here */
  if (r == NULL) return NULL;
  int seq = PyTuple_CheckExact(r) || PyList_CheckExact(r);
  /* The items of a sequence are the caller's when only it holds them and only
   * this call holds it. */
  Py_ssize_t n = seq ? PySequence_Fast_GET_SIZE(r) : 1;
  PyObject **items = seq ? PySequence_Fast_ITEMS(r) : &r;
  char *ok = PyMem_Calloc((size_t)(n > 0 ? n : 1), 1);
  PyObject *owned = NULL;
  if (ok == NULL) {
    PyErr_NoMemory();
  } else if ((seq && Py_REFCNT(r) != 1) || prove(d, items, n, 1, ok) == 0) {
    owned = seq ? PyTuple_New(n) : Py_NewRef(ok[0] ? Py_True : Py_False);
    for (Py_ssize_t i = 0; seq && owned != NULL && i < n; ++i)
      PyTuple_SET_ITEM(owned, i, Py_NewRef(ok[i] ? Py_True : Py_False));
  }
  PyMem_Free(ok);
  PyObject *pair = owned != NULL ? PyTuple_Pack(2, r, owned) : NULL;
  Py_DECREF(r);
  Py_XDECREF(owned);
  return pair;
}

/* owned_attr(obj, name): see the method table. */
static PyObject *owned_attr(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 2 || !PyUnicode_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "owned_attr(obj, name: str)");
  PyObject *v = PyObject_GetAttr(args[0], args[1]);
  if (v == NULL) return NULL;
  char mine = 0;
  if (prove(d, &v, 1, 2, &mine) < 0) { /* the attribute and this lookup */
    Py_DECREF(v);
    return NULL;
  }
  Py_DECREF(v);
  return Py_NewRef(mine ? Py_True : Py_False);
}

PyMethodDef mt_ext_autograd_methods[] = {
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(name, out, inputs, backward_fn) -> out: makes `out` the result of a "
     "recorded operation when one of `inputs` requires grad (grad mode is the "
     "caller's check) and `out` is a floating-point or complex DTensor: "
     "out.grad_fn = Node(name, inputs needing a gradient (None for the others), "
     "backward_fn). Local.\n\n"
     "Example: record('double', y, (x,), lambda g: (g * 2,))"},
    {"needs_grad", (PyCFunction)(void (*)(void))needs_grad_py, METH_FASTCALL,
     "needs_grad(args, kwargs) -> bool: whether an argument, or an item of a list or "
     "tuple argument, is a DTensor that requires grad. Local.\n\n"
     "Example: needs_grad((w, 2), {}) is True when w requires grad"},
    {"register_grad", register_grad, METH_VARARGS,
     "register_grad(func, name, backward): the C dispatch records the calls it takes "
     "of the registered ufunc or reduction `func` while grad mode is on, as a Node "
     "named `name` whose backward_fn is backward(grad, node, output). Local.\n\n"
     "Example: _C.register_grad(numpy.tanh, 'tanh', tanh_backward)"},
    {"call_owned", (PyCFunction)(void (*)(void))call_owned, METH_FASTCALL,
     "call_owned(f, args: list) -> (result, owned): calls f(*args) after emptying "
     "`args` (so the caller's references to the arguments end with the call), and "
     "says whether the caller now holds the only reference to the result, a "
     "DTensor, and to its local memory (see docs/design.md, Autograd); for a tuple "
     "or list result, a tuple of such bools, one per item (False for a non-DTensor). "
     "Local.\n\n"
     "Example: gs, owned = call_owned(node.backward_fn, [g])"},
    {"owned_attr", (PyCFunction)(void (*)(void))owned_attr, METH_FASTCALL,
     "owned_attr(obj, name) -> bool: whether the attribute `name` of `obj` is a "
     "DTensor that only that attribute references, with local memory nothing else "
     "reaches (call_owned's test). Local.\n\n"
     "Example: owned_attr(w, '_grad') after w.grad was stored by backward"},
    {NULL, NULL, 0, NULL},
};

int mt_ext_autograd_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->node_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &node_spec, NULL);
  if (st->node_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "Node", (PyObject *)st->node_type);
}
