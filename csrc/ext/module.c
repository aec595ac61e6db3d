/* mpitensor._C: the module's setup (PEP 489 multi-phase init), which runs each
 * area's; the helpers the areas share, and the definition, are in ext_args.c. */
#include "ext.h"

/* Adds the capsule of `p` named `what` (a row of ext_structs.c's exports) as
 * `name`: an address Python reads only as what the capsule's row says it is. */
static int add_capsule(PyObject *module, const char *name, const char *what, void *p) {
  PyObject *v = mt_ext_export(what, p);
  int rc = v == NULL ? -1 : PyModule_AddObjectRef(module, name, v);
  Py_XDECREF(v);
  return rc;
}

static int module_exec(PyObject *module) {
  if (mt_ext_import_numpy() < 0) return -1;
  PyMethodDef *tables[] = {mt_ext_pool_methods, mt_ext_ops_methods,
                           mt_ext_autograd_methods, mt_ext_decide_methods,
                           mt_ext_exec_methods, mt_ext_hooks_methods,
                           mt_ext_entry_methods,  mt_ext_move_methods,
                           mt_ext_owned_methods,  mt_ext_one_mesh_methods,
                           mt_ext_call_agreement_methods, mt_ext_deferred_methods,
                           mt_ext_views_methods,  mt_ext_spec_methods, NULL};
  for (PyMethodDef **t = tables; *t != NULL; ++t)
    if (PyModule_AddFunctions(module, *t) < 0) return -1;
  /* The counters, for the ctypes bindings that pass them back to C
   * (mpitensor._comm, mpitensor.checkpoint._io), and the modes (mpitensor._modes). */
  mt_ext_state *st = mt_ext_state_of(module);
  if (add_capsule(module, "COMM_COUNTERS", "mpitensor._C.comm_counters",
                  &st->comm_counters) < 0 ||
      add_capsule(module, "IO_COUNTERS", "mpitensor._C.io_counters", &st->io_counters) < 0 ||
      add_capsule(module, "MODES", "mpitensor._C.modes", &st->modes) < 0)
    return -1;
  /* Grad mode starts on; `want` holds an object from the start, as ctypes reads
   * it. */
  st->modes.grad_enabled = 1, st->modes.want = Py_NewRef(Py_None);
  if (mt_ext_ops_exec(module) < 0 || mt_ext_structs_exec(module) < 0 ||
      mt_ext_pool_exec(module) < 0 ||
      mt_ext_mesh_base_exec(module) < 0 ||
      mt_ext_dtensor_exec(module) < 0)
    return -1;
  mt_ext_dispatch *d = st->dispatch;
  d->mesh_base = st->mesh_base_type, d->dtensor_base = st->dtensor_base_type;
  d->modes = &st->modes;
  if (add_capsule(module, "HOOK_CALLS", "mpitensor._C.hook_calls", d->hook_calls) < 0)
    return -1;
  PyObject *statuses = mt_ext_status_exceptions();
  int rc = statuses == NULL ? -1 : PyModule_AddObjectRef(module, "STATUS_EXCEPTIONS", statuses);
  Py_XDECREF(statuses);
  if (rc < 0) return -1;
  if (PyModule_AddIntConstant(module, "DEFER_MIN_SIZE", MT_EXT_DEFER_MIN_SIZE) < 0) return -1;
  return PyModule_AddIntConstant(module, "HOOK_COUNT", MT_HOOK_COUNT);
}

#define MT_EXT_TYPES(X, st)                                                            \
  X(st->pool_handler); X(st->dtensor_base_type); X(st->mesh_base_type)

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
  mt_ext_state *st = mt_ext_state_of(module);
  MT_EXT_TYPES(Py_VISIT, st);
  return mt_ext_ops_traverse(st, visit, arg);
}

static int module_clear(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  MT_EXT_TYPES(Py_CLEAR, st);
  mt_ext_ops_clear(st);
  return 0;
}

static void module_free(void *module) {
  module_clear((PyObject *)module);
  mt_ext_ops_free(mt_ext_state_of((PyObject *)module));
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

PyMODINIT_FUNC PyInit__C(void) {
  struct PyModuleDef *def = &mt_ext_module_def;
  def->m_slots = module_slots, def->m_traverse = module_traverse;
  def->m_clear = module_clear, def->m_free = module_free;
  return PyModuleDef_Init(def);
}
