/* The dim maps Python builds (einsum, reshape, ...: mpitensor._algorithms._dispatch.DimMap,
 * an mt_dimmap filled through ctypes), read on a memo miss. The core's constants
 * the builders use reach Python from the core itself (mpitensor._clib.CORE). */
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
    PyErr_SetString(PyExc_TypeError, "a dim map is an mpitensor._algorithms._dispatch.DimMap");
    return NULL;
  }
  mt_error err = {0};
  return mt_ext_ok(mt_dimmap_check(map, &err), &err) == 0 ? map : NULL;
}
