/* What the C path and the Python entry share: the registered signatures and op
 * ids, the memo key of a call (each operand's layout id or scalar kind, a
 * reduction's axes), the decision found in the mesh's memo or made by the core on
 * a miss (mt_op_dimmap, mt_memo_decide), and the layout of an output. One miss is
 * one memo miss, whichever entry meets it. */
#include "ext.h"

#include <limits.h>
#include <string.h>

#include "mpitensor/core/prop.h"

int64_t mt_ext_op_id(mt_ext_dispatch *d, PyObject *key) {
  PyObject *id = PyDict_GetItemWithError(d->op_ids, key);
  if (id != NULL) return PyLong_AsLongLong(id);
  if (PyErr_Occurred()) return -1;
  /* Bounded: forgotten keys get new ids, and their decisions simply miss. */
  if (PyDict_GET_SIZE(d->op_ids) >= (1 << 16)) PyDict_Clear(d->op_ids);
  id = PyLong_FromLongLong(d->next_op);
  if (id == NULL || PyDict_SetItem(d->op_ids, key, id) < 0) {
    Py_XDECREF(id);
    return -1;
  }
  Py_DECREF(id);
  return d->next_op++;
}

/* The bitmask of the dims `axis` names in an ndim-d tensor; -1 when it names one
 * twice or out of range (the Python entry raises NumPy's error). */
static int64_t axes_mask(PyObject *axis, int ndim) {
  if (axis == Py_None) return ndim >= 32 ? -1 : (int64_t)((1u << ndim) - 1u);
  int one = PyLong_CheckExact(axis);
  Py_ssize_t n = one ? 1 : PyTuple_GET_SIZE(axis);
  int64_t mask = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *item = one ? axis : PyTuple_GET_ITEM(axis, i);
    long a = PyLong_CheckExact(item) ? PyLong_AsLong(item) : LONG_MIN;
    if (a == -1 && PyErr_Occurred()) PyErr_Clear(), a = LONG_MIN;
    if (a < 0) a += ndim;
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

/* Scalar kinds: Python numbers, NumPy scalars by type number, 0-d ndarrays by type
 * number, and (from the Python entry only) other types by op id. */
enum { KIND_FLOAT = 1, KIND_INT = 2, KIND_BOOL = 3, KIND_COMPLEX = 4,
       KIND_NUMPY = 1 << 8, KIND_ARRAY0 = 1 << 16, KIND_OTHER = 1 << 24 };

/* The kind of a scalar operand (>= 1), or 0 when `o` is none the C path takes
 * (strict) or -1 with an exception. */
static int64_t scalar_kind(mt_ext_dispatch *d, PyObject *o, int strict) {
  PyTypeObject *t = Py_TYPE(o);
  if (t == &PyFloat_Type) return KIND_FLOAT;
  if (t == &PyLong_Type) return KIND_INT;
  if (t == &PyBool_Type) return KIND_BOOL;
  if (t == &PyComplex_Type) return KIND_COMPLEX;
  if (PyArray_IsScalar(o, Generic)) {
    PyArray_Descr *descr = PyArray_DescrFromScalar(o);
    int64_t kind = descr == NULL ? -1 : KIND_NUMPY + descr->type_num;
    Py_XDECREF(descr);
    return kind;
  }
  if (strict) return 0;
  if (PyArray_Check(o) && PyArray_NDIM((PyArrayObject *)o) == 0)
    return KIND_ARRAY0 + PyArray_DESCR((PyArrayObject *)o)->type_num;
  int64_t id = mt_ext_op_id(d, (PyObject *)t);
  return id < 0 ? -1 : KIND_OTHER + id;
}


/* Adds DTensor operand i; the first sets the mesh. 1, 0 (not C-path), or -1. */
static int gather_tensor(mt_ext_dispatch *d, PyObject *o, int i, int strict,
                         mt_ext_call *c) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)o;
  if (strict && !mt_ext_plain_dtensor(d, o)) return 0;
  if (c->mb == NULL) {
    c->mb = b->spec == NULL ? NULL : mt_ext_spec_mesh(d, b->spec);
    if (c->mb == NULL) {
      if (strict) return 0;
      PyErr_SetString(PyExc_TypeError, "a DTensor's spec must name a DeviceMesh");
      return -1;
    }
  }
  if (strict && (!c->mb->member || PyTuple_GET_ITEM(b->spec, 0) != (PyObject *)c->mb))
    return 0;
  int64_t id;
  if (mt_ext_layout_id(d, c->mb, b, NULL, &id) < 0) {
    if (!strict) return -1;
    PyErr_Clear(); /* the Python entry reports what is wrong with it */
    return 0;
  }
  c->dt[c->ntensors] = b;
  c->id[c->ntensors++] = id;
  c->tensors |= 1u << i;
  c->key.operand[i] = id;
  return 1;
}

int mt_ext_call_gather(mt_ext_dispatch *d, PyObject *const *ops, int n, int strict,
                       mt_ext_call *c) {
  /* Only what is read is set: dt, id and key.operand up to the counts. */
  c->mb = NULL, c->ntensors = 0, c->tensors = 0;
  c->key.op = 0, c->key.aux = 0;
  if (n < 1 || n > MT_MEMO_MAX_OPERANDS) {
    if (strict) return 0;
    PyErr_Format(PyExc_TypeError, "an operation takes 1 to %d operands here",
                 MT_MEMO_MAX_OPERANDS);
    return -1;
  }
  c->key.noperands = c->noperands = n;
  for (int i = 0; i < n; ++i) {
    if (strict && mt_ext_known_tensor(d, ops[i], i, c)) continue;
    int rc;
    if (mt_ext_is_dtensor(d, ops[i])) {
      rc = gather_tensor(d, ops[i], i, strict, c);
    } else {
      int64_t kind = scalar_kind(d, ops[i], strict);
      rc = kind > 0 ? 1 : (int)kind;
      c->key.operand[i] = -kind;
    }
    if (rc <= 0) return rc;
  }
  if (c->ntensors > 0) return 1;
  if (strict) return 0;
  PyErr_SetString(PyExc_TypeError, "an operation on DTensors needs a DTensor operand");
  return -1;
}

int mt_ext_call_inputs(mt_ext_dispatch *d, const mt_ext_call *c, mt_ext_inputs *in) {
  mt_prop_inputs *p = &in->prop;
  memset(p, 0, sizeof *p);
  p->ninputs = c->ntensors, p->mesh_ndim = c->mb->mesh_ndim;
  memcpy(p->mesh_shape, c->mb->mesh_shape, sizeof p->mesh_shape);
  for (int t = 0; t < c->ntensors; ++t) {
    mt_layout_key key;
    if (mt_ext_spec_key(d, c->mb, c->dt[t]->spec, &key) < 0) return -1;
    p->ndim[t] = key.ndim, p->itemsize[t] = key.itemsize;
    memcpy(p->shape[t], key.shape, sizeof p->shape[t]);
    memcpy(p->placements[t], key.placements, sizeof p->placements[t]);
    in->dtype[t] = mt_ext_descr_dtype((PyArray_Descr *)PyTuple_GET_ITEM(c->dt[t]->spec, 3));
  }
  return 0;
}

/* Raises the core's error, as "numpy.add: " + its message when `sig` names the op. */
static void *raise_named(const mt_ext_sig *sig, int rc, const mt_error *err) {
  if (sig == NULL) return mt_ext_raise(rc, err);
  PyObject *name = PyObject_GetAttrString(sig->func, "__name__");
  mt_error named = {rc, ""};
  snprintf(named.msg, sizeof named.msg, "numpy.%.60s: %.440s",
           name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : "?", err->msg);
  Py_XDECREF(name);
  PyErr_Clear();
  return mt_ext_raise(rc, &named);
}

mt_decision *mt_ext_decide_map(mt_ext_mesh_base *mb, const mt_memo_key *key,
                               const mt_dimmap *map, const mt_ext_inputs *in,
                               const mt_ext_sig *sig) {
  mt_decision *dec = NULL;
  mt_error err = {0};
  int rc = mt_memo_decide(mb->memo, key, map, &in->prop, in->dtype, &dec, &err);
  return rc == MT_OK ? dec : raise_named(sig, rc, &err);
}

mt_decision *mt_ext_call_miss(mt_ext_dispatch *d, const mt_ext_sig *sig,
                              const mt_ext_call *c, uint32_t axes, int keepdims) {
  mt_ext_inputs in;
  if (mt_ext_call_inputs(d, c, &in) < 0) return NULL;
  mt_op_args args = {c->noperands, c->tensors, axes, keepdims};
  mt_dimmap map;
  mt_error err = {0};
  int rc = mt_op_dimmap(&sig->op, &args, &in.prop, in.dtype[0], &map, &err);
  return rc == MT_OK ? mt_ext_decide_map(c->mb, &c->key, &map, &in, sig)
                     : raise_named(sig, rc, &err);
}

/* Whether the Python layout `layout` has element type `descr`. */
static int same_dtype(PyObject *layout, PyArray_Descr *descr) {
  PyObject *have = PyTuple_GET_ITEM(layout, 2);
  return have == (PyObject *)descr ||
         (PyArray_DescrCheck(have) && PyArray_EquivTypes((PyArray_Descr *)have, descr));
}

int mt_ext_known_output(mt_ext_dispatch *d, mt_ext_mesh_base *mb, int64_t out_id,
                        int64_t out_slot, PyArray_Descr *descr, PyObject **layout) {
  if (out_id == 0) return 0;
  *layout = mt_ext_py_layout(d, mb, out_id, out_slot, NULL, NULL);
  if (*layout == NULL) return PyErr_Occurred() ? -1 : 0;
  if (same_dtype(*layout, descr)) return 1;
  Py_CLEAR(*layout);
  return 0;
}

int mt_ext_decision_output(mt_ext_dispatch *d, mt_ext_mesh_base *mb,
                           const mt_memo_key *key, const mt_decision *dec,
                           PyArray_Descr *descr, int64_t *id, PyObject **layout) {
  int known = mt_ext_known_output(d, mb, dec->out_id, dec->out_slot, descr, layout);
  if (known != 0) {
    *id = dec->out_id;
    return known < 0 ? -1 : 0;
  }
  mt_layout_key out;
  memset(&out, 0, sizeof out);
  out.mesh_ndim = dec->mesh_ndim, out.ndim = dec->out_ndim;
  memcpy(out.placements, dec->out_placements, sizeof out.placements);
  memcpy(out.shape, dec->out_shape, sizeof out.shape);
  mt_layout_contiguous_strides(out.ndim, out.shape, out.stride);
  out.dtype = mt_ext_dtype_key(descr), out.itemsize = (int64_t)PyDataType_ELSIZE(descr);
  int64_t slot;
  mt_error err = {0};
  int rc = mt_layout_table_intern(mb->layouts, &out, id, &slot, &err);
  if (rc != MT_OK) {
    mt_ext_raise(rc, &err);
    return -1;
  }
  *layout = mt_ext_py_layout(d, mb, *id, slot, &out, (PyObject *)descr);
  if (*layout == NULL) return -1;
  mt_decision *live = mt_memo_peek(mb->memo, key);
  if (live != NULL) live->out_id = *id, live->out_slot = slot;
  return 0;
}
