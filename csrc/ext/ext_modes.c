/* _C.modes: the modes in force, held once. mpitensor._modes (the ground floor)
 * sets them as the features that switch them are entered and left; the executor
 * and the Python hook sites read the same fields. `tracing` (some tool listens:
 * collective checks, debug logging, a gather warning, an entered CommDebugMode),
 * `gather_report` and `events` are derived from the flags whenever one is set,
 * so neither side keeps a copy of the other's state. */
#include "ext.h"

#include <stddef.h>
#include <structmember.h>

static void derive(mt_ext_modes *m) {
  m->gather_report = (char)(m->gather_warning || m->log_info);
  m->tracing = (char)(m->checks || m->log_debug || m->gather_warning || m->listeners > 0);
  m->events = (char)(m->tracing || m->gather_report);
}

/* A flag member's setter: the member table gives the offset, this recomputes. */
static int set_flag(PyObject *self, PyObject *value, void *offset) {
  if (value == NULL) {
    PyErr_SetString(PyExc_AttributeError, "modes cannot be deleted");
    return -1;
  }
  long v = PyLong_AsLong(value);
  if (v == -1 && PyErr_Occurred()) return -1;
  char *field = (char *)self + (size_t)(uintptr_t)offset;
  if (offset == (void *)offsetof(mt_ext_modes, implicit_replication) ||
      offset == (void *)offsetof(mt_ext_modes, listeners)) {
    if (v < 0 || v > INT32_MAX) {
      PyErr_SetString(PyExc_ValueError, "a mode's depth is a non-negative int");
      return -1;
    }
    *(int *)(void *)field = (int)v;
  } else {
    *field = (char)(v != 0);
  }
  derive((mt_ext_modes *)self);
  return 0;
}

static PyObject *get_flag(PyObject *self, void *offset) {
  const char *field = (const char *)self + (size_t)(uintptr_t)offset;
  if (offset == (void *)offsetof(mt_ext_modes, implicit_replication) ||
      offset == (void *)offsetof(mt_ext_modes, listeners))
    return PyLong_FromLong(*(const int *)(const void *)field);
  return PyBool_FromLong(*field);
}

#define FLAG(name, doc) \
  {#name, get_flag, set_flag, doc, (void *)offsetof(mt_ext_modes, name)}
#define DERIVED(name, doc) {#name, get_flag, NULL, doc, (void *)offsetof(mt_ext_modes, name)}

static PyGetSetDef modes_getset[] = {
    FLAG(grad_enabled, "Operations on DTensors that require grad are recorded."),
    FLAG(backward, "Autograd's engine is running a backward pass."),
    FLAG(checks, "Collective mismatch checks (mpitensor.debug)."),
    FLAG(log_debug, "The mpitensor logger is at DEBUG."),
    FLAG(log_info, "The mpitensor logger is at INFO (gathers are logged)."),
    FLAG(gather_warning, "Gathers an operation needs warn (set_gather_warning)."),
    FLAG(implicit_replication, "Depth of implicit_replication() blocks."),
    FLAG(listeners, "Entered CommDebugModes."),
    DERIVED(tracing, "Some tool listens: the executor emits trace events."),
    DERIVED(gather_report, "Gathers an operation needs are reported."),
    DERIVED(events, "The executor emits trace events (tracing or gather reports)."),
    {NULL, NULL, NULL, NULL, NULL},
};

static void modes_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static PyType_Slot modes_slots[] = {
    {Py_tp_dealloc, modes_dealloc},
    {Py_tp_getset, modes_getset},
    {Py_tp_doc, "The modes in force (mpitensor._modes sets them). Local."},
    {0, NULL},
};

static PyType_Spec modes_spec = {
    .name = "mpitensor._C.Modes",
    .basicsize = sizeof(mt_ext_modes),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = modes_slots,
};

int mt_ext_modes_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->modes_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &modes_spec, NULL);
  if (st->modes_type == NULL) return -1;
  mt_ext_modes *m = PyObject_New(mt_ext_modes, st->modes_type);
  if (m == NULL) return -1;
  m->grad_enabled = 1, m->backward = 0, m->checks = 0, m->log_debug = 0;
  m->log_info = 0, m->gather_warning = 0, m->implicit_replication = 0;
  m->listeners = 0;
  derive(m);
  st->dispatch->modes = m;
  return PyModule_AddObjectRef(module, "modes", (PyObject *)m);
}
