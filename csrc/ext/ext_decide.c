/* The executor's first steps: gathering a call's operands into its memo key (each
 * DTensor's layout id, each scalar's kind), and its decision, found in the mesh's
 * memo or made on a miss from the op's dim map (the core builds a registered
 * ufunc's or reduction's; an op entry's builder gives the others'). */
#include "ext.h"

#include <limits.h>
#include <string.h>

#include "mpitensor/core/prop.h"

/* The bitmask of the dims `axis` names in an ndim-d tensor; -1 when it names one
 * twice or out of range. */
static int64_t axes_mask(PyObject *axis, int ndim) {
  if (axis == Py_None) return ndim >= 32 ? -1 : (int64_t)((1u << ndim) - 1u);
  int one = PyLong_CheckExact(axis);
  if (!one && !PyTuple_CheckExact(axis)) return -1;
  Py_ssize_t n = one ? 1 : PyTuple_GET_SIZE(axis);
  int64_t mask = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *item = one ? axis : PyTuple_GET_ITEM(axis, i);
    long a = PyLong_CheckExact(item) ? PyLong_AsLong(item) : LONG_MIN;
    if (a == -1 && PyErr_Occurred()) PyErr_Clear(), a = LONG_MIN;
    if (a < 0 && a != LONG_MIN) a += ndim;
    if (a < 0 || a >= ndim || (mask >> a & 1)) return -1;
    mask |= (int64_t)1 << a;
  }
  return mask;
}

int64_t mt_ext_reduction_aux(PyObject *axis, int ndim, int keepdims, uint32_t *axes) {
  int64_t mask = axes_mask(axis, ndim);
  if (mask < 0) return -1;
  *axes = (uint32_t)mask;
  return mask | (int64_t)keepdims << 32;
}

/* Scalar kinds: Python numbers, NumPy scalars and 0-d arrays by type number. */
enum { KIND_FLOAT = 1, KIND_INT = 2, KIND_BOOL = 3, KIND_COMPLEX = 4,
       KIND_NUMPY = 1 << 8, KIND_ARRAY0 = 1 << 16 };

/* The kind of a scalar operand (>= 1), or 0 for an object that is none. */
static int64_t scalar_kind(PyObject *o) {
  PyTypeObject *t = Py_TYPE(o);
  if (t == &PyFloat_Type) return KIND_FLOAT;
  if (t == &PyLong_Type) return KIND_INT;
  if (t == &PyBool_Type) return KIND_BOOL;
  if (t == &PyComplex_Type) return KIND_COMPLEX;
  if (PyArray_IsScalar(o, Generic)) {
    PyArray_Descr *descr = PyArray_DescrFromScalar(o);
    int64_t kind = descr == NULL ? 0 : KIND_NUMPY + descr->type_num;
    Py_XDECREF(descr);
    return kind;
  }
  if (PyArray_Check(o) && PyArray_NDIM((PyArrayObject *)o) == 0)
    return KIND_ARRAY0 + PyArray_DESCR((PyArrayObject *)o)->type_num;
  return 0;
}

/* Whether a plain ndarray operand `o` (not 0-d) mixed with DTensors of `mb` is
 * replicated on it: one of one element always, as torch replicates a one-element
 * tensor (every rank holds a value of that shape); larger ones only under
 * implicit replication or on the local mesh, where there is nothing to trust. */
static int replicates(const mt_ext_dispatch *d, const mt_ext_mesh_base *mb, PyObject *o) {
  return d->modes->implicit_replication > 0 || mb->local ||
         PyArray_SIZE((PyArrayObject *)o) == 1;
}

/* Adds operand i: a DTensor, an implicitly replicated ndarray, or a scalar. */
static int gather_one(mt_ext_dispatch *d, PyObject *o, int i, mt_ext_call *c,
                      PyObject *key) {
  if (!mt_ext_is_dtensor(d, o)) {
    if (PyArray_Check(o) && PyArray_NDIM((PyArrayObject *)o) > 0) {
      if (!replicates(d, c->mb, o)) {
        if (c->defer_mixed && mt_ext_numeric(o)) return c->mixed = 1, 0;
        mt_ext_error(d, "mixed", key, o);
        return -1;
      }
      o = c->made[c->nmade++] = mt_ext_replicated(d, c->mb, o);
      if (o == NULL) return -1;
    } else {
      int64_t kind = scalar_kind(o);
      c->key.operand[i] = -kind;
      return kind > 0 ? 1 : 0;
    }
  }
  mt_ext_dtensor *b = (mt_ext_dtensor *)o;
  if (!mt_ext_same_mesh(mt_ext_spec_mesh(d, b->spec), c->mb)) {
    /* A Replicate DTensor of another mesh of the same ranks (mt_ext_call_mesh). */
    o = c->made[c->nmade++] = mt_ext_replicated(d, c->mb, b->local);
    if (o == NULL) return -1;
    b = (mt_ext_dtensor *)o;
  }
  if (mt_ext_strided(d, o)) return c->strided = 1, 0;
  int64_t id;
  if (mt_ext_layout_id(d, c->mb, b, NULL, &id) < 0) return -1;
  mt_ext_call_add(d, c, i, b, id);
  return 1;
}

int mt_ext_gather(mt_ext_dispatch *d, PyObject *const *ops, int n, mt_ext_call *c,
                  PyObject *key, int defer_mixed) {
  mt_ext_call_init(c, n);
  c->defer_mixed = defer_mixed;
  if (n < 1 || n > MT_MEMO_MAX_OPERANDS) return 0;
  int err = 0;
  c->mb = mt_ext_call_mesh(d, ops, n, key, &err);
  if (c->mb == NULL) return err ? -1 : 0;
  for (int i = 0; i < n; ++i) {
    int rc = gather_one(d, ops[i], i, c, key);
    if (rc <= 0) {
      mt_ext_call_release(c);
      return rc;
    }
  }
  return mt_ext_wanting(d) ? mt_ext_call_want(d, c) : 1;
}

int mt_ext_call_want(mt_ext_dispatch *d, mt_ext_call *c) {
  PyObject *w = d->modes->want;
  if (!mt_ext_is_dtensor(d, w) || ((mt_ext_dtensor *)w)->spec == NULL ||
      mt_ext_spec_mesh(d, ((mt_ext_dtensor *)w)->spec) != c->mb)
    return 1;
  if (mt_ext_layout_id(d, c->mb, (mt_ext_dtensor *)w, NULL, &c->key.want) < 0) {
    mt_ext_call_release(c);
    return -1;
  }
  return 1;
}

void mt_ext_call_release(mt_ext_call *c) {
  for (int i = 0; i < c->nmade; ++i) Py_CLEAR(c->made[i]);
  c->nmade = 0;
}

/* The tensor inputs as the core sees them, with their mt_dtype codes. */
static int call_inputs(mt_ext_dispatch *d, const mt_ext_call *c, mt_prop_inputs *p,
                       int *dtype) {
  memset(p, 0, sizeof *p);
  p->mesh_ndim = c->mb->mesh_ndim;
  memcpy(p->mesh_shape, c->mb->mesh_shape, sizeof p->mesh_shape);
  mt_layout_key key;
  for (int t = 0; t < c->ntensors; ++t) {
    if (mt_ext_spec_key(d, c->mb, c->dt[t]->spec, &key) < 0) return -1;
    mt_prop_inputs_add(p, &key);
    dtype[t] = mt_ext_descr_dtype((PyArray_Descr *)PyTuple_GET_ITEM(c->dt[t]->spec, 3));
    p->alias[t] = mt_ext_alias_of(c, t) + 1;
  }
  for (int i = 0, t = 0; i < c->noperands; ++i)
    if (c->tensors >> i & 1u) p->grad |= (c->key.grad >> i & 1u) << t++;
  if (c->key.want == 0) return 0;
  if (mt_ext_spec_key(d, c->mb, ((mt_ext_dtensor *)d->modes->want)->spec, &key) < 0)
    return -1;
  mt_prop_inputs_want(p, &key);
  return 0;
}

/* Raises the core's error, as "numpy.add: " + its message for a registered op. */
static void *raise_named(const mt_ext_op *op, int rc, const mt_error *err) {
  if (op->sig == NULL) return mt_ext_raise(rc, err);
  PyObject *name = PyObject_GetAttrString(op->sig->func, "__name__");
  mt_error named = {rc, ""};
  snprintf(named.msg, sizeof named.msg, "numpy.%.60s: %.440s",
           name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : "?", err->msg);
  Py_XDECREF(name);
  PyErr_Clear();
  return mt_ext_raise(rc, &named);
}

/* A scalar operand of memo word kind `kind` as ufunc.resolve_dtypes takes it: a
 * Python number's type (a weak scalar), else its dtype. New reference. */
static PyObject *scalar_type(int64_t kind) {
  if (kind == KIND_FLOAT) return Py_NewRef((PyObject *)&PyFloat_Type);
  if (kind == KIND_INT) return Py_NewRef((PyObject *)&PyLong_Type);
  if (kind == KIND_COMPLEX) return Py_NewRef((PyObject *)&PyComplex_Type);
  int num = kind == KIND_BOOL       ? NPY_BOOL
            : kind >= KIND_ARRAY0 ? (int)(kind - KIND_ARRAY0)
                                  : (int)(kind - KIND_NUMPY);
  return (PyObject *)PyArray_DescrFromType(num);
}

/* The operand types of the call and one None for the result, as
 * ufunc.resolve_dtypes takes them. New reference, or NULL with an exception. */
static PyObject *operand_types(const mt_ext_call *c) {
  PyObject *types = PyTuple_New(c->noperands + 1);
  for (int i = 0, t = 0; types != NULL && i < c->noperands; ++i) {
    PyObject *o = !(c->tensors >> i & 1u)
                      ? scalar_type(-c->key.operand[i])
                      : Py_NewRef(PyTuple_GET_ITEM(c->dt[t++]->spec, 3));
    if (o == NULL) Py_CLEAR(types);
    else PyTuple_SET_ITEM(types, i, o);
  }
  if (types != NULL) PyTuple_SET_ITEM(types, c->noperands, Py_NewRef(Py_None));
  return types;
}

/* The dtype a ufunc's loop gives for the call's operands (NumPy's promotion,
 * weak Python scalars included). New reference, or NULL. */
static PyObject *ufunc_result(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c) {
  PyObject *types = operand_types(c), *res = NULL, *out = NULL;
  PyObject *fn = types != NULL ? PyObject_GetAttrString(op->sig->func, "resolve_dtypes")
                               : NULL;
  if (fn != NULL) res = mt_ext_hook(d, MT_HOOK_DTYPE, fn, &types, 1, NULL);
  Py_XDECREF(fn);
  if (res != NULL && PyTuple_Check(res) && PyTuple_GET_SIZE(res) > c->noperands)
    out = Py_NewRef(PyTuple_GET_ITEM(res, c->noperands));
  Py_XDECREF(types);
  Py_XDECREF(res);
  return out;
}

/* The dtype of the reduction of one element of the input (a sum of int8 is an
 * int64, a mean of ints a float64). New reference, or NULL. */
static PyObject *reduction_result(mt_ext_dispatch *d, const mt_ext_op *op,
                                  const mt_ext_call *c) {
  PyArray_Descr *descr = (PyArray_Descr *)PyTuple_GET_ITEM(c->dt[0]->spec, 3);
  npy_intp one = 1;
  Py_INCREF(descr);
  PyObject *stand_in = PyArray_Zeros(1, &one, descr, 0), *res = NULL, *out = NULL;
  if (stand_in != NULL) res = mt_ext_hook(d, MT_HOOK_DTYPE, op->sig->func, &stand_in, 1, NULL);
  if (res != NULL) out = PyObject_GetAttrString(res, "dtype");
  Py_XDECREF(stand_in);
  Py_XDECREF(res);
  return out;
}

PyArray_Descr *mt_ext_keyword_dtype(const mt_ext_op *op) {
  Py_ssize_t nkw = op->kwnames != NULL ? PyTuple_GET_SIZE(op->kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject *name = PyTuple_GET_ITEM(op->kwnames, i);
    if (PyUnicode_CompareWithASCIIString(name, "dtype") != 0) continue;
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter2(op->extra[op->nextra - nkw + i], &descr))
      PyErr_Clear();
    return descr;
  }
  return NULL;
}

/* The mt_dtype of the op's local result, which decides the Partials it keeps
 * exactly (mt_dimmap_dtypes); -1 where it is not known before the op runs (an op
 * entry's own local function, or a registered function that is no ufunc, whose
 * Partials are reduced first whatever its dtype). A dtype= keyword gives it, else
 * NumPy does; what NumPy refuses here it raises when the op runs. */
static int result_dtype(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c) {
  if (op->sig == NULL) return -1;
  PyObject *descr = (PyObject *)mt_ext_keyword_dtype(op);
  if (descr == NULL && op->sig->ufunc)
    descr = ufunc_result(d, op, c);
  else if (descr == NULL && op->sig->op.rule.reduce_op >= 0)
    descr = reduction_result(d, op, c);
  int code = descr != NULL && PyArray_DescrCheck(descr)
                 ? mt_ext_descr_dtype((PyArray_Descr *)descr)
                 : -1;
  if (descr == NULL) PyErr_Clear();
  Py_XDECREF(descr);
  return code;
}

/* A miss: the op's dim map decided and stored. */
static mt_decision *miss(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c) {
  mt_prop_inputs in;
  int dtype[MT_PROP_MAX_INPUTS];
  if (call_inputs(d, c, &in, dtype) < 0) return NULL;
  mt_dimmap map;
  mt_error err = {0};
  mt_decision *dec = NULL;
  int rc;
  if (op->sig != NULL) {
    mt_op_args args = {c->noperands, c->tensors, op->axes, op->keepdims, op->shorten};
    rc = mt_op_dimmap(&op->sig->op, &args, &in, dtype[0], &map, &err);
    if (rc != MT_OK) return raise_named(op, rc, &err);
  } else {
    PyObject *made = mt_ext_hook(d, MT_HOOK_BUILD, op->build, NULL, 0, NULL);
    if (made == NULL) return NULL;
    const mt_dimmap *m = mt_ext_dimmap_get(made, &map);
    Py_DECREF(made);
    if (m == NULL) return NULL;
  }
  if (map.ninputs == in.ninputs) mt_dimmap_dtypes(&map, dtype, result_dtype(d, op, c));
  rc = mt_memo_decide(c->mb->memo, &c->key, &map, &in, dtype, &dec, &err);
  return rc == MT_OK ? dec : (mt_decision *)raise_named(op, rc, &err);
}

mt_decision *mt_ext_decide(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                           int *hit) {
  mt_decision *dec = mt_memo_find(c->mb->memo, &c->key);
  *hit = dec != NULL;
  return dec != NULL ? dec : miss(d, op, c);
}

PyObject *mt_ext_decision_out(mt_ext_dispatch *d, const mt_decision *dec) {
  PyObject *pl = mt_ext_placement_objects(d, dec->out_placements, dec->mesh_ndim);
  PyObject *shape = dec->out_ndim < 0 ? Py_NewRef(Py_None)
                                      : mt_ext_int_tuple(dec->out_shape, dec->out_ndim);
  PyObject *out = pl && shape ? PyTuple_Pack(2, pl, shape) : NULL;
  Py_XDECREF(pl);
  Py_XDECREF(shape);
  return out;
}

/* Whether the Python layout `layout` has element type `descr`. */
static int same_dtype(PyObject *layout, PyArray_Descr *descr) {
  PyObject *have = PyTuple_GET_ITEM(layout, 2);
  return have == (PyObject *)descr ||
         (PyArray_DescrCheck(have) && PyArray_EquivTypes((PyArray_Descr *)have, descr));
}

int mt_ext_decision_output(mt_ext_dispatch *d, mt_ext_mesh_base *mb,
                           const mt_memo_key *key, const mt_decision *dec,
                           PyArray_Descr *descr, int64_t *id, PyObject **layout) {
  if (dec->out_id != 0) {
    *layout = mt_ext_py_layout(d, mb, dec->out_id, dec->out_slot, NULL, NULL);
    if (*layout == NULL && PyErr_Occurred()) return -1;
    if (*layout != NULL && same_dtype(*layout, descr)) return (*id = dec->out_id), 0;
    Py_CLEAR(*layout);
  }
  mt_layout_key out;
  mt_decision_out_key(dec, mt_ext_dtype_key(descr), (int64_t)PyDataType_ELSIZE(descr), &out);
  *layout = mt_ext_output_layout(d, mb, key, &out, (PyObject *)descr, id);
  return *layout == NULL ? -1 : 0;
}

PyObject *mt_ext_output_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb,
                               const mt_memo_key *key, const mt_layout_key *out,
                               PyObject *dtype, int64_t *id) {
  int64_t slot;
  mt_error err = {0};
  int rc = mt_layout_table_intern(mb->layouts, out, id, &slot, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  mt_decision *live = mt_memo_peek(mb->memo, key);
  if (live != NULL) live->out_id = *id, live->out_slot = slot;
  return mt_ext_py_layout(d, mb, *id, slot, out, dtype);
}

/* decide(key, operands, build) -> (out placements, out shape, bytes moved): an
 * operation's decision, for a caller that compares it with another way, without
 * running anything. Local. */
static PyObject *decide(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 3 || !PyTuple_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "decide(key, operands: tuple, build)");
  mt_ext_op op = {0};
  op.sig = mt_ext_sig_of(d, args[0]);
  op.key = args[0], op.build = args[2];
  mt_ext_call c;
  int rc = mt_ext_gather(d, &PyTuple_GET_ITEM(args[1], 0), (int)PyTuple_GET_SIZE(args[1]),
                         &c, args[0], 0);
  if (rc <= 0) return rc < 0 ? NULL : PyErr_Format(PyExc_TypeError, "no DTensor operand");
  c.key.op = op.sig != NULL ? op.sig->id : mt_ext_op_id(d, args[0]);
  int hit;
  const mt_decision *dec = c.key.op < 0 ? NULL : mt_ext_decide(d, &op, &c, &hit);
  PyObject *out = dec != NULL ? mt_ext_decision_out(d, dec) : NULL;
  PyObject *bytes = out != NULL ? PyLong_FromLongLong(mt_decision_bytes(dec)) : NULL;
  if (out != NULL)
    Py_SETREF(out, bytes ? PyTuple_Pack(3, PyTuple_GET_ITEM(out, 0), PyTuple_GET_ITEM(out, 1),
                                        bytes) : NULL);
  Py_XDECREF(bytes);
  mt_ext_call_release(&c);
  return out;
}

/* implicit(operands[, like]) -> operands: the tuple with each plain ndarray (not
 * 0-d) the executor would replicate made the Replicate DTensor it makes, on the
 * mesh of the first DTensor operand; the tuple itself when there is none. With
 * `like` (a DTensor), every one on like's mesh: a backward's operands, which its
 * forward took so. Local. */
static PyObject *implicit(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs < 1 || nargs > 2 || !PyTuple_Check(args[0]) ||
      (nargs == 2 && !mt_ext_is_dtensor(d, args[1])))
    return PyErr_Format(PyExc_TypeError, "implicit(operands: tuple[, like: DTensor])");
  PyObject *ops = args[0];
  Py_ssize_t n = PyTuple_GET_SIZE(ops);
  int every = nargs == 2;
  mt_ext_mesh_base *mb = NULL;
  for (Py_ssize_t i = every ? -1 : 0; mb == NULL && i < n; ++i) {
    PyObject *o = i < 0 ? args[1] : PyTuple_GET_ITEM(ops, i);
    if (mt_ext_is_dtensor(d, o) && ((mt_ext_dtensor *)o)->spec != NULL)
      mb = mt_ext_spec_mesh(d, ((mt_ext_dtensor *)o)->spec);
  }
  PyObject *out = NULL;
  for (Py_ssize_t i = 0; mb != NULL && i < n; ++i) {
    PyObject *o = PyTuple_GET_ITEM(ops, i);
    if (Py_TYPE(o) != &PyArray_Type || PyArray_NDIM((PyArrayObject *)o) == 0 ||
        !(every || replicates(d, mb, o)))
      continue;
    if (out == NULL) { /* a new tuple: a whole slice would be `ops` itself */
      if ((out = PyTuple_New(n)) == NULL) return NULL;
      for (Py_ssize_t j = 0; j < n; ++j)
        PyTuple_SET_ITEM(out, j, Py_NewRef(PyTuple_GET_ITEM(ops, j)));
    }
    PyObject *r = mt_ext_replicated(d, mb, o);
    if (r == NULL) {
      Py_DECREF(out);
      return NULL;
    }
    Py_DECREF(PyTuple_GET_ITEM(out, i));
    PyTuple_SET_ITEM(out, i, r);
  }
  return out != NULL ? out : Py_NewRef(ops);
}

/* is_scalar(obj): see the method table. */
static PyObject *is_scalar(PyObject *Py_UNUSED(module), PyObject *o) {
  return PyBool_FromLong(scalar_kind(o) > 0);
}

PyMethodDef mt_ext_decide_methods[] = {
    {"is_scalar", is_scalar, METH_O,
     "is_scalar(obj) -> whether the executor takes obj as a scalar operand: a Python "
     "float, int, bool or complex (exactly), a NumPy scalar or a 0-d ndarray; an "
     "operation passes it to NumPy as it is. Local.\n\n"
     "Example: _C.is_scalar(2.0) and not _C.is_scalar([2.0])"},
    {"implicit", (PyCFunction)(void (*)(void))implicit, METH_FASTCALL,
     "implicit(operands[, like]) -> operands: each plain ndarray (not 0-d) the "
     "executor replicates (one element always, any inside implicit_replication() or "
     "on the local mesh) made the Replicate DTensor it makes, on the first DTensor "
     "operand's mesh; with like, every one, on like's mesh. Local.\n\n"
     "Example: _C.implicit((dt, numpy.ones(1)))[1].placements == (Replicate(),)"},
    {"decide", (PyCFunction)(void (*)(void))decide, METH_FASTCALL,
     "decide(key, operands, build) -> (out_placements, out_shape, bytes): the "
     "decision of an operation (a registered ufunc, or a key whose dim map build() "
     "gives on a miss) on the operands, found in or added to the mesh's memo; "
     "nothing runs. Local.\n\n"
     "Example: _C.decide(numpy.add, (a, b), None)[0]"},
    {NULL, NULL, 0, NULL},
};
