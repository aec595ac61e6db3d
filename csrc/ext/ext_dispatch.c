/* _C.DTensorBase: the C base of mpitensor.DTensor, and the fast path of NumPy
 * operations on DTensors whose sharding decision is already made.
 *
 * The rules live in Python (mpitensor._ops): on the first call of an operation
 * for given input specs, the Python slow path decides, runs and wraps, and, when
 * the decision needed no communication, records (operation, input specs, scalar
 * types) -> output spec here. A later call with the same input spec objects is
 * then glue only: one table lookup, the NumPy call on the local arrays, and the
 * allocation of the result with the recorded spec. Everything else (out=, other
 * keywords, plain ndarrays, unusual scalars, register_sharding rules, decisions
 * with redistributions, ranks outside the mesh) takes the Python path unchanged.
 *
 * The decisions are kept per mesh, in its ``_dispatch`` table
 * (ext_dispatch_table.c), keyed by the identity of layouts: the table gives every
 * DTensor of one (placements, shape, dtype, stride) on the mesh the same layout
 * tuple, kept beside its spec. Nothing in the table references the mesh, so a
 * dropped mesh is freed at once, as before. */
#include "ext.h"

#include <stddef.h>
#include <structmember.h>

enum { BIN_N = 13, UN_N = 4, CMP_N = 6, RED_N = 9 };

static const char *const BIN_NAMES[BIN_N][3] = {
    {"add", "__add__", "__radd__"},
    {"subtract", "__sub__", "__rsub__"},
    {"multiply", "__mul__", "__rmul__"},
    {"matmul", "__matmul__", "__rmatmul__"},
    {"true_divide", "__truediv__", "__rtruediv__"},
    {"floor_divide", "__floordiv__", "__rfloordiv__"},
    {"remainder", "__mod__", "__rmod__"},
    {"power", "__pow__", "__rpow__"},
    {"left_shift", "__lshift__", "__rlshift__"},
    {"right_shift", "__rshift__", "__rrshift__"},
    {"bitwise_and", "__and__", "__rand__"},
    {"bitwise_xor", "__xor__", "__rxor__"},
    {"bitwise_or", "__or__", "__ror__"},
};
enum { B_ADD, B_SUB, B_MUL, B_MATMUL, B_TDIV, B_FDIV, B_MOD, B_POW, B_LSH, B_RSH,
       B_AND, B_XOR, B_OR };

static const char *const UN_NAMES[UN_N][2] = {
    {"negative", "__neg__"}, {"positive", "__pos__"},
    {"absolute", "__abs__"}, {"invert", "__invert__"},
};

/* Indexed by Py_LT, Py_LE, Py_EQ, Py_NE, Py_GT, Py_GE. */
static const char *const CMP_NAMES[CMP_N][2] = {
    {"less", "__lt__"},    {"less_equal", "__le__"},    {"equal", "__eq__"},
    {"not_equal", "__ne__"}, {"greater", "__gt__"}, {"greater_equal", "__ge__"},
};

/* The reductions whose slow path calls numpy.<name>(local, axis=axes,
 * keepdims=keepdims); the fast path calls the ndarray method of the same name,
 * which runs the same ufunc reduction. */
static const char *const RED_NAMES[RED_N] = {"sum", "mean", "prod", "max", "min",
                                             "all", "any", "std", "var"};

typedef struct {
  PyObject_HEAD
  PyObject *local; /* _local_tensor */
  PyObject *spec;   /* _spec */
  PyObject *table;  /* the DispatchTable of the spec's mesh, or NULL */
  PyObject *layout; /* the table's (placements, shape, dtype, stride), or NULL */
} BaseObject;

struct mt_ext_dispatch {
  PyTypeObject *dtensor; /* mpitensor.DTensor: the exact type of fast operands */
  PyObject *custom;      /* the register_sharding dict; a ufunc in it is never fast */
  PyObject *ufunc_impl;  /* Python __array_ufunc__ (the slow path) */
  PyObject *rewrap;      /* rewrap(spec, result): a result of another dtype or type */
  PyObject *bin[BIN_N][3];
  PyObject *un[UN_N][2];
  PyObject *cmp[CMP_N][2];
  PyObject *red_name[RED_N];
  PyObject *red_impl[RED_N];
  PyObject *s_call, *s_axis, *s_keepdims, *s_dispatch, *kw_axis_keepdims;
  PyTypeObject *table_type; /* borrowed from the module state */
  int enabled;
  int traced; /* a debugging tool listens (mpitensor._trace): every call goes slow */
  long long hits, misses;
};

/* -- state -------------------------------------------------------------------- */

static mt_ext_dispatch *dispatch_of(PyObject *obj) {
  PyObject *module = PyType_GetModuleByDef(Py_TYPE(obj), &mt_ext_module_def);
  if (module == NULL) return NULL;
  mt_ext_dispatch *d = mt_ext_state_of(module)->dispatch;
  if (d == NULL || d->dtensor == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "mpitensor._C.dispatch_install was not called");
    return NULL;
  }
  return d;
}

/* The decision table of the mesh of `spec` (new reference), or NULL without an
 * exception when the spec or its mesh has none. */
static mt_ext_table *table_of(mt_ext_dispatch *d, PyObject *spec) {
  if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) return NULL;
  PyObject *t = PyObject_GetAttr(PyTuple_GET_ITEM(spec, 0), d->s_dispatch);
  if (t == NULL) {
    PyErr_Clear();
    return NULL;
  }
  if (Py_TYPE(t) != d->table_type) Py_CLEAR(t);
  return (mt_ext_table *)t;
}

/* The recorded entry of the key in the table of DTensor `dt`'s mesh, or NULL.
 * *table gets a new reference to that table (keep it while the entry is used). */
static mt_ext_entry *find(PyObject *dt, PyObject *op, PyObject *k0, PyObject *k1,
                          long long aux, PyObject **table) {
  PyObject *t = ((BaseObject *)dt)->table;
  mt_ext_entry *e = t == NULL ? NULL : mt_ext_table_lookup((mt_ext_table *)t, op, k0, k1, aux);
  *table = e == NULL ? NULL : Py_NewRef(t);
  return e;
}

/* -- the fast path -------------------------------------------------------------- */

/* The key and the NumPy argument of one operand: a DTensor gives its layout and
 * local ndarray, a Python or NumPy scalar its type and itself. -1: not fast. */
static int operand(mt_ext_dispatch *d, PyObject *o, PyObject **key, PyObject **arg) {
  PyTypeObject *t = Py_TYPE(o);
  if (t == d->dtensor) {
    BaseObject *b = (BaseObject *)o;
    if (b->layout == NULL || b->local == NULL || !PyArray_CheckExact(b->local)) return -1;
    *key = b->layout;
    *arg = b->local;
    return 0;
  }
  if (t == &PyFloat_Type || t == &PyLong_Type || t == &PyBool_Type ||
      t == &PyComplex_Type || PyArray_IsScalar(o, Generic)) {
    *key = (PyObject *)t;
    *arg = o;
    return 0;
  }
  return -1;
}

/* What a result needs from its first DTensor operand: its spec (the result's own
 * when the layouts are the same object, as for most elementwise ops) and the
 * table; owned, since the NumPy call may run Python code. */
typedef struct {
  PyObject *spec, *table, *layout;
  int same; /* the result's layout is the operand's */
} Origin;

static void origin_take(Origin *o, PyObject *dt, PyObject *out_layout) {
  BaseObject *b = (BaseObject *)dt;
  o->spec = Py_NewRef(b->spec);
  o->table = Py_NewRef(b->table);
  o->layout = Py_NewRef(out_layout);
  o->same = out_layout == b->layout;
}

static void origin_drop(Origin *o) {
  Py_DECREF(o->spec);
  Py_DECREF(o->table);
  Py_DECREF(o->layout);
}

/* The result's DTensorSpec: the operand's when the layout is the same, else a new
 * one of the operand's spec class, mesh and the result's layout. */
static PyObject *make_spec(const Origin *o) {
  if (o->same) return Py_NewRef(o->spec);
  PyTypeObject *tp = Py_TYPE(o->spec);
  PyObject *spec = tp->tp_alloc(tp, 5);
  if (spec == NULL) return NULL;
  PyTuple_SET_ITEM(spec, 0, Py_NewRef(PyTuple_GET_ITEM(o->spec, 0)));
  for (Py_ssize_t i = 0; i < 4; ++i)
    PyTuple_SET_ITEM(spec, i + 1, Py_NewRef(PyTuple_GET_ITEM(o->layout, i)));
  return spec;
}

/* A DTensor of the recorded layout around `res` (stolen); a result of another
 * type or dtype goes through the Python rewrap(spec, result). */
static PyObject *wrap(mt_ext_dispatch *d, const Origin *o, PyObject *res) {
  PyObject *spec = make_spec(o), *out = NULL;
  if (spec == NULL) {
    Py_DECREF(res);
    return NULL;
  }
  PyObject *want = PyTuple_GET_ITEM(o->layout, 2); /* the dtype */
  if (PyArray_CheckExact(res) &&
      ((PyObject *)PyArray_DESCR((PyArrayObject *)res) == want ||
       PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)res), (PyArray_Descr *)want))) {
    BaseObject *b = (BaseObject *)d->dtensor->tp_alloc(d->dtensor, 0);
    if (b != NULL) {
      b->local = Py_NewRef(res);
      b->spec = Py_NewRef(spec);
      b->table = Py_NewRef(o->table);
      b->layout = Py_NewRef(o->layout);
    }
    out = (PyObject *)b;
  } else {
    out = PyObject_CallFunctionObjArgs(d->rewrap, spec, res, NULL);
  }
  Py_DECREF(spec);
  Py_DECREF(res);
  return out;
}

/* The keys and NumPy arguments of n operands, and the first DTensor among them;
 * -1 when an operand is not fast or none is a DTensor. */
static int operands(mt_ext_dispatch *d, PyObject *const *ops, int n, PyObject **key,
                    PyObject **arg, PyObject **dt) {
  *dt = NULL;
  for (int i = 0; i < n; ++i) {
    if (operand(d, ops[i], &key[i], &arg[i]) < 0) return -1;
    if (*dt == NULL && Py_TYPE(ops[i]) == d->dtensor) *dt = ops[i];
  }
  return *dt != NULL ? 0 : -1;
}

/* 1 with *out set (a hit), 0 for a miss (nothing done), -1 with an exception. */
static int fast_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops, int n,
                      PyObject **out) {
  PyObject *key[2] = {NULL, NULL}, *arg[2], *dt, *table;
  if (!d->enabled || d->traced || n < 1 || n > 2) return 0;
  if (PyDict_GET_SIZE(d->custom) != 0) {
    int has = PyDict_Contains(d->custom, ufunc);
    if (has != 0) return has < 0 ? -1 : 0;
  }
  mt_ext_entry *e = operands(d, ops, n, key, arg, &dt) < 0
                        ? NULL : find(dt, ufunc, key[0], key[1], n, &table);
  if (e == NULL) {
    d->misses++;
    return 0;
  }
  d->hits++;
  Origin o;
  origin_take(&o, dt, e->out);
  Py_DECREF(table);
  PyObject *res = PyObject_Vectorcall(ufunc, arg, (size_t)n, NULL);
  *out = res == NULL ? NULL : wrap(d, &o, res);
  origin_drop(&o);
  return *out != NULL ? 1 : -1;
}

/* f(first, args..., **kwnames) for a vectorcall argument list. */
static PyObject *call_with_first(PyObject *f, PyObject *first, PyObject *const *args,
                                 Py_ssize_t nargs, PyObject *kwnames) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  PyObject *small[16], **stack = small;
  if (nargs + nkw + 1 > 16) {
    stack = PyMem_Malloc((size_t)(nargs + nkw + 1) * sizeof(PyObject *));
    if (stack == NULL) return PyErr_NoMemory();
  }
  stack[0] = first;
  for (Py_ssize_t i = 0; i < nargs + nkw; ++i) stack[i + 1] = args[i];
  PyObject *res = PyObject_Vectorcall(f, stack, (size_t)(nargs + 1), kwnames);
  if (stack != small) PyMem_Free(stack);
  return res;
}

static PyObject *call2(PyObject *f, PyObject *a, PyObject *b) {
  PyObject *args[2] = {a, b};
  return PyObject_Vectorcall(f, args, 2, NULL);
}

/* -- operators ------------------------------------------------------------------- */

static int base_init(PyObject *self, PyObject *args, PyObject *kwds);

/* Whether `o` is a DTensorBase (subclass) instance: its type or a base has our
 * tp_init, which a subclass without __init__ inherits as is. */
static int is_dtensor_like(PyObject *o) {
  PyObject *mro = Py_TYPE(o)->tp_mro;
  for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); ++i)
    if (((PyTypeObject *)PyTuple_GET_ITEM(mro, i))->tp_init == base_init) return 1;
  return 0;
}

static PyObject *binary(int op, PyObject *l, PyObject *r) {
  int left = is_dtensor_like(l);
  mt_ext_dispatch *d = dispatch_of(left ? l : r);
  if (d == NULL) return NULL;
  PyObject *ops[2] = {l, r}, *res = NULL;
  int hit = fast_ufunc(d, d->bin[op][0], ops, 2, &res);
  if (hit != 0) return res;
  return left ? call2(d->bin[op][1], l, r) : call2(d->bin[op][2], r, l);
}

#define BINARY_SLOT(fn, op) \
  static PyObject *fn(PyObject *l, PyObject *r) { return binary(op, l, r); }
BINARY_SLOT(nb_add, B_ADD)
BINARY_SLOT(nb_sub, B_SUB)
BINARY_SLOT(nb_mul, B_MUL)
BINARY_SLOT(nb_matmul, B_MATMUL)
BINARY_SLOT(nb_tdiv, B_TDIV)
BINARY_SLOT(nb_fdiv, B_FDIV)
BINARY_SLOT(nb_mod, B_MOD)
BINARY_SLOT(nb_lsh, B_LSH)
BINARY_SLOT(nb_rsh, B_RSH)
BINARY_SLOT(nb_and, B_AND)
BINARY_SLOT(nb_xor, B_XOR)
BINARY_SLOT(nb_or, B_OR)

static PyObject *nb_pow(PyObject *l, PyObject *r, PyObject *mod) {
  if (mod == Py_None) return binary(B_POW, l, r);
  /* Three-argument pow: as the mixin's __pow__ would be called (a TypeError). */
  if (!is_dtensor_like(l)) Py_RETURN_NOTIMPLEMENTED;
  mt_ext_dispatch *d = dispatch_of(l);
  if (d == NULL) return NULL;
  PyObject *args[3] = {l, r, mod};
  return PyObject_Vectorcall(d->bin[B_POW][1], args, 3, NULL);
}

static PyObject *unary(int op, PyObject *x) {
  mt_ext_dispatch *d = dispatch_of(x);
  if (d == NULL) return NULL;
  PyObject *res = NULL;
  int hit = fast_ufunc(d, d->un[op][0], &x, 1, &res);
  if (hit != 0) return res;
  return PyObject_Vectorcall(d->un[op][1], &x, 1, NULL);
}

static PyObject *nb_neg(PyObject *x) { return unary(0, x); }
static PyObject *nb_pos(PyObject *x) { return unary(1, x); }
static PyObject *nb_abs(PyObject *x) { return unary(2, x); }
static PyObject *nb_invert(PyObject *x) { return unary(3, x); }

static PyObject *richcompare(PyObject *self, PyObject *other, int op) {
  mt_ext_dispatch *d = dispatch_of(self);
  if (d == NULL) return NULL;
  PyObject *ops[2] = {self, other}, *res = NULL;
  int hit = fast_ufunc(d, d->cmp[op][0], ops, 2, &res);
  if (hit != 0) return res;
  return call2(d->cmp[op][1], self, other);
}

/* -- __array_ufunc__ and reduction methods ------------------------------------------ */

static int is_str(PyObject *o, PyObject *interned) {
  return o == interned || (PyUnicode_Check(o) && PyUnicode_Compare(o, interned) == 0);
}

static PyObject *array_ufunc(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
  mt_ext_dispatch *d = dispatch_of(self);
  if (d == NULL) return NULL;
  if (nargs >= 3 && nargs <= 4 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) &&
      is_str(args[1], d->s_call)) {
    PyObject *res = NULL;
    int hit = fast_ufunc(d, args[0], args + 2, (int)(nargs - 2), &res);
    if (hit != 0) return res;
  }
  return call_with_first(d->ufunc_impl, self, args, nargs, kwnames);
}

/* The key part of a reduction's (axis, keepdims): 0 and *aux set, or -1 when the
 * arguments are not a plain int or None axis and a bool keepdims. */
static int reduction_aux(PyObject *axis, const PyObject *keepdims, long long *aux) {
  long long a = 0;
  if (keepdims != Py_True && keepdims != Py_False) return -1;
  if (axis != Py_None) {
    if (!PyLong_CheckExact(axis)) return -1;
    int overflow = 0;
    long v = PyLong_AsLongAndOverflow(axis, &overflow);
    if (overflow || v < -MT_MAX_NDIM || v > MT_MAX_NDIM) return -1;
    a = (long long)v + MT_MAX_NDIM + 1;
  }
  *aux = 2 * a + (keepdims == Py_True);
  return 0;
}

/* (axis, keepdims) of a call self.<reduction>(axis=None, keepdims=False) when it
 * has only those arguments; -1 otherwise. */
static int reduction_args(mt_ext_dispatch *d, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames, PyObject **axis, PyObject **keepdims) {
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  if (nargs > 1) return -1;
  *axis = nargs == 1 ? args[0] : Py_None;
  *keepdims = Py_False;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject *k = PyTuple_GET_ITEM(kwnames, i);
    if (nargs == 0 && is_str(k, d->s_axis)) *axis = args[i];
    else if (is_str(k, d->s_keepdims)) *keepdims = args[nargs + i];
    else return -1;
  }
  return 0;
}

static PyObject *reduce_method(int idx, PyObject *self, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames) {
  mt_ext_dispatch *d = dispatch_of(self);
  if (d == NULL) return NULL;
  PyObject *axis, *keepdims;
  long long aux;
  PyObject *table;
  BaseObject *b = (BaseObject *)self;
  if (d->enabled && !d->traced && Py_TYPE(self) == d->dtensor && b->local != NULL &&
      b->layout != NULL && PyArray_CheckExact(b->local) &&
      reduction_args(d, args, nargs, kwnames, &axis, &keepdims) == 0 &&
      reduction_aux(axis, keepdims, &aux) == 0) {
    mt_ext_entry *e = find(self, d->red_name[idx], b->layout, NULL, aux, &table);
    if (e != NULL) {
      d->hits++;
      /* The method may run Python code that changes the table: own what we use. */
      Origin o;
      origin_take(&o, self, e->out);
      PyObject *axes = Py_NewRef(e->axes), *local = Py_NewRef(b->local);
      Py_DECREF(table);
      PyObject *stack[3] = {local, axes, keepdims};
      PyObject *res = PyObject_VectorcallMethod(d->red_name[idx], stack, 1,
                                                d->kw_axis_keepdims);
      PyObject *out = res == NULL ? NULL : wrap(d, &o, res);
      origin_drop(&o);
      Py_DECREF(axes);
      Py_DECREF(local);
      return out;
    }
  }
  d->misses++;
  return call_with_first(d->red_impl[idx], self, args, nargs, kwnames);
}

#define REDUCTION(fn, idx)                                                          \
  static PyObject *fn(PyObject *self, PyObject *const *args, Py_ssize_t nargs,   \
                      PyObject *kwnames) {                                       \
    return reduce_method(idx, self, args, nargs, kwnames);                       \
  }
REDUCTION(m_sum, 0)
REDUCTION(m_mean, 1)
REDUCTION(m_prod, 2)
REDUCTION(m_max, 3)
REDUCTION(m_min, 4)
REDUCTION(m_all, 5)
REDUCTION(m_any, 6)
REDUCTION(m_std, 7)
REDUCTION(m_var, 8)

#define RED_DEF(name, fn)                                             \
  {name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL | METH_KEYWORDS, \
   "numpy." name " of this DTensor; see numpy.ndarray." name ". Collective on the " \
   "mesh when a sharded axis or a Partial must be gathered or reduced; a sum, mean, " \
   "prod, max or min over a sharded axis is local and gives a Partial.\n\n"       \
   "Example: dt." name "(axis=0)"}

/* -- the type -------------------------------------------------------------------- */

/* Sets the spec of `b`, the table of its mesh and its layout there: the fast path
 * keys on layout identity, so every DTensor of one layout on a mesh, made
 * anywhere (from_local, redistribute, factories, results), gets the table's one
 * layout tuple. 0, or -1 with an exception. */
static int set_spec(BaseObject *b, PyObject *spec) {
  PyObject *module = PyType_GetModuleByDef(Py_TYPE(b), &mt_ext_module_def);
  if (module == NULL) return -1;
  mt_ext_dispatch *d = mt_ext_state_of(module)->dispatch;
  PyObject *table = d != NULL && d->table_type != NULL
                        ? (PyObject *)table_of(d, spec) : NULL;
  PyObject *layout = NULL;
  if (table != NULL) {
    layout = mt_ext_table_intern((mt_ext_table *)table, spec);
    if (layout == NULL) {
      Py_DECREF(table);
      return -1;
    }
  }
  Py_XSETREF(b->spec, Py_NewRef(spec));
  Py_XSETREF(b->table, table);
  Py_XSETREF(b->layout, layout);
  return 0;
}

static int base_init(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"local_tensor", "spec", NULL};
  PyObject *local, *spec;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:DTensor", kwlist, &local, &spec))
    return -1;
  BaseObject *b = (BaseObject *)self;
  if (set_spec(b, spec) < 0) return -1;
  Py_XSETREF(b->local, Py_NewRef(local));
  return 0;
}

static PyObject *spec_get(PyObject *self, void *closure) {
  BaseObject *b = (BaseObject *)self;
  if (b->spec == NULL) {
    PyErr_SetString(PyExc_AttributeError, "_spec");
    return NULL;
  }
  return Py_NewRef(b->spec);
}

static int spec_set(PyObject *self, PyObject *value, void *closure) {
  BaseObject *b = (BaseObject *)self;
  if (value != NULL) return set_spec(b, value);
  Py_CLEAR(b->spec);
  Py_CLEAR(b->table);
  Py_CLEAR(b->layout);
  return 0;
}

static PyGetSetDef base_getset[] = {
    {"_spec", spec_get, spec_set,
     "The DTensorSpec: mesh, placements, global shape, dtype, stride.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int base_traverse(PyObject *self, visitproc visit, void *arg) {
  BaseObject *b = (BaseObject *)self;
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(b->local);
  Py_VISIT(b->spec);
  Py_VISIT(b->table);
  Py_VISIT(b->layout);
  return 0;
}

static int base_clear(PyObject *self) {
  BaseObject *b = (BaseObject *)self;
  Py_CLEAR(b->local);
  Py_CLEAR(b->spec);
  Py_CLEAR(b->table);
  Py_CLEAR(b->layout);
  return 0;
}

static void base_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  base_clear(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

/* copy.copy(dt) as before the C base: a DTensor of the same local array and spec
 * (pickling then fails on the mesh's communicator, as it always did). */
static PyObject *base_reduce(PyObject *self, PyObject *unused) {
  BaseObject *b = (BaseObject *)self;
  if (b->local == NULL || b->spec == NULL) {
    PyErr_SetString(PyExc_AttributeError, "DTensor has no _local_tensor or _spec");
    return NULL;
  }
  return Py_BuildValue("(O(OO))", (PyObject *)Py_TYPE(self), b->local, b->spec);
}

static PyMemberDef base_members[] = {
    {"_local_tensor", T_OBJECT_EX, offsetof(BaseObject, local), 0,
     "This rank's local ndarray (or a pending asynchronous one)."},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef base_methods[] = {
    {"__array_ufunc__", (PyCFunction)(void (*)(void))array_ufunc,
     METH_FASTCALL | METH_KEYWORDS,
     "NumPy ufuncs on DTensors, sharded (see mpitensor._ops._elementwise)."},
    {"__reduce__", base_reduce, METH_NOARGS, "(type, (local_tensor, spec))."},
    RED_DEF("sum", m_sum), RED_DEF("mean", m_mean), RED_DEF("prod", m_prod),
    RED_DEF("max", m_max), RED_DEF("min", m_min),   RED_DEF("all", m_all),
    RED_DEF("any", m_any), RED_DEF("std", m_std),   RED_DEF("var", m_var),
    {NULL, NULL, 0, NULL},
};

static PyType_Slot base_slots[] = {
    {Py_tp_doc, "The C base of mpitensor.DTensor: its two fields and the fast path "
                "of NumPy operations. Internal: use mpitensor.DTensor."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, base_init},
    {Py_tp_dealloc, base_dealloc},
    {Py_tp_traverse, base_traverse},
    {Py_tp_clear, base_clear},
    {Py_tp_members, base_members},
    {Py_tp_getset, base_getset},
    {Py_tp_methods, base_methods},
    {Py_tp_richcompare, richcompare},
    {Py_nb_add, nb_add},
    {Py_nb_subtract, nb_sub},
    {Py_nb_multiply, nb_mul},
    {Py_nb_matrix_multiply, nb_matmul},
    {Py_nb_true_divide, nb_tdiv},
    {Py_nb_floor_divide, nb_fdiv},
    {Py_nb_remainder, nb_mod},
    {Py_nb_power, nb_pow},
    {Py_nb_lshift, nb_lsh},
    {Py_nb_rshift, nb_rsh},
    {Py_nb_and, nb_and},
    {Py_nb_xor, nb_xor},
    {Py_nb_or, nb_or},
    {Py_nb_negative, nb_neg},
    {Py_nb_positive, nb_pos},
    {Py_nb_absolute, nb_abs},
    {Py_nb_invert, nb_invert},
    {0, NULL},
};

static PyType_Spec base_spec = {
    .name = "mpitensor._C.DTensorBase",
    .basicsize = sizeof(BaseObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = base_slots,
};

/* -- module functions ---------------------------------------------------------------- */

static int get_attr(PyObject *obj, const char *name, PyObject **out) {
  *out = PyObject_GetAttrString(obj, name);
  return *out == NULL ? -1 : 0;
}

static int install_ops(mt_ext_dispatch *d, PyObject *mixin, PyObject *numpy) {
  for (int i = 0; i < BIN_N; ++i)
    if (get_attr(numpy, BIN_NAMES[i][0], &d->bin[i][0]) < 0 ||
        get_attr(mixin, BIN_NAMES[i][1], &d->bin[i][1]) < 0 ||
        get_attr(mixin, BIN_NAMES[i][2], &d->bin[i][2]) < 0)
      return -1;
  for (int i = 0; i < UN_N; ++i)
    if (get_attr(numpy, UN_NAMES[i][0], &d->un[i][0]) < 0 ||
        get_attr(mixin, UN_NAMES[i][1], &d->un[i][1]) < 0)
      return -1;
  for (int i = 0; i < CMP_N; ++i)
    if (get_attr(numpy, CMP_NAMES[i][0], &d->cmp[i][0]) < 0 ||
        get_attr(mixin, CMP_NAMES[i][1], &d->cmp[i][1]) < 0)
      return -1;
  return 0;
}

static int install_reductions(mt_ext_dispatch *d, PyObject *impls) {
  for (int i = 0; i < RED_N; ++i) {
    d->red_name[i] = PyUnicode_InternFromString(RED_NAMES[i]);
    if (d->red_name[i] == NULL) return -1;
    d->red_impl[i] = PyObject_GetItem(impls, d->red_name[i]);
    if (d->red_impl[i] == NULL) return -1;
  }
  d->s_call = PyUnicode_InternFromString("__call__");
  d->s_axis = PyUnicode_InternFromString("axis");
  d->s_keepdims = PyUnicode_InternFromString("keepdims");
  if (d->s_call == NULL || d->s_axis == NULL || d->s_keepdims == NULL) return -1;
  d->s_dispatch = PyUnicode_InternFromString("_dispatch");
  if (d->s_dispatch == NULL) return -1;
  d->kw_axis_keepdims = PyTuple_Pack(2, d->s_axis, d->s_keepdims);
  return d->kw_axis_keepdims == NULL ? -1 : 0;
}

static mt_ext_dispatch *module_dispatch(PyObject *module) {
  return mt_ext_state_of(module)->dispatch;
}

/* dispatch_install(DTensor, custom, ufunc_impl, rewrap, mixin, numpy, reductions) */
static PyObject *dispatch_install(PyObject *module, PyObject *const *args,
                                  Py_ssize_t nargs) {
  if (nargs != 7) {
    PyErr_SetString(PyExc_TypeError, "dispatch_install takes 7 arguments");
    return NULL;
  }
  mt_ext_state *st = mt_ext_state_of(module);
  if (!PyType_Check(args[0]) ||
      !PyType_IsSubtype((PyTypeObject *)args[0], st->dtensor_base_type) ||
      !PyDict_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError,
                    "dispatch_install needs a DTensorBase subclass and a dict");
    return NULL;
  }
  mt_ext_dispatch_clear(st);
  mt_ext_dispatch *d = st->dispatch;
  d->custom = Py_NewRef(args[1]);
  d->ufunc_impl = Py_NewRef(args[2]);
  d->rewrap = Py_NewRef(args[3]);
  if (install_ops(d, args[4], args[5]) < 0 || install_reductions(d, args[6]) < 0) {
    mt_ext_dispatch_clear(st);
    return NULL;
  }
  d->table_type = st->table_type;
  d->dtensor = (PyTypeObject *)Py_NewRef(args[0]);
  d->enabled = 1;
  Py_RETURN_NONE;
}

static mt_ext_dispatch *installed(PyObject *module) {
  mt_ext_dispatch *d = module_dispatch(module);
  if (d->dtensor == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "mpitensor._C.dispatch_install was not called");
    return NULL;
  }
  return d;
}

/* Adds (op, k0, k1, aux) -> the layout of DTensor `out` to the table of DTensor
 * `dt`'s mesh, when both have layouts there and out's dtype is a NumPy dtype. */
static PyObject *record(mt_ext_dispatch *d, PyObject *dt, PyObject *op, PyObject *k0,
                        PyObject *k1, long long aux, PyObject *out, PyObject *axes) {
  BaseObject *b = (BaseObject *)dt, *r = (BaseObject *)out;
  if (Py_TYPE(out) != d->dtensor || b->table == NULL || r->layout == NULL ||
      r->table != b->table || !PyArray_DescrCheck(PyTuple_GET_ITEM(r->layout, 2)))
    Py_RETURN_NONE;
  if (mt_ext_table_insert((mt_ext_table *)b->table, op, k0, k1, aux, r->layout, axes) < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* dispatch_record_ufunc(ufunc, operands, out): no-op unless every operand is a
 * DTensor or a Python/NumPy scalar. */
static PyObject *dispatch_record_ufunc(PyObject *module, PyObject *const *args,
                                       Py_ssize_t nargs) {
  mt_ext_dispatch *d = installed(module);
  if (d == NULL) return NULL;
  if (nargs != 3 || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "dispatch_record_ufunc(ufunc, operands, out)");
    return NULL;
  }
  int n = (int)PyTuple_GET_SIZE(args[1]);
  PyObject *key[2] = {NULL, NULL}, *arg[2], *dt;
  if (n < 1 || n > 2 || operands(d, &PyTuple_GET_ITEM(args[1], 0), n, key, arg, &dt) < 0)
    Py_RETURN_NONE;
  return record(d, dt, args[0], key[0], key[1], n, args[2], NULL);
}

/* dispatch_record_reduction(name, dtensor, axis, keepdims, axes, out): no-op unless
 * name is one of the fast methods and axis an int or None. */
static PyObject *dispatch_record_reduction(PyObject *module, PyObject *const *args,
                                           Py_ssize_t nargs) {
  mt_ext_dispatch *d = installed(module);
  if (d == NULL) return NULL;
  if (nargs != 6 || Py_TYPE(args[1]) != d->dtensor || !PyTuple_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "dispatch_record_reduction(name, dtensor, axis, keepdims, axes, out)");
    return NULL;
  }
  long long aux;
  PyObject *layout = ((BaseObject *)args[1])->layout;
  if (layout == NULL || reduction_aux(args[2], args[3], &aux) < 0) Py_RETURN_NONE;
  for (int i = 0; i < RED_N; ++i)
    if (PyUnicode_Check(args[0]) && is_str(args[0], d->red_name[i]))
      return record(d, args[1], d->red_name[i], layout, NULL, aux, args[5], args[4]);
  Py_RETURN_NONE;
}

/* dispatch_enable(flag) -> the previous flag. */
static PyObject *dispatch_enable(PyObject *module, PyObject *flag) {
  mt_ext_dispatch *d = installed(module);
  if (d == NULL) return NULL;
  int on = PyObject_IsTrue(flag);
  if (on < 0) return NULL;
  int was = d->enabled;
  d->enabled = on;
  return PyBool_FromLong(was);
}

/* set_modes(tracing, grad_enabled): mpitensor._modes publishes the modes C needs.
 * While a debugging tool listens, the slow path runs every call, so that decisions
 * are logged and traced there. Works before install. */
static PyObject *set_modes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "set_modes(tracing, grad_enabled)");
    return NULL;
  }
  int traced = PyObject_IsTrue(args[0]), grad = PyObject_IsTrue(args[1]);
  if (traced < 0 || grad < 0) return NULL;
  module_dispatch(module)->traced = traced;
  Py_RETURN_NONE;
}

static PyObject *dispatch_stats(PyObject *module, PyObject *unused) {
  mt_ext_dispatch *d = module_dispatch(module);
  return Py_BuildValue("(LL)", d->hits, d->misses);
}

PyMethodDef mt_ext_dispatch_methods[] = {
    {"dispatch_install", (PyCFunction)(void (*)(void))dispatch_install, METH_FASTCALL,
     "dispatch_install(DTensor, custom, ufunc_impl, rewrap, mixin, numpy, reductions): "
     "connects the fast path to the Python slow path. Local."},
    {"dispatch_record_ufunc", (PyCFunction)(void (*)(void))dispatch_record_ufunc,
     METH_FASTCALL,
     "dispatch_record_ufunc(ufunc, operands, out): a decision without "
     "communication, for the fast path. Local."},
    {"dispatch_record_reduction", (PyCFunction)(void (*)(void))dispatch_record_reduction,
     METH_FASTCALL,
     "dispatch_record_reduction(name, dtensor, axis, keepdims, axes, out). Local."},
    {"dispatch_enable", dispatch_enable, METH_O,
     "dispatch_enable(flag) -> previous: turns the fast path on or off. Local."},
    {"set_modes", (PyCFunction)(void (*)(void))set_modes, METH_FASTCALL,
     "set_modes(tracing, grad_enabled): the modes of mpitensor._modes that C reads. "
     "Local."},
    {"dispatch_stats", dispatch_stats, METH_NOARGS,
     "dispatch_stats() -> (hits, misses) of the fast path so far. Local."},
    {NULL, NULL, 0, NULL},
};

void mt_ext_dispatch_clear(mt_ext_state *st) {
  mt_ext_dispatch *d = st->dispatch;
  if (d == NULL) return;
  Py_CLEAR(d->dtensor);
  Py_CLEAR(d->custom);
  Py_CLEAR(d->ufunc_impl);
  Py_CLEAR(d->rewrap);
  for (int i = 0; i < BIN_N; ++i)
    for (int j = 0; j < 3; ++j) Py_CLEAR(d->bin[i][j]);
  for (int i = 0; i < UN_N; ++i) {
    Py_CLEAR(d->un[i][0]);
    Py_CLEAR(d->un[i][1]);
  }
  for (int i = 0; i < CMP_N; ++i) {
    Py_CLEAR(d->cmp[i][0]);
    Py_CLEAR(d->cmp[i][1]);
  }
  for (int i = 0; i < RED_N; ++i) {
    Py_CLEAR(d->red_name[i]);
    Py_CLEAR(d->red_impl[i]);
  }
  Py_CLEAR(d->s_call);
  Py_CLEAR(d->s_axis);
  Py_CLEAR(d->s_keepdims);
  Py_CLEAR(d->s_dispatch);
  Py_CLEAR(d->kw_axis_keepdims);
  d->table_type = NULL;
  d->enabled = 0;
}

int mt_ext_dispatch_traverse(mt_ext_state *st, visitproc visit, void *arg) {
  mt_ext_dispatch *d = st->dispatch;
  if (d == NULL) return 0;
  Py_VISIT(d->dtensor);
  Py_VISIT(d->custom);
  Py_VISIT(d->ufunc_impl);
  Py_VISIT(d->rewrap);
  for (int i = 0; i < BIN_N; ++i)
    for (int j = 0; j < 3; ++j) Py_VISIT(d->bin[i][j]);
  for (int i = 0; i < UN_N; ++i) {
    Py_VISIT(d->un[i][0]);
    Py_VISIT(d->un[i][1]);
  }
  for (int i = 0; i < CMP_N; ++i) {
    Py_VISIT(d->cmp[i][0]);
    Py_VISIT(d->cmp[i][1]);
  }
  for (int i = 0; i < RED_N; ++i) Py_VISIT(d->red_impl[i]);
  return 0;
}

void mt_ext_dispatch_free(mt_ext_state *st) {
  mt_ext_dispatch_clear(st);
  PyMem_Free(st->dispatch);
  st->dispatch = NULL;
}

int mt_ext_dispatch_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->dispatch = PyMem_Calloc(1, sizeof(mt_ext_dispatch));
  if (st->dispatch == NULL) {
    PyErr_NoMemory();
    return -1;
  }
  st->dtensor_base_type =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &base_spec, NULL);
  if (st->dtensor_base_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "DTensorBase", (PyObject *)st->dtensor_base_type);
}
