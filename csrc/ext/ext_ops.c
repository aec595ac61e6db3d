/* What the executor knows of operations: the ground floor's types
 * (dispatch_init), the ufuncs and reductions whose dim maps the core builds
 * (register_ufunc, register_reduction), the backwards autograd records them, its
 * moves and its views with (register_grad), and op ids. */
#include "ext.h"

#include <string.h>

#define NAME(name, _) #name,
static const char *const ufunc_names[MT_EXT_NUFUNC] = {
    MT_EXT_BINARY(NAME) "power", MT_EXT_UNARY(NAME) MT_EXT_COMPARE(NAME)
        MT_EXT_POWER_PATHS(NAME)};
static const char *const reduction_names[MT_EXT_NREDUCTION] = {MT_EXT_REDUCTIONS(NAME)};
#undef NAME

int64_t mt_ext_op_id(mt_ext_dispatch *d, PyObject *key) {
  PyObject *id = PyDict_GetItemWithError(d->op_ids, key);
  if (id != NULL) return PyLong_AsLongLong(id);
  if (PyErr_Occurred()) return -1;
  /* Bounded like a mesh's memo, since a key without a decision there is of no use:
   * keys carry shapes (reshape, broadcast_to), so a program of ever new shapes
   * would otherwise grow it. Forgotten keys get new ids; their decisions miss. */
  if (PyDict_GET_SIZE(d->op_ids) >= d->decision_limit) PyDict_Clear(d->op_ids);
  id = PyLong_FromLongLong(d->next_op);
  if (id == NULL || PyDict_SetItem(d->op_ids, key, id) < 0) {
    Py_XDECREF(id);
    return -1;
  }
  Py_DECREF(id);
  return d->next_op++;
}

/* A new signature for `func`; NULL with an exception. */
static mt_ext_sig *add_sig(mt_ext_dispatch *d, PyObject *func, PyObject *label) {
  if (mt_ext_sig_of(d, func) != NULL) {
    PyErr_SetString(PyExc_ValueError, "this function is registered already");
    return NULL;
  }
  if (d->sigs == NULL || d->nsigs == d->sig_cap) {
    int cap = d->sig_cap ? 2 * d->sig_cap : 64;
    mt_ext_sig *sigs = PyMem_Realloc(d->sigs, (size_t)cap * sizeof *sigs);
    if (sigs == NULL) return (mt_ext_sig *)PyErr_NoMemory();
    d->sigs = sigs, d->sig_cap = cap;
  }
  int64_t id = mt_ext_op_id(d, func);
  if (id < 0) return NULL;
  mt_error err = {0};
  if (mt_ext_ok(mt_ptr_index_add(d->sig_index, func, d->nsigs, &err), &err) < 0) return NULL;
  mt_ext_sig *sig = &d->sigs[d->nsigs++];
  d->last_ufunc = NULL;
  memset(sig, 0, sizeof *sig);
  sig->func = Py_NewRef(func), sig->label = Py_NewRef(label), sig->id = id;
  return sig;
}

static int int_attr(PyObject *obj, const char *name) {
  PyObject *v = PyObject_GetAttrString(obj, name);
  long n = v == NULL ? -1 : PyLong_AsLong(v);
  Py_XDECREF(v);
  return (int)n;
}

/* register_ufunc(ufunc, family, kind, label) */
static PyObject *register_ufunc(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *ufunc, *label;
  int family, kind;
  if (!PyArg_ParseTuple(args, "OiiU:register_ufunc", &ufunc, &family, &kind, &label))
    return NULL;
  if ((family != MT_OP_ELEMENTWISE && family != MT_OP_MATMUL) || kind < 0 ||
      kind >= MT_ELEMENTWISE_COUNT)
    return PyErr_Format(PyExc_ValueError, "unknown ufunc family %d or kind %d", family, kind);
  int nin = int_attr(ufunc, "nin"), nout = int_attr(ufunc, "nout");
  if (nin < 1 || nout < 1) return NULL;
  mt_ext_sig *sig = add_sig(d, ufunc, label);
  if (sig == NULL) return NULL;
  sig->op.family = family, sig->op.kind = kind, sig->nin = nin, sig->nout = nout;
  sig->ufunc = 1;
  Py_RETURN_NONE;
}

/* register_elementwise(func, nin, label) */
static PyObject *register_elementwise(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *label;
  int nin;
  if (!PyArg_ParseTuple(args, "OiU:register_elementwise", &func, &nin, &label)) return NULL;
  if (!PyCallable_Check(func) || nin < 1 || nin > MT_MEMO_MAX_OPERANDS)
    return PyErr_Format(PyExc_ValueError, "register_elementwise: a callable of 1 to %d "
                        "operands", MT_MEMO_MAX_OPERANDS);
  mt_ext_sig *sig = add_sig(d, func, label);
  if (sig == NULL) return NULL;
  sig->op.family = MT_OP_ELEMENTWISE, sig->op.kind = MT_ELEMENTWISE_NONE;
  sig->nin = nin, sig->nout = 1;
  Py_RETURN_NONE;
}

/* register_cast(func, label) */
static PyObject *register_cast(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *label;
  if (!PyArg_ParseTuple(args, "OU:register_cast", &func, &label)) return NULL;
  mt_ext_sig *sig = add_sig(d, func, label);
  if (sig == NULL) return NULL;
  sig->op.family = MT_OP_ELEMENTWISE, sig->op.kind = MT_ELEMENTWISE_NONE;
  sig->nin = 1, sig->nout = 1, sig->cast = 1;
  Py_RETURN_NONE;
}

/* register_lanes(func, local, default_axis, label) */
static PyObject *register_lanes(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *local, *axis, *label;
  if (!PyArg_ParseTuple(args, "OOOU:register_lanes", &func, &local, &axis, &label)) return NULL;
  if (!PyCallable_Check(local) || (axis != Py_None && !PyLong_CheckExact(axis)))
    return PyErr_Format(PyExc_TypeError, "register_lanes(func, local: callable, "
                        "default_axis: int | None, label: str)");
  long default_axis = axis == Py_None ? MT_EXT_NO_AXIS : PyLong_AsLong(axis);
  if (default_axis == -1 && PyErr_Occurred()) return NULL;
  if (axis != Py_None && (default_axis < -NPY_MAXDIMS || default_axis >= NPY_MAXDIMS))
    return PyErr_Format(PyExc_ValueError, "register_lanes: no array has axis %ld",
                        default_axis);
  mt_ext_sig *sig = add_sig(d, func, label);
  if (sig == NULL) return NULL;
  sig->op.family = MT_OP_ELEMENTWISE, sig->op.kind = MT_ELEMENTWISE_NONE;
  sig->nin = 1, sig->nout = 1, sig->lanes = 1, sig->lanes_axis = (int)default_axis;
  sig->op.rule.reduce_op = -1; /* no stand-in reduction tells its dtype */
  Py_XSETREF(sig->method, Py_NewRef(local));
  Py_RETURN_NONE;
}

/* register_differences(func, local, label) */
static PyObject *register_differences(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *local, *label;
  if (!PyArg_ParseTuple(args, "OOU:register_differences", &func, &local, &label)) return NULL;
  if (!PyCallable_Check(local))
    return PyErr_Format(PyExc_TypeError,
                        "register_differences(func, local: callable, label: str)");
  mt_ext_sig *sig = add_sig(d, func, label);
  if (sig == NULL) return NULL;
  sig->op.family = MT_OP_LANES, sig->op.rule.reduce_op = -1;
  sig->nin = 1, sig->nout = 1, sig->differences = 1;
  Py_XSETREF(sig->method, Py_NewRef(local));
  Py_RETURN_NONE;
}

/* register_join(func, local, label[, new_axis]) */
static PyObject *register_join(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *local, *label;
  int new_axis = 0;
  if (!PyArg_ParseTuple(args, "OOU|p:register_join", &func, &local, &label, &new_axis))
    return NULL;
  if (!PyCallable_Check(local))
    return PyErr_Format(PyExc_TypeError,
                        "register_join(func, local: callable, label: str[, new_axis])");
  mt_ext_sig *sig = add_sig(d, func, label);
  if (sig == NULL) return NULL;
  sig->op.family = new_axis ? MT_OP_STACK : MT_OP_JOIN, sig->op.rule.reduce_op = -1;
  sig->nout = 1, sig->join = 1;
  Py_XSETREF(sig->method, Py_NewRef(local));
  Py_RETURN_NONE;
}

/* concatenate_blocks(*blocks, axis): see the method table. */
static PyObject *concatenate_blocks(PyObject *Py_UNUSED(module), PyObject *const *a,
                                    Py_ssize_t n) {
  if (n < 2) return PyErr_Format(PyExc_TypeError, "concatenate_blocks(*blocks, axis)");
  long axis = PyLong_AsLong(a[n - 1]);
  if (axis == -1 && PyErr_Occurred()) return NULL;
  if (axis < -NPY_MAXDIMS || axis >= NPY_MAXDIMS)
    return PyErr_Format(PyExc_ValueError, "concatenate_blocks: axis %ld", axis);
  PyObject *blocks = PyTuple_New(n - 1);
  for (Py_ssize_t i = 0; blocks != NULL && i < n - 1; ++i)
    PyTuple_SET_ITEM(blocks, i, Py_NewRef(a[i]));
  PyObject *out = blocks != NULL ? PyArray_Concatenate(blocks, (int)axis) : NULL;
  Py_XDECREF(blocks);
  return out;
}

/* stack_blocks(*blocks, axis): see the method table. */
static PyObject *stack_blocks(PyObject *Py_UNUSED(module), PyObject *const *a, Py_ssize_t n) {
  if (n < 2) return PyErr_Format(PyExc_TypeError, "stack_blocks(*blocks, axis)");
  long axis = PyLong_AsLong(a[n - 1]);
  if (axis == -1 && PyErr_Occurred()) return NULL;
  PyObject *blocks = PyTuple_New(n - 1);
  for (Py_ssize_t i = 0; blocks != NULL && i < n - 1; ++i) {
    if (!PyArray_Check(a[i])) {
      Py_DECREF(blocks);
      return PyErr_Format(PyExc_TypeError, "stack_blocks: block %zd is no ndarray", i);
    }
    PyArrayObject *b = (PyArrayObject *)a[i];
    int nd = PyArray_NDIM(b);
    if (axis < 0 || axis > nd || nd >= NPY_MAXDIMS) {
      Py_DECREF(blocks);
      return PyErr_Format(PyExc_ValueError, "stack_blocks: axis %ld of %d-dim blocks", axis,
                          nd);
    }
    /* The block with a dim of one at `axis`: a view, whatever its strides. */
    npy_intp dims[NPY_MAXDIMS];
    for (int k = 0, j = 0; k <= nd; ++k) dims[k] = k == axis ? 1 : PyArray_DIM(b, j++);
    PyArray_Dims shape = {dims, nd + 1};
    PyObject *view = PyArray_Newshape(b, &shape, NPY_CORDER);
    if (view == NULL) Py_CLEAR(blocks);
    else PyTuple_SET_ITEM(blocks, i, view);
  }
  PyObject *out = blocks != NULL ? PyArray_Concatenate(blocks, (int)axis) : NULL;
  Py_XDECREF(blocks);
  return out;
}

/* register_reduction(func, method, reduce_op, partial_rule, partial_ops, even_only,
 * logical, label): `method` names the DTensorBase reduction method it backs, or is None; the local
 * array is reduced by ndarray's method of that name (else `func`) until
 * set_reduction_local says otherwise. */
static PyObject *register_reduction(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *label;
  const char *method;
  mt_reduction_rule rule;
  unsigned int ops;
  if (!PyArg_ParseTuple(args, "OziiIppU:register_reduction", &func, &method, &rule.reduce_op,
                        &rule.partial_rule, &ops, &rule.even_only, &rule.logical, &label))
    return NULL;
  rule.partial_ops = ops;
  int m = 0;
  while (method != NULL && m < MT_EXT_NREDUCTION &&
         strcmp(reduction_names[m], method) != 0)
    ++m;
  if (m == MT_EXT_NREDUCTION) return PyErr_Format(PyExc_ValueError, "no method %s", method);
  mt_ext_sig *sig = add_sig(d, func, label);
  if (sig == NULL) return NULL;
  sig->op.family = MT_OP_REDUCTION, sig->op.rule = rule;
  if (method != NULL) {
    /* ndarray's own method, called as a function: a local array is an ndarray, so
     * this is what looking the name up on it would find. */
    sig->method = PyObject_GetAttr((PyObject *)&PyArray_Type, d->reduction_name[m]);
    if (sig->method == NULL) return NULL;
    sig->int_axis = strncmp(method, "arg", 3) == 0;
    d->reduction_sig[m] = (int)(sig - d->sigs);
  }
  Py_RETURN_NONE;
}

/* set_reduction_local(func, local, small, small_size): the registered reduction
 * `func`'s local array reduced by `local`, called as ndarray's method is, except
 * one of fewer than `small_size` elements, reduced by `small`: where `local` only
 * adds its own call around the same result. */
static PyObject *set_reduction_local(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *local, *small;
  Py_ssize_t small_size;
  if (!PyArg_ParseTuple(args, "OOOn:set_reduction_local", &func, &local, &small, &small_size))
    return NULL;
  mt_ext_sig *sig = mt_ext_sig_of(d, func);
  if (sig == NULL || sig->op.family != MT_OP_REDUCTION)
    return PyErr_Format(PyExc_ValueError, "%R is not a registered reduction", func);
  Py_XSETREF(sig->method, Py_NewRef(local));
  Py_XSETREF(sig->small, Py_NewRef(small));
  sig->small_size = small_size;
  Py_RETURN_NONE;
}

/* register_grad(func, name, backward): how the executor records what it runs
 * (mpitensor.autograd._engine.register_backward): the ufunc or reduction `func`
 * (node.saved: the operands; aux: a reduction's (axis, keepdims)), "redistribute"
 * (its moves) or "view" (the views it reads strided operands through). */
static PyObject *register_grad(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *func, *name, *backward;
  if (!PyArg_ParseTuple(args, "OUO:register_grad", &func, &name, &backward)) return NULL;
  if (!PyCallable_Check(backward))
    return PyErr_Format(PyExc_TypeError, "an operand backward is a callable, for every call");
  int move = PyUnicode_Check(func) && PyUnicode_CompareWithASCIIString(func, "redistribute") == 0;
  int view = PyUnicode_Check(func) && PyUnicode_CompareWithASCIIString(func, "view") == 0;
  if (move || view) {
    PyObject *entry = PyTuple_Pack(2, name, backward);
    if (entry == NULL) return NULL;
    if (move) Py_XSETREF(d->move_grad, entry);
    else Py_XSETREF(d->view_grad, entry);
    Py_RETURN_NONE;
  }
  mt_ext_sig *sig = mt_ext_sig_of(d, func);
  if (sig == NULL) return PyErr_Format(PyExc_ValueError, "%R is not registered", func);
  Py_XSETREF(sig->grad_name, Py_NewRef(name));
  Py_XSETREF(sig->grad_backward, Py_NewRef(backward));
  Py_RETURN_NONE;
}

/* The operators' ufuncs and NumPy's ufunc type. */
static int load_numpy(mt_ext_dispatch *d) {
  PyObject *np = PyImport_ImportModule("numpy");
  if (np == NULL) return -1;
  int rc = (d->ufunc_type = PyObject_GetAttrString(np, "ufunc")) ? 0 : -1;
  for (int i = 0; rc == 0 && i < MT_EXT_NUFUNC; ++i)
    rc = (d->ufunc[i] = PyObject_GetAttrString(np, ufunc_names[i])) ? 0 : -1;
  if (rc == 0) rc = (d->isnan = PyObject_GetAttrString(np, "isnan")) ? 0 : -1;
  if (rc == 0) rc = (d->where = PyObject_GetAttrString(np, "where")) ? 0 : -1;
  Py_DECREF(np);
  return rc;
}

/* The interned placements: Replicate(), Shard(0..), Partial(op) by reduce op; and
 * the maker of strided shards. */
static int load_placements(mt_ext_dispatch *d, PyObject *rep, PyObject *shards,
                           PyObject *partials, PyObject *strided) {
  if (!PyTuple_Check(shards) || PyTuple_GET_SIZE(shards) != MT_MAX_NDIM ||
      !PyTuple_Check(partials) || PyTuple_GET_SIZE(partials) != MT_REDUCE_COUNT) {
    PyErr_Format(PyExc_ValueError, "dispatch_init: %d shards and %d partials", MT_MAX_NDIM,
                 MT_REDUCE_COUNT);
    return -1;
  }
  if (!PyCallable_Check(strided)) {
    PyErr_SetString(PyExc_TypeError, "dispatch_init: strided shards are made by a callable");
    return -1;
  }
  d->replicate = Py_NewRef(rep), d->strided = Py_NewRef(strided);
  for (int i = 0; i < MT_MAX_NDIM; ++i) d->shard[i] = Py_NewRef(PyTuple_GET_ITEM(shards, i));
  for (int i = 0; i < MT_REDUCE_COUNT; ++i)
    d->partial[i] = Py_NewRef(PyTuple_GET_ITEM(partials, i));
  return 0;
}

/* dispatch_init(DTensor, DTensorSpec, Node, Request, replicate, shards, partials,
 * strided) */
static PyObject *dispatch_init(PyObject *module, PyObject *args) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  PyObject *dtensor, *spec, *node, *request, *deferred, *rep, *shards, *partials, *strided;
  if (!PyArg_ParseTuple(args, "O!O!O!O!O!OOOO:dispatch_init", &PyType_Type, &dtensor,
                        &PyType_Type, &spec, &PyType_Type, &node, &PyType_Type, &request,
                        &PyType_Type, &deferred, &rep, &shards, &partials, &strided))
    return NULL;
  if (!PyType_IsSubtype((PyTypeObject *)dtensor, d->dtensor_base))
    return PyErr_Format(PyExc_TypeError, "dispatch_init needs a DTensorBase subclass");
  if (d->dtensor != NULL)
    return PyErr_Format(PyExc_RuntimeError, "dispatch_init was called already");
  if (load_numpy(d) < 0 || load_placements(d, rep, shards, partials, strided) < 0) return NULL;
  d->spec = (PyTypeObject *)Py_NewRef(spec), d->node_type = (PyTypeObject *)Py_NewRef(node);
  d->request_type = (PyTypeObject *)Py_NewRef(request);
  d->deferred_type = (PyTypeObject *)Py_NewRef(deferred);
  d->dtensor = (PyTypeObject *)Py_NewRef(dtensor);
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

PyMethodDef mt_ext_ops_methods[] = {
    {"dispatch_init", dispatch_init, METH_VARARGS,
     "dispatch_init(DTensor, DTensorSpec, Node, Request, Deferred, replicate, shards, "
     "partials, strided): the ground floor's types and interned placements, once. "
     "Local."},
    {"register_ufunc", register_ufunc, METH_VARARGS,
     "register_ufunc(ufunc, family, kind, label): a ufunc's signature (FAMILY_ELEMENTWISE "
     "with an ELEMENTWISE_* kind, or FAMILY_MATMUL) and the name its calls are agreed "
     "by. Local."},
    {"register_elementwise", register_elementwise, METH_VARARGS,
     "register_elementwise(func, nin, label): a NumPy function of `nin` operands that "
     "the executor runs as an elementwise call whose Partials are reduced first "
     "(numpy.where, numpy.clip): executor_call takes its calls of DTensors and "
     "scalars. Local.\n\n"
     "Example: _C.register_elementwise(numpy.where, 3, 'numpy.where')"},
    {"register_cast", register_cast, METH_VARARGS,
     "register_cast(func, label): func(x, dtype, copy=True) casts x elementwise "
     "(numpy.ndarray.astype): executor_call takes its calls that move nothing. "
     "Local.\n\n"
     "Example: _C.register_cast(numpy.ndarray.astype, 'DTensor.astype')"},
    {"register_lanes", register_lanes, METH_VARARGS,
     "register_lanes(func, local, default_axis, label): func(x, axis) works along the "
     "lanes of one axis (numpy.sort, numpy.cumsum, numpy.flip), local(block, axis) on "
     "a block that holds whole lanes; default_axis the axis of a call that gives none "
     "(None: such a call is the entry's). executor_call takes a call of a DTensor and "
     "an int axis that no mesh dim shards, without Partials: each block's lanes are "
     "whole where they lie, so nothing moves and the placements stay. Local.\n\n"
     "Example: _C.register_lanes(numpy.cumsum, numpy.ndarray.cumsum, None, "
     "'numpy.cumsum')"},
    {"register_differences", register_differences, METH_VARARGS,
     "register_differences(func, local, label): func(x, n, axis) works along the lanes "
     "of one axis and gives n fewer elements there (numpy.diff), local(block, n, axis) "
     "on a block that holds whole lanes. executor_call takes a call of a DTensor "
     "without Partials, an int n of at least 1 and an int axis that no mesh dim "
     "shards, the core's mt_dimmap_lanes its dim map. Local.\n\n"
     "Example: _C.register_differences(numpy.diff, diff_block, 'numpy.diff')"},
    {"register_join", register_join, METH_VARARGS,
     "register_join(func, local, label[, new_axis]): func(arrays, axis) joins DTensors "
     "along an existing axis (numpy.concatenate), or with new_axis along a new one "
     "(numpy.stack); local(*blocks, axis) joins the blocks. The executor runs "
     "_C.execute(func, arrays, axis=axis) with the core's dim map (mt_dimmap_join: each "
     "input's axis whole, the output's as long as theirs together; mt_dimmap_stack: "
     "the new axis as long as the inputs are many), and executor_call takes a call of "
     "DTensors of one mesh, of the same other dims, joined along an int axis that no "
     "mesh dim shards, without Partials. Local.\n\n"
     "Example: _C.register_join(numpy.stack, _C.stack_blocks, 'numpy.stack', True)"},
    {"stack_blocks", (PyCFunction)(void (*)(void))stack_blocks, METH_FASTCALL,
     "stack_blocks(*blocks, axis) -> NumPy's stack of the ndarrays `blocks` along a new "
     "`axis` (normalised), through NumPy's C API (a stack's local function). Local.\n\n"
     "Example: _C.stack_blocks(a, b, 0)"},
    {"concatenate_blocks", (PyCFunction)(void (*)(void))concatenate_blocks, METH_FASTCALL,
     "concatenate_blocks(*blocks, axis) -> NumPy's concatenate of the ndarrays `blocks` "
     "along `axis`, through NumPy's C API (a join's local function). Local.\n\n"
     "Example: _C.concatenate_blocks(a, b, 1)"},
    {"register_reduction", register_reduction, METH_VARARGS,
     "register_reduction(func, method, reduce_op, partial_rule, partial_ops, even_only, "
     "logical, label): a reduction's signature, the DTensor method it backs (reduce_op "
     "-1: the reduced dims are merged by its Python entry; logical: all or any, whose "
     "bool results combine by reduce_op whatever the input) and the name its calls are "
     "agreed by. Local.\n\n"
     "Example: _C.register_reduction(numpy.any, 'any', R_MAX, P_NONE, 0, False, True, "
     "'numpy.any')"},
    {"set_reduction_local", set_reduction_local, METH_VARARGS,
     "set_reduction_local(func, local, small, small_size): the registered reduction's "
     "local arrays reduced by `local` in place of ndarray's method, those of fewer "
     "than `small_size` elements by `small`. Local.\n\n"
     "Example: _C.set_reduction_local(numpy.sum, local_sum, numpy.ndarray.sum, 8192)"},
    {"register_grad", register_grad, METH_VARARGS,
     "register_grad(func, name, backward): how the executor records what it runs: "
     "the registered ufunc or reduction `func`, 'redistribute' or 'view' "
     "(mpitensor.autograd._engine.register_backward says how). Local.\n\n"
     "Example: _C.register_grad(numpy.tanh, 'tanh', tanh_backward)"},
    {"set_cache_limits", set_cache_limits, METH_VARARGS,
     "set_cache_limits(decisions, plans, layouts): bounds of meshes made later. Local."},
    {NULL, NULL, 0, NULL},
};

static int intern_names(mt_ext_dispatch *d) {
  for (int m = 0; m < MT_EXT_NREDUCTION; ++m) {
    d->reduction_name[m] = PyUnicode_InternFromString(reduction_names[m]);
    d->reduction_sig[m] = -1;
    if (d->reduction_name[m] == NULL) return -1;
  }
#define TEXT(name, text) text,
  static const char *const texts[MT_S_COUNT] = {MT_EXT_STRINGS(TEXT)};
#undef TEXT
  for (int i = 0; i < MT_S_COUNT; ++i)
    if ((d->str[i] = PyUnicode_InternFromString(texts[i])) == NULL) return -1;
  d->kw_keepdims = PyTuple_Pack(1, d->str[MT_S_KEEPDIMS]);
  d->kw_out = PyTuple_Pack(1, d->str[MT_S_OUT]);
  d->kw_dtype = PyTuple_Pack(1, d->str[MT_S_DTYPE]);
  return d->kw_keepdims == NULL || d->kw_out == NULL || d->kw_dtype == NULL ? -1 : 0;
}

int mt_ext_ops_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  mt_ext_dispatch *d = st->dispatch = PyMem_Calloc(1, sizeof *d);
  if (d == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  d->module = module, d->next_op = 1;
  d->redistribute_op = d->next_op++;
  d->decision_limit = 4096, d->plan_limit = 256, d->layout_limit = 4096;
  d->op_ids = PyDict_New();
  d->hooks = PyDict_New();
  d->call_names = PyDict_New();
  if (d->op_ids == NULL || d->hooks == NULL || d->call_names == NULL || intern_names(d) < 0 ||
      PyModule_AddObjectRef(module, "call_names", d->call_names) < 0)
    return -1;
  mt_error err = {0};
  return mt_ext_ok(mt_ptr_index_create(&d->sig_index, &err), &err);
}

/* Every object the state holds, for traverse and clear. */
#define MT_EXT_OPS_OBJECTS(X, d)                                                      \
  X(d->dtensor); X(d->spec); X(d->node_type); X(d->request_type); X(d->move_grad);    \
  X(d->deferred_type); X(d->deferred); X(d->isnan); X(d->where); X(d->hooks);        \
  X(d->view_grad); X(d->ufunc_type); X(d->replicate); X(d->op_ids); X(d->strided);    \
  X(d->kw_keepdims); X(d->kw_out); X(d->kw_dtype); X(d->errstate_var);              \
  X(d->errstate_seen[0]); X(d->errstate_seen[1]); X(d->call_names);                  \
  for (int i_ = 0; i_ < MT_S_COUNT; ++i_) X(d->str[i_]);                              \
  for (int i_ = 0; i_ < MT_MAX_NDIM; ++i_) X(d->shard[i_]);                           \
  for (int i_ = 0; i_ < MT_REDUCE_COUNT; ++i_) X(d->partial[i_]);                     \
  for (int i_ = 0; i_ < MT_EXT_NUFUNC; ++i_) X(d->ufunc[i_]);                         \
  for (int i_ = 0; i_ < MT_EXT_NREDUCTION; ++i_) X(d->reduction_name[i_]);            \
  for (int i_ = 0; i_ < d->nsigs; ++i_) {                                             \
    X(d->sigs[i_].func); X(d->sigs[i_].label); X(d->sigs[i_].method);                 \
    X(d->sigs[i_].small);                                                             \
    X(d->sigs[i_].grad_name); X(d->sigs[i_].grad_backward);                           \
  }

int mt_ext_ops_traverse(mt_ext_state *st, visitproc visit, void *arg) {
  mt_ext_dispatch *d = st->dispatch;
  if (d == NULL) return 0;
  MT_EXT_OPS_OBJECTS(Py_VISIT, d);
  return 0;
}

void mt_ext_ops_clear(mt_ext_state *st) {
  mt_ext_dispatch *d = st->dispatch;
  if (d == NULL) return;
  mt_ext_dtensor_free_all(d);
  MT_EXT_OPS_OBJECTS(Py_CLEAR, d);
  d->nsigs = 0, d->last_ufunc = NULL;
  if (d->sig_index != NULL) mt_ptr_index_clear(d->sig_index);
}

void mt_ext_ops_free(mt_ext_state *st) {
  mt_ext_ops_clear(st);
  if (st->dispatch != NULL) {
    PyMem_Free(st->dispatch->sigs);
    mt_ptr_index_destroy(st->dispatch->sig_index);
  }
  PyMem_Free(st->dispatch);
  st->dispatch = NULL;
}
