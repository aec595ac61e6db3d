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

#include "mpitensor/comm/counters.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/io/io.h"
#include "mpitensor/kernels/kernels.h"
#include "mpitensor/mpitensor.h"

#include "mpitensor/core/layout_table.h"
#include "mpitensor/core/memo.h"

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
  PyTypeObject *mesh_base_type;
  PyTypeObject *decision_type;
  PyTypeObject *node_type; /* mpitensor.autograd.Node (ext_autograd.c) */
  struct mt_ext_dispatch *dispatch; /* the dispatch's state (ext_dispatch.c), owned */
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

/* The mt_dtype code of an array's element type (of a dtype), or -2 for a type
 * the core does not know. */
int mt_ext_dtype(PyArrayObject *a);
int mt_ext_descr_dtype(PyArray_Descr *d);

/* A new reference to a C-contiguous array with the elements of `obj`, which must
 * be an ndarray (TypeError otherwise); copies only when `obj` is not contiguous. */
PyArrayObject *mt_ext_contiguous(PyObject *obj);

/* Raises the Python exception that matches a core status (ValueError for
 * MT_EINVAL, IndexError, TypeError, MemoryError, NotImplementedError, else
 * RuntimeError) with the core's message, and returns NULL. */
PyObject *mt_ext_raise(int code, const mt_error *err);

/* The status that mt_ext_raise turns back into the exception class `kind` (or its
 * closest base; MT_ESTATE, a RuntimeError, for any other), so that an exception
 * can travel through an agreement. */
int mt_ext_status_of(PyObject *kind);

/* `text` (a str) as UTF-8 in err->msg, cut at a character boundary; -1 with an
 * exception when it is not a str. */
int mt_ext_set_message(mt_error *err, PyObject *text);

/* Reads a tuple or list of ints into `out` (at most `cap` of them); sets *n.
 * Returns 0, or -1 with a Python exception set that names `what`. */
int mt_ext_int64s(PyObject *seq, int64_t *out, int cap, int *n, const char *what);

/* Reads placements encoded as a sequence of (kind, dim, reduce_op) int triples. */
int mt_ext_placements(PyObject *seq, mt_placement *out, int *n);

/* Reads (global shape, mesh shape, placement codes) into a validated layout.
 * Returns 0, or -1 with the matching Python exception set. */
int mt_ext_layout(PyObject *shape, PyObject *mesh_shape, PyObject *codes, mt_layout *out);

/* A time model from its Python form, the tuple (alpha_shm, beta_shm, alpha_net,
 * beta_net, call, copy, reduce, ranks_per_node), checked (mt_time_model_check:
 * ValueError); -1 with an exception set otherwise. And the tuple of a model. */
int mt_ext_time_model(PyObject *obj, mt_time_model *out);
PyObject *mt_ext_time_model_tuple(const mt_time_model *model);

/* A new C-contiguous array; large ones take their memory from the block pool and
 * give it back when freed. Steals no reference to `descr`. */
PyArrayObject *mt_ext_new_array(PyObject *module, PyArray_Descr *descr, int ndim,
                                const npy_intp *dims);

/* Each area adds its functions and types to the module in Py_mod_exec. */
typedef struct mt_mesh mt_mesh;
/* The core mesh behind a _C.Mesh, or NULL with TypeError set; without the check
 * for an object known to be one (a MeshBase's handle). */
mt_mesh *mt_ext_mesh_get(PyObject *module, PyObject *obj);
mt_mesh *mt_ext_mesh_get_unchecked(PyObject *obj);
/* 0 on the thread that created the _C.Mesh `obj`, else -1 with RuntimeError set
 * (the same on every rank, before any communication); what every collective on a
 * mesh checks first. mt_ext_mesh_for_collective is mt_ext_mesh_get and the check. */
int mt_ext_mesh_check_thread(PyObject *obj);
mt_mesh *mt_ext_mesh_for_collective(PyObject *module, PyObject *obj);

/* ---- The dispatch of NumPy operations on DTensors. ---- */

/* _C.MeshBase, the C base of DeviceMesh: its communicators' handle, and the
 * decision memo and layout table of the tensors on it, with the Python form of
 * each layout (placements, shape, dtype, stride) kept by layout slot. */
typedef struct mt_ext_mesh_base {
  PyObject_HEAD
  PyObject *handle; /* the _C.Mesh (`_handle`), or NULL */
  mt_memo *memo;
  mt_layout_table *layouts;
  PyObject **py_layouts; /* by layout slot, for py_ids[slot]; py_cap of each */
  int64_t *py_ids;
  int64_t py_cap;
  int member; /* this rank holds a coordinate of the mesh */
  int mesh_ndim;
  int64_t mesh_shape[MT_MAX_MESH_NDIM];
} mt_ext_mesh_base;

/* _C.DTensorBase, the C base of DTensor. */
typedef struct mt_ext_dtensor {
  PyObject_HEAD
  PyObject *local;   /* _local_tensor */
  PyObject *spec;    /* _spec: (mesh, placements, shape, dtype, stride) */
  int64_t layout_id; /* on the spec's mesh; 0 until first needed */
  PyObject *grad_fn; /* _grad_fn: the autograd Node that made it, or NULL */
  char requires_grad;
} mt_ext_dtensor;

/* A registered operation: a ufunc, or a reduction with its ndarray method, and
 * the signature its dim map is built from (core/dimmap.c). */
typedef struct mt_ext_sig {
  PyObject *func;   /* the ufunc, or the NumPy reduction (numpy.sum) */
  PyObject *method; /* reduction: ndarray's method (a descriptor: local array first) */
  int64_t id;       /* its op id in the memo */
  mt_op_sig op;
  int nin, nout; /* ufunc */
  int int_axis;  /* reduction: axis is an int or None (argmax, argmin) */
  /* Autograd (register_grad): the node's name and backward of a recorded call, or
   * NULL: such calls take the Python entry in grad mode. */
  PyObject *grad_name, *grad_backward;
} mt_ext_sig;

enum { MT_EXT_NBINARY = 14, MT_EXT_NUNARY = 4, MT_EXT_NCOMPARE = 6,
       MT_EXT_NREDUCTION = 11 };
/* The ufuncs of the operators and the names of the reduction methods
 * (ext_dtensor.c), in the order of the arrays of mt_ext_dispatch. */
extern const char *const mt_ext_binary_names[MT_EXT_NBINARY];
extern const char *const mt_ext_unary_names[MT_EXT_NUNARY];
extern const char *const mt_ext_compare_names[MT_EXT_NCOMPARE];
extern const char *const mt_ext_reduction_names[MT_EXT_NREDUCTION];

typedef struct mt_ext_dispatch {
  PyObject *module; /* borrowed: the module whose state this is */
  /* The ground floor's types and registry (dispatch_init). */
  PyTypeObject *dtensor;
  PyTypeObject *spec;
  PyTypeObject *mesh_base;    /* borrowed from the module state */
  PyTypeObject *dtensor_base; /* borrowed from the module state */
  PyTypeObject *node_type;    /* borrowed from the module state */
  PyObject *functions; /* NumPy function -> its DTensor version (mpitensor._registry) */
  PyObject *rules;     /* NumPy function -> a user's register_sharding rule */
  PyObject *ufunc_type;
  PyObject *replicate, *shard[MT_MAX_NDIM], *partial[MT_REDUCE_COUNT];
  /* The operators' ufuncs, the reduction methods' names and their signatures. */
  PyObject *binary[MT_EXT_NBINARY], *unary[MT_EXT_NUNARY], *compare[MT_EXT_NCOMPARE];
  PyObject *reduction_name[MT_EXT_NREDUCTION];
  int reduction_sig[MT_EXT_NREDUCTION]; /* index into sigs, or -1 */
  /* Registered operations and op ids. */
  mt_ext_sig *sigs;
  int nsigs, sig_cap;
  /* func -> index into sigs + 1 (0: empty), by address: a registered function is
   * found by identity, as NumPy hands it back, without hashing a Python object. */
  int *sig_slots;
  size_t sig_mask;
  PyObject *op_ids;    /* a Python op key -> its op id (bounded) */
  int64_t next_op;
  PyObject *s_call, *s_axis, *s_keepdims, *s_out, *kw_keepdims, *s_redistribute;
  /* Modes (mpitensor._modes) and switches. */
  int enabled, tracing, grad_enabled;
  long long c_calls, python_calls;
  /* DTensor.redistribute's C path (ext_redistribute_fast.c): its op id in the
   * memo and the calls it took. */
  int64_t redistribute_op;
  long long redistribute_c_calls;
  int64_t decision_limit, plan_limit, layout_limit; /* for new meshes */
} mt_ext_dispatch;

/* The dispatch's state of the module. */
static inline mt_ext_dispatch *mt_ext_dispatch_module(PyObject *module) {
  return mt_ext_state_of(module)->dispatch;
}

/* Whether `o` is a DTensorBase (or a subclass) instance. */
static inline int mt_ext_is_dtensor(const mt_ext_dispatch *d, PyObject *o) {
  return PyObject_TypeCheck(o, d->dtensor_base);
}

/* A call of an operator, ufunc or reduction method: the C path when it can take
 * the call, else the operation's Python entry in the registry. `ops` holds n
 * operands and then the keyword values of `kwnames`. */
PyObject *mt_ext_call_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *const *ops,
                            Py_ssize_t n, PyObject *kwnames);
PyObject *mt_ext_array_ufunc(mt_ext_dispatch *d, PyObject *ufunc, PyObject *method,
                             PyObject *const *ops, Py_ssize_t n, PyObject *kwnames);
PyObject *mt_ext_call_reduction(mt_ext_dispatch *d, int method, PyObject *self,
                                PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames);

/* Autograd (ext_autograd.c). Whether an operand needs a gradient (exactly a
 * DTensor that requires grad); and `out`, the result of `sig` on `ops` made by
 * the C path with recording off, recorded: a Node holding the operands and `aux`
 * (or None) when its dtype has gradients. Steals `out`; NULL with an exception. */
int mt_ext_any_needs_grad(const mt_ext_dispatch *d, PyObject *const *ops, Py_ssize_t n);
/* Whether a DTensor the C path made has gradients: a floating-point or complex
 * result (autograd.record's test). */
int mt_ext_has_gradient(PyObject *out);
PyObject *mt_ext_record(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *out,
                        PyObject *const *ops, int n, PyObject *aux);

/* DTensorSpec <-> C layouts (ext_spec.c). */
int mt_ext_spec_key(mt_ext_dispatch *d, const mt_ext_mesh_base *mb, PyObject *spec,
                    mt_layout_key *key);
int mt_ext_layout_id(mt_ext_dispatch *d, mt_ext_mesh_base *mb, mt_ext_dtensor *dt,
                     mt_layout_key *key, int64_t *id);
int mt_ext_key_layout(const mt_layout_key *key, const mt_ext_mesh_base *mb,
                      mt_layout *out);
int mt_ext_dtype_key(PyArray_Descr *descr);
int mt_ext_placement_code(mt_ext_dispatch *d, PyObject *p, mt_placement *out);
PyObject *mt_ext_placement_objects(mt_ext_dispatch *d, const mt_placement *p, int n);
PyObject *mt_ext_int_tuple(const int64_t *v, int n);
PyObject *mt_ext_py_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb, int64_t id,
                           int64_t slot, const mt_layout_key *key, PyObject *dtype);
PyObject *mt_ext_make_spec(mt_ext_dispatch *d, PyObject *mesh, PyObject *layout);
mt_ext_mesh_base *mt_ext_spec_mesh(mt_ext_dispatch *d, PyObject *spec);

/* Deciding (ext_decide.c). A call's operands: its mesh, the DTensors among them
 * and the memo key (each DTensor's layout id, each scalar's kind). */
typedef struct mt_ext_call {
  mt_ext_mesh_base *mb;
  int noperands, ntensors;
  uint32_t tensors; /* bit i: operand i is a DTensor */
  mt_ext_dtensor *dt[MT_MEMO_MAX_OPERANDS];
  int64_t id[MT_MEMO_MAX_OPERANDS];
  mt_memo_key key; /* op and aux are the caller's to set */
} mt_ext_call;

/* The tensor inputs as the core sees them, and their element types, for a miss. */
typedef struct mt_ext_inputs {
  mt_prop_inputs prop;
  int dtype[MT_PROP_MAX_INPUTS]; /* mt_dtype codes */
} mt_ext_inputs;

/* The registered signature of `func` (a ufunc or reduction), or NULL. */
/* The first cell of `func` in sig_slots. */
static inline size_t mt_ext_sig_home(const mt_ext_dispatch *d, const PyObject *func) {
  return (size_t)(((uint64_t)(uintptr_t)func >> 4) * 0x9E3779B97F4A7C15u >> 32) & d->sig_mask;
}
static inline mt_ext_sig *mt_ext_sig_of(const mt_ext_dispatch *d, const PyObject *func) {
  if (d->sig_slots == NULL) return NULL;
  for (size_t i = mt_ext_sig_home(d, func);; i = (i + 1) & d->sig_mask) {
    int s = d->sig_slots[i];
    if (s == 0) return NULL;
    if (d->sigs[s - 1].func == func) return &d->sigs[s - 1];
  }
}
/* The op id of a hashable Python key, or -1 with an exception. */
int64_t mt_ext_op_id(mt_ext_dispatch *d, PyObject *key);
/* The memo's aux word of a reduction over `axis` (None, an int or a tuple of ints,
 * normalised here) with `keepdims`, and the reduced dims in *axes; -1 when `axis`
 * names a dim twice or out of range. */
int64_t mt_ext_reduction_aux(PyObject *axis, int ndim, int keepdims, uint32_t *axes);

/* Classifies n operands. `strict` (the C path): only exact DTensors on one mesh
 * this rank is in, with ndarray local data and not recording for autograd, and
 * Python or NumPy scalars; 0 otherwise, with no exception. Else (the Python
 * entry) any DTensor (the first one's mesh) and any scalar. 1, 0 or -1. */
int mt_ext_call_gather(mt_ext_dispatch *d, PyObject *const *ops, int n, int strict,
                       mt_ext_call *c);

/* A DTensor operand the C path takes: exactly a DTensor, with a plain ndarray as
 * its local data, not recording for autograd. */
static inline int mt_ext_plain_dtensor(const mt_ext_dispatch *d, PyObject *o) {
  const mt_ext_dtensor *b = (const mt_ext_dtensor *)o;
  return Py_TYPE(o) == d->dtensor && b->local != NULL && PyArray_CheckExact(b->local) &&
         !(d->grad_enabled && b->requires_grad);
}

/* The C path's common operand: a DTensor that has met its mesh's layout table
 * before. Its id is valid (ids are never reused and a new spec resets it), so
 * neither the spec nor the table is read. Adds it as operand i: 1, or 0 for
 * mt_ext_call_gather to judge. */
static inline int mt_ext_known_tensor(const mt_ext_dispatch *d, PyObject *o, int i,
                                      mt_ext_call *c) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)o;
  if (!mt_ext_plain_dtensor(d, o) || b->layout_id == 0) return 0;
  mt_ext_mesh_base *mb = (mt_ext_mesh_base *)PyTuple_GET_ITEM(b->spec, 0);
  if (mb != c->mb && (c->mb != NULL || !mb->member)) return 0;
  c->mb = mb;
  c->dt[c->ntensors] = b;
  c->id[c->ntensors++] = b->layout_id;
  c->tensors |= 1u << i;
  c->key.operand[i] = b->layout_id;
  return 1;
}

int mt_ext_call_inputs(mt_ext_dispatch *d, const mt_ext_call *c, mt_ext_inputs *in);
/* The decision of a registered op for the call: from the memo (a hit), else made
 * from the op's signature and stored (a miss). NULL with an exception. */
mt_decision *mt_ext_call_miss(mt_ext_dispatch *d, const mt_ext_sig *sig,
                              const mt_ext_call *c, uint32_t axes, int keepdims);
/* A miss of `key` decided from `map` by the core (mt_memo_decide); NULL with an
 * exception (naming the op of `sig`, if any). */
mt_decision *mt_ext_decide_map(mt_ext_mesh_base *mb, const mt_memo_key *key,
                               const mt_dimmap *map, const mt_ext_inputs *in,
                               const mt_ext_sig *sig);
/* The Python layout of the output layout (out_id, out_slot) when the layout
 * table still holds it and its element type is `descr`: 1 and *layout, else 0,
 * or -1 with an exception. */
int mt_ext_known_output(mt_ext_dispatch *d, mt_ext_mesh_base *mb, int64_t out_id,
                        int64_t out_slot, PyArray_Descr *descr, PyObject **layout);
/* The layout id and Python layout of an output of element type `descr`: the
 * decision's own when known and of that type, else interned now and recorded in
 * the memo's decision of `key`. */
int mt_ext_decision_output(mt_ext_dispatch *d, mt_ext_mesh_base *mb,
                           const mt_memo_key *key, const mt_decision *dec,
                           PyArray_Descr *descr, int64_t *id, PyObject **layout);
/* The dim map of a _C.DimMap, or NULL with TypeError; a new _C.DimMap of a map. */
const mt_dimmap *mt_ext_dimmap_get(PyObject *module, PyObject *obj);
PyObject *mt_ext_dimmap_new(PyObject *module, const mt_dimmap *map);

/* Plans (ext_redistribute.c): a _C.Plan around a plan the caller owns one of,
 * and a plan run on a local array. */
PyObject *mt_ext_plan_wrap(PyObject *module, mt_plan *plan);
PyObject *mt_ext_run_plan(PyObject *module, mt_mesh *mesh, const mt_plan *plan,
                          PyObject *local);

/* DTensor.redistribute(mesh, placements) by the C path when it can take the call
 * (not async, no forward_dtype, no tool listening, not recorded for autograd,
 * the move decided in the mesh's memo): 1 with *out, 0 when the Python
 * implementation must run it, -1 with an exception. Collective on the mesh. */
int mt_ext_redistribute_fast(mt_ext_dispatch *d, PyObject *self, const PyObject *mesh,
                             PyObject *placements, PyObject **out);

int mt_ext_mesh_exec(PyObject *module);
int mt_ext_redistribute_exec(PyObject *module);
int mt_ext_pool_exec(PyObject *module);
int mt_ext_prop_exec(PyObject *module);
int mt_ext_mesh_base_exec(PyObject *module);
int mt_ext_dtensor_exec(PyObject *module);
int mt_ext_dispatch_exec(PyObject *module);
int mt_ext_autograd_exec(PyObject *module);
int mt_ext_decide_exec(PyObject *module);
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
extern PyMethodDef mt_ext_autograd_methods[];
extern PyMethodDef mt_ext_decide_methods[];
extern PyMethodDef mt_ext_ring_methods[];
extern PyMethodDef mt_ext_kernels_methods[];
extern PyMethodDef mt_ext_agree_methods[];
extern PyMethodDef mt_ext_watchdog_methods[];

/* The mt_dtype code of a NumPy dtype, or a negative value for one the core does not
 * know. */
int mt_ext_descr_dtype(PyArray_Descr *d);

#endif
