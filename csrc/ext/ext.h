/* Shared private declarations of the mpitensor._C extension.
 *
 * The extension is glue: argument conversion, GIL release, status -> exception,
 * and the one executor every operation on DTensors runs through (ext_exec.c).
 * Calls from C into Python go through one table (ext_hooks.c) and nowhere else. */
#ifndef MPITENSOR_EXT_H
#define MPITENSOR_EXT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* One NumPy C API table for all of the extension's files; only ext_args.c defines
 * it (mt_ext_import_numpy fills it), the others see it through this symbol. */
#define PY_ARRAY_UNIQUE_SYMBOL MT_ARRAY_API
#ifndef MT_EXT_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>
#include <stdbool.h>
#include <string.h>

#include "mpitensor/comm/counters.h"
#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/pending.h"
#include "mpitensor/comm/redistribute.h"
#include "mpitensor/core/layout_table.h"
#include "mpitensor/core/memo.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/ptr_index.h"
#include "mpitensor/io/io.h"
#include "mpitensor/mpitensor.h"

typedef struct mt_ext_dispatch mt_ext_dispatch;

/* A function off every cached call's path: kept out of line and apart, so the
 * paths it branches from stay as the compiler lays them out without it. */
#define MT_EXT_COLD __attribute__((noinline, cold))

/* -- modes ---------------------------------------------------------------------- */

/* The modes in force, the one state both Python and C read: a plain struct in the
 * module state that mpitensor._modes maps through ctypes (`_C.MODES`, a
 * capsule of it) and sets as features are entered and left; the executor reads the
 * fields. Python lays it out from ext_structs.c's table. */
typedef struct mt_ext_modes {
  bool grad_enabled, backward, checks, log_debug, log_info, gather_warning;
  /* A recorded forward runs with grad mode off: its decisions still price the
   * way back of the gradients its inputs will get. */
  bool grad_priced;
  /* The DTensor whose gradient a backward is computing (None: none): the outputs
   * of the operations it runs are headed to that DTensor's layout. Python owns
   * the reference (the ctypes structure keeps it). */
  PyObject *want;
  /* listeners: entered CommDebugModes and DebugModes; recorders: the DebugModes
   * alone, under which every call a program makes goes through the Python door,
   * whose trace nests the operations it runs under the call. */
  int implicit_replication, listeners, recorders;
  /* The records of live copy-views by the memory they were made of (a dict that
   * mpitensor._algorithms._views keeps, or NULL): while it holds any, a write
   * into a DTensor may have to reach a view's base, which only Python's write
   * does. */
  PyObject *copy_views;
} mt_ext_modes;

/* Per-module state (PEP 489): the heap types, and what the C libraries keep no
 * global of: the communication and I/O counters (atomic cells, which the
 * ctypes bindings pass back to C through their capsules) and the modes. */
typedef struct mt_ext_state {
  PyTypeObject *dtensor_base_type, *mesh_base_type;
  PyObject *pool_handler; /* capsule of the NumPy allocator over the block pool */
  mt_ext_dispatch *dispatch; /* owned (ext_ops.c) */
  mt_comm_counters comm_counters;
  mt_io_counters io_counters;
  mt_ext_modes modes;
} mt_ext_state;

/* The module's definition (ext_args.c; PyInit__C sets its slots), by which a type
 * finds its module. */
extern struct PyModuleDef mt_ext_module_def;

static inline mt_ext_state *mt_ext_state_of(PyObject *module) {
  return (mt_ext_state *)PyModule_GetState(module);
}

/* -- arguments (ext_args.c) ------------------------------------------------------- */

/* The mt_dtype code of an array's or a dtype's element type, or -2 for a type
 * the core does not know. */
int mt_ext_dtype(PyArrayObject *a);
int mt_ext_descr_dtype(PyArray_Descr *d);
/* Whether values of this dtype carry gradients: floating point (bfloat16 included)
 * or complex. */
int mt_ext_inexact(PyArray_Descr *d);
/* A new reference to a C-contiguous ndarray of `obj`'s elements (TypeError for a
 * non-ndarray); copies only when it is not contiguous. */
PyArrayObject *mt_ext_contiguous(PyObject *obj);
/* The Python exception of a core status, with the core's message; returns NULL. */
PyObject *mt_ext_raise(int code, const mt_error *err);
/* 0 when `rc` is MT_OK, else -1 with its exception (mt_ext_raise). */
static inline int mt_ext_ok(int rc, const mt_error *err) {
  return rc == MT_OK ? 0 : (mt_ext_raise(rc, err), -1);
}
/* The core status of the Python exception being raised (MemoryError, OverflowError,
 * IndexError, TypeError, ValueError, NotImplementedError, OSError, else MT_ESTATE,
 * which raises as RuntimeError), its message in err->msg; the exception is cleared.
 * The reverse of mt_ext_raise, for an exception that must travel to other ranks. */
int mt_ext_fetch_status(mt_error *err);
/* Imports NumPy's C API: 0, or -1 with an exception. */
int mt_ext_import_numpy(void);
/* ((status, exception class), ...): the one status <-> exception table, most
 * specific first (new reference; NULL with an exception). */
PyObject *mt_ext_status_exceptions(void);
/* A tuple of ints. */
PyObject *mt_ext_int_tuple(const int64_t *v, int n);
/* A new C-contiguous array; large ones come from the block pool. */
PyArrayObject *mt_ext_new_array(PyObject *module, PyArray_Descr *descr, int ndim,
                                const npy_intp *dims);
/* Makes the block pool NumPy's allocator while a local function runs on operands
 * of which one is large (its results and temporaries then reuse resident blocks):
 * the allocator to give back to mt_ext_pool_leave, or NULL when none is large. */
PyObject *mt_ext_pool_enter(PyObject *module, PyObject *const *operands, Py_ssize_t n);
/* Gives NumPy back the allocator mt_ext_pool_enter replaced (none for NULL),
 * keeping any exception the local function raised. */
void mt_ext_pool_leave(PyObject *old);

/* -- meshes (ext_mesh_base.c) ------------------------------------------------------ */

/* _C.MeshBase, the C base of every mesh: its communicators, which it owns, and the
 * decision memo and layout table of the tensors on it, with the Python form of
 * each layout (placements, shape, dtype, stride) kept by layout slot. */
typedef struct mt_ext_mesh_base {
  PyObject_HEAD
  mt_mesh *mesh; /* its communicators, owned; NULL until adopted */
  mt_memo *memo;
  mt_layout_table *layouts;
  PyObject **py_layouts; /* by layout slot, valid for py_ids[slot] */
  int64_t *py_ids;
  int64_t py_cap;
  char member; /* this rank holds a coordinate of the mesh */
  char local;  /* mpitensor's local mesh: ndarrays mix in as Replicate */
  unsigned long long key; /* equal meshes (DeviceMesh.__eq__) have equal keys; 0 unset */
  unsigned long long ranks_key; /* meshes of the same ranks of one communicator: equal; 0 unset */
  long long call_agreements; /* the program's calls agreed on over this mesh */
  int mesh_ndim;
  int64_t mesh_shape[MT_MAX_MESH_NDIM];
} mt_ext_mesh_base;

/* The number of ranks of the mesh `mb`. */
static inline int64_t mt_ext_mesh_size(const mt_ext_mesh_base *mb) {
  int64_t n = 1;
  for (int i = 0; i < mb->mesh_ndim; ++i) n *= mb->mesh_shape[i];
  return n;
}

/* 0 when the mesh may run a collective here (mt_mesh_check: its creating thread,
 * its communicators alive), else -1 with the exception, the same on every rank. */
int mt_ext_mesh_check(const mt_ext_mesh_base *mb);

/* The members of the mesh agree on `fp`: 0 when they all hold it, else -1 with
 * ValueError(`message`, UTF-8, cut to what an mt_error holds) on every member;
 * the mesh's own check first. 0 at once on a rank outside the mesh and on a mesh
 * of one rank. Collective on the mesh. */
int mt_ext_mesh_agree(const mt_ext_mesh_base *mb, uint64_t fp, const char *message,
                      Py_ssize_t len);

/* Whether an operand that requires grad gets a gradient from this operation's
 * decision: grad mode is on, or the forward of a recorded operation runs. */
static inline int mt_ext_grad_wanted(const mt_ext_modes *m) {
  return m->grad_enabled | m->grad_priced;
}
/* Whether the executor emits trace events: a tool listens (checks, debug logs, a
 * gather warning, a CommDebugMode), or gathers are logged. */
static inline int mt_ext_events(const mt_ext_modes *m) {
  return m->checks || m->log_debug || m->gather_warning || m->listeners > 0 || m->log_info;
}

/* -- DTensors -------------------------------------------------------------------- */

/* _C.DTensorBase, the C base of DTensor. `fresh`: during a backward, the executor
 * allocated the local array for this DTensor alone (the engine may write into it). */
typedef struct mt_ext_dtensor {
  PyObject_HEAD
  PyObject *local;   /* _local_tensor */
  PyObject *spec;    /* _spec: (mesh, placements, shape, dtype, stride) */
  int64_t layout_id; /* on the spec's mesh; 0 until first needed */
  PyObject *grad_fn; /* _grad_fn: the autograd Node that made it, or NULL */
  /* Autograd's attributes, NULL (unset) until used (mpitensor.DTensor says what
   * each is). Here rather than in the Python class's __slots__, which
   * subtype_dealloc would walk one by one at every free. */
  PyObject *grad, *retains_grad, *grad_owned, *backward_hooks, *post_hooks;
  char requires_grad, fresh;
} mt_ext_dtensor;

/* Frees the memory of freed DTensors kept for reuse (the dispatch is cleared;
 * ext_spec.c, where new DTensors take it). */
void mt_ext_dtensor_free_all(mt_ext_dispatch *d);

/* -- registered operations (ext_ops.c) ------------------------------------------ */

/* A ufunc or reduction whose dim map the core builds (core/dimmap.c), and its
 * backward when it has one (register_backward). */
typedef struct mt_ext_sig {
  PyObject *func;   /* the ufunc, or the NumPy reduction (numpy.sum) */
  PyObject *label;  /* the name a user writes ("numpy.sum"), which agreements hash */
  PyObject *method; /* reduction: ndarray's method (local array first) or the
                     * registered local function, or NULL */
  PyObject *small;  /* reduction: what runs instead on a local array of fewer than
                     * small_size elements, or NULL */
  Py_ssize_t small_size;
  int64_t id;       /* its op id in the memo */
  mt_op_sig op;
  int nin, nout;  /* ufunc, or elementwise function (register_elementwise) */
  int ufunc;      /* a NumPy ufunc: its resolve_dtypes gives the result's dtype */
  int cast;       /* func(x, dtype, copy=True) casts x (register_cast) */
  /* func(x, axis) works along the lanes of one axis (register_lanes), `method`
   * its local function; lanes_axis the axis when the call gives none
   * (MT_EXT_NO_AXIS: the call must give one). */
  int lanes, lanes_axis;
  /* func(x, n, axis) works along the lanes of one axis, its output n shorter there
   * (register_differences: np.diff), `method` its local function. */
  int differences;
  /* func(arrays, axis) joins DTensors along an existing axis, or a new one
   * (op.family MT_OP_STACK) (register_join), `method` its local function:
   * method(*blocks, axis). */
  int join;
  int int_axis;   /* reduction: axis is an int or None (argmax, argmin) */
  int user_rule;  /* a user's register_sharding rule: the Python door runs it */
  PyObject *grad_name, *grad_backward; /* NULL: no backward */
} mt_ext_sig;

enum { MT_EXT_NO_AXIS = -1000 };

/* DTensorBase's operators, X(ufunc, number slot), as NDArrayOperatorsMixin lists
 * them (power, whose slot takes a modulus, apart); its comparisons in Py_LT ..
 * Py_GE order; its reduction methods, X(name, whether a sharded axis reduces
 * locally to a Partial). One list each, from which the slots, the methods, their
 * ufuncs' names and the indices below are made (ext_dtensor.c, ext_ops.c). */
#define MT_EXT_BINARY(X)                                                               \
  X(add, Py_nb_add) X(subtract, Py_nb_subtract) X(multiply, Py_nb_multiply)           \
  X(matmul, Py_nb_matrix_multiply) X(true_divide, Py_nb_true_divide)                   \
  X(floor_divide, Py_nb_floor_divide) X(remainder, Py_nb_remainder)                    \
  X(left_shift, Py_nb_lshift) X(right_shift, Py_nb_rshift) X(bitwise_and, Py_nb_and)   \
  X(bitwise_xor, Py_nb_xor) X(bitwise_or, Py_nb_or) X(divmod, Py_nb_divmod)
/* The operators in place, X(ufunc, number slot, the operator not in place): the
 * ufunc into the left operand. */
#define MT_EXT_IN_PLACE(X)                                                             \
  X(add, Py_nb_inplace_add, PyNumber_Add)                                              \
  X(subtract, Py_nb_inplace_subtract, PyNumber_Subtract)                               \
  X(multiply, Py_nb_inplace_multiply, PyNumber_Multiply)                               \
  X(matmul, Py_nb_inplace_matrix_multiply, PyNumber_MatrixMultiply)                    \
  X(true_divide, Py_nb_inplace_true_divide, PyNumber_TrueDivide)                       \
  X(floor_divide, Py_nb_inplace_floor_divide, PyNumber_FloorDivide)                    \
  X(remainder, Py_nb_inplace_remainder, PyNumber_Remainder)                            \
  X(left_shift, Py_nb_inplace_lshift, PyNumber_Lshift)                                 \
  X(right_shift, Py_nb_inplace_rshift, PyNumber_Rshift)                                \
  X(bitwise_and, Py_nb_inplace_and, PyNumber_And)                                      \
  X(bitwise_xor, Py_nb_inplace_xor, PyNumber_Xor) X(bitwise_or, Py_nb_inplace_or, PyNumber_Or)
#define MT_EXT_UNARY(X)                                                                \
  X(negative, Py_nb_negative) X(positive, Py_nb_positive) X(absolute, Py_nb_absolute)  \
  X(invert, Py_nb_invert)
#define MT_EXT_COMPARE(X) \
  X(less, 0) X(less_equal, 0) X(equal, 0) X(not_equal, 0) X(greater, 0) X(greater_equal, 0)
/* The ufuncs NumPy's ** takes for a few exponents (nb_power says which). */
#define MT_EXT_POWER_PATHS(X) X(square, 0) X(reciprocal, 0) X(sqrt, 0)
#define MT_EXT_REDUCTIONS(X)                                                          \
  X(sum, 1) X(mean, 1) X(prod, 1) X(max, 1) X(min, 1) X(all, 0) X(any, 0) X(std, 0)    \
  X(var, 0) X(argmax, 0) X(argmin, 0)
#define MT_EXT_UFUNC_INDEX(name, _) MT_UF_##name,
#define MT_EXT_REDUCTION_INDEX(name, _) MT_RED_##name,
/* Indices into mt_ext_dispatch.ufunc and its reduction arrays. */
enum { MT_EXT_BINARY(MT_EXT_UFUNC_INDEX) MT_UF_power, MT_EXT_UNARY(MT_EXT_UFUNC_INDEX)
       MT_EXT_COMPARE(MT_EXT_UFUNC_INDEX) MT_EXT_POWER_PATHS(MT_EXT_UFUNC_INDEX) MT_EXT_NUFUNC };
enum { MT_EXT_REDUCTIONS(MT_EXT_REDUCTION_INDEX) MT_EXT_NREDUCTION };
/* The freed DTensors kept for reuse (ext_dtensor.c, ext_spec.c): enough for the temporaries
 * of an expression, few enough to hold little memory. */
enum { MT_EXT_FREE_DTENSORS = 16 };

/* The hook table's kinds (ext_hooks.c): every call from C into Python is one.
 * Their counts, and RUNS (operations the executor ran), are an array that
 * mpitensor._trace reads through ctypes (the capsule `_C.HOOK_CALLS`, in this
 * order). */
enum { MT_HOOK_LOCAL, MT_HOOK_BUILD, MT_HOOK_ENTRY, MT_HOOK_EVENT, MT_HOOK_PLACEMENTS,
       MT_HOOK_ERROR, MT_HOOK_DTYPE, MT_HOOK_ERRSTATE, MT_HOOK_DEFERRED,
       MT_HOOK_RUNS, MT_HOOK_COUNT };
/* The trace events, each installed as the hook of its name (ext_hooks.c). */
enum { MT_EVENT_DECISION, MT_EVENT_MOVE, MT_EVENT_UNMOVED, MT_EVENT_COUNT };
/* The strings the extension compares keywords with, sets slots by or names hooks
 * by, interned in mt_ext_dispatch.str: X(index, text). Node's slots, Request's
 * and the events' hooks (in MT_EVENT_* order) each run in order. */
#define MT_EXT_STRINGS(X)                                                              \
  X(CALL, "__call__") X(AXIS, "axis") X(KEEPDIMS, "keepdims") X(OUT, "out")           \
  X(REDISTRIBUTE, "DTensor.redistribute") X(NODE, "name") X(NODE_INPUTS, "inputs")     \
  X(NODE_BACKWARD, "backward_fn") X(NODE_SAVED, "saved") X(NODE_AUX, "aux")            \
  X(REQUEST, "_pending") X(REQUEST_RESULT, "_result")                                  \
  X(EVENT, "decision") X(EVENT_MOVE, "move") X(EVENT_UNMOVED, "unmoved")               \
  X(DOOR, "door") X(NAME, "__name__") X(PACKAGE, "mpitensor.")                        \
  X(ARRAY_API, "mpitensor.array_api") X(TESTING, "mpitensor.testing")                 \
  X(MODULE, "__module__") X(QUALNAME, "__qualname__") X(ERRSTATE, "errstate")         \
  X(SETTLE, "settle") X(RESULT, "result") X(DTYPE, "dtype") X(COPY, "copy")         \
  X(INDEX_KEYS, "_index_keys") X(VIEW, "view") X(BLOCK_RESHAPES, "_block_reshapes")     \
  X(ORDER_C, "C") X(N, "n") X(WRITE, "write") X(SETITEM, "DTensor.__setitem__")
#define MT_EXT_STRING_INDEX(name, _) MT_S_##name,
enum { MT_EXT_STRINGS(MT_EXT_STRING_INDEX) MT_S_COUNT };

struct mt_ext_dispatch {
  PyObject *module; /* borrowed: the module whose state this is */
  PyTypeObject *dtensor, *spec, *mesh_base, *dtensor_base, *node_type, *request_type;
  /* mpitensor._deferred.Deferred, and the one whose operands are frozen (NULL:
   * none; owned), which ext_deferred.c settles before any other use of data. */
  PyTypeObject *deferred_type;
  PyObject *deferred;
  PyObject *isnan; /* numpy.isnan, which may defer (ext_entry.c) */
  PyObject *where; /* numpy.where, which may defer too */
  mt_ext_modes *modes; /* the module state's */
  /* (name, backward) of the moves redistribute records, and of the views the
   * executor reads strided operands through (register_grad); NULL: none. */
  PyObject *move_grad, *view_grad;
  /* name -> callable: an event's, "placements", "door", "error" */
  PyObject *hooks;
  PyObject *ufunc_type;
  PyObject *replicate, *shard[MT_MAX_NDIM], *partial[MT_REDUCE_COUNT];
  PyObject *strided; /* _strided_shard(dim, split_factor): a _StridedShard */
  PyObject *ufunc[MT_EXT_NUFUNC]; /* the operators' */
  PyObject *reduction_name[MT_EXT_NREDUCTION];
  int reduction_sig[MT_EXT_NREDUCTION]; /* index into sigs, or -1 */
  mt_ext_sig *sigs;
  int nsigs, sig_cap;
  mt_ptr_index *sig_index; /* func -> index into sigs, by address */
  /* The last ufunc an operator or __array_ufunc__ called and its index into sigs
   * (-1: none), borrowed: an expression repeats its operators. Forgotten when a
   * signature is added or the sigs cleared; a registered ufunc cannot die while
   * remembered (its sig holds it). */
  PyObject *last_ufunc;
  int last_sig;
  PyObject *op_ids; /* an op key -> its op id (bounded) */
  int64_t next_op, redistribute_op;
  PyObject *str[MT_S_COUNT], *kw_keepdims, *kw_out, *kw_dtype; /* ("keepdims",), ... */
  long long hook_calls[MT_HOOK_COUNT];
  /* NumPy's error state (watch_errstate): its context variable (NULL: not
   * watched), and the last two states seen with whether each raises, held so
   * that a state's address is never another's. */
  PyObject *errstate_var, *errstate_seen[2];
  int errstate_raises[2];
  /* The name a user writes of each function called through the Python door
   * (mpitensor._registry.call_label fills it; `_C.call_names`), by which the
   * ranks agree on a call. */
  PyObject *call_names;
  /* The memory of freed DTensors of type `dtensor`, untracked and with every
   * field cleared, which the next ones reuse (ext_dtensor.c, ext_spec.c). */
  PyObject *free_dtensors[MT_EXT_FREE_DTENSORS];
  int nfree_dtensors;
  int64_t decision_limit, plan_limit, layout_limit; /* for new meshes */
};

static inline mt_ext_dispatch *mt_ext_dispatch_module(PyObject *module) {
  return mt_ext_state_of(module)->dispatch;
}

static inline int mt_ext_is_dtensor(const mt_ext_dispatch *d, PyObject *o) {
  return PyObject_TypeCheck(o, d->dtensor_base);
}

/* The registered signature of `func`, found by address. */
static inline mt_ext_sig *mt_ext_sig_of(const mt_ext_dispatch *d, const PyObject *func) {
  int s = d->sig_index != NULL ? mt_ptr_index_find(d->sig_index, func) : -1;
  return s < 0 ? NULL : &d->sigs[s];
}
/* The op id of a hashable key, or -1 with an exception. */
int64_t mt_ext_op_id(mt_ext_dispatch *d, PyObject *key);

/* -- the hook table (ext_hooks.c) ---------------------------------------------------- */

/* fn(*args, **kwnames) as hook `kind`: the one way C calls Python. */
PyObject *mt_ext_hook(mt_ext_dispatch *d, int kind, PyObject *fn, PyObject *const *args,
                      size_t nargsf, PyObject *kwnames);
/* args[0].name(*args[1:nargs]) as hook `kind`. */
PyObject *mt_ext_hook_method(mt_ext_dispatch *d, int kind, PyObject *name,
                             PyObject *const *args, size_t nargs);
/* fn(*args, **kwargs) as hook `kind` (args a tuple, kwargs a dict or NULL). */
PyObject *mt_ext_hook_call(mt_ext_dispatch *d, int kind, PyObject *fn, PyObject *args,
                           PyObject *kwargs);
/* The trace event `kind` (an MT_EVENT_*) with n arguments, when tracing; 0, or -1
 * with an exception. */
int mt_ext_event(mt_ext_dispatch *d, int kind, PyObject *const *args, Py_ssize_t n);
/* The event of a DTensor of `spec` about to move by `plan` (NULL: no rank of it
 * communicates), named `what` (None: an operation's input) to `dst` placements
 * (None: the plan's): "move", or "unmoved" when `same` (an explicit redistribute
 * to its own placements, checked like any since another rank's may move). */
int mt_ext_move_event(mt_ext_dispatch *d, PyObject *spec, mt_plan *plan, int same,
                      PyObject *what, PyObject *dst);

/* The exception of error `kind` of the operation `key` (its function or op key),
 * with `arg` (NULL: None), raised by the error hook (mpitensor._registry), which
 * names the operation as a user writes it. Returns NULL. The kinds: "no_rule",
 * "no_backward" (a floating-point result of an op without a backward rule),
 * "mixed" (arg: a plain ndarray operand), "mesh" (arg: the two meshes of its
 * DTensors), "in_place_grad" (key: the function or its name), "out_grad",
 * "keyword_grad" (arg: the keyword of a DTensor that needs a gradient). */
PyObject *mt_ext_error(mt_ext_dispatch *d, const char *kind, PyObject *key, PyObject *arg);

/* Whether NumPy's error state of the calling context raises, or calls a
 * function, on some floating-point error (the hook "errstate", once per state
 * seen): then a local function's error on one rank is every rank's. 1, 0 (or
 * not watched), or -1 with an exception. */
int mt_ext_errstate_raises(mt_ext_dispatch *d);

/* -- specs and layouts (ext_spec.c) ------------------------------------------------ */

/* The code of an interned placement (Replicate(), Shard(i), Partial(op)), found
 * by identity: 1, or 0 for any other object. */
int mt_ext_interned_code(const mt_ext_dispatch *d, const PyObject *p, mt_placement *out);
int mt_ext_spec_key(mt_ext_dispatch *d, const mt_ext_mesh_base *mb, PyObject *spec,
                    mt_layout_key *key);
int mt_ext_layout_id(mt_ext_dispatch *d, mt_ext_mesh_base *mb, mt_ext_dtensor *dt,
                     mt_layout_key *key, int64_t *id);
int mt_ext_dtype_key(PyArray_Descr *descr);
PyObject *mt_ext_placement_objects(mt_ext_dispatch *d, const mt_placement *p, int n);
PyObject *mt_ext_py_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb, int64_t id,
                           int64_t slot, const mt_layout_key *key, PyObject *dtype);
/* A new DTensorSpec of (mesh, placements, shape, dtype, stride), borrowed; and one
 * of a mesh and a Python layout (placements, shape, dtype, stride). */
PyObject *mt_ext_spec_new(mt_ext_dispatch *d, PyObject *const *items);
PyObject *mt_ext_make_spec(mt_ext_dispatch *d, PyObject *mesh, PyObject *layout);
/* A DTensor of `spec` around `local` (both stolen; NULL for either: NULL), of
 * layout id `id` (0: unknown) and freshness `fresh`. */
PyObject *mt_ext_new_dtensor(mt_ext_dispatch *d, PyObject *local, PyObject *spec, int64_t id,
                             int fresh);
mt_ext_mesh_base *mt_ext_spec_mesh(mt_ext_dispatch *d, PyObject *spec);
/* The core code of a Placement: an interned one by identity, else its `_code`
 * (kind, dim, reduce_op[, split_factor]). 0, or -1 with an exception. */
int mt_ext_placement_code(const mt_ext_dispatch *d, PyObject *p, mt_placement *out);
/* Whether a placement is a strided shard (kind MT_PLACEMENT_STRIDED, which only
 * the core's strided.h reads), a DTensor holds one, or an argument of a
 * registered function (or an item of a list or tuple one) is such a DTensor. */
int mt_ext_placement_strided(const mt_ext_dispatch *d, PyObject *p);
int mt_ext_strided(const mt_ext_dispatch *d, PyObject *o);
int mt_ext_args_strided(const mt_ext_dispatch *d, PyObject *args, PyObject *kwargs);
/* Strided shards as plain layouts (ext_strided.c). The layout of `shape` on `mb`
 * with `placements` (a tuple; strided ones allowed): 0, or -1 with an exception. */
int mt_ext_strided_layout(mt_ext_dispatch *d, const mt_ext_mesh_base *mb, PyObject *shape,
                          PyObject *placements, mt_layout *out);
/* A DTensor of layout `l` (dtype that of `like`'s spec; placements `pl`, or made
 * from `l`'s when NULL) around `local`, reshaped to this rank's part of `l`: the
 * same elements in the same order when `l` holds them as `like` does (its
 * expansion, or a common plain form). No autograd history. */
PyObject *mt_ext_as_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *like,
                           PyObject *local, const mt_layout *l, PyObject *pl);
/* A ufunc call whose DTensor operands are strided alike (one mesh, placements and
 * shape) or replicated, among scalars, is the plain call on their expansions,
 * read back. A view of an operand that wants a gradient, and the result read
 * back, record as restride (register_grad's "view"). _views: the plain call's
 * operands and keywords in `r` (1; 0 when the call is not such a one: the Python
 * door takes it, and moves the operands; -1 with an exception). _back:
 * drops them, reads back `res` (stolen; NULL without an exception when a result
 * has no view in the strided shape). */
typedef struct mt_ext_strided_reading {
  mt_ext_mesh_base *mb;
  mt_layout l, e; /* the operands' strided layout and its plain expansion */
  PyObject *placements, *views[MT_MEMO_MAX_OPERANDS + 8]; /* l's placements, borrowed */
  PyObject *out; /* out= (borrowed), written through views, or NULL */
  Py_ssize_t nviews;
} mt_ext_strided_reading;
int mt_ext_strided_views(mt_ext_dispatch *d, PyObject *const *ops, Py_ssize_t n,
                         PyObject *kwnames, mt_ext_strided_reading *r);
PyObject *mt_ext_strided_back(mt_ext_dispatch *d, mt_ext_strided_reading *r, PyObject *res);
/* A strided DTensor as its plain expansion, for a reduction over every element
 * (which the expansion gives as it is), recorded as a view; NULL without an
 * exception when it has a Partial. */
PyObject *mt_ext_strided_whole(mt_ext_dispatch *d, PyObject *self);

/* -- deciding (ext_decide.c) -------------------------------------------------------- */

/* A call's operands: its mesh, the DTensors among them and the memo key. */
typedef struct mt_ext_call {
  mt_ext_mesh_base *mb;
  int noperands, ntensors;
  uint32_t tensors; /* bit i: operand i is a DTensor */
  mt_ext_dtensor *dt[MT_MEMO_MAX_OPERANDS];
  int64_t id[MT_MEMO_MAX_OPERANDS];
  mt_memo_key key; /* op and aux are the caller's to set */
  PyObject *made[MT_MEMO_MAX_OPERANDS]; /* DTensors made of ndarrays (implicit) */
  int nmade;
  int strided; /* gathering stopped at a strided operand (its door calls the hook) */
  /* With defer_mixed (the gather's argument), a plain ndarray that the executor's
   * own rule does not replicate stops gathering (mixed = 1, no error), for a door
   * that hands such a call to the Python door, which agrees on the array first. */
  int defer_mixed, mixed;
} mt_ext_call;

/* The memo key word of the DTensor just added as tensor input c->ntensors - 1:
 * its layout id, or, when it is the same DTensor as an earlier tensor input t, a
 * word of its own (MT_EXT_ALIAS_WORD - t): the engine then moves the two once
 * (mt_prop_inputs.alias), so x * x is not decided as x * y. */
#define MT_EXT_ALIAS_WORD (-((int64_t)1 << 40))
static inline int64_t mt_ext_operand_word(const mt_ext_call *c, int64_t id) {
  const mt_ext_dtensor *last = c->dt[c->ntensors - 1];
  for (int t = 0; t < c->ntensors - 1; ++t)
    if (c->dt[t] == last) return MT_EXT_ALIAS_WORD - t;
  return id;
}
/* The earlier tensor input that tensor input t is the same DTensor as, or -1. */
static inline int mt_ext_alias_of(const mt_ext_call *c, int t) {
  for (int k = 0; k < t; ++k)
    if (c->dt[k] == c->dt[t]) return k;
  return -1;
}

/* A call of n operands, none gathered yet (its mesh unknown). */
static inline void mt_ext_call_init(mt_ext_call *c, int n) {
  c->mb = NULL, c->ntensors = 0, c->tensors = 0, c->nmade = 0, c->strided = 0;
  c->defer_mixed = 0, c->mixed = 0;
  c->key.op = 0, c->key.aux = 0, c->key.grad = 0, c->key.want = 0;
  c->key.noperands = c->noperands = n;
}
/* DTensor b, of layout id `id` on the call's mesh, as operand i: the next tensor
 * input, its memo key word, and whether its gradient is wanted. */
static inline void mt_ext_call_add(const mt_ext_dispatch *d, mt_ext_call *c, int i,
                                   mt_ext_dtensor *b, int64_t id) {
  c->dt[c->ntensors] = b;
  c->id[c->ntensors++] = id;
  c->tensors |= 1u << i;
  c->key.operand[i] = mt_ext_operand_word(c, id);
  c->key.grad |= (uint32_t)(b->requires_grad & mt_ext_grad_wanted(d->modes)) << i;
}

/* Gathers n operands: DTensors of one mesh (DTensors pending an async move are
 * completed), scalars, and under implicit replication ndarrays as Replicate
 * DTensors (kept in c->made). 1, or 0 when they are not an operation's operands
 * (no DTensor, another object: NotImplemented; with `defer_mixed`, a plain
 * ndarray too, c->mixed set), or -1 with an exception. */
int mt_ext_gather(mt_ext_dispatch *d, PyObject *const *ops, int n, mt_ext_call *c,
                  PyObject *key, int defer_mixed);
void mt_ext_call_release(mt_ext_call *c);
/* Sets c->key.want from the modes' `want` when it is a DTensor on the call's mesh:
 * 1, or -1 with an exception (the call released). */
int mt_ext_call_want(mt_ext_dispatch *d, mt_ext_call *c);
static inline int mt_ext_wanting(const mt_ext_dispatch *d) {
  return d->modes->want != NULL && d->modes->want != Py_None;
}

/* What an operation is: how to decide it, what to run, how to record it. */
typedef struct mt_ext_op {
  const mt_ext_sig *sig; /* a registered ufunc or reduction, or NULL */
  PyObject *key;         /* the op's key, for events and errors */
  PyObject *build;       /* without sig: the builder of its dim map on a miss */
  uint32_t axes;
  int keepdims;
  PyObject *func; /* the local function, called with the local operands, then: */
  PyObject *const *extra;
  Py_ssize_t nextra;
  PyObject *kwnames; /* names of the last of the extra arguments */
  int pass_box;      /* and this rank's output box (a shape tuple) last */
  PyObject *aux;     /* what the autograd node keeps besides the operands */
  int64_t shorten;   /* a lanes op: how much shorter its output is along `axes` */
} mt_ext_op;

/* -- the executor's doors (ext_entry.c) and function families (ext_families.c) -- */

/* The common operand: exactly a DTensor with an ndarray and a layout id, on the
 * call's mesh. Adds it as operand i: 1, or 0 for mt_ext_gather to judge. */
static inline int mt_ext_known_tensor(const mt_ext_dispatch *d, PyObject *o, int i,
                               mt_ext_call *c) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)o;
  if (Py_TYPE(o) != d->dtensor || b->layout_id == 0 || !PyArray_CheckExact(b->local))
    return 0;
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)PyTuple_GET_ITEM(b->spec, 0);
  if (mb != c->mb && c->mb != NULL) return 0;
  c->mb = mb;
  mt_ext_call_add(d, c, i, b, b->layout_id);
  return 1;
}

/* mt_ext_gather of operands that are all known DTensors, inline: the call of a
 * cached operation. */
static inline int mt_ext_gather_fast(mt_ext_dispatch *d, PyObject *const *ops, int n,
                              mt_ext_call *c, PyObject *key, int defer_mixed) {
  mt_ext_call_init(c, n);
  for (int i = 0; i < n; ++i)
    if (!mt_ext_known_tensor(d, ops[i], i, c)) return mt_ext_gather(d, ops, n, c, key, defer_mixed);
  return mt_ext_wanting(d) ? mt_ext_call_want(d, c) : 1;
}

/* The agreement of func(*args, **kwargs) for a C door that runs it (its frame
 * `caller`; None: mpitensor's own call, not agreed). 0, or -1 with the agreed
 * exception. */
int mt_ext_agree_on(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                    PyObject *kwargs, PyObject *caller);
/* Whether `o` is large enough that np.isnan's or np.where's blocks of it may wait
 * for the reduction that reads them, the same on every rank. */
int mt_ext_may_defer(const mt_ext_dispatch *d, PyObject *o);
/* Whether `spec`'s placements hold whole lanes along `ax` with nothing to reduce:
 * no Partial, and no Shard of dim `ax` (ax < 0: of none). A placement C cannot
 * read counts as neither (0), for the Python entry to take (ext_families.c). */
int mt_ext_whole_along(const mt_ext_dispatch *d, PyObject *spec, long ax);
/* func(*args, **kwargs) of a function family (elementwise, cast, lanes, join) run
 * by the executor, agreed on the frame `caller`; NotImplemented before any
 * agreement where the family does not take the call. */
PyObject *mt_ext_family_call(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                             PyObject *kwargs, PyObject *caller);

/* The op's dtype= keyword as a NumPy dtype, or NULL (none, or one NumPy refuses,
 * which then raises in the call itself). New reference. */
PyArray_Descr *mt_ext_keyword_dtype(const mt_ext_op *op);
/* mt_ext_decide of the call once its memo key holds the op's dtype= keyword, as
 * mt_ext_execute decides it. */
const mt_decision *mt_ext_decide_typed(mt_ext_dispatch *d, const mt_ext_op *op,
                                       mt_ext_call *c, int *hit);
/* The decision of the call: the memo's (*hit), else made from the op's signature
 * or its builder's dim map and stored. NULL with an exception. */
mt_decision *mt_ext_decide(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                           int *hit);
/* The output layout id and Python layout of element type `descr`, interned and
 * remembered in the decision of `key` when the memo still holds it. */
int mt_ext_decision_output(mt_ext_dispatch *d, mt_ext_mesh_base *mb,
                           const mt_memo_key *key, const mt_decision *dec,
                           PyArray_Descr *descr, int64_t *id, PyObject **layout);
/* `out` interned on the mesh as the output layout of the decision stored under
 * `key` (remembered there while the memo holds it): its id, and its Python
 * layout of dtype object `dtype`. NULL with an exception. */
PyObject *mt_ext_output_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb,
                               const mt_memo_key *key, const mt_layout_key *out,
                               PyObject *dtype, int64_t *id);
/* The dim map a builder gave (a buffer of one mt_dimmap), copied into `map` and
 * checked: `map`, or NULL with an exception. */
const mt_dimmap *mt_ext_dimmap_get(PyObject *obj, mt_dimmap *map);
/* (output placements, output shape or None) of a decision. */
PyObject *mt_ext_decision_out(mt_ext_dispatch *d, const mt_decision *dec);
int64_t mt_ext_reduction_aux(PyObject *axis, int ndim, int keepdims, uint32_t *axes);

/* -- the executor (ext_exec.c) -------------------------------------------------------- */

/* Runs `op` on the gathered call (its decision `dec`, found or made): the inputs'
 * plans, the local function, the wrap, the autograd record and the trace events.
 * Collective on the mesh when a plan moves data. */
PyObject *mt_ext_run(mt_ext_dispatch *d, const mt_ext_op *op, mt_ext_call *c,
                     const mt_decision *dec, int hit, PyObject *const *ops);
/* Decides and runs. */
PyObject *mt_ext_execute(mt_ext_dispatch *d, const mt_ext_op *op, mt_ext_call *c,
                         PyObject *const *ops);
/* A ufunc call, a reduction method call, and __array_ufunc__. */
PyObject *mt_ext_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops,
                       Py_ssize_t n, PyObject *kwnames);
/* x op= y: the ufunc into x (out=(x,)), not agreed: an operator's operands are
 * DTensors and scalars, as the executor's fast path takes them. y NULL: a unary
 * ufunc into x. */
PyObject *mt_ext_ufunc_in_place(mt_ext_dispatch *d, PyObject *ufunc, PyObject *x,
                                PyObject *y);
PyObject *mt_ext_reduction(mt_ext_dispatch *d, int method, PyObject *self,
                           PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *mt_ext_array_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *method,
                             PyObject *const *ops, Py_ssize_t n, PyObject *kwnames);
/* DTensor.redistribute: a move decided in the mesh's memo, run sync or async,
 * recorded and traced. `what` names it in events. Collective on the mesh. */
PyObject *mt_ext_move(mt_ext_dispatch *d, PyObject *self, PyObject *mesh,
                      PyObject *placements, int async, PyObject *dtype,
                      PyObject *backward_dtype, PyObject *what);
/* A plan run on this rank's local array (collective on the mesh), blocking or
 * started (a _C.Request). */
PyObject *mt_ext_run_plan(PyObject *module, mt_mesh *mesh, const mt_plan *plan,
                          PyObject *local);
PyObject *mt_ext_start_plan(PyObject *module, mt_ext_mesh_base *mb, const mt_plan *plan,
                            PyObject *local);
/* Completes `b`'s pending move (a mpitensor._comm.Request in its local slot):
 * waits for it (collective) and puts the local array it gives in the slot; nothing
 * when the slot holds an ndarray. The one completion: the executor's operands,
 * redistribute and DTensor._data. 0, or -1 with an exception. */
int mt_ext_complete(mt_ext_dispatch *d, mt_ext_dtensor *b);
/* -- deferred locals (ext_deferred.c) ---------------------------------------------- */

/* Settles the pending Deferred, if any: computes it when anything but the
 * dispatch holds it, and gives its operands back their writes. 0, or -1 with an
 * exception. Called before every completion, so before any operation reads or
 * writes a DTensor's data or hands a local array out. */
int mt_ext_settle(mt_ext_dispatch *d);
/* The size from which a block may wait (_C.DEFER_MIN_SIZE): below it, writing
 * the block costs less than the deferring. */
enum { MT_EXT_DEFER_MIN_SIZE = 1 << 15 };
/* Whether copy-views made of the memory `local` lies in have records (the modes'
 * copy_views): a write into it must reach them, which only Python's write does.
 * -1 with an exception. */
int mt_ext_has_copy_views(const mt_ext_modes *m, PyObject *local);
/* Puts the computed array of the Deferred in `b`'s slot in its place. */
int mt_ext_complete_deferred(mt_ext_dispatch *d, mt_ext_dtensor *b);

/* A mpitensor._comm.Request that owns `req`, a plan's exchange in flight; `keep`
 * stays referenced until it completes, and wait() returns `result`. */
PyObject *mt_ext_request_new(mt_ext_dispatch *d, mt_request *req, PyObject *keep,
                             PyObject *result);

/* -- owners (ext_owned.c) ---------------------------------------------------------- */

/* A capsule holding one more reference of `plan` (named "mpitensor.plan"), which
 * mpitensor._plan reads: how the trace events hand a plan to Python. */
PyObject *mt_ext_plan_wrap(mt_plan *plan);
/* A capsule ("mpitensor.pending") that owns `pending` and one reference of `keep`
 * (NULL: none): freed, it completes the exchange, then lets `keep` go. NULL with
 * an exception when it cannot be made, the exchange completed. */
PyObject *mt_ext_pending_own(mt_pending *pending, PyObject *keep);
/* The mt_pending such a capsule owns; NULL with an exception for another object. */
mt_pending *mt_ext_pending_of(PyObject *capsule);
/* The pointer a filled ctypes.c_void_p holds, read through its buffer, so that no
 * address passes through Python as an int; NULL with a TypeError for anything
 * else or a null pointer. */
void *mt_ext_pointer_of(PyObject *pointer);
extern PyMethodDef mt_ext_owned_methods[];

/* Whether a plain ndarray holds what a DTensor can: numbers in native order. */
static inline int mt_ext_numeric(PyObject *o) {
  const PyArray_Descr *t = PyArray_DESCR((PyArrayObject *)o);
  return t->kind != 0 && strchr("biufc", t->kind) != NULL && PyArray_ISNBO(t->byteorder);
}
/* What the Python door must do for a call with these arguments
 * (ext_call_agreement.c, `_C.call_flags`): bit 0 a strided DTensor, bit 1 one that
 * needs a gradient (grad mode on, out= aside), bit 2 more than one mesh, bit 3 a
 * plain numeric ndarray. */
int mt_ext_call_flags(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs);
/* Whether `frame` (None: a program) runs a program's code rather than mpitensor's
 * own, whose calls are alike on every rank by construction (ext_call_agreement.c).
 * -1 with an exception. */
int mt_ext_by_program(mt_ext_dispatch *d, PyObject *frame);
/* The fingerprint of name(*args, **kwargs) (`_C.call_fingerprint`'s) into *out: 0,
 * or -1 with an exception. */
int mt_ext_fingerprint(mt_ext_dispatch *d, PyObject *name, PyObject *args, PyObject *kwargs,
                       uint64_t *out);
/* `_C.agree_call` once the caller is judged (`program`): the ranks agree on
 * name(*args, **kwargs) when a program made it on a mesh of more than one rank;
 * its flags (call_flags' bits and the error state's only `with_flags`: a C door
 * that runs the call needs neither), or -1 with the agreed exception. */
long mt_ext_agree_call(mt_ext_dispatch *d, PyObject *name, PyObject *args, PyObject *kwargs,
                       int program, int with_flags);
/* The bits of mt_ext_agree_call's flags (mpitensor._call_agreement names them):
 * a program made the call; every rank's DTensors hold C-contiguous local arrays;
 * a program made it while NumPy's error state raises on some floating-point error;
 * from MT_EXT_AGREED_CALL_FLAGS on, call_flags' bits. */
enum {
  MT_EXT_AGREED_PROGRAM = 1,
  MT_EXT_AGREED_CONTIGUOUS = 2,
  MT_EXT_AGREED_RAISES = 4,
  MT_EXT_AGREED_CALL_FLAGS = 3
};

/* -- operands on one mesh (ext_one_mesh.c) ------------------------------------------ */

/* The mesh an operation on the n operands runs on: of its first DTensor that is
 * not Replicate on every mesh dim (or that needs a gradient), else of its first
 * DTensor; NULL without an exception when there is no DTensor. Every DTensor
 * operand's pending move completes here (collective). A DTensor of another mesh
 * is the error hook's "mesh" error of the operation `key` (*err = 1, NULL), unless
 * it mixes in (mt_ext_mixes_in). */
mt_ext_mesh_base *mt_ext_call_mesh(mt_ext_dispatch *d, PyObject *const *ops, int n,
                                   PyObject *key, int *err);
/* Whether meshes `a` and `b` are equal (DeviceMesh.__eq__). */
static inline int mt_ext_same_mesh(const mt_ext_mesh_base *a, const mt_ext_mesh_base *b) {
  return a == b || (a->key != 0 && a->key == b->key);
}
/* Whether DTensor `b` of mesh `m` mixes into an operation on another mesh `mb`:
 * it is Replicate on every dim of a mesh of the same ranks and needs no gradient,
 * so that every rank of `mb` holds its whole value, as an implicitly replicated
 * ndarray. */
int mt_ext_mixes_in(const mt_ext_dispatch *d, const mt_ext_dtensor *b,
                    const mt_ext_mesh_base *m, const mt_ext_mesh_base *mb);
/* Whether the DTensors among `args` and `kwargs` (and in their lists and tuples)
 * live on more than one mesh. */
int mt_ext_args_meshes_differ(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs);
/* A Replicate DTensor on `mb` around `arr`, as implicit_replication() makes. */
PyObject *mt_ext_replicated(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *arr);

/* -- autograd (ext_autograd.c) ------------------------------------------------------ */

/* Whether an operand needs a gradient: exactly a DTensor that requires grad. */
static inline int mt_ext_needs_grad(const mt_ext_dispatch *d, PyObject *o) {
  return Py_TYPE(o) == d->dtensor && ((const mt_ext_dtensor *)o)->requires_grad;
}

/* Whether a DTensor operand leaves its call to the Python door before any
 * agreement: its block waits (mpitensor._ops._deferring reads it), it is strided
 * (the door moves it to a plain layout) or a gradient is wanted of it (the door
 * records the call). */
int mt_ext_door_operand(const mt_ext_dispatch *d, PyObject *o);
/* func(*pos, **kw) through the Python door (the hook "door",
 * mpitensor._registry.door_from_c): a call a C door leaves to Python. `agreed`:
 * False, or True when the call's agreement is made already, or the int flags of
 * the agreement a C door made on a call written in Python, whose door goes on. */
PyObject *mt_ext_door_hook(mt_ext_dispatch *d, PyObject *func, PyObject *pos, PyObject *kw,
                           PyObject *agreed);
/* `out` (a DTensor, or a tuple: its first) recorded as made by `backward` from the
 * n inputs (those that need a gradient), keeping `saved` and `aux` for it; out
 * is returned, or NULL with an exception (out released). */
PyObject *mt_ext_record(mt_ext_dispatch *d, PyObject *name, PyObject *backward,
                        PyObject *out, PyObject *const *inputs, Py_ssize_t n,
                        PyObject *saved, PyObject *aux);

/* -- the layouts of the structs Python reads (ext_structs.c) --------------------------- */

/* _C.STRUCTS, {C name: (size, ((field, element type, offset, size, extents),
 * ...))}, a field's element type the C name of a scalar type, "void *",
 * "PyObject *" or a struct of the table, its extents () for a scalar, (n,) for an
 * array of n, (n, m) for n arrays of m; and _C.EXPORTS, {capsule name: (element
 * type, size, extents)} of what each capsule the extension exports (the module's
 * counters and modes, a mesh's tables) points to, "opaque" (size 0) where Python
 * only passes the pointer back to C. Python reads a capsule only through its row
 * (mpitensor._clib.exported). Added by mt_ext_structs_exec. */
/* A new capsule of `p` named `name`, which must be a row of the table (a
 * SystemError otherwise, so an export cannot skip its row). */
PyObject *mt_ext_export(const char *name, void *p);

/* -- each area adds its functions and types in Py_mod_exec ----------------------------- */

int mt_ext_ops_exec(PyObject *module);
int mt_ext_structs_exec(PyObject *module);
int mt_ext_pool_exec(PyObject *module);
int mt_ext_mesh_base_exec(PyObject *module);
int mt_ext_dtensor_exec(PyObject *module);
int mt_ext_ops_traverse(mt_ext_state *st, visitproc visit, void *arg);
void mt_ext_ops_clear(mt_ext_state *st);
void mt_ext_ops_free(mt_ext_state *st);
extern PyMethodDef mt_ext_pool_methods[], mt_ext_ops_methods[], mt_ext_autograd_methods[],
    mt_ext_decide_methods[], mt_ext_exec_methods[],
    mt_ext_hooks_methods[], mt_ext_entry_methods[], mt_ext_move_methods[],
    mt_ext_one_mesh_methods[], mt_ext_call_agreement_methods[], mt_ext_deferred_methods[],
    mt_ext_views_methods[], mt_ext_spec_methods[];

#endif
