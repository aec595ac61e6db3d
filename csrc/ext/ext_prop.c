/* The dim maps Python builds (einsum, reshape, ...: mpitensor._ops._dispatch.DimMap,
 * an mt_dimmap filled through ctypes), read on a memo miss; and the core's enums
 * the builders use. */
#include "ext.h"

#include <string.h>

#include "mpitensor/core/prop.h"

const mt_dimmap *mt_ext_dimmap_get(PyObject *obj, mt_dimmap *map) {
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
  int fits = view.len == (Py_ssize_t)sizeof *map;
  if (fits) memcpy(map, view.buf, sizeof *map);
  PyBuffer_Release(&view);
  if (!fits) {
    PyErr_SetString(PyExc_TypeError, "a dim map is an mpitensor._ops._dispatch.DimMap");
    return NULL;
  }
  mt_error err = {0};
  int rc = mt_dimmap_check(map, &err);
  if (rc == MT_OK) return map;
  mt_ext_raise(rc, &err);
  return NULL;
}

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

int mt_ext_prop_exec(PyObject *module) { return add_enums(module); }
