/* The argument helpers every area of mpitensor._C shares: C arrays to Python
 * tuples, NumPy dtypes to core codes, core statuses to exceptions. They call only
 * the core and CPython, so every area depends on them and they on no area. What
 * every area reads is defined here too: NumPy's C API table and the module's
 * definition (whose slots module.c, the top, fills in). */
#include <stdio.h>
#include <string.h>

#define MT_EXT_IMPORTS_NUMPY
#include "ext.h"

int mt_ext_import_numpy(void) { return PyArray_ImportNumPyAPI(); }

struct PyModuleDef mt_ext_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mpitensor._C",
    .m_doc = "The C core of mpitensor. Internal: use the mpitensor package.",
    .m_size = sizeof(mt_ext_state),
};

/* The one table of statuses and the exceptions they are, both ways: C raises by
 * it, mt_ext_fetch_status maps a Python exception back by it, and Python reads it
 * (_C.STATUS_EXCEPTIONS, in mpitensor._clib). The most specific first: NumPy's
 * AxisError is both a ValueError and an IndexError, and goes to the ranks that
 * learn it as IndexError, as NumPy's own AxisError is caught by `except
 * IndexError`. Any other status is a RuntimeError, any other exception
 * MT_ESTATE. */
static const struct {
  PyObject **type;
  int code;
} status_table[] = {
    {&PyExc_MemoryError, MT_ENOMEM}, {&PyExc_OverflowError, MT_EOVERFLOW},
    {&PyExc_IndexError, MT_EINDEX},  {&PyExc_TypeError, MT_ETYPE},
    {&PyExc_ValueError, MT_EINVAL},  {&PyExc_NotImplementedError, MT_ENOTSUP},
    {&PyExc_OSError, MT_EIO},        {&PyExc_FloatingPointError, MT_EFLOAT},
};
enum { STATUS_TABLE_LEN = sizeof status_table / sizeof status_table[0] };

PyObject *mt_ext_status_exceptions(void) {
  PyObject *out = PyTuple_New(STATUS_TABLE_LEN);
  for (int i = 0; out != NULL && i < STATUS_TABLE_LEN; ++i) {
    PyObject *pair = Py_BuildValue("(iO)", status_table[i].code, *status_table[i].type);
    if (pair == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, i, pair);
  }
  return out;
}

PyObject *mt_ext_raise(int code, const mt_error *err) {
  PyObject *type = PyExc_RuntimeError;
  for (int i = 0; i < STATUS_TABLE_LEN; ++i) {
    if (status_table[i].code == code) {
      type = *status_table[i].type;
      break;
    }
  }
  const char *msg = (err != NULL && err->msg[0] != '\0') ? err->msg : mt_strerror(code);
  PyErr_SetString(type, msg);
  return NULL;
}

int mt_ext_fetch_status(mt_error *err) {
  int code = MT_ESTATE;
  for (int i = 0; i < STATUS_TABLE_LEN; ++i) {
    if (PyErr_ExceptionMatches(*status_table[i].type)) {
      code = status_table[i].code;
      break;
    }
  }
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject *text = value != NULL ? PyObject_Str(value) : NULL;
  const char *msg = text != NULL ? PyUnicode_AsUTF8(text) : NULL;
  snprintf(err->msg, sizeof err->msg, "%s", msg != NULL ? msg : mt_strerror(code));
  PyErr_Clear();
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return code;
}

PyObject *mt_ext_int_tuple(const int64_t *v, int n) {
  PyObject *out = PyTuple_New(n);
  for (int i = 0; out != NULL && i < n; ++i) {
    PyObject *x = PyLong_FromLongLong(v[i]);
    if (x == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, i, x);
  }
  return out;
}

int mt_ext_dtype(PyArrayObject *a) { return mt_ext_descr_dtype(PyArray_DESCR(a)); }

/* ml_dtypes' bfloat16 is a user-defined NumPy dtype of kind 'V', whose type number
 * is assigned when ml_dtypes is imported: it is known by its scalar type's name. */
static int is_bfloat16(PyArray_Descr *d) {
  if (d->type_num < NPY_USERDEF || PyDataType_ELSIZE(d) != 2) return 0;
  const char *name = d->typeobj->tp_name, *dot = strrchr(name, '.');
  return strcmp(dot != NULL ? dot + 1 : name, "bfloat16") == 0;
}

int mt_ext_inexact(PyArray_Descr *d) {
  return d->kind == 'f' || d->kind == 'c' || (d->kind == 'V' && is_bfloat16(d));
}

int mt_ext_descr_dtype(PyArray_Descr *d) {
  if (d->kind == 'V') return is_bfloat16(d) ? MT_DTYPE_BFLOAT16 : -2;
  return mt_dtype_of_kind(d->kind, (size_t)PyDataType_ELSIZE(d));
}

PyArrayObject *mt_ext_contiguous(PyObject *obj) {
  PyArrayObject *a = (PyArrayObject *)obj;
  if (!PyArray_Check(obj))
    return (PyArrayObject *)PyErr_Format(PyExc_TypeError, "expected a NumPy ndarray, got %s",
                                         Py_TYPE(obj)->tp_name);
  if (mt_ext_dtype(a) < 0 || !PyArray_ISNOTSWAPPED(a))
    return (PyArrayObject *)PyErr_Format(PyExc_TypeError, "mpitensor does not move arrays "
                                         "of dtype %R", (PyObject *)PyArray_DESCR(a));
  return (PyArrayObject *)PyArray_GETCONTIGUOUS(a);
}
