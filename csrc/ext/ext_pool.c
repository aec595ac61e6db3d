/* NumPy arrays whose data lives in the core's block pool (mpitensor/comm/pool.h).
 *
 * NumPy (>= 1.22) lets an array remember the allocator that made it and frees its
 * data through that allocator, so the outputs of redistribute give their blocks back
 * to the pool when the user drops them, and the next redistribute of that size
 * finds them resident instead of page-faulting fresh memory in. */
#include "ext.h"

#include "mpitensor/comm/pool.h"

static void *pool_malloc(void *ctx, size_t size) {
  return mt_pool_alloc(size > 0 ? size : 1);
}

static void *pool_calloc(void *ctx, size_t n, size_t elsize) {
  return mt_pool_calloc(n, elsize);
}

static void *pool_realloc(void *ctx, void *ptr, size_t size) {
  return mt_pool_realloc(ptr, size);
}

static void pool_free(void *ctx, void *ptr, size_t size) { mt_pool_free(ptr); }

static PyDataMem_Handler pool_handler = {
    "mpitensor_pool",
    1,
    {NULL, pool_malloc, pool_calloc, pool_realloc, pool_free},
};

PyArrayObject *mt_ext_new_array(PyObject *module, PyArray_Descr *descr, int ndim,
                                const npy_intp *dims) {
  npy_intp bytes = PyDataType_ELSIZE(descr);
  for (int i = 0; i < ndim; ++i) bytes *= dims[i];
  PyObject *pool = mt_ext_state_of(module)->pool_handler;
  PyObject *old = mt_pool_worth((size_t)bytes) ? PyDataMem_SetHandler(pool) : NULL;
  Py_INCREF(descr);
  PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, (npy_intp *)dims, NULL,
                                       NULL, 0, NULL);
  if (old != NULL) {
    Py_XDECREF(PyDataMem_SetHandler(old));
    Py_DECREF(old);
  }
  return (PyArrayObject *)arr;
}

PyObject *mt_ext_pool_enter(PyObject *module, PyObject *const *operands, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i)
    if (PyArray_Check(operands[i]) &&
        mt_pool_worth((size_t)PyArray_NBYTES((PyArrayObject *)operands[i])))
      return PyDataMem_SetHandler(mt_ext_state_of(module)->pool_handler);
  return NULL;
}

void mt_ext_pool_leave(PyObject *old) {
  if (old == NULL) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject *pool = PyDataMem_SetHandler(old);
  if (pool == NULL) PyErr_Clear();
  Py_XDECREF(pool);
  Py_DECREF(old);
  PyErr_Restore(type, value, tb);
}

/* empty(shape, dtype) -> a new C-contiguous array, from the pool when it is large:
 * the outputs the ctypes bindings fill (mpitensor._comm). Local. */
static PyObject *empty(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  PyArray_Dims shape = {NULL, 0};
  PyArray_Descr *descr = NULL;
  if (nargs != 2) return PyErr_Format(PyExc_TypeError, "empty(shape, dtype)");
  if (!PyArray_IntpConverter(args[0], &shape)) return NULL;
  PyObject *out = PyArray_DescrConverter(args[1], &descr)
                      ? (PyObject *)mt_ext_new_array(module, descr, shape.len, shape.ptr)
                      : NULL;
  Py_XDECREF(descr);
  PyDimMem_FREE(shape.ptr);
  return out;
}

/* data_address(array): see the method table. NumPy's `.ctypes.data` makes an
 * object on every read, which a small kernel's call would pay per array. */
static PyObject *data_address(PyObject *module, PyObject *arg) {
  if (!PyArray_Check(arg))
    return PyErr_Format(PyExc_TypeError, "data_address(array: ndarray)");
  return PyLong_FromVoidPtr(PyArray_DATA((PyArrayObject *)arg));
}

PyMethodDef mt_ext_pool_methods[] = {
    {"empty", (PyCFunction)(void (*)(void))empty, METH_FASTCALL,
     "empty(shape, dtype) -> a new C-contiguous array, from the block pool when "
     "large. Local."},
    {"data_address", data_address, METH_O,
     "data_address(array) -> the address of an ndarray's data, as its .ctypes.data. "
     "Local.\n\nExample: _C.data_address(numpy.zeros(3)) == a.ctypes.data"},
    {NULL, NULL, 0, NULL},
};

int mt_ext_pool_exec(PyObject *module) {
  PyObject *capsule = PyCapsule_New(&pool_handler, "mem_handler", NULL);
  if (capsule == NULL) return -1;
  mt_ext_state_of(module)->pool_handler = capsule;
  return 0;
}
