/* _C.DimMap and _C.propagate: the sharding-propagation engine (core/prop.c).
 *
 * A DimMap is built once per op signature in Python and checked once here; each
 * call of propagate then passes only the inputs' shapes, placement codes and
 * itemsizes. */
#include "ext.h"

#include "mpitensor/prop.h"

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

/* DimMap(in_labels, in_bcast, out_labels, label_kind, label_reduce_op, even_only,
 *        partial_rule, partial_inputs, partial_ops, sized_labels, label_size
 *        [, out_size]). Local. */
static PyObject *dimmap_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  PyObject *in_labels, *in_bcast, *out_labels, *kinds, *ops, *sizes, *out_sizes = NULL;
  unsigned int even_only, partial_inputs, partial_ops, sized_labels;
  int partial_rule;
  if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
    PyErr_SetString(PyExc_TypeError, "DimMap takes positional arguments only");
    return NULL;
  }
  if (!PyArg_ParseTuple(args, "OOOOOIiIIIO|O:DimMap", &in_labels, &in_bcast, &out_labels,
                        &kinds, &ops, &even_only, &partial_rule, &partial_inputs,
                        &partial_ops, &sized_labels, &sizes, &out_sizes))
    return NULL;
  DimMapObject *self = (DimMapObject *)tp->tp_alloc(tp, 0);
  if (self == NULL) return NULL;
  mt_dimmap *m = &self->map;
  memset(m, 0, sizeof *m);
  PyObject *fast = PySequence_Fast(in_labels, "in_labels must be a sequence");
  if (fast == NULL) goto fail;
  Py_ssize_t nin = PySequence_Fast_GET_SIZE(fast);
  if (nin > MT_PROP_MAX_INPUTS) {
    Py_DECREF(fast);
    PyErr_Format(PyExc_ValueError, "at most %d inputs are supported", MT_PROP_MAX_INPUTS);
    goto fail;
  }
  m->ninputs = (int)nin;
  for (Py_ssize_t i = 0; i < nin; ++i) {
    if (read_ints(PySequence_Fast_GET_ITEM(fast, i), m->in_labels[i], MT_MAX_NDIM,
                  &m->in_ndim[i], "input labels") < 0) {
      Py_DECREF(fast);
      goto fail;
    }
  }
  Py_DECREF(fast);
  int64_t bcast[MT_PROP_MAX_INPUTS];
  int nb = 0, nk = 0, no = 0, ns = 0;
  if (mt_ext_int64s(in_bcast, bcast, MT_PROP_MAX_INPUTS, &nb, "in_bcast") < 0) goto fail;
  if (nb != m->ninputs) {
    PyErr_SetString(PyExc_ValueError, "in_bcast needs one bitmask per input");
    goto fail;
  }
  for (int i = 0; i < nb; ++i) m->in_bcast[i] = (uint32_t)bcast[i];
  if (read_ints(out_labels, m->out_labels, MT_MAX_NDIM, &m->out_ndim, "output labels") < 0 ||
      read_ints(kinds, m->label_kind, MT_PROP_MAX_LABELS, &nk, "label kinds") < 0 ||
      read_ints(ops, m->label_reduce_op, MT_PROP_MAX_LABELS, &no, "label reduce ops") < 0 ||
      mt_ext_int64s(sizes, m->label_size, MT_PROP_MAX_LABELS, &ns, "label sizes") < 0 ||
      read_out_sizes(out_sizes, m) < 0)
    goto fail;
  if (no != nk || ns != nk) {
    PyErr_SetString(PyExc_ValueError,
                    "label_kind, label_reduce_op and label_size need one entry per label");
    goto fail;
  }
  m->nlabels = nk;
  m->even_only = even_only;
  m->partial_rule = partial_rule;
  m->partial_inputs = partial_inputs;
  m->partial_ops = partial_ops;
  m->sized_labels = sized_labels;
  mt_error err = {0};
  int rc = mt_dimmap_check(m, &err);
  if (rc != MT_OK) {
    Py_DECREF(self);
    return mt_ext_raise(rc, &err);
  }
  return (PyObject *)self;
fail:
  Py_DECREF(self);
  return NULL;
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

static PyObject *codes_tuple(const mt_placement *p, int n) {
  PyObject *out = PyTuple_New(n);
  for (int m = 0; out != NULL && m < n; ++m) {
    PyObject *t = Py_BuildValue("(iii)", p[m].kind, p[m].dim, p[m].reduce_op);
    if (t == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, m, t);
  }
  return out;
}

/* propagate(dimmap, mesh_shape, shapes, codes, itemsizes)
 *   -> (input codes per input, output codes, output shape). Local. */
static PyObject *propagate(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 5) {
    return PyErr_Format(PyExc_TypeError,
                        "propagate(dimmap, mesh_shape, shapes, codes, itemsizes)");
  }
  PyTypeObject *tp = mt_ext_state_of(module)->dimmap_type;
  if (!PyObject_TypeCheck(args[0], tp)) {
    PyErr_SetString(PyExc_TypeError, "expected a _C.DimMap");
    return NULL;
  }
  const mt_dimmap *map = &((DimMapObject *)args[0])->map;
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  int nm = 0, ni = 0;
  if (mt_ext_int64s(args[1], in.mesh_shape, MT_MAX_MESH_NDIM, &nm, "mesh shape") < 0)
    return NULL;
  in.mesh_ndim = nm;
  int64_t itemsizes[MT_PROP_MAX_INPUTS];
  if (mt_ext_int64s(args[4], itemsizes, MT_PROP_MAX_INPUTS, &ni, "itemsizes") < 0)
    return NULL;
  in.ninputs = ni;
  for (int i = 0; i < ni; ++i) in.itemsize[i] = itemsizes[i];
  PyObject *shapes = PySequence_Fast(args[2], "shapes must be a sequence");
  PyObject *codes = shapes ? PySequence_Fast(args[3], "codes must be a sequence") : NULL;
  int ok = codes != NULL;
  if (ok && (PySequence_Fast_GET_SIZE(shapes) != ni || PySequence_Fast_GET_SIZE(codes) != ni)) {
    PyErr_SetString(PyExc_ValueError, "shapes, codes and itemsizes need one entry per input");
    ok = 0;
  }
  for (int i = 0; ok && i < ni; ++i) {
    int np = 0;
    ok = mt_ext_int64s(PySequence_Fast_GET_ITEM(shapes, i), in.shape[i], MT_MAX_NDIM,
                       &in.ndim[i], "shape") == 0 &&
         mt_ext_placements(PySequence_Fast_GET_ITEM(codes, i), in.placements[i], &np) == 0;
    if (ok && np != nm) {
      PyErr_Format(PyExc_ValueError, "input %d has %d placements for a %d-D mesh", i, np, nm);
      ok = 0;
    }
  }
  Py_XDECREF(shapes);
  Py_XDECREF(codes);
  if (!ok) return NULL;
  mt_prop_result res;
  memset(&res, 0, sizeof res);
  mt_error err = {0};
  int rc = mt_propagate(map, &in, &res, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  PyObject *ins = PyTuple_New(ni);
  for (int i = 0; ins != NULL && i < ni; ++i) {
    PyObject *c = codes_tuple(res.in_placements[i], nm);
    if (c == NULL) Py_CLEAR(ins);
    else PyTuple_SET_ITEM(ins, i, c);
  }
  PyObject *outc = codes_tuple(res.out_placements, nm);
  PyObject *shape = PyTuple_New(res.out_ndim);
  for (int d = 0; shape != NULL && d < res.out_ndim; ++d) {
    PyObject *v = PyLong_FromLongLong(res.out_shape[d]);
    if (v == NULL) Py_CLEAR(shape);
    else PyTuple_SET_ITEM(shape, d, v);
  }
  if (ins == NULL || outc == NULL || shape == NULL) {
    Py_XDECREF(ins);
    Py_XDECREF(outc);
    Py_XDECREF(shape);
    return NULL;
  }
  return Py_BuildValue("(NNN)", ins, outc, shape);
}

PyMethodDef mt_ext_prop_methods[] = {
    {"propagate", (PyCFunction)(void (*)(void))propagate, METH_FASTCALL,
     "propagate(dimmap, mesh_shape, shapes, codes, itemsizes) -> (input codes per input, "
     "output codes, output shape): the cheapest placements for an op. Local."},
    {NULL, NULL, 0, NULL},
};

int mt_ext_prop_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->dimmap_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &dimmap_spec, NULL);
  if (st->dimmap_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "DimMap", (PyObject *)st->dimmap_type);
}
