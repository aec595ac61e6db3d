/* The agreement on a NumPy call a program makes on DTensors (mpitensor.
 * _call_agreement): before the call runs, the ranks of its mesh agree on a
 * fingerprint of it, equal on every rank exactly when the calls are alike, up to a
 * 64-bit collision. DTensors count by placements, global shape and dtype (their
 * local values differ by rank), ndarrays by shape, dtype and bytes, numbers,
 * strings, slices and their lists and tuples by value, functions and types by module
 * and qualified name, anything else by its type. Python's own hash salts strings
 * per process, so the values are encoded here into one byte stream with a fixed
 * hash. Every call a program makes pays for the agreement, so all of it is here in
 * C: whose call it is, the mesh, the fingerprint and the all-reduce; and the
 * flags of the call's arguments (call_flags), which it hands the Python door. */
#include "ext.h"

#include <stdio.h>
#include <string.h>

#include "mpitensor/comm/agree.h"
#include "mpitensor/core/layout.h"

/* A streaming 64-bit hash: words folded by multiply and rotate, then mixed as
 * splitmix64 finishes, so that nearby streams spread over the whole range. */
typedef struct hasher {
  uint64_t h;
  uint64_t n; /* bytes fed */
} hasher;

static uint64_t rotl(uint64_t x, int r) { return x << r | x >> (64 - r); }

static void feed_word(hasher *s, uint64_t w) {
  s->h ^= rotl(w * 0x87c37b91114253d5ull, 31) * 0x4cf5ad432745937full;
  s->h = rotl(s->h, 27) * 5 + 0x52dce729;
}

static void feed(hasher *s, const void *data, size_t len) {
  const unsigned char *p = data;
  s->n += len;
  for (; len >= 8; p += 8, len -= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    feed_word(s, w);
  }
  if (len) {
    uint64_t w = 0;
    memcpy(&w, p, len);
    feed_word(s, w ^ (uint64_t)len << 56);
  }
}

static void feed_i64(hasher *s, int64_t v) { feed_word(s, (uint64_t)v), s->n += 8; }

static void feed_tag(hasher *s, char tag) { feed_word(s, (uint64_t)(unsigned char)tag), ++s->n; }

static uint64_t finish(hasher *s) {
  uint64_t z = s->h ^ s->n;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A str's UTF-8 bytes, length first. -1 with an exception. */
static int feed_str(hasher *s, PyObject *o) {
  Py_ssize_t len;
  const char *u = PyUnicode_AsUTF8AndSize(o, &len);
  if (u == NULL) return -1;
  feed_i64(s, len);
  feed(s, u, (size_t)len);
  return 0;
}

/* repr(o), for values whose repr is canonical and that have no cheaper form. */
static int feed_repr(hasher *s, PyObject *o) {
  PyObject *r = PyObject_Repr(o);
  if (r == NULL) return -1;
  int rc = feed_str(s, r);
  Py_DECREF(r);
  return rc;
}

/* An attribute that is a str, or its absence (None): a function's module. `name`
 * is one of the interned strings, so the lookup makes no string. */
static int feed_attr(hasher *s, PyObject *o, PyObject *name) {
  PyObject *v = PyObject_GetAttr(o, name);
  if (v == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();
    feed_tag(s, 'N');
    return 0;
  }
  int rc = PyUnicode_Check(v) ? feed_str(s, v) : (feed_tag(s, '?'), 0);
  Py_DECREF(v);
  return rc;
}

/* A dtype: its kind, size and byte order, and which type (by number, or by the
 * name of its scalar type for a user dtype, whose number follows import order). */
static int feed_dtype(hasher *s, PyArray_Descr *t) {
  feed_i64(s, (int64_t)t->kind << 16 | (int64_t)(unsigned char)t->byteorder << 8);
  feed_i64(s, (int64_t)PyDataType_ELSIZE(t));
  if (t->type_num < NPY_USERDEF) {
    feed_i64(s, t->type_num);
    return 0;
  }
  const char *name = t->typeobj->tp_name;
  feed(s, name, strlen(name));
  return 0;
}

/* A DTensor: its placements (the core's codes), global shape and dtype. */
static int feed_dtensor(mt_ext_dispatch *d, hasher *s, PyObject *o) {
  PyObject *spec = ((mt_ext_dtensor *)o)->spec;
  if (spec == NULL || !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 5) {
    PyErr_SetString(PyExc_TypeError, "a DTensor's spec is a DTensorSpec");
    return -1;
  }
  PyObject *pl = PyTuple_GET_ITEM(spec, 1), *shape = PyTuple_GET_ITEM(spec, 2),
           *dtype = PyTuple_GET_ITEM(spec, 3);
  if (!PyTuple_Check(pl) || !PyTuple_Check(shape) || !PyArray_DescrCheck(dtype)) {
    PyErr_SetString(PyExc_TypeError, "a DTensor's spec is a DTensorSpec");
    return -1;
  }
  feed_tag(s, 'T');
  feed_i64(s, PyTuple_GET_SIZE(pl));
  for (Py_ssize_t m = 0; m < PyTuple_GET_SIZE(pl); ++m) {
    mt_placement c;
    if (mt_ext_placement_code(d, PyTuple_GET_ITEM(pl, m), &c) < 0) return -1;
    feed_i64(s, (int64_t)c.kind << 48 | (int64_t)c.dim << 32 | (int64_t)c.reduce_op << 16);
    feed_i64(s, c.split_factor);
  }
  feed_i64(s, PyTuple_GET_SIZE(shape));
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); ++i) {
    int64_t n = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
    if (n == -1 && PyErr_Occurred()) return -1;
    feed_i64(s, n);
  }
  return feed_dtype(s, (PyArray_Descr *)dtype);
}

/* An ndarray: shape, dtype and its bytes (C order); of objects, each one's repr. */
static int feed_ndarray(hasher *s, PyArrayObject *a) {
  feed_tag(s, 'A');
  feed_i64(s, PyArray_NDIM(a));
  for (int i = 0; i < PyArray_NDIM(a); ++i) feed_i64(s, PyArray_DIM(a, i));
  feed_dtype(s, PyArray_DESCR(a));
  if (PyDataType_REFCHK(PyArray_DESCR(a))) {
    PyObject *items = PyArray_ToList(a);
    if (items == NULL) return -1;
    int rc = feed_repr(s, items);
    Py_DECREF(items);
    return rc;
  }
  PyArrayObject *c = PyArray_GETCONTIGUOUS(a);
  if (c == NULL) return -1;
  feed(s, PyArray_DATA(c), (size_t)PyArray_NBYTES(c));
  Py_DECREF(c);
  return 0;
}

static int feed_value(mt_ext_dispatch *d, hasher *s, PyObject *v);

static int feed_sequence(mt_ext_dispatch *d, hasher *s, PyObject *v) {
  feed_tag(s, PyList_Check(v) ? '[' : '(');
  feed_i64(s, PySequence_Fast_GET_SIZE(v));
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(v); ++k)
    if (feed_value(d, s, PySequence_Fast_ITEMS(v)[k]) < 0) return -1;
  return 0;
}

static int feed_value(mt_ext_dispatch *d, hasher *s, PyObject *v) {
  PyTypeObject *t = Py_TYPE(v);
  if (v == Py_None) return feed_tag(s, 'N'), 0;
  if (v == Py_Ellipsis) return feed_tag(s, 'E'), 0;
  if (t == &PyBool_Type) return feed_tag(s, v == Py_True ? 'Y' : 'n'), 0;
  if (t == &PyLong_Type) {
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (n == -1 && PyErr_Occurred()) return -1;
    feed_tag(s, 'i');
    if (!overflow) return feed_i64(s, n), 0;
    return feed_repr(s, v);
  }
  if (t == &PyFloat_Type) {
    double x = PyFloat_AS_DOUBLE(v);
    feed_tag(s, 'f');
    feed(s, &x, sizeof x);
    return 0;
  }
  if (t == &PyComplex_Type) {
    Py_complex z = PyComplex_AsCComplex(v);
    feed_tag(s, 'c');
    feed(s, &z, sizeof z);
    return 0;
  }
  if (t == &PyUnicode_Type) return feed_tag(s, 's'), feed_str(s, v);
  if (t == &PyBytes_Type) {
    feed_tag(s, 'y');
    feed_i64(s, PyBytes_GET_SIZE(v));
    feed(s, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v));
    return 0;
  }
  if (mt_ext_is_dtensor(d, v)) return feed_dtensor(d, s, v);
  if (t == &PyTuple_Type || t == &PyList_Type) return feed_sequence(d, s, v);
  if (t == &PySlice_Type) {
    PySliceObject *sl = (PySliceObject *)v;
    feed_tag(s, ':');
    if (feed_value(d, s, sl->start) < 0 || feed_value(d, s, sl->stop) < 0) return -1;
    return feed_value(d, s, sl->step);
  }
  if (PyArray_Check(v)) return feed_ndarray(s, (PyArrayObject *)v);
  if (PyArray_IsScalar(v, Generic)) {
    /* A NumPy scalar: the 0-d array of its value. */
    PyObject *a = PyArray_FromScalar(v, NULL);
    if (a == NULL) return -1;
    feed_tag(s, 'g');
    int rc = feed_ndarray(s, (PyArrayObject *)a);
    Py_DECREF(a);
    return rc;
  }
  if (PyArray_DescrCheck(v)) return feed_tag(s, 'D'), feed_dtype(s, (PyArray_Descr *)v);
  if (PyType_Check(v) || PyCallable_Check(v)) {
    feed_tag(s, 'F');
    if (feed_attr(s, v, d->str[MT_S_MODULE]) < 0) return -1;
    PyObject *qual = PyObject_GetAttr(v, d->str[MT_S_QUALNAME]);
    if (qual == NULL) {
      if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
      PyErr_Clear();
      return feed_attr(s, (PyObject *)t, d->str[MT_S_QUALNAME]);
    }
    int rc = PyUnicode_Check(qual) ? feed_str(s, qual) : (feed_tag(s, '?'), 0);
    Py_DECREF(qual);
    return rc;
  }
  /* No canonical value: compared by type only. */
  feed_tag(s, '?');
  if (feed_attr(s, (PyObject *)t, d->str[MT_S_MODULE]) < 0) return -1;
  return feed_attr(s, (PyObject *)t, d->str[MT_S_QUALNAME]);
}

int mt_ext_fingerprint(mt_ext_dispatch *d, PyObject *name, PyObject *args, PyObject *kwargs,
                       uint64_t *out) {
  hasher s = {0x9e3779b97f4a7c15ull, 0};
  if (feed_str(&s, name) < 0) return -1;
  /* The count of positional arguments first: f(x, "axis", 1) is not f(x, axis=1). */
  feed_i64(&s, PyTuple_GET_SIZE(args));
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i)
    if (feed_value(d, &s, PyTuple_GET_ITEM(args, i)) < 0) return -1;
  if (PyDict_GET_SIZE(kwargs) == 1) {
    /* One keyword: no order to settle. */
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    PyDict_Next(kwargs, &pos, &k, &v);
    if (feed_value(d, &s, k) < 0 || feed_value(d, &s, v) < 0) return -1;
  } else if (PyDict_GET_SIZE(kwargs) > 1) {
    /* Keywords in sorted order: their order in the call does not matter. */
    PyObject *keys = PyDict_Keys(kwargs);
    if (keys == NULL || PyList_Sort(keys) < 0) {
      Py_XDECREF(keys);
      return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); ++i) {
      PyObject *k = PyList_GET_ITEM(keys, i);
      if (feed_value(d, &s, k) < 0 || feed_value(d, &s, PyDict_GetItem(kwargs, k)) < 0) {
        Py_DECREF(keys);
        return -1;
      }
    }
    Py_DECREF(keys);
  }
  *out = finish(&s);
  return 0;
}

/* call_fingerprint(name, args, kwargs): see the method table. */
static PyObject *call_fingerprint(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyUnicode_Check(args[0]) || !PyTuple_Check(args[1]) ||
      !PyDict_Check(args[2]))
    return PyErr_Format(PyExc_TypeError,
                        "call_fingerprint(name: str, args: tuple, kwargs: dict)");
  uint64_t fp;
  if (mt_ext_fingerprint(mt_ext_dispatch_module(module), args[0], args[1], args[2], &fp) < 0)
    return NULL;
  return PyLong_FromLongLong((long long)fp);
}

/* Whether `frame` runs a program's code (or the array API namespace's, on a
 * program's behalf), not mpitensor's own: the calls mpitensor makes inside an
 * operation are alike on every rank by construction. -1 with an exception. */
int mt_ext_by_program(mt_ext_dispatch *d, PyObject *frame) {
  if (frame == Py_None) return 1;
  if (!PyFrame_Check(frame)) {
    PyErr_SetString(PyExc_TypeError, "agree_call: caller must be a frame or None");
    return -1;
  }
  PyObject *globals = PyFrame_GetGlobals((PyFrameObject *)frame);
  PyObject *name = globals == NULL ? NULL : PyDict_GetItemWithError(globals, d->str[MT_S_NAME]);
  Py_XDECREF(globals);
  if (name == NULL) return PyErr_Occurred() ? -1 : 1;
  if (!PyUnicode_Check(name)) return 1;
  if (PyUnicode_Tailmatch(name, d->str[MT_S_PACKAGE], 0, PY_SSIZE_T_MAX, -1) != 1) return 1;
  return PyUnicode_Tailmatch(name, d->str[MT_S_ARRAY_API], 0, PY_SSIZE_T_MAX, -1) == 1 ||
         PyUnicode_Tailmatch(name, d->str[MT_S_TESTING], 0, PY_SSIZE_T_MAX, -1) == 1;
}

/* The first DTensor among `items` (and in their lists and tuples), or NULL. */
static PyObject *first_dtensor(mt_ext_dispatch *d, PyObject *const *items, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *v = items[i];
    if (mt_ext_is_dtensor(d, v)) return v;
    if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
      PyObject *t = first_dtensor(d, PySequence_Fast_ITEMS(v), PySequence_Fast_GET_SIZE(v));
      if (t != NULL) return t;
    }
  }
  return NULL;
}

/* Whether every DTensor among `items` (and in their lists and tuples) holds a
 * C-contiguous local array. */
static int contiguous(mt_ext_dispatch *d, PyObject *const *items, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *v = items[i];
    if (mt_ext_is_dtensor(d, v)) {
      PyObject *local = ((mt_ext_dtensor *)v)->local;
      if (local == NULL || !PyArray_Check(local) ||
          !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)local))
        return 0;
    } else if ((PyTuple_CheckExact(v) || PyList_CheckExact(v)) &&
               !contiguous(d, PySequence_Fast_ITEMS(v), PySequence_Fast_GET_SIZE(v))) {
      return 0;
    }
  }
  return 1;
}

static int args_contiguous(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs) {
  if (!contiguous(d, PySequence_Fast_ITEMS(args), PyTuple_GET_SIZE(args))) return 0;
  Py_ssize_t pos = 0;
  PyObject *key, *v;
  while (PyDict_Next(kwargs, &pos, &key, &v))
    if (!contiguous(d, &v, 1)) return 0;
  return 1;
}

/* Whether `a`, or an item of it when it is a list or tuple, is a DTensor that
 * needs a gradient. */
static int item_needs_grad(const mt_ext_dispatch *d, PyObject *a) {
  if (mt_ext_needs_grad(d, a)) return 1;
  if (PyTuple_CheckExact(a) || PyList_CheckExact(a))
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(a); ++k)
      if (mt_ext_needs_grad(d, PySequence_Fast_ITEMS(a)[k])) return 1;
  return 0;
}

/* Whether an argument (out= aside, which is a write), or an item of a list or
 * tuple argument, needs a gradient. */
static int args_need_grad(const mt_ext_dispatch *d, PyObject *args, PyObject *kwargs) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i)
    if (item_needs_grad(d, PyTuple_GET_ITEM(args, i))) return 1;
  Py_ssize_t pos = 0;
  PyObject *key, *a;
  while (kwargs != NULL && PyDict_Next(kwargs, &pos, &key, &a))
    if (item_needs_grad(d, a) && PyUnicode_Compare(key, d->str[MT_S_OUT]) != 0) return 1;
  return 0;
}

/* Whether `v` is a plain numeric ndarray of one dim or more. */
static int plain_array(PyObject *v) {
  return Py_TYPE(v) == &PyArray_Type && PyArray_NDIM((PyArrayObject *)v) > 0 &&
         mt_ext_numeric(v);
}

/* Whether a plain numeric ndarray is among `items` or in a list or tuple one. */
static int has_plain(PyObject *const *items, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *v = items[i];
    if (plain_array(v)) return 1;
    if (PyTuple_CheckExact(v) || PyList_CheckExact(v))
      for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(v); ++k)
        if (plain_array(PySequence_Fast_ITEMS(v)[k])) return 1;
  }
  return 0;
}

/* Whether a plain numeric ndarray (not 0-d) is an argument or in a list or tuple
 * one. */
static int args_plain(PyObject *args, PyObject *kwargs) {
  if (has_plain(PySequence_Fast_ITEMS(args), PyTuple_GET_SIZE(args))) return 1;
  Py_ssize_t pos = 0;
  PyObject *key, *v;
  while (kwargs != NULL && PyDict_Next(kwargs, &pos, &key, &v))
    if (has_plain(&v, 1)) return 1;
  return 0;
}

int mt_ext_call_flags(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs) {
  int strided = mt_ext_args_strided(d, args, kwargs);
  int grad = d->modes->grad_enabled && args_need_grad(d, args, kwargs);
  int meshes = mt_ext_args_meshes_differ(d, args, kwargs);
  int plain = args_plain(args, kwargs);
  return strided | grad << 1 | meshes << 2 | plain << 3;
}

/* call_flags(args, kwargs): see the method table. */
static PyObject *call_flags(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyDict_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "call_flags(args: tuple, kwargs: dict)");
  return PyLong_FromLong(mt_ext_call_flags(mt_ext_dispatch_module(module), args[0], args[1]));
}

/* The ValueError's text for a call of `name` whose ranks differ, cut to fit an
 * mt_error at a character boundary. */
static void mismatch_message(PyObject *name, mt_error *err) {
  const char *u = PyUnicode_AsUTF8(name);
  if (u == NULL) {
    PyErr_Clear();
    u = "a call";
  }
  int len = snprintf(err->msg, sizeof err->msg,
                     "%s: the ranks of the mesh made different calls (other arguments, "
                     "or DTensors of other placements, shapes or dtypes); every rank of "
                     "the mesh must make the same call", u);
  if (len >= (int)sizeof err->msg) {
    size_t end = sizeof err->msg - 1;
    while (end > 0 && ((unsigned char)err->msg[end] & 0xC0) == 0x80) --end;
    err->msg[end] = '\0';
  }
}

long mt_ext_agree_call(mt_ext_dispatch *d, PyObject *name, PyObject *args, PyObject *kwargs,
                       int program, int with_flags) {
  int flags = with_flags ? mt_ext_call_flags(d, args, kwargs) : 0;
  PyObject *first = NULL; /* borrowed: the arguments hold it */
  if (program && !d->modes->checks) {
    first = first_dtensor(d, PySequence_Fast_ITEMS(args), PyTuple_GET_SIZE(args));
    Py_ssize_t pos = 0;
    PyObject *key, *v;
    while (first == NULL && PyDict_Next(kwargs, &pos, &key, &v)) first = first_dtensor(d, &v, 1);
  }
  mt_ext_mesh_base *mb =
      first == NULL ? NULL : mt_ext_spec_mesh(d, ((mt_ext_dtensor *)first)->spec);
  /* Whether the local arrays are C-contiguous: this rank's say on a mesh of one,
   * every member's once agreed, and no say (0) where nothing is agreed. */
  int64_t contig = mb != NULL && mb->member && args_contiguous(d, args, kwargs);
  if (mb != NULL && mb->member && mt_ext_mesh_size(mb) > 1) {
    if (mb->mesh == NULL) {
      PyErr_SetString(PyExc_RuntimeError, "agree_call: the mesh has no communicators");
      return -1;
    }
    uint64_t fp;
    if (mt_ext_mesh_check(mb) < 0 || mt_ext_fingerprint(d, name, args, kwargs, &fp) < 0) return -1;
    mt_error err = {0};
    int rc;
    ++mb->call_agreements;
    Py_BEGIN_ALLOW_THREADS
    rc = mt_agree_with(mb->mesh, MT_OK, fp, &contig, 1, &err);
    Py_END_ALLOW_THREADS
    if (rc == MT_EINVAL) {
      /* Every rank agreed with MT_OK, so the fingerprints differ; only then is the
       * error worded, and every rank raises the first rank's words (its call's
       * name), in a second agreement that only a refused call makes. */
      mismatch_message(name, &err);
      Py_BEGIN_ALLOW_THREADS
      rc = mt_agree(mb->mesh, MT_EINVAL, 0, &err);
      Py_END_ALLOW_THREADS
    }
    if (rc != MT_OK) {
      mt_ext_raise(rc, &err);
      return -1;
    }
  }
  int raises = program && with_flags ? mt_ext_errstate_raises(d) : 0;
  if (raises < 0) return -1;
  return (program ? MT_EXT_AGREED_PROGRAM : 0) | (contig ? MT_EXT_AGREED_CONTIGUOUS : 0) |
         (raises ? MT_EXT_AGREED_RAISES : 0) | (long)flags << MT_EXT_AGREED_CALL_FLAGS;
}

int mt_ext_agree_on(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                    PyObject *kwargs, PyObject *caller) {
  if (caller == Py_None) return 0;
  int program = mt_ext_by_program(d, caller);
  return program < 0 || mt_ext_agree_call(d, sig->label, args, kwargs, program, 0) < 0 ? -1 : 0;
}

/* agree_call(name, args, kwargs, caller): see the method table. */
static PyObject *agree_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyUnicode_Check(args[0]) || !PyTuple_Check(args[1]) ||
      !PyDict_Check(args[2]))
    return PyErr_Format(PyExc_TypeError,
                        "agree_call(name: str, args: tuple, kwargs: dict, caller: frame)");
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  int program = mt_ext_by_program(d, args[3]);
  long flags = program < 0 ? -1 : mt_ext_agree_call(d, args[0], args[1], args[2], program, 1);
  return flags < 0 ? NULL : PyLong_FromLong(flags);
}

PyMethodDef mt_ext_call_agreement_methods[] = {
    {"call_flags", (PyCFunction)(void (*)(void))call_flags, METH_FASTCALL,
     "call_flags(args, kwargs) -> int: what the Python door (mpitensor._registry.door) "
     "must do for a call with these arguments: bit 0, a DTensor among them (or in a "
     "list or tuple one) is strided; bit 1, grad mode is on and one needs a gradient "
     "(out= aside); bit 2, they live on more than one mesh (see one_mesh); bit 3, a "
     "plain numeric ndarray (not 0-d) is among them, taken as replicated. Local.\n\n"
     "Example: _C.call_flags((dt, 0), {}) & 2"},
    {"call_fingerprint", (PyCFunction)(void (*)(void))call_fingerprint, METH_FASTCALL,
     "call_fingerprint(name, args, kwargs) -> int: a 64-bit fingerprint of the call "
     "name(*args, **kwargs), the same on every rank exactly when the calls are alike "
     "(up to a collision): DTensors by placements, global shape and dtype, ndarrays "
     "by shape, dtype and bytes, numbers, strings, slices and their lists and tuples "
     "by value, functions and types by module and qualified name, anything else by "
     "its type. Local.\n\n"
     "Example: _C.call_fingerprint('numpy.sum', (dt,), {'axis': 0})"},
    {"agree_call", (PyCFunction)(void (*)(void))agree_call, METH_FASTCALL,
     "agree_call(name, args, kwargs, caller) -> flags: when the frame `caller` (None: "
     "a program) runs a program's code, not mpitensor's, outside the collective "
     "checks, and the first DTensor argument's mesh has more than one rank, the ranks "
     "agree on call_fingerprint(name, args, kwargs): ValueError on every rank when "
     "the calls differ. Bit 0 of the result: a program made the call; bit 1: the "
     "DTensors hold C-contiguous local arrays on every rank of the mesh (known from "
     "the agreement, or on a mesh of one rank; else 0); bit 2: a program made it while "
     "NumPy's error state raises (or calls a function) on some floating-point error; "
     "from bit 3 on: "
     "call_flags(args, kwargs). "
     "Collective on that mesh when it agrees.\n\n"
     "Example: _C.agree_call('numpy.sum', (dt,), {'axis': 0}, sys._getframe(1))"},
    {NULL, NULL, 0, NULL},
};
