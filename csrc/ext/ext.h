/* Shared private declarations of the mpitensor._C extension: argument conversion,
 * status-to-exception mapping, and the registration hook of each area. The
 * extension holds no logic of its own; everything it does is a call into the core. */
#ifndef MPITENSOR_EXT_H
#define MPITENSOR_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* One NumPy C API table for all of the extension's files; only module.c imports
 * it, the others see it through this symbol. */
#define PY_ARRAY_UNIQUE_SYMBOL MT_ARRAY_API
#ifndef MT_EXT_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "mpitensor/counters.h"
#include "mpitensor/io.h"
#include "mpitensor/kernels.h"
#include "mpitensor/mpitensor.h"
#include "mpitensor/plan.h"

/* Per-module state (PEP 489): the heap types, for isinstance checks in any area;
 * and what the C libraries keep no global of: the communication and I/O counters
 * (every mesh counts into `comm_counters`), the current I/O options and the BLAS
 * of the kernels, read and changed under the GIL. */
typedef struct mt_ext_state {
  PyTypeObject *mesh_type;
  PyTypeObject *plan_type;
  PyTypeObject *request_type;
  PyTypeObject *dimmap_type;
  PyTypeObject *exchange_type;
  PyObject *pool_handler; /* capsule of the NumPy allocator over the block pool */
  PyTypeObject *dtensor_base_type;
  PyTypeObject *table_type;
  struct mt_ext_dispatch *dispatch; /* the fast path's state (ext_dispatch.c), owned */
  mt_comm_counters comm_counters;
  mt_io_counters io_counters;
  mt_io_options io_options; /* io_options.counters is &io_counters */
  mt_blas blas;
} mt_ext_state;

/* The module's definition, to find the module state from a type (PEP 573). */
extern struct PyModuleDef mt_ext_module_def;

static inline mt_ext_state *mt_ext_state_of(PyObject *module) {
  return (mt_ext_state *)PyModule_GetState(module);
}

/* The mt_dtype code of an array's element type, or -1 with TypeError set. */
int mt_ext_dtype(PyArrayObject *a);

/* A new reference to a C-contiguous array with the elements of `obj`, which must
 * be an ndarray (TypeError otherwise); copies only when `obj` is not contiguous. */
PyArrayObject *mt_ext_contiguous(PyObject *obj);

/* Raises the Python exception that matches a core status (ValueError for
 * MT_EINVAL, IndexError, TypeError, MemoryError, NotImplementedError, else
 * RuntimeError) with the core's message, and returns NULL. */
PyObject *mt_ext_raise(int code, const mt_error *err);

/* Reads a tuple or list of ints into `out` (at most `cap` of them); sets *n.
 * Returns 0, or -1 with a Python exception set that names `what`. */
int mt_ext_int64s(PyObject *seq, int64_t *out, int cap, int *n, const char *what);

/* Reads placements encoded as a sequence of (kind, dim, reduce_op) int triples. */
int mt_ext_placements(PyObject *seq, mt_placement *out, int *n);

/* Reads (global shape, mesh shape, placement codes) into a validated layout.
 * Returns 0, or -1 with the matching Python exception set. */
int mt_ext_layout(PyObject *shape, PyObject *mesh_shape, PyObject *codes, mt_layout *out);

/* A new C-contiguous array; large ones take their memory from the block pool and
 * give it back when freed. Steals no reference to `descr`. */
PyArrayObject *mt_ext_new_array(PyObject *module, PyArray_Descr *descr, int ndim,
                                const npy_intp *dims);

/* Each area adds its functions and types to the module in Py_mod_exec. */
typedef struct mt_mesh mt_mesh;
/* The core mesh behind a _C.Mesh, or NULL with TypeError set. */
mt_mesh *mt_ext_mesh_get(PyObject *module, PyObject *obj);
int mt_ext_mesh_exec(PyObject *module);
int mt_ext_redistribute_exec(PyObject *module);
int mt_ext_pool_exec(PyObject *module);
int mt_ext_prop_exec(PyObject *module);
int mt_ext_dispatch_exec(PyObject *module);
typedef struct mt_ext_dispatch mt_ext_dispatch;

/* A recorded decision of the fast path (ext_dispatch_table.c). */
typedef struct {
  PyObject *op;       /* ufunc, or a reduction's interned name; NULL: empty slot */
  PyObject *key[2];   /* per operand: its layout (DTensor) or its type (scalar) */
  long long aux;      /* ufunc: operand count; reduction: axis and keepdims */
  PyObject *out;      /* the output's layout (placements, shape, dtype, stride) */
  PyObject *axes;     /* reduction: the normalized axis tuple; else NULL */
} mt_ext_entry;
typedef struct mt_ext_table mt_ext_table;
/* The entry of a key, or NULL. Borrowed: valid until the table next changes. */
mt_ext_entry *mt_ext_table_lookup(mt_ext_table *t, PyObject *op, PyObject *k0,
                                  PyObject *k1, long long aux);
/* Adds or replaces an entry. 0, or -1 with MemoryError. */
int mt_ext_table_insert(mt_ext_table *t, PyObject *op, PyObject *k0, PyObject *k1,
                        long long aux, PyObject *out, PyObject *axes);
/* The table's one layout tuple (placements, shape, dtype, stride) equal to that of
 * `spec` (a DTensorSpec of the table's mesh); new reference, or NULL with an
 * exception. */
PyObject *mt_ext_table_intern(mt_ext_table *t, PyObject *spec);
int mt_ext_table_exec(PyObject *module);
int mt_ext_dispatch_traverse(mt_ext_state *st, visitproc visit, void *arg);
void mt_ext_dispatch_clear(mt_ext_state *st);
void mt_ext_dispatch_free(mt_ext_state *st);
int mt_ext_ring_exec(PyObject *module);
extern PyMethodDef mt_ext_pool_methods[];
extern PyMethodDef mt_ext_mesh_methods[];
extern PyMethodDef mt_ext_redistribute_methods[];
extern PyMethodDef mt_ext_layout_methods[];
extern PyMethodDef mt_ext_rng_methods[];
extern PyMethodDef mt_ext_prop_methods[];
extern PyMethodDef mt_ext_io_methods[];

extern PyMethodDef mt_ext_dispatch_methods[];
extern PyMethodDef mt_ext_ring_methods[];
extern PyMethodDef mt_ext_kernels_methods[];
extern PyMethodDef mt_ext_agree_methods[];

/* The mt_dtype code of a NumPy dtype, or a negative value for one the core does not
 * know. */
int mt_ext_descr_dtype(PyArray_Descr *d);

#endif
