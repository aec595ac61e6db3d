/* _C.DTensorBase: the C base of mpitensor.DTensor. It holds the local ndarray,
 * the spec, the layout id of the spec on its mesh (found when first needed), and
 * autograd's requires_grad bit and node; its operators (in place too), __array_ufunc__,
 * reduction methods and redistribute are the executor's doors (ext_entry.c,
 * ext_move.c). NumPy functions come in through DTensor.__array_function__, in
 * Python, to the Python door (mpitensor._registry.door). */
#include "ext.h"

#include <stddef.h>
#include <structmember.h>

static void base_dealloc(PyObject *self);

/* DTensorBase itself when `o` is an instance of it or of a subclass, else NULL:
 * the one type in o's MRO with our dealloc (a subclass has CPython's). */
static PyTypeObject *base_of(PyObject *o) {
  /* DTensor's own base first: every operator of a DTensor looks it up. */
  PyTypeObject *base = Py_TYPE(o)->tp_base;
  if (base != NULL && base->tp_dealloc == base_dealloc) return base;
  PyObject *mro = Py_TYPE(o)->tp_mro;
  for (Py_ssize_t i = 0; mro != NULL && i < PyTuple_GET_SIZE(mro); ++i) {
    PyTypeObject *t = (PyTypeObject *)PyTuple_GET_ITEM(mro, i);
    if (t->tp_dealloc == base_dealloc) return t;
  }
  return NULL;
}

/* The module state of DTensorBase (a heap type made with its module), read
 * from the type directly: PyType_GetModuleState checks what is known here, on
 * every operator and every free of a DTensor. */
static mt_ext_state *state_of_base(PyTypeObject *base) {
  PyObject *module = ((PyHeapTypeObject *)base)->ht_module;
  return module != NULL ? mt_ext_state_of(module) : NULL;
}

/* The dispatch's state from DTensorBase's module state (NULL with an exception
 * for no DTensorBase, or before dispatch_init). */
static mt_ext_dispatch *dispatch_at(PyTypeObject *base) {
  mt_ext_state *st = base != NULL ? state_of_base(base) : NULL;
  if (st == NULL || st->dispatch == NULL || st->dispatch->dtensor == NULL) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_RuntimeError, "mpitensor._C.dispatch_init was not called");
    return NULL;
  }
  return st->dispatch;
}

static mt_ext_dispatch *dispatch_of(PyObject *o) { return dispatch_at(base_of(o)); }

/* A binary operator: the slot runs for l or r, whichever is a DTensor. */
static PyObject *binary(int op, PyObject *l, PyObject *r) {
  PyTypeObject *base = base_of(l);
  mt_ext_dispatch *d = dispatch_at(base != NULL ? base : base_of(r));
  if (d == NULL) return NULL;
  PyObject *ops[2] = {l, r};
  return mt_ext_ufunc(d, d->ufunc[op], ops, 2, NULL);
}

static PyObject *unary(int op, PyObject *x) {
  mt_ext_dispatch *d = dispatch_of(x);
  return d == NULL ? NULL : mt_ext_ufunc(d, d->ufunc[op], &x, 1, NULL);
}

/* An operator in place, x op= y: the ufunc into x, as NumPy's out=(x,). Where
 * that is not implemented, x op y, as CPython would do next: a C slot of a base
 * class is also a subclass's sq_inplace_concat, which CPython would call again
 * for +=, and take its NotImplemented as the result. */
static PyObject *in_place(int op, PyObject *x, PyObject *y,
                          PyObject *(*not_in_place)(PyObject *, PyObject *)) {
  mt_ext_dispatch *d = dispatch_of(x);
  PyObject *res = d == NULL ? NULL : mt_ext_ufunc_in_place(d, d->ufunc[op], x, y);
  if (res != Py_NotImplemented) return res;
  Py_DECREF(res);
  return not_in_place(x, y);
}

static PyObject *power_of(PyObject *x, PyObject *y) { return PyNumber_Power(x, y, Py_None); }

#define BINARY_SLOT(name, _) \
  static PyObject *nb_##name(PyObject *l, PyObject *r) { return binary(MT_UF_##name, l, r); }
#define UNARY_SLOT(name, _) \
  static PyObject *nb_##name(PyObject *x) { return unary(MT_UF_##name, x); }
#define IN_PLACE_SLOT(name, _, not_in_place)                  \
  static PyObject *in_place_##name(PyObject *x, PyObject *y) { \
    return in_place(MT_UF_##name, x, y, not_in_place);         \
  }
MT_EXT_BINARY(BINARY_SLOT)
MT_EXT_UNARY(UNARY_SLOT)
MT_EXT_IN_PLACE(IN_PLACE_SLOT)

/* The ufunc NumPy's ** takes in place of power for a DTensor x raised to y, or -1:
 * an exact int 2 squares whatever the dtype, an exact int -1 and an exact float 0.5
 * take reciprocal and sqrt for floating and complex dtypes (NumPy's
 * fast_scalar_power). Their results differ from power's, in dtype (a bool squared
 * is int8) or in the last bit of complex values, so DTensors take the same paths. */
static int power_path(PyObject *x, PyObject *y) {
  if (base_of(x) == NULL) return -1;
  PyObject *local = ((mt_ext_dtensor *)x)->local;
  if (local == NULL || !PyArray_Check(local)) return -1;
  PyArray_Descr *descr = PyArray_DESCR((PyArrayObject *)local);
  int inexact = PyDataType_ISFLOAT(descr) || PyDataType_ISCOMPLEX(descr);
  if (PyLong_CheckExact(y)) {
    int overflow = 0;
    long e = PyLong_AsLongAndOverflow(y, &overflow);
    if (e == -1 && PyErr_Occurred()) PyErr_Clear();
    if (overflow) return -1;
    if (e == 2) return MT_UF_square;
    return e == -1 && inexact ? MT_UF_reciprocal : -1;
  }
  return PyFloat_CheckExact(y) && PyFloat_AS_DOUBLE(y) == 0.5 && inexact ? MT_UF_sqrt : -1;
}

/* CPython's ternaryfunc fixes the parameter types. */
/* cppcheck-suppress constParameter */
static PyObject *nb_power(PyObject *l, PyObject *r, PyObject *mod) {
  if (mod != Py_None)
    return PyErr_Format(PyExc_TypeError, "pow() with a modulus is not supported on DTensors");
  int path = power_path(l, r);
  return path < 0 ? binary(MT_UF_power, l, r) : unary(path, l);
}

/* cppcheck-suppress constParameter */
static PyObject *in_place_power(PyObject *x, PyObject *y, PyObject *mod) {
  if (mod != Py_None)
    return PyErr_Format(PyExc_TypeError, "pow() with a modulus is not supported on DTensors");
  int path = power_path(x, y);
  if (path < 0) return in_place(MT_UF_power, x, y, power_of);
  mt_ext_dispatch *d = dispatch_of(x);
  return d == NULL ? NULL : mt_ext_ufunc_in_place(d, d->ufunc[path], x, NULL);
}

static PyObject *richcompare(PyObject *self, PyObject *other, int op) {
  mt_ext_dispatch *d = dispatch_of(self);
  if (d == NULL) return NULL;
  PyObject *ops[2] = {self, other};
  return mt_ext_ufunc(d, d->ufunc[MT_UF_less + op], ops, 2, NULL);
}

/* __array_ufunc__(ufunc, method, *operands, **kwargs). */
static PyObject *array_ufunc(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
  mt_ext_dispatch *d = dispatch_of(self);
  if (d == NULL) return NULL;
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError, "__array_ufunc__(ufunc, method, *inputs, **kwargs)");
    return NULL;
  }
  return mt_ext_array_ufunc(d, args[0], args[1], args + 2, nargs - 2, kwnames);
}

#define REDUCTION(name, _)                                                           \
  static PyObject *m_##name(PyObject *self, PyObject *const *args, Py_ssize_t nargs,   \
                            PyObject *kwnames) {                                      \
    mt_ext_dispatch *d = dispatch_of(self);                                           \
    return d == NULL ? NULL                                                           \
                     : mt_ext_reduction(d, MT_RED_##name, self, args, nargs, kwnames); \
  }
MT_EXT_REDUCTIONS(REDUCTION)

#define REDUCTION_DEF(name, partial)                                                  \
  {#name, (PyCFunction)(void (*)(void))m_##name, METH_FASTCALL | METH_KEYWORDS,        \
   partial ? "numpy." #name " of this DTensor; see numpy.ndarray." #name ". Over a "   \
             "sharded axis it is local and gives a Partial. Collective on the mesh "   \
             "when a Partial must be reduced first.\n\nExample: dt." #name "(axis=0)"   \
           : "numpy." #name " of this DTensor; see numpy.ndarray." #name ". The "       \
             "reduced axes are gathered first: collective on the mesh when one is "    \
             "sharded or a Partial must be reduced.\n\nExample: dt." #name "(axis=0)"},

/* -- redistribute -------------------------------------------------------------------- */

/* The keyword arguments of redistribute, in the order of its parameters. */
static const char *const redistribute_kw[] = {"device_mesh", "placements", "async_op",
                                              "forward_dtype", "backward_dtype"};
enum { RD_MESH, RD_PLACEMENTS, RD_ASYNC, RD_FORWARD, RD_BACKWARD, RD_NARGS };

/* Its arguments by parameter (NULL: not given); 0 when they do not bind. */
static int redistribute_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                             PyObject **bound) {
  for (int i = 0; i < RD_NARGS; ++i) bound[i] = NULL;
  if (nargs > 2) return 0;
  for (Py_ssize_t i = 0; i < nargs; ++i) bound[i] = args[i];
  Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, k);
    int at = -1;
    for (int j = 0; at < 0 && j < RD_NARGS; ++j)
      if (PyUnicode_CompareWithASCIIString(name, redistribute_kw[j]) == 0) at = j;
    if (at < 0 || bound[at] != NULL) return 0;
    bound[at] = args[nargs + k];
  }
  return 1;
}

/* redistribute(device_mesh=None, placements=None, *, async_op=False,
 * forward_dtype=None, backward_dtype=None): the move in the executor. */
static PyObject *m_redistribute(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
  mt_ext_dispatch *d = dispatch_of(self);
  if (d == NULL) return NULL;
  PyObject *a[RD_NARGS];
  if (!redistribute_args(args, nargs, kwnames, a))
    return PyErr_Format(PyExc_TypeError, "redistribute(device_mesh=None, placements=None, "
                        "*, async_op=False, forward_dtype=None, backward_dtype=None)");
  int async = a[RD_ASYNC] != NULL ? PyObject_IsTrue(a[RD_ASYNC]) : 0;
  if (async < 0) return NULL;
  for (int i = 0; i < RD_NARGS; ++i)
    if (a[i] == NULL) a[i] = Py_None;
  return mt_ext_move(d, self, a[RD_MESH], a[RD_PLACEMENTS], async, a[RD_FORWARD],
                     a[RD_BACKWARD], d->str[MT_S_REDISTRIBUTE]);
}

PyDoc_STRVAR(redistribute_doc,
"redistribute($self, /, device_mesh=None, placements=None, *, async_op=False,\n"
"             forward_dtype=None, backward_dtype=None)\n"
"--\n"
"\n"
"The same global tensor with new placements. Collective on the mesh.\n"
"\n"
"``placements`` is required (RuntimeError without it, as in torch; write\n"
"``[Replicate()] * mesh.ndim`` or use :meth:`full_tensor`). Each change runs as\n"
"the cheapest plan the C planner finds: one MPI collective on one mesh dim\n"
"where that does the job (Shard->Replicate all-gather, Shard->Shard\n"
"all-to-all, Replicate->Shard local chunk, Partial->Replicate all-reduce,\n"
"Partial->Shard reduce-scatter), or one direct all-to-all over the mesh that\n"
"moves each element at most once. Uneven shards are never padded.\n"
"``forward_dtype`` casts before communicating. With ``async_op=True`` every\n"
"collective is issued before the call returns, the last one nonblocking; the\n"
"data is completed on first use (see :meth:`to_local`) or by :meth:`wait`. The\n"
"result is that of this tensor's values at the call, as torch's: writing to\n"
"its local array before the wait does not change it.\n"
"In backward (autograd), the gradient goes back to this tensor's placements\n"
"(a Partial's: Replicate), cast to ``backward_dtype`` first when given (each\n"
"rank's part as it is, so the collective moves that dtype) and to this\n"
"tensor's dtype after.\n"
"Partial placements may be kept but not created: RuntimeError. A reduction\n"
"the dtype lacks (complex max/min, bool or integer avg) is a TypeError on\n"
"every rank, whatever the mesh size.\n"
"\n"
"A repeated move (same layout, same target) runs its cached plan from the\n"
"mesh's memo without running any Python code.\n"
"\n"
"Example (``mpiexec -n 4``)::\n"
"\n"
"    >>> mesh = init_device_mesh(\"cpu\", (4,))\n"
"    >>> dt = distribute_tensor(np.arange(16.0).reshape(4, 4), mesh, [Shard(0)])\n"
"    >>> dt.redistribute(mesh, [Shard(1)]).to_local().shape   # one all-to-all\n"
"    (4, 1)\n");

/* -- fields ------------------------------------------------------------------------- */

static int base_init(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"local_tensor", "spec", NULL};
  PyObject *local, *spec;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:DTensor", kwlist, &local, &spec))
    return -1;
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  Py_XSETREF(b->spec, Py_NewRef(spec));
  Py_XSETREF(b->local, Py_NewRef(local));
  b->layout_id = 0, b->fresh = 0;
  return 0;
}

static PyObject *spec_get(PyObject *self, void *closure) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  if (b->spec == NULL) {
    PyErr_SetString(PyExc_AttributeError, "_spec");
    return NULL;
  }
  return Py_NewRef(b->spec);
}

/* A new spec may be another layout: its id is found again when needed. */
static int spec_set(PyObject *self, PyObject *value, void *closure) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  Py_XSETREF(b->spec, Py_XNewRef(value));
  b->layout_id = 0;
  return 0;
}

/* _local_tensor: a waiting Deferred is settled first, since the array handed out
 * may be written (ext_deferred.c); a pending asynchronous move stays as it is. */
static PyObject *local_get(PyObject *self, void *unused) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  mt_ext_dispatch *d = dispatch_of(self);
  if (d == NULL || (d->deferred != NULL && mt_ext_settle(d) < 0)) return NULL;
  /* Read after the settle, which runs Python code. */
  if (b->local != NULL && Py_TYPE(b->local) == d->deferred_type &&
      mt_ext_complete_deferred(d, b) < 0)
    return NULL;
  if (b->local == NULL) PyErr_SetString(PyExc_AttributeError, "_local_tensor");
  return Py_XNewRef(b->local);
}

static int local_set(PyObject *self, PyObject *value, void *unused) {
  Py_XSETREF(((mt_ext_dtensor *)self)->local, Py_XNewRef(value));
  return 0;
}

static PyGetSetDef base_getset[] = {
    {"_spec", spec_get, spec_set,
     "The DTensorSpec: mesh, placements, global shape, dtype, stride.", NULL},
    {"_local_tensor", local_get, local_set,
     "This rank's local ndarray (or a pending asynchronous one).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef base_members[] = {
    {"_requires_grad", T_BOOL, offsetof(mt_ext_dtensor, requires_grad), 0,
     "Whether autograd records operations on this tensor while grad mode is on."},
    {"_grad_fn", T_OBJECT, offsetof(mt_ext_dtensor, grad_fn), 0,
     "The autograd Node that made this tensor, or None (a leaf)."},
    {"_fresh", T_BOOL, offsetof(mt_ext_dtensor, fresh), 0,
     "Made during a backward by the executor, whose new local array only this "
     "DTensor holds: autograd's engine may write into it."},
    {"_grad", T_OBJECT_EX, offsetof(mt_ext_dtensor, grad), 0,
     "The accumulated gradient (unset until one is stored)."},
    {"_retains_grad", T_OBJECT_EX, offsetof(mt_ext_dtensor, retains_grad), 0,
     "retain_grad()'s flag (unset until called)."},
    {"_grad_owned", T_OBJECT_EX, offsetof(mt_ext_dtensor, grad_owned), 0,
     "Whether the gradient is still the engine's own: nobody read it since it was "
     "stored."},
    {"_backward_hooks", T_OBJECT_EX, offsetof(mt_ext_dtensor, backward_hooks), 0,
     "register_hook's table (unset until used)."},
    {"_post_accumulate_grad_hooks", T_OBJECT_EX, offsetof(mt_ext_dtensor, post_hooks), 0,
     "register_post_accumulate_grad_hook's table (unset until used)."},
    {NULL, 0, 0, 0, NULL},
};

/* Every object field, for traverse and clear. */
#define DTENSOR_OBJECTS(X, b)                                                          \
  X(b->local); X(b->spec); X(b->grad_fn); X(b->grad); X(b->retains_grad);              \
  X(b->grad_owned); X(b->backward_hooks); X(b->post_hooks)

static int base_traverse(PyObject *self, visitproc visit, void *arg) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  Py_VISIT(Py_TYPE(self));
  DTENSOR_OBJECTS(Py_VISIT, b);
  return 0;
}

static int base_clear(PyObject *self) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  DTENSOR_OBJECTS(Py_CLEAR, b);
  return 0;
}

/* The dispatch whose DTensor type is `tp`, else NULL (no exception). */
static mt_ext_dispatch *dispatch_of_dtensor_type(PyTypeObject *tp) {
  PyTypeObject *base = tp->tp_base;
  if (base == NULL || base->tp_dealloc != base_dealloc) return NULL;
  mt_ext_state *st = state_of_base(base);
  mt_ext_dispatch *d = st != NULL ? st->dispatch : NULL;
  return d != NULL && d->dtensor == tp ? d : NULL;
}

/* A DTensor's memory goes back to the allocator, or, for a DTensor of exactly the
 * dispatch's type, waits in its free list: every operation makes one, and
 * allocating it (malloc, zeroing, GC link) and freeing it cost as much as the
 * executor's decision. By then base_clear has cleared its fields. */
static void base_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  base_clear(self);
  mt_ext_dispatch *d = dispatch_of_dtensor_type(tp);
  if (d != NULL && d->nfree_dtensors < MT_EXT_FREE_DTENSORS)
    d->free_dtensors[d->nfree_dtensors++] = self;
  else
    tp->tp_free(self);
  Py_DECREF(tp);
}

/* _data(): the local ndarray, its pending move completed first (the executor's
 * completion, mt_ext_complete). */
static PyObject *m_data(PyObject *self, PyObject *unused) {
  mt_ext_dispatch *d = dispatch_of(self);
  if (d == NULL || mt_ext_complete(d, (mt_ext_dtensor *)self) < 0) return NULL;
  PyObject *local = ((mt_ext_dtensor *)self)->local;
  if (local == NULL) PyErr_SetString(PyExc_AttributeError, "_local_tensor");
  return Py_XNewRef(local);
}

static PyMethodDef base_methods[] = {
    {"_data", m_data, METH_NOARGS,
     "The local ndarray, whatever grad mode says, completing a pending asynchronous "
     "redistribute first. Local unless one is pending (then collective on the mesh)."
     "\n\nExample: dt._data().shape"},
    {"redistribute", (PyCFunction)(void (*)(void))m_redistribute,
     METH_FASTCALL | METH_KEYWORDS, redistribute_doc},
    {"__array_ufunc__", (PyCFunction)(void (*)(void))array_ufunc,
     METH_FASTCALL | METH_KEYWORDS,
     "NumPy ufuncs on DTensors, sharded (see mpitensor._ops._elementwise)."},
    MT_EXT_REDUCTIONS(REDUCTION_DEF)
    {NULL, NULL, 0, NULL},
};

static PyType_Slot base_slots[] = {
    {Py_tp_doc, "The C base of mpitensor.DTensor: its fields and the entry points of "
                "NumPy operations. Internal: use mpitensor.DTensor."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, base_init},
    {Py_tp_dealloc, base_dealloc},
    {Py_tp_traverse, base_traverse},
    {Py_tp_clear, base_clear},
    {Py_tp_members, base_members},
    {Py_tp_getset, base_getset},
    {Py_tp_methods, base_methods},
    {Py_tp_richcompare, richcompare},
#define SLOT(name, slot) {slot, nb_##name},
    MT_EXT_BINARY(SLOT) MT_EXT_UNARY(SLOT) {Py_nb_power, nb_power},
#define IN_PLACE_SLOT_ENTRY(name, slot, _) {slot, in_place_##name},
    MT_EXT_IN_PLACE(IN_PLACE_SLOT_ENTRY) {Py_nb_inplace_power, in_place_power},
    {0, NULL},
};

static PyType_Spec base_spec = {
    .name = "mpitensor._C.DTensorBase",
    .basicsize = sizeof(mt_ext_dtensor),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = base_slots,
};

int mt_ext_dtensor_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->dtensor_base_type =
      (PyTypeObject *)PyType_FromModuleAndSpec(module, &base_spec, NULL);
  if (st->dtensor_base_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "DTensorBase", (PyObject *)st->dtensor_base_type);
}
