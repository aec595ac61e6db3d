/* The hook table: every call from C into Python goes through mt_ext_hook, and no
 * other file of the extension calls a Python callable. The kinds:
 *
 *   LOCAL       an operation's local function on this rank's arrays: a ufunc, an
 *               ndarray method, the compute an op entry gave (_ops), or a user's
 *               function (local_map, register_sharding);
 *   BUILD       an op entry's dim-map builder, on a memo miss only;
 *   ENTRY       the Python door (mpitensor._registry.door_from_c, the hook
 *               "door"), with a ufunc call or a reduction method that the
 *               executor's doors leave to Python (out=, other keywords, a user's
 *               register_sharding rule, an operand they cannot read): it agrees
 *               on the call and runs the function's Python entry;
 *   EVENT       a trace event for the debugging tools, only while one listens
 *               (_C.modes.events): each kind ("decision", "move", "unmoved") is
 *               the hook of its name, a function of mpitensor._trace;
 *   PLACEMENTS  the normaliser of placements that are not the interned objects
 *               (mpitensor._args.normalize_placements), which raises torch's
 *               errors;
 *   ERROR       the exception of an operation the executor refuses (no sharding
 *               rule, no backward, a plain ndarray operand, two meshes, a
 *               write under grad mode): the error hook
 *               (mpitensor._registry.executor_error) names the operation as a
 *               user writes it and raises;
 *   DTYPE       NumPy's dtype of an operation's result, which decides the Partials
 *               it keeps exactly, on a memo miss only: ufunc.resolve_dtypes, or
 *               the reduction of a one-element stand-in;
 *   ERRSTATE    whether NumPy's error state raises on floating-point errors
 *               (mpitensor._registry.errstate_raises), once per state seen;
 *   DEFERRED    a Deferred local's settle or result (ext_deferred.c), a method
 *               of mpitensor._deferred.Deferred.
 *
 * Each call is counted by kind (mpitensor._trace.hook_stats()), so tests can show
 * what a path costs: a cached `a + b` makes one LOCAL call and nothing else. */
#include "ext.h"

PyObject *mt_ext_hook(mt_ext_dispatch *d, int kind, PyObject *fn, PyObject *const *args,
                      size_t nargsf, PyObject *kwnames) {
  d->hook_calls[kind]++;
  return PyObject_Vectorcall(fn, args, nargsf, kwnames);
}

PyObject *mt_ext_hook_method(mt_ext_dispatch *d, int kind, PyObject *name,
                             PyObject *const *args, size_t nargs) {
  d->hook_calls[kind]++;
  return PyObject_VectorcallMethod(name, args, nargs, NULL);
}

PyObject *mt_ext_hook_call(mt_ext_dispatch *d, int kind, PyObject *fn, PyObject *args,
                           PyObject *kwargs) {
  d->hook_calls[kind]++;
  return PyObject_Call(fn, args, kwargs);
}

PyObject *mt_ext_door_hook(mt_ext_dispatch *d, PyObject *func, PyObject *pos, PyObject *kw,
                           PyObject *agreed) {
  PyObject *fn = PyDict_GetItemWithError(d->hooks, d->str[MT_S_DOOR]);
  if (fn == NULL)
    return PyErr_Occurred() ? NULL
                            : PyErr_Format(PyExc_RuntimeError, "no door hook: import mpitensor");
  PyObject *stack[4] = {func, pos, kw, agreed};
  Py_INCREF(fn); /* the hook may be replaced while it runs */
  PyObject *res = mt_ext_hook(d, MT_HOOK_ENTRY, fn, stack, 4, NULL);
  Py_DECREF(fn);
  return res;
}

int mt_ext_event(mt_ext_dispatch *d, int kind, PyObject *const *args, Py_ssize_t n) {
  PyObject *fn = PyDict_GetItemWithError(d->hooks, d->str[MT_S_EVENT + kind]);
  if (fn == NULL) return PyErr_Occurred() ? -1 : 0;
  Py_INCREF(fn); /* the hook may remove itself */
  PyObject *r = mt_ext_hook(d, MT_HOOK_EVENT, fn, args, (size_t)n, NULL);
  Py_DECREF(fn);
  Py_XDECREF(r);
  return r == NULL ? -1 : 0;
}

int mt_ext_move_event(mt_ext_dispatch *d, PyObject *spec, mt_plan *plan, int same,
                      PyObject *what, PyObject *dst) {
  PyObject *p = plan != NULL ? mt_ext_plan_wrap(plan) : Py_NewRef(Py_None);
  if (p == NULL) return -1;
  PyObject *args[7] = {what, PyTuple_GET_ITEM(spec, 0), same ? dst : p,
                       PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(spec, 3),
                       PyTuple_GET_ITEM(spec, 1), dst};
  int rc = mt_ext_event(d, same ? MT_EVENT_UNMOVED : MT_EVENT_MOVE, args, same ? 5 : 7);
  Py_DECREF(p);
  return rc;
}

PyObject *mt_ext_error(mt_ext_dispatch *d, const char *kind, PyObject *key, PyObject *arg) {
  PyObject *fn = PyDict_GetItemString(d->hooks, "error");
  if (fn == NULL)
    return PyErr_Format(PyExc_RuntimeError, "%s: %R (no error hook: import mpitensor)", kind,
                        key);
  PyObject *args[3] = {PyUnicode_FromString(kind), key, arg != NULL ? arg : Py_None};
  PyObject *r = args[0] != NULL ? mt_ext_hook(d, MT_HOOK_ERROR, fn, args, 3, NULL) : NULL;
  Py_XDECREF(args[0]);
  if (r != NULL) {
    Py_DECREF(r);
    PyErr_Format(PyExc_RuntimeError, "the error hook raised nothing for %s", kind);
  }
  return NULL;
}

int mt_ext_errstate_raises(mt_ext_dispatch *d) {
  if (d->errstate_var == NULL) return 0;
  PyObject *state = NULL;
  if (PyContextVar_Get(d->errstate_var, NULL, &state) < 0) return -1;
  if (state == NULL) return 0;
  for (int i = 0; i < 2; ++i) {
    if (state == d->errstate_seen[i]) {
      Py_DECREF(state);
      return d->errstate_raises[i];
    }
  }
  PyObject *fn = PyDict_GetItemWithError(d->hooks, d->str[MT_S_ERRSTATE]);
  if (fn == NULL) {
    Py_DECREF(state);
    return PyErr_Occurred() ? -1 : 0;
  }
  Py_INCREF(fn);
  PyObject *r = mt_ext_hook(d, MT_HOOK_ERRSTATE, fn, NULL, 0, NULL);
  Py_DECREF(fn);
  int raises = r != NULL ? PyObject_IsTrue(r) : -1;
  Py_XDECREF(r);
  if (raises < 0) {
    Py_DECREF(state);
    return -1;
  }
  /* The first state seen is the program's usual one: it keeps its slot, and the
   * states of errstate blocks take turns in the other. */
  int slot = d->errstate_seen[0] == NULL ? 0 : 1;
  Py_XSETREF(d->errstate_seen[slot], state);
  d->errstate_raises[slot] = raises;
  return raises;
}

/* watch_errstate(var, fn): see the method table. */
static PyObject *watch_errstate(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 2 || !PyContextVar_CheckExact(args[0]) || !PyCallable_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "watch_errstate(var: ContextVar, fn)");
  if (PyDict_SetItem(d->hooks, d->str[MT_S_ERRSTATE], args[1]) < 0) return NULL;
  Py_XSETREF(d->errstate_var, Py_NewRef(args[0]));
  Py_CLEAR(d->errstate_seen[0]);
  Py_CLEAR(d->errstate_seen[1]);
  Py_RETURN_NONE;
}

/* errstate_raises(): see the method table. */
static PyObject *errstate_raises(PyObject *module, PyObject *Py_UNUSED(unused)) {
  int raises = mt_ext_errstate_raises(mt_ext_dispatch_module(module));
  return raises < 0 ? NULL : PyBool_FromLong(raises);
}

/* set_hook(name, fn): installs a Python hook (an event's: "decision", "move",
 * "unmoved"; "placements", "door", "error"); None removes. */
static PyObject *set_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 2 || !PyUnicode_Check(args[0]))
    return PyErr_Format(PyExc_TypeError, "set_hook(name: str, fn)");
  if (args[1] == Py_None) {
    if (PyDict_DelItem(d->hooks, args[0]) < 0) PyErr_Clear();
    Py_RETURN_NONE;
  }
  if (!PyCallable_Check(args[1]))
    return PyErr_Format(PyExc_TypeError, "a hook must be callable");
  if (PyDict_SetItem(d->hooks, args[0], args[1]) < 0) return NULL;
  Py_RETURN_NONE;
}

PyMethodDef mt_ext_hooks_methods[] = {
    {"set_hook", (PyCFunction)(void (*)(void))set_hook, METH_FASTCALL,
     "set_hook(name, fn): the Python side of hook `name` ('decision', 'move', "
     "'unmoved': the trace events of that name; "
     "'placements': placement normalisation; 'door': the Python door, which takes "
     "the calls the executor's doors leave to Python; 'error': the exception of a "
     "refused operation); None "
     "removes it. "
     "Local.\n\n"
     "Example: _C.set_hook('decision', mpitensor._trace.decision)"},
    {"watch_errstate", (PyCFunction)(void (*)(void))watch_errstate, METH_FASTCALL,
     "watch_errstate(var, fn): NumPy's error state is the context variable `var`; "
     "fn() says whether the current one raises (or calls a function) on a "
     "floating-point error, asked once per state the executor sees: where it does, "
     "an error of an operation's local function on one rank is raised on every "
     "rank. Local.\n\n"
     "Example: _C.watch_errstate(np._core.umath._extobj_contextvar, errstate_raises)"},
    {"errstate_raises", errstate_raises, METH_NOARGS,
     "errstate_raises() -> bool: whether NumPy's error state here raises (or calls a "
     "function) on some floating-point error, as watch_errstate's fn says, asked once "
     "per state seen. Local.\n\n"
     "Example: with np.errstate(over='raise'): assert _C.errstate_raises()"},
    {NULL, NULL, 0, NULL},
};
