/* _C.DimMap: an operation's dim map (core/prop.c), checked once, for the
 * operations whose maps Python builds (einsum, reshape, ...); and the core's
 * builders of the registered families, for Python-driven uses of them. */
#include "ext.h"

#include "mpitensor/core/prop.h"

typedef struct {
  PyObject_HEAD
  mt_dimmap map;
} DimMapObject;

/* A sequence of small ints into `out` (at most `cap`); sets *n. */
static int read_ints(PyObject *seq, int *out, int cap, int *n, const char *what) {
  int64_t tmp[MT_PROP_MAX_LABELS > MT_MAX_NDIM ? MT_PROP_MAX_LABELS : MT_MAX_NDIM];
  if (mt_ext_int64s(seq, tmp, cap, n, what) < 0) return -1;
  for (int i = 0; i < *n; ++i) {
    if (tmp[i] < INT32_MIN || tmp[i] > INT32_MAX) {
      PyErr_Format(PyExc_ValueError, "%s: entry %d is out of range", what, i);
      return -1;
    }
    out[i] = (int)tmp[i];
  }
  return 0;
}

/* Optional out_size: one entry per output dim, its size, or -1 where the dim takes
 * its label's size (mt_dimmap's out_resized). */
static int read_out_sizes(PyObject *seq, mt_dimmap *m) {
  int64_t sizes[MT_MAX_NDIM];
  int n = 0;
  if (seq == NULL) return 0;
  if (mt_ext_int64s(seq, sizes, MT_MAX_NDIM, &n, "out_size") < 0) return -1;
  if (n != m->out_ndim) {
    PyErr_SetString(PyExc_ValueError, "out_size needs one entry per output dim");
    return -1;
  }
  for (int d = 0; d < n; ++d) {
    if (sizes[d] < 0) continue;
    m->out_resized |= 1u << d;
    m->out_size[d] = sizes[d];
  }
  return 0;
}

/* Each input's labels and its broadcast bitmask. */
static int read_inputs(PyObject *in_labels, PyObject *in_bcast, mt_dimmap *m) {
  PyObject *fast = PySequence_Fast(in_labels, "in_labels must be a sequence");
  if (fast == NULL) return -1;
  Py_ssize_t nin = PySequence_Fast_GET_SIZE(fast);
  int rc = nin <= MT_PROP_MAX_INPUTS ? 0 : -1;
  if (rc < 0)
    PyErr_Format(PyExc_ValueError, "at most %d inputs are supported", MT_PROP_MAX_INPUTS);
  m->ninputs = (int)nin;
  for (Py_ssize_t i = 0; rc == 0 && i < nin; ++i)
    rc = read_ints(PySequence_Fast_GET_ITEM(fast, i), m->in_labels[i], MT_MAX_NDIM,
                   &m->in_ndim[i], "input labels");
  Py_DECREF(fast);
  int64_t bcast[MT_PROP_MAX_INPUTS];
  int nb = 0;
  if (rc < 0 || mt_ext_int64s(in_bcast, bcast, MT_PROP_MAX_INPUTS, &nb, "in_bcast") < 0)
    return -1;
  if (nb != m->ninputs) {
    PyErr_SetString(PyExc_ValueError, "in_bcast needs one bitmask per input");
    return -1;
  }
  for (int i = 0; i < nb; ++i) m->in_bcast[i] = (uint32_t)bcast[i];
  return 0;
}

/* The output labels and the per-label kinds, reduce ops and sizes. */
static int read_labels(PyObject *out_labels, PyObject *kinds, PyObject *ops,
                       PyObject *sizes, PyObject *out_sizes, mt_dimmap *m) {
  int nk = 0, no = 0, ns = 0;
  if (read_ints(out_labels, m->out_labels, MT_MAX_NDIM, &m->out_ndim, "output labels") < 0 ||
      read_ints(kinds, m->label_kind, MT_PROP_MAX_LABELS, &nk, "label kinds") < 0 ||
      read_ints(ops, m->label_reduce_op, MT_PROP_MAX_LABELS, &no, "label reduce ops") < 0 ||
      mt_ext_int64s(sizes, m->label_size, MT_PROP_MAX_LABELS, &ns, "label sizes") < 0 ||
      read_out_sizes(out_sizes, m) < 0)
    return -1;
  if (no != nk || ns != nk) {
    PyErr_SetString(PyExc_ValueError,
                    "label_kind, label_reduce_op and label_size need one entry per label");
    return -1;
  }
  m->nlabels = nk;
  return 0;
}

/* DimMap(in_labels, in_bcast, out_labels, label_kind, label_reduce_op, even_only,
 *        partial_rule, partial_inputs, partial_ops, sized_labels, label_size
 *        [, out_size]). Local. */
static PyObject *dimmap_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  PyObject *in_labels, *in_bcast, *out_labels, *kinds, *ops, *sizes, *out_sizes = NULL;
  mt_dimmap m;
  memset(&m, 0, sizeof m);
  if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
    PyErr_SetString(PyExc_TypeError, "DimMap takes positional arguments only");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "OOOOOIiIIIO|O:DimMap", &in_labels, &in_bcast, &out_labels,
                        &kinds, &ops, &m.even_only, &m.partial_rule, &m.partial_inputs,
                        &m.partial_ops, &m.sized_labels, &sizes, &out_sizes) ||
      read_inputs(in_labels, in_bcast, &m) < 0 ||
      read_labels(out_labels, kinds, ops, sizes, out_sizes, &m) < 0)
    return NULL;
  mt_error err = {0};
  int rc = mt_dimmap_check(&m, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  DimMapObject *self = (DimMapObject *)tp->tp_alloc(tp, 0);
  if (self != NULL) self->map = m;
  return (PyObject *)self;
}

static void dimmap_dealloc(DimMapObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static PyObject *dimmap_get_ninputs(DimMapObject *self, void *c) {
  return PyLong_FromLong(self->map.ninputs);
}

static PyGetSetDef dimmap_getset[] = {
    {"ninputs", (getter)dimmap_get_ninputs, NULL, "number of inputs", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot dimmap_slots[] = {
    {Py_tp_new, dimmap_new},
    {Py_tp_dealloc, dimmap_dealloc},
    {Py_tp_getset, dimmap_getset},
    {Py_tp_doc, "DimMap(in_labels, in_bcast, out_labels, label_kind, label_reduce_op, "
                "even_only, partial_rule, partial_inputs, partial_ops, sized_labels, "
                "label_size[, out_size]): an op's dim map, checked once. Local."},
    {0, NULL},
};

static PyType_Spec dimmap_spec = {
    .name = "mpitensor._C.DimMap",
    .basicsize = sizeof(DimMapObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = dimmap_slots,
};

const mt_dimmap *mt_ext_dimmap_get(PyObject *module, PyObject *obj) {
  if (!PyObject_TypeCheck(obj, mt_ext_state_of(module)->dimmap_type)) {
    PyErr_Format(PyExc_TypeError, "expected a _C.DimMap, got %s", Py_TYPE(obj)->tp_name);
    return NULL;
  }
  return &((DimMapObject *)obj)->map;
}

static PyObject *dimmap_new_of(PyObject *module, const mt_dimmap *map) {
  PyTypeObject *tp = mt_ext_state_of(module)->dimmap_type;
  DimMapObject *self = (DimMapObject *)tp->tp_alloc(tp, 0);
  if (self != NULL) self->map = *map;
  return (PyObject *)self;
}

/* dimmap_elementwise(kind, noperands, tensors, shapes) -> DimMap; `tensors` is the
 * bitmask of the operands that are tensors, `shapes` theirs. */
static PyObject *dimmap_elementwise(PyObject *module, PyObject *args) {
  int kind, noperands;
  unsigned int tensors;
  PyObject *shapes;
  if (!PyArg_ParseTuple(args, "iiIO:dimmap_elementwise", &kind, &noperands, &tensors,
                        &shapes))
    return NULL;
  PyObject *fast = PySequence_Fast(shapes, "shapes must be a sequence");
  if (fast == NULL) return NULL;
  int n = (int)PySequence_Fast_GET_SIZE(fast), nd[MT_PROP_MAX_INPUTS], rc = 0;
  int64_t sh[MT_PROP_MAX_INPUTS][MT_MAX_NDIM];
  if (n > MT_PROP_MAX_INPUTS) rc = -1, PyErr_SetString(PyExc_ValueError, "too many shapes");
  for (int i = 0; rc == 0 && i < n; ++i)
    rc = mt_ext_int64s(PySequence_Fast_GET_ITEM(fast, i), sh[i], MT_MAX_NDIM, &nd[i],
                       "shape");
  Py_DECREF(fast);
  if (rc < 0) return NULL;
  mt_dimmap map;
  mt_error err = {0};
  rc = mt_dimmap_elementwise(kind, noperands, tensors, nd,
                             (const int64_t(*)[MT_MAX_NDIM])sh, &map, &err);
  return rc == MT_OK ? dimmap_new_of(module, &map) : mt_ext_raise(rc, &err);
}

/* dimmap_matmul(a_shape, b_shape, transpose_b) -> DimMap. */
static PyObject *dimmap_matmul(PyObject *module, PyObject *args) {
  PyObject *a, *b;
  int transpose_b, na = 0, nb = 0;
  int64_t sa[MT_MAX_NDIM], sb[MT_MAX_NDIM];
  if (!PyArg_ParseTuple(args, "OOp:dimmap_matmul", &a, &b, &transpose_b) ||
      mt_ext_int64s(a, sa, MT_MAX_NDIM, &na, "a_shape") < 0 ||
      mt_ext_int64s(b, sb, MT_MAX_NDIM, &nb, "b_shape") < 0)
    return NULL;
  mt_dimmap map;
  mt_error err = {0};
  int rc = mt_dimmap_matmul(na, sa, nb, sb, transpose_b, &map, &err);
  return rc == MT_OK ? dimmap_new_of(module, &map) : mt_ext_raise(rc, &err);
}

PyMethodDef mt_ext_prop_methods[] = {
    {"dimmap_elementwise", dimmap_elementwise, METH_VARARGS,
     "dimmap_elementwise(kind, noperands, tensors, shapes) -> DimMap of an elementwise "
     "op (ELEMENTWISE_* kind; tensors: bitmask of the tensor operands). Local."},
    {"dimmap_matmul", dimmap_matmul, METH_VARARGS,
     "dimmap_matmul(a_shape, b_shape, transpose_b) -> DimMap of a @ b (or a @ b.T). "
     "Local."},
    {NULL, NULL, 0, NULL},
};

/* The core's enums, so that Python never copies them. */
static int add_enums(PyObject *module) {
  static const struct { const char *name; int value; } enums[] = {
      {"LABEL_KEEP", MT_LABEL_KEEP}, {"LABEL_CONTRACT", MT_LABEL_CONTRACT},
      {"LABEL_REDUCE", MT_LABEL_REDUCE}, {"LABEL_REPLICATE", MT_LABEL_REPLICATE},
      {"PARTIAL_NONE", MT_PARTIAL_NONE}, {"PARTIAL_LINEAR_ALL", MT_PARTIAL_LINEAR_ALL},
      {"PARTIAL_LINEAR_ONE", MT_PARTIAL_LINEAR_ONE}, {"PARTIAL_SAME_OP", MT_PARTIAL_SAME_OP},
      {"PARTIAL_ADDITIVE", MT_PARTIAL_ADDITIVE},
      {"REDUCE_SUM", MT_REDUCE_SUM}, {"REDUCE_AVG", MT_REDUCE_AVG},
      {"REDUCE_PRODUCT", MT_REDUCE_PRODUCT}, {"REDUCE_MAX", MT_REDUCE_MAX},
      {"REDUCE_MIN", MT_REDUCE_MIN}, {"REDUCE_COUNT", MT_REDUCE_COUNT},
      {"PLACEMENT_REPLICATE", MT_PLACEMENT_REPLICATE},
      {"PLACEMENT_SHARD", MT_PLACEMENT_SHARD}, {"PLACEMENT_PARTIAL", MT_PLACEMENT_PARTIAL},
      {"ELEMENTWISE_NONE", MT_ELEMENTWISE_NONE}, {"ELEMENTWISE_ADD", MT_ELEMENTWISE_ADD},
      {"ELEMENTWISE_MUL", MT_ELEMENTWISE_MUL}, {"ELEMENTWISE_DIV", MT_ELEMENTWISE_DIV},
      {"ELEMENTWISE_MAX", MT_ELEMENTWISE_MAX}, {"ELEMENTWISE_MIN", MT_ELEMENTWISE_MIN},
      {"ELEMENTWISE_NEG", MT_ELEMENTWISE_NEG},
      {"ELEMENTWISE_INCREASING", MT_ELEMENTWISE_INCREASING},
      {"FAMILY_ELEMENTWISE", MT_OP_ELEMENTWISE}, {"FAMILY_MATMUL", MT_OP_MATMUL},
      {"PROP_MAX_INPUTS", MT_PROP_MAX_INPUTS}, {"PROP_MAX_LABELS", MT_PROP_MAX_LABELS},
  };
  for (size_t i = 0; i < sizeof enums / sizeof enums[0]; ++i)
    if (PyModule_AddIntConstant(module, enums[i].name, enums[i].value) < 0) return -1;
  PyObject *ops = PyTuple_New(MT_REDUCE_COUNT);
  for (int op = 0; ops != NULL && op < MT_REDUCE_COUNT; ++op) {
    PyObject *name = PyUnicode_FromString(mt_reduce_op_name(op));
    if (name == NULL) Py_CLEAR(ops);
    else PyTuple_SET_ITEM(ops, op, name);
  }
  if (ops == NULL || PyModule_AddObjectRef(module, "REDUCE_OPS", ops) < 0) {
    Py_XDECREF(ops);
    return -1;
  }
  Py_DECREF(ops);
  return 0;
}

int mt_ext_prop_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->dimmap_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &dimmap_spec, NULL);
  if (st->dimmap_type == NULL || add_enums(module) < 0) return -1;
  return PyModule_AddObjectRef(module, "DimMap", (PyObject *)st->dimmap_type);
}
