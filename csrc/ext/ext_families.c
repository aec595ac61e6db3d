/* The executor's function families: NumPy functions that are no ufunc or
 * reduction but that the executor runs as they are, taken by the Python door's
 * first C call (door_enter, through executor_take) before any Python entry runs:
 *
 *   elementwise  np.where(m, x, y), np.clip(x, lo, hi)    register_elementwise
 *   cast         x.astype(dtype) where nothing moves       register_cast
 *   lanes        np.sort, np.cumsum, np.flip along an      register_lanes
 *                axis no mesh dim shards
 *   differences  np.diff along an axis no mesh dim shards  register_differences
 *                (the core's mt_dimmap_lanes)
 *   join         np.concatenate along an axis no mesh dim  register_join
 *                shards (the core's mt_dimmap_join), and
 *                np.stack along a new axis (mt_dimmap_stack)
 *
 * Each is agreed on first (a program's call), then run by the executor when its
 * operands are what the family reads; what it declines before the agreement its
 * Python entry runs, and what it declines after, the Python door runs, agreed. */
#include "ext.h"

int mt_ext_door_operand(const mt_ext_dispatch *d, PyObject *o) {
  return !PyArray_CheckExact(((mt_ext_dtensor *)o)->local) || mt_ext_strided(d, o) ||
         (mt_ext_needs_grad(d, o) && mt_ext_grad_wanted(d->modes));
}

/* Whether func(*args, **kwargs) of a registered elementwise function is a call
 * the executor may take as it is: its operands first, none None, then only None
 * positionally (clip's out), no keyword; no DTensor operand the door takes, no
 * plain ndarray of more than one element (the door agrees on it, then replicates
 * it), and no DTensor condition of np.where large enough that its entry may defer
 * the call. */
static int elementwise_takes(const mt_ext_dispatch *d, const mt_ext_sig *sig,
                             PyObject *args, PyObject *kwargs) {
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  if (nargs < sig->nin || PyDict_GET_SIZE(kwargs) != 0) return 0;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject *o = PyTuple_GET_ITEM(args, i);
    if ((o == Py_None) != (i >= sig->nin)) return 0;
    int plain = PyArray_Check(o) && PyArray_NDIM((PyArrayObject *)o) > 0 &&
                PyArray_SIZE((PyArrayObject *)o) != 1;
    if (Py_TYPE(o) == d->dtensor ? mt_ext_door_operand(d, o) : plain) return 0;
  }
  return sig->func != d->where || !mt_ext_may_defer(d, PyTuple_GET_ITEM(args, 0));
}

/* func(*args) of a registered elementwise function (np.where, np.clip): agreed,
 * then run by the executor when its operands are DTensors of one mesh and
 * scalars, none strided and no gradient wanted; else, agreed, by the Python door. */
static PyObject *elementwise_call(mt_ext_dispatch *d, const mt_ext_sig *sig,
                                  PyObject *args, PyObject *kwargs, PyObject *caller) {
  if (!elementwise_takes(d, sig, args, kwargs)) Py_RETURN_NOTIMPLEMENTED;
  if (mt_ext_agree_on(d, sig, args, kwargs, caller) < 0) return NULL;
  PyObject *const *ops = &PyTuple_GET_ITEM(args, 0);
  mt_ext_call c;
  int rc = mt_ext_gather_fast(d, ops, sig->nin, &c, sig->func, 1);
  if (rc < 0) PyErr_Clear(); /* the Python door raises what it must */
  if (rc <= 0 || c.mixed || c.strided ||
      (mt_ext_grad_wanted(d->modes) && c.key.grad != 0)) {
    if (rc > 0) mt_ext_call_release(&c);
    if (caller == Py_None) Py_RETURN_NOTIMPLEMENTED;
    return mt_ext_door_hook(d, sig->func, args, kwargs, Py_True);
  }
  c.key.op = sig->id;
  mt_ext_op op = {sig, sig->func, NULL, 0, 0, sig->func, NULL, 0, NULL, 0, NULL, 0};
  PyObject *out = mt_ext_execute(d, &op, &c, ops);
  mt_ext_call_release(&c);
  return out;
}

int mt_ext_whole_along(const mt_ext_dispatch *d, PyObject *spec, long ax) {
  PyObject *placements = PyTuple_GET_ITEM(spec, 1);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(placements); ++i) {
    mt_placement code;
    if (mt_ext_placement_code(d, PyTuple_GET_ITEM(placements, i), &code) < 0) {
      PyErr_Clear();
      return 0;
    }
    if (code.kind == MT_PLACEMENT_PARTIAL || (code.kind == MT_PLACEMENT_SHARD && code.dim == ax))
      return 0;
  }
  return 1;
}

/* func(*args, **kwargs), agreed already, of the n DTensors `items`: run by the
 * executor as op `op` (the call's memo key aux `aux`) where its decision moves
 * nothing, the operands are not strided and no gradient is wanted; else by the
 * Python door, agreed (mpitensor's own call: NotImplemented). */
static PyObject *run_unmoved(mt_ext_dispatch *d, const mt_ext_op *op, PyObject *const *items,
                             int n, int64_t aux, PyObject *args, PyObject *kwargs,
                             const PyObject *caller) {
  mt_ext_call c;
  PyObject *out = NULL;
  int rc = mt_ext_gather_fast(d, items, n, &c, op->sig->func, 0), ran = 0;
  if (rc > 0 && !c.strided && c.mb->member &&
      !(mt_ext_grad_wanted(d->modes) && c.key.grad != 0)) {
    int hit;
    c.key.op = op->sig->id, c.key.aux = aux;
    const mt_decision *dec = mt_ext_decide_typed(d, op, &c, &hit);
    if (dec != NULL && dec->nplans == 0 && dec->partitioned == 0) {
      out = mt_ext_run(d, op, &c, dec, hit, items);
      ran = 1;
    }
  }
  if (rc > 0) mt_ext_call_release(&c);
  if (ran) return out;
  PyErr_Clear(); /* the Python door raises what it must */
  if (caller == Py_None) Py_RETURN_NOTIMPLEMENTED;
  return mt_ext_door_hook(d, op->sig->func, args, kwargs, Py_True);
}

/* run_unmoved of `op` with the local function's extra arguments `nints` Python
 * ints: `a`, then `b` (np.diff's n and axis, or an axis alone). */
static PyObject *run_with_ints(mt_ext_dispatch *d, const mt_ext_op *op, int nints, long a,
                               long b, PyObject *const *items, int n, int64_t aux,
                               PyObject *args, PyObject *kwargs, const PyObject *caller) {
  PyObject *extra[2] = {PyLong_FromLong(a), nints > 1 ? PyLong_FromLong(b) : NULL}, *out = NULL;
  if (extra[0] != NULL && (nints < 2 || extra[1] != NULL)) {
    mt_ext_op with = *op;
    with.extra = extra, with.nextra = nints;
    out = run_unmoved(d, &with, items, n, aux, args, kwargs, caller);
  }
  Py_XDECREF(extra[0]);
  Py_XDECREF(extra[1]);
  return out;
}

/* The argument at `i` of func(x, ...), positional or by `name`, or NULL when the
 * call does not give it; `*bad` set where both give it. */
static PyObject *argument(PyObject *args, PyObject *kwargs, Py_ssize_t i, PyObject *name,
                          int *bad) {
  PyObject *kw = PyDict_GET_SIZE(kwargs) != 0 ? PyDict_GetItemWithError(kwargs, name) : NULL;
  if (kw == NULL && PyErr_Occurred()) PyErr_Clear(), *bad = 1;
  if (i < PyTuple_GET_SIZE(args)) {
    if (kw != NULL) *bad = 1;
    return PyTuple_GET_ITEM(args, i);
  }
  return kw;
}

/* The spec of func(x, ...)'s x when the executor may take it along its lanes: a
 * DTensor of this rank's mesh that the door would not take (mt_ext_door_operand);
 * else NULL. */
static PyObject *lanes_operand(mt_ext_dispatch *d, PyObject *args) {
  PyObject *x = PyTuple_GET_SIZE(args) >= 1 ? PyTuple_GET_ITEM(args, 0) : NULL;
  if (x == NULL || Py_TYPE(x) != d->dtensor || mt_ext_door_operand(d, x)) return NULL;
  PyObject *spec = ((mt_ext_dtensor *)x)->spec;
  return mt_ext_spec_mesh(d, spec)->member ? spec : NULL;
}

/* The axis `axis` (an exact int; NULL: `dflt`, MT_EXT_NO_AXIS for none)
 * normalised, when `spec` holds whole lanes along it (mt_ext_whole_along); else
 * -1 (no exception). */
static int whole_axis(const mt_ext_dispatch *d, PyObject *spec, PyObject *axis, long dflt) {
  Py_ssize_t ndim = PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 2));
  if (axis != NULL && !PyLong_CheckExact(axis)) return -1;
  long ax = axis == NULL ? dflt : PyLong_AsLong(axis);
  if (ax == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  if (ax == MT_EXT_NO_AXIS || ax < -ndim || ax >= ndim) return -1;
  if (ax < 0) ax += ndim;
  return mt_ext_whole_along(d, spec, ax) ? (int)ax : -1;
}

/* The dtype of x.astype(dtype, copy=True) (func(x, dtype, {"copy": True}) as
 * DTensor.astype calls it, or without copy) when the executor may take the call:
 * x a DTensor of this rank's mesh, without Partials, that the door would not
 * take (mt_ext_door_operand); the dtype a bool or number in the machine's byte
 * order (whose type number alone tells casts apart in the memo's key). New
 * reference, or NULL (no exception): the entry's call. */
static PyArray_Descr *cast_dtype(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs) {
  Py_ssize_t pos = 0;
  PyObject *key, *v, *x = PyTuple_GET_SIZE(args) == 2 ? PyTuple_GET_ITEM(args, 0) : NULL;
  if (x == NULL || Py_TYPE(x) != d->dtensor || mt_ext_door_operand(d, x) ||
      PyDict_GET_SIZE(kwargs) > 1 || !mt_ext_spec_mesh(d, ((mt_ext_dtensor *)x)->spec)->member)
    return NULL;
  /* A Partial is the entry's: it keeps one that the cast keeps exactly, where the
   * executor would reduce it (on a mesh of one rank, without a move). */
  if (!mt_ext_whole_along(d, ((mt_ext_dtensor *)x)->spec, -1)) return NULL;
  while (PyDict_Next(kwargs, &pos, &key, &v))
    if (v != Py_True || !PyUnicode_Check(key) ||
        PyUnicode_Compare(key, d->str[MT_S_COPY]) != 0)
      return NULL;
  PyArray_Descr *descr = NULL;
  if (!PyArray_DescrConverter2(PyTuple_GET_ITEM(args, 1), &descr) || descr == NULL) {
    PyErr_Clear(); /* the entry raises NumPy's error */
    return NULL;
  }
  if ((PyTypeNum_ISBOOL(descr->type_num) || PyTypeNum_ISNUMBER(descr->type_num)) &&
      PyArray_ISNBO(descr->byteorder))
    return descr;
  Py_DECREF(descr);
  return NULL;
}

/* x.astype(dtype) (a function of register_cast) of an x without Partials:
 * agreed, then run by the executor when nothing moves, x is not strided and no
 * gradient is wanted; else, agreed, by the Python door. */
static PyObject *cast_call(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                           PyObject *kwargs, PyObject *caller) {
  PyArray_Descr *descr = cast_dtype(d, args, kwargs);
  if (descr == NULL) Py_RETURN_NOTIMPLEMENTED;
  if (mt_ext_agree_on(d, sig, args, kwargs, caller) < 0) {
    Py_DECREF(descr);
    return NULL;
  }
  PyObject *x = PyTuple_GET_ITEM(args, 0), *extra[1] = {(PyObject *)descr};
  mt_ext_op op = {sig, sig->func, NULL, 0, 0, sig->func, extra, 1, d->kw_dtype, 0, NULL, 0};
  PyObject *out = run_unmoved(d, &op, &x, 1, 0, args, kwargs, caller);
  Py_DECREF(descr);
  return out;
}

/* The axis of func(x, axis) of a lanes function (register_lanes), normalised, when
 * the executor may take the call: x as lanes_operand takes it, without Partials,
 * the axis an int in range (positional or axis=, else the function's default)
 * along which no mesh dim shards x, no other argument; else -1 (no exception):
 * the entry's call. */
static int lanes_axis(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                      PyObject *kwargs) {
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  PyObject *spec = lanes_operand(d, args);
  int bad = 0;
  PyObject *axis = spec != NULL ? argument(args, kwargs, 1, d->str[MT_S_AXIS], &bad) : NULL;
  if (spec == NULL || bad || nargs > 2 ||
      (nargs > 1) + PyDict_GET_SIZE(kwargs) != (axis != NULL))
    return -1;
  return whole_axis(d, spec, axis, sig->lanes_axis);
}

/* func(x, axis) of a lanes function: agreed, then run by the executor on each
 * block, where nothing moves, when lanes_axis says it may; else, agreed, by the
 * Python door. */
static PyObject *lanes_call(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                            PyObject *kwargs, PyObject *caller) {
  long ax = lanes_axis(d, sig, args, kwargs);
  if (ax < 0) Py_RETURN_NOTIMPLEMENTED;
  if (mt_ext_agree_on(d, sig, args, kwargs, caller) < 0) return NULL;
  mt_ext_op op = {sig, sig->func, NULL, 0, 0, sig->method, NULL, 0, NULL, 0, NULL, 0};
  return run_with_ints(d, &op, 1, ax, 0, &PyTuple_GET_ITEM(args, 0), 1, 0, args, kwargs,
                       caller);
}

/* The axis of np.diff(x, n, axis) when the executor may take the call, n in `*n`:
 * x as lanes_operand takes it, without Partials; n an int of at least 1
 * (positional or n=, else 1) and the axis an int in range (positional or axis=,
 * else the last) along which no mesh dim shards x, and no other argument; else
 * -1 (no exception): the entry's call. */
static int differences_axis(mt_ext_dispatch *d, PyObject *args, PyObject *kwargs, long *n) {
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  PyObject *spec = lanes_operand(d, args);
  if (spec == NULL || nargs > 3) return -1;
  int bad = 0;
  PyObject *count = argument(args, kwargs, 1, d->str[MT_S_N], &bad);
  PyObject *axis = argument(args, kwargs, 2, d->str[MT_S_AXIS], &bad);
  Py_ssize_t given = (nargs > 1) + (nargs > 2) + PyDict_GET_SIZE(kwargs);
  if (bad || given != (count != NULL) + (axis != NULL) ||
      (count != NULL && !PyLong_CheckExact(count)))
    return -1;
  *n = count == NULL ? 1 : PyLong_AsLong(count);
  if (*n == -1 && PyErr_Occurred()) PyErr_Clear();
  return *n < 1 ? -1 : whole_axis(d, spec, axis, -1);
}

/* np.diff(x, n, axis) of a differences function: agreed, then run by the executor
 * on each block, where nothing moves, when differences_axis says it may; else,
 * agreed, by the Python door. */
static PyObject *differences_call(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                                  PyObject *kwargs, PyObject *caller) {
  long n = 0;
  int ax = differences_axis(d, args, kwargs, &n);
  if (ax < 0) Py_RETURN_NOTIMPLEMENTED;
  if (mt_ext_agree_on(d, sig, args, kwargs, caller) < 0) return NULL;
  mt_ext_op op = {sig, sig->func, NULL, 1u << ax, 0, sig->method, NULL, 0, NULL, 0, NULL, n};
  /* The memo's key tells calls apart by axis and n: their outputs differ. */
  return run_with_ints(d, &op, 2, n, ax, &PyTuple_GET_ITEM(args, 0), 1,
                       (int64_t)n * MT_MAX_NDIM + ax, args, kwargs, caller);
}

/* The axis of np.concatenate(arrays, axis) when the executor may take the call:
 * `arrays` a tuple or list of 2 to MT_PROP_MAX_INPUTS DTensors of one mesh object,
 * this rank a member, none of them one the door would take (mt_ext_door_operand)
 * or Partial, of the same number of dims and the same other dims, joined along an
 * int axis in range (positional or axis=, else 0) that no mesh dim shards; else -1
 * (no exception): the entry's call, which also raises NumPy's errors. A stack
 * (np.stack) asks the same of a new axis, in range of the output's dims, and the
 * same shapes throughout. */
static int join_axis(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                     PyObject *kwargs, PyObject **arrays) {
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  *arrays = nargs >= 1 ? PyTuple_GET_ITEM(args, 0) : NULL;
  if (*arrays == NULL || nargs > 2 ||
      !(PyTuple_CheckExact(*arrays) || PyList_CheckExact(*arrays)))
    return -1;
  int bad = 0;
  PyObject *axis = argument(args, kwargs, 1, d->str[MT_S_AXIS], &bad);
  if (bad || (nargs > 1) + PyDict_GET_SIZE(kwargs) != (axis != NULL)) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(*arrays);
  PyObject *const *items = PySequence_Fast_ITEMS(*arrays);
  if (n < 2 || n > MT_PROP_MAX_INPUTS || (axis != NULL && !PyLong_CheckExact(axis))) return -1;
  PyObject *spec0 = Py_TYPE(items[0]) == d->dtensor ? ((mt_ext_dtensor *)items[0])->spec : NULL;
  if (spec0 == NULL || !mt_ext_spec_mesh(d, spec0)->member) return -1;
  PyObject *shape0 = PyTuple_GET_ITEM(spec0, 2);
  Py_ssize_t ndim = PyTuple_GET_SIZE(shape0);
  const int stack = sig->op.family == MT_OP_STACK;
  Py_ssize_t out_ndim = ndim + stack;
  long ax = axis == NULL ? 0 : PyLong_AsLong(axis);
  if (ax == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  if ((ndim == 0 && !stack) || out_ndim > MT_MAX_NDIM || ax < -out_ndim || ax >= out_ndim)
    return -1;
  if (ax < 0) ax += out_ndim;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *x = items[i];
    if (Py_TYPE(x) != d->dtensor || mt_ext_door_operand(d, x)) return -1;
    PyObject *spec = ((mt_ext_dtensor *)x)->spec, *shape = PyTuple_GET_ITEM(spec, 2);
    if (PyTuple_GET_ITEM(spec, 0) != PyTuple_GET_ITEM(spec0, 0) ||
        PyTuple_GET_SIZE(shape) != ndim)
      return -1;
    for (Py_ssize_t k = 0; k < ndim; ++k)
      if ((k != ax || stack) && PyObject_RichCompareBool(PyTuple_GET_ITEM(shape, k),
                                                         PyTuple_GET_ITEM(shape0, k),
                                                         Py_EQ) != 1) {
        PyErr_Clear();
        return -1;
      }
    if (!mt_ext_whole_along(d, spec, stack ? -1 : ax)) return -1;
  }
  return (int)ax;
}

/* np.concatenate(arrays, axis) or np.stack(arrays, axis) of a join function:
 * agreed, then run by the executor on the blocks, where nothing moves, when
 * join_axis says it may; else, agreed, by the Python door. */
static PyObject *join_call(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                           PyObject *kwargs, PyObject *caller) {
  PyObject *arrays = NULL;
  int ax = join_axis(d, sig, args, kwargs, &arrays);
  if (ax < 0) Py_RETURN_NOTIMPLEMENTED;
  if (mt_ext_agree_on(d, sig, args, kwargs, caller) < 0) return NULL;
  mt_ext_op op = {sig, sig->func, NULL, 1u << ax, 0, sig->method, NULL, 0, NULL, 0, NULL, 0};
  return run_with_ints(d, &op, 1, ax, 0, PySequence_Fast_ITEMS(arrays),
                       (int)PySequence_Fast_GET_SIZE(arrays), ax, args, kwargs, caller);
}

PyObject *mt_ext_family_call(mt_ext_dispatch *d, const mt_ext_sig *sig, PyObject *args,
                             PyObject *kwargs, PyObject *caller) {
  if (sig->lanes) return lanes_call(d, sig, args, kwargs, caller);
  if (sig->differences) return differences_call(d, sig, args, kwargs, caller);
  if (sig->join) return join_call(d, sig, args, kwargs, caller);
  return sig->cast ? cast_call(d, sig, args, kwargs, caller)
                   : elementwise_call(d, sig, args, kwargs, caller);
}
