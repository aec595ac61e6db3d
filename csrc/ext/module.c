/* mpitensor._C: the module definition (PEP 489 multi-phase init), which runs each
 * area's setup; the helpers the areas share are in ext_args.c. */
#define MT_EXT_IMPORTS_NUMPY
#include "ext.h"

static int add_methods(PyObject *module, PyMethodDef *defs) {
  return PyModule_AddFunctions(module, defs);
}

static int module_exec(PyObject *module) {
  if (PyArray_ImportNumPyAPI() < 0) return -1;
  if (add_methods(module, mt_ext_mesh_methods) < 0) return -1;
  if (add_methods(module, mt_ext_layout_methods) < 0) return -1;
  if (add_methods(module, mt_ext_rng_methods) < 0) return -1;
  if (add_methods(module, mt_ext_redistribute_methods) < 0) return -1;
  if (add_methods(module, mt_ext_pool_methods) < 0) return -1;
  if (add_methods(module, mt_ext_prop_methods) < 0) return -1;
  if (add_methods(module, mt_ext_io_methods) < 0) return -1;
  if (add_methods(module, mt_ext_dispatch_methods) < 0) return -1;
  if (add_methods(module, mt_ext_autograd_methods) < 0) return -1;
  if (add_methods(module, mt_ext_decide_methods) < 0) return -1;
  if (add_methods(module, mt_ext_ring_methods) < 0) return -1;
  if (add_methods(module, mt_ext_kernels_methods) < 0) return -1;
  if (add_methods(module, mt_ext_agree_methods) < 0) return -1;
  if (add_methods(module, mt_ext_watchdog_methods) < 0) return -1;
  mt_ext_state *st = mt_ext_state_of(module);
  st->io_options = mt_io_options_default();
  st->io_options.counters = &st->io_counters;
  if (mt_ext_pool_exec(module) < 0) return -1;
  if (mt_ext_mesh_exec(module) < 0) return -1;
  if (mt_ext_redistribute_exec(module) < 0) return -1;
  if (mt_ext_prop_exec(module) < 0) return -1;
  if (mt_ext_mesh_base_exec(module) < 0) return -1;
  if (mt_ext_dtensor_exec(module) < 0) return -1;
  if (mt_ext_decide_exec(module) < 0) return -1;
  if (mt_ext_autograd_exec(module) < 0) return -1;
  if (mt_ext_dispatch_exec(module) < 0) return -1;
  if (mt_ext_ring_exec(module) < 0) return -1;
  if (PyModule_AddIntConstant(module, "MAX_NDIM", MT_MAX_NDIM) < 0) return -1;
  if (PyModule_AddIntConstant(module, "MAX_MESH_NDIM", MT_MAX_MESH_NDIM) < 0) return -1;
  return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg) {
  mt_ext_state *st = mt_ext_state_of(module);
  Py_VISIT(st->mesh_type);
  Py_VISIT(st->plan_type);
  Py_VISIT(st->request_type);
  Py_VISIT(st->dimmap_type);
  Py_VISIT(st->exchange_type);
  Py_VISIT(st->pool_handler);
  Py_VISIT(st->dtensor_base_type);
  Py_VISIT(st->mesh_base_type);
  Py_VISIT(st->decision_type);
  Py_VISIT(st->node_type);
  return mt_ext_dispatch_traverse(st, visit, arg);
}

static int module_clear(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  Py_CLEAR(st->mesh_type);
  Py_CLEAR(st->plan_type);
  Py_CLEAR(st->request_type);
  Py_CLEAR(st->dimmap_type);
  Py_CLEAR(st->exchange_type);
  Py_CLEAR(st->pool_handler);
  Py_CLEAR(st->dtensor_base_type);
  Py_CLEAR(st->mesh_base_type);
  Py_CLEAR(st->decision_type);
  Py_CLEAR(st->node_type);
  mt_ext_dispatch_clear(st);
  return 0;
}

static void module_free(void *module) {
  module_clear((PyObject *)module);
  mt_ext_dispatch_free(mt_ext_state_of((PyObject *)module));
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
    {0, NULL},
};

struct PyModuleDef mt_ext_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "mpitensor._C",
    .m_doc = "The C core of mpitensor. Internal: use the mpitensor package.",
    .m_size = sizeof(mt_ext_state),
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&mt_ext_module_def); }
