/* The Python entry's side of the dispatch: _C.decide_ufunc, decide_reduction and
 * decide (Python-driven operations with their own dim maps), memo_lookup and
 * memo_insert (a user's register_sharding rule), op_id, and _C.Decision, the
 * decision as named fields. They use the memo of the C path (ext_decide.c), so an
 * operation decided by either is decided for both. */
#include "ext.h"
#include "ext_call.h"

#include <stddef.h>

#include "mpitensor/comm/mesh.h"
#include <string.h>
#include <structmember.h>

typedef struct {
  PyObject_HEAD
  PyObject *plans;          /* per DTensor input: a _C.Plan to run first, or None */
  PyObject *zeroed;         /* per DTensor input: this rank uses zeros (partitioned) */
  PyObject *out_placements; /* tuple of Placements */
  PyObject *out_shape;      /* tuple, or None while a user rule's output is unknown */
  PyObject *out_stride;     /* contiguous strides of out_shape, or None */
  PyObject *out_local_shape; /* this rank's box of the output, or None */
  char local_only;          /* no input moves */
  char cached;              /* found in the memo */
} DecisionObject;

static PyObject *plans_tuple(PyObject *module, const mt_decision *dec, char *local_only) {
  PyObject *plans = PyTuple_New(dec->ninputs);
  int none = 1;
  for (int i = 0; plans != NULL && i < dec->ninputs; ++i) {
    PyObject *p = dec->plan[i] == NULL ? Py_NewRef(Py_None)
                                       : mt_ext_plan_wrap(module, dec->plan[i]);
    if (p == NULL) Py_CLEAR(plans);
    else PyTuple_SET_ITEM(plans, i, p);
    none = none && dec->plan[i] == NULL;
  }
  *local_only = none ? 1 : 0;
  return plans;
}

/* Per input, whether this rank replaces it by zeros (mt_decision's partition). */
static PyObject *zeroed_tuple(const mt_ext_mesh_base *mb, const mt_decision *dec) {
  mt_mesh *mesh = mb->member ? mt_ext_mesh_get_unchecked(mb->handle) : NULL;
  int64_t coord[MT_MAX_MESH_NDIM];
  int have = mesh != NULL && mt_mesh_coordinate(mesh, coord);
  PyObject *t = PyTuple_New(dec->ninputs);
  for (int i = 0; t != NULL && i < dec->ninputs; ++i) {
    int z = 0;
    for (int m = 0; have && m < dec->mesh_ndim; ++m)
      z |= (dec->partition[i] >> m & 1u) && coord[m] != 0;
    PyTuple_SET_ITEM(t, i, PyBool_FromLong(z));
  }
  return t;
}

/* This rank's box of the output, or None (not a member, shape unknown). */
static PyObject *local_shape(const mt_ext_mesh_base *mb, const mt_decision *dec) {
  mt_mesh *mesh = mb->member ? mt_ext_mesh_get_unchecked(mb->handle) : NULL;
  int64_t coord[MT_MAX_MESH_NDIM];
  mt_layout l;
  mt_box box;
  if (mesh == NULL || dec->out_ndim < 0 || !mt_mesh_coordinate(mesh, coord) ||
      mt_layout_init(&l, dec->out_ndim, dec->out_shape, mb->mesh_ndim, mb->mesh_shape,
                     dec->out_placements, NULL) != MT_OK ||
      mt_layout_local_box(&l, coord, &box, NULL) != MT_OK)
    return Py_NewRef(Py_None);
  return mt_ext_int_tuple(box.shape, box.ndim);
}

static PyObject *decision_object(mt_ext_dispatch *d, const mt_ext_mesh_base *mb,
                                 const mt_decision *dec, int cached) {
  PyTypeObject *tp = mt_ext_state_of(d->module)->decision_type;
  DecisionObject *o = (DecisionObject *)tp->tp_alloc(tp, 0);
  if (o == NULL) return NULL;
  o->cached = (char)cached;
  o->plans = plans_tuple(d->module, dec, &o->local_only);
  o->zeroed = zeroed_tuple(mb, dec);
  o->out_placements = mt_ext_placement_objects(d, dec->out_placements, dec->mesh_ndim);
  if (dec->out_ndim >= 0) {
    int64_t stride[MT_MAX_NDIM];
    mt_layout_contiguous_strides(dec->out_ndim, dec->out_shape, stride);
    o->out_shape = mt_ext_int_tuple(dec->out_shape, dec->out_ndim);
    o->out_stride = mt_ext_int_tuple(stride, dec->out_ndim);
  } else {
    o->out_shape = Py_NewRef(Py_None), o->out_stride = Py_NewRef(Py_None);
  }
  o->out_local_shape = local_shape(mb, dec);
  if (!o->plans || !o->zeroed || !o->out_placements || !o->out_shape || !o->out_stride ||
      !o->out_local_shape)
    Py_CLEAR(o);
  return (PyObject *)o;
}

/* The call of `operands` (a sequence) for the Python entry. */
static int gather_seq(mt_ext_dispatch *d, PyObject *operands, mt_ext_call *c) {
  PyObject *fast = PySequence_Fast(operands, "operands must be a sequence");
  if (fast == NULL) return -1;
  int rc = PySequence_Fast_GET_SIZE(fast) > MT_MEMO_MAX_OPERANDS
               ? (PyErr_Format(PyExc_TypeError, "at most %d operands",
                               MT_MEMO_MAX_OPERANDS), -1)
               : mt_ext_call_gather(d, PySequence_Fast_ITEMS(fast),
                                    (int)PySequence_Fast_GET_SIZE(fast), 0, c);
  Py_DECREF(fast);
  return rc;
}

/* decide_ufunc(ufunc, operands) -> Decision. A ufunc nobody registered is an
 * elementwise op that reduces every Partial first. */
static PyObject *decide_ufunc(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "decide_ufunc(ufunc, operands)");
  mt_ext_sig *sig = mt_ext_sig_of(d, args[0]);
  mt_ext_sig plain;
  memset(&plain, 0, sizeof plain);
  plain.func = args[0], plain.op.family = MT_OP_ELEMENTWISE;
  plain.op.kind = MT_ELEMENTWISE_NONE;
  if (sig == NULL || sig->op.family == MT_OP_REDUCTION) {
    plain.id = mt_ext_op_id(d, args[0]);
    if (plain.id < 0) return NULL;
    sig = &plain;
  }
  mt_ext_call c;
  if (gather_seq(d, args[1], &c) < 0) return NULL;
  c.key.op = sig->id;
  int hit;
  const mt_decision *dec = mt_ext_call_decide(d, sig, &c, 0, 0, &hit);
  return dec == NULL ? NULL : decision_object(d, c.mb, dec, hit);
}

/* decide_reduction(func, dtensor, axis, keepdims) -> Decision. */
static PyObject *decide_reduction(PyObject *module, PyObject *const *args,
                                  Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 4) return PyErr_Format(PyExc_TypeError,
                                      "decide_reduction(func, dtensor, axis, keepdims)");
  mt_ext_sig *sig = mt_ext_sig_of(d, args[0]);
  if (sig == NULL || sig->op.family != MT_OP_REDUCTION)
    return PyErr_Format(PyExc_TypeError, "%R is not a registered reduction", args[0]);
  int keepdims = PyObject_IsTrue(args[3]);
  mt_ext_call c;
  if (keepdims < 0 || mt_ext_call_gather(d, &args[1], 1, 0, &c) < 0) return NULL;
  uint32_t axes;
  int ndim = (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(c.dt[0]->spec, 2));
  c.key.op = sig->id;
  c.key.aux = mt_ext_reduction_aux(args[2], ndim, keepdims, &axes);
  if (c.key.aux < 0) return PyErr_Format(PyExc_ValueError, "invalid axis %R", args[2]);
  int hit;
  const mt_decision *dec = mt_ext_call_decide(d, sig, &c, axes, keepdims, &hit);
  return dec == NULL ? NULL : decision_object(d, c.mb, dec, hit);
}

static int64_t op_of(PyObject *obj) {
  int64_t op = PyLong_AsLongLong(obj);
  if (op < 1 && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "op ids are >= 1");
  return op;
}

/* decide(op, operands, build) -> Decision; build() gives the _C.DimMap on a miss. */
static PyObject *decide(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "decide(op, operands, build)");
  mt_ext_call c;
  if (gather_seq(d, args[1], &c) < 0 || (c.key.op = op_of(args[0])) < 1) return NULL;
  const mt_decision *dec = mt_memo_find(c.mb->memo, &c.key);
  if (dec != NULL) return decision_object(d, c.mb, dec, 1);
  PyObject *map = PyObject_CallNoArgs(args[2]);
  const mt_dimmap *m = map == NULL ? NULL : mt_ext_dimmap_get(module, map);
  mt_ext_inputs in;
  if (m != NULL && mt_ext_call_inputs(d, &c, &in) == 0)
    dec = mt_ext_decide_map(c.mb, &c.key, m, &in, NULL);
  Py_XDECREF(map);
  return dec == NULL ? NULL : decision_object(d, c.mb, dec, 0);
}

/* memo_lookup(op, operands) -> Decision or None (counted as a hit or a miss). */
static PyObject *memo_lookup(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "memo_lookup(op, operands)");
  mt_ext_call c;
  if (gather_seq(d, args[1], &c) < 0 || (c.key.op = op_of(args[0])) < 1) return NULL;
  const mt_decision *dec = mt_memo_find(c.mb->memo, &c.key);
  if (dec == NULL) Py_RETURN_NONE;
  return decision_object(d, c.mb, dec, 1);
}

/* Placements (a sequence of Placement objects, one per mesh dim) into p. */
static int placements_of(mt_ext_dispatch *d, PyObject *seq, int n, mt_placement *p) {
  PyObject *fast = PySequence_Fast(seq, "placements must be a sequence");
  if (fast == NULL) return -1;
  int rc = PySequence_Fast_GET_SIZE(fast) == n ? 0 : -1;
  if (rc < 0) PyErr_Format(PyExc_ValueError, "%d placements are needed", n);
  for (int m = 0; rc == 0 && m < n; ++m)
    rc = mt_ext_placement_code(d, PySequence_Fast_GET_ITEM(fast, m), &p[m]);
  Py_DECREF(fast);
  return rc;
}

/* The decision a caller made itself: targets per DTensor input, the output. */
static int caller_decision(mt_ext_dispatch *d, const mt_ext_call *c, PyObject *targets,
                           PyObject *out_pl, PyObject *out_shape, mt_placement (*to)[MT_MAX_MESH_NDIM],
                           mt_decision *dec) {
  memset(dec, 0, sizeof *dec);
  dec->ninputs = c->ntensors, dec->mesh_ndim = c->mb->mesh_ndim, dec->out_ndim = -1;
  PyObject *fast = PySequence_Fast(targets, "targets must be a sequence");
  if (fast == NULL) return -1;
  int rc = PySequence_Fast_GET_SIZE(fast) == c->ntensors ? 0 : -1;
  if (rc < 0) PyErr_SetString(PyExc_ValueError, "one target per DTensor input");
  for (int t = 0; rc == 0 && t < c->ntensors; ++t)
    rc = placements_of(d, PySequence_Fast_GET_ITEM(fast, t), dec->mesh_ndim, to[t]);
  Py_DECREF(fast);
  if (rc == 0) rc = placements_of(d, out_pl, dec->mesh_ndim, dec->out_placements);
  if (rc == 0 && out_shape != Py_None)
    rc = mt_ext_int64s(out_shape, dec->out_shape, MT_MAX_NDIM, &dec->out_ndim, "out_shape");
  return rc;
}

/* memo_insert(op, operands, targets, out_placements, out_shape) -> Decision: a
 * decision a user's rule made (out_shape None until its first run tells). */
static PyObject *memo_insert(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 5)
    return PyErr_Format(PyExc_TypeError,
                        "memo_insert(op, operands, targets, out_placements, out_shape)");
  mt_ext_call c;
  mt_ext_inputs in;
  mt_placement to[MT_PROP_MAX_INPUTS][MT_MAX_MESH_NDIM];
  mt_decision outcome, *stored = NULL;
  if (gather_seq(d, args[1], &c) < 0 || (c.key.op = op_of(args[0])) < 1 ||
      mt_ext_call_inputs(d, &c, &in) < 0 ||
      caller_decision(d, &c, args[2], args[3], args[4], to, &outcome) < 0)
    return NULL;
  mt_error err = {0};
  int rc = mt_memo_decide_targets(c.mb->memo, &c.key, &in.prop, in.dtype,
                                  (const mt_placement(*)[MT_MAX_MESH_NDIM])to, &outcome,
                                  &stored, &err);
  return rc == MT_OK ? decision_object(d, c.mb, stored, 0) : mt_ext_raise(rc, &err);
}

static PyObject *op_id(PyObject *module, PyObject *key) {
  int64_t id = mt_ext_op_id(mt_ext_dispatch_module(module), key);
  return id < 0 ? NULL : PyLong_FromLongLong(id);
}

static PyObject *contiguous_strides(PyObject *module, PyObject *shape) {
  int64_t sh[MT_MAX_NDIM], st[MT_MAX_NDIM];
  int n = 0;
  if (mt_ext_int64s(shape, sh, MT_MAX_NDIM, &n, "shape") < 0) return NULL;
  mt_layout_contiguous_strides(n, sh, st);
  return mt_ext_int_tuple(st, n);
}

PyMethodDef mt_ext_decide_methods[] = {
    {"decide_ufunc", (PyCFunction)(void (*)(void))decide_ufunc, METH_FASTCALL,
     "decide_ufunc(ufunc, operands) -> Decision of the ufunc on DTensors and scalars "
     "(one mesh). Local."},
    {"decide_reduction", (PyCFunction)(void (*)(void))decide_reduction, METH_FASTCALL,
     "decide_reduction(func, dtensor, axis, keepdims) -> Decision of a registered "
     "reduction. Local."},
    {"decide", (PyCFunction)(void (*)(void))decide, METH_FASTCALL,
     "decide(op, operands, build) -> Decision of op (an op_id) on the operands; on a "
     "miss build() gives its _C.DimMap. Local."},
    {"memo_lookup", (PyCFunction)(void (*)(void))memo_lookup, METH_FASTCALL,
     "memo_lookup(op, operands) -> Decision, or None on a miss. Local."},
    {"memo_insert", (PyCFunction)(void (*)(void))memo_insert, METH_FASTCALL,
     "memo_insert(op, operands, targets, out_placements, out_shape) -> Decision: "
     "stores a decision the caller made (targets per DTensor input). Local."},
    {"op_id", op_id, METH_O,
     "op_id(key) -> the memo's id of an operation's hashable key. Local."},
    {"contiguous_strides", contiguous_strides, METH_O,
     "contiguous_strides(shape) -> torch's strides of a contiguous tensor (a dim of "
     "size 0 counts as 1). Local."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef decision_members[] = {
    {"plans", T_OBJECT, offsetof(DecisionObject, plans), READONLY,
     "per DTensor input: the _C.Plan it runs first, or None"},
    {"zeroed", T_OBJECT, offsetof(DecisionObject, zeroed), READONLY,
     "per DTensor input: this rank uses zeros of its local shape instead (a "
     "Replicate input partitioned into Partial(sum))"},
    {"out_placements", T_OBJECT, offsetof(DecisionObject, out_placements), READONLY,
     "the output's placements"},
    {"out_shape", T_OBJECT, offsetof(DecisionObject, out_shape), READONLY,
     "the output's global shape (None until a user rule's first run)"},
    {"out_stride", T_OBJECT, offsetof(DecisionObject, out_stride), READONLY,
     "the output's contiguous global strides"},
    {"out_local_shape", T_OBJECT, offsetof(DecisionObject, out_local_shape), READONLY,
     "this rank's box of the output (None outside the mesh)"},
    {"local_only", T_BOOL, offsetof(DecisionObject, local_only), READONLY,
     "no input is redistributed"},
    {"cached", T_BOOL, offsetof(DecisionObject, cached), READONLY,
     "the decision was in the memo"},
    {NULL, 0, 0, 0, NULL},
};

static void decision_dealloc(PyObject *self) {
  DecisionObject *o = (DecisionObject *)self;
  PyTypeObject *tp = Py_TYPE(self);
  Py_XDECREF(o->plans);
  Py_XDECREF(o->zeroed);
  Py_XDECREF(o->out_placements);
  Py_XDECREF(o->out_shape);
  Py_XDECREF(o->out_stride);
  Py_XDECREF(o->out_local_shape);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static PyType_Slot decision_slots[] = {
    {Py_tp_dealloc, decision_dealloc},
    {Py_tp_members, decision_members},
    {Py_tp_doc, "What an operation does on given inputs: the plan each input runs "
                "first and the output's placements and shape. Local."},
    {0, NULL},
};

static PyType_Spec decision_spec = {
    .name = "mpitensor._C.Decision",
    .basicsize = sizeof(DecisionObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = decision_slots,
};

int mt_ext_decide_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->decision_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &decision_spec, NULL);
  if (st->decision_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "Decision", (PyObject *)st->decision_type);
}
