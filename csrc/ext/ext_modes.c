/* _C.modes: the modes in force, held once. mpitensor._modes (the ground floor)
 * sets them as the features that switch them are entered and left; the executor
 * and the Python hook sites read the same fields. `tracing` (some tool listens:
 * collective checks, debug logging, a gather warning, an entered CommDebugMode),
 * `gather_report` and `events` (either: the executor emits trace events) are
 * computed from the flags where they are read, so neither side keeps a copy of
 * the other's state. */
#include "ext.h"

#include <stddef.h>
#include <structmember.h>

#define FLAG(name, type, doc) {#name, type, offsetof(mt_ext_modes, name), 0, doc}

static PyMemberDef modes_members[] = {
    FLAG(grad_enabled, T_BOOL, "Operations on DTensors that require grad are recorded."),
    FLAG(grad_priced, T_BOOL, "A recorded forward runs: decisions price its inputs' "
         "gradients."),
    FLAG(want, T_OBJECT, "The DTensor whose gradient a backward rule computes: the "
         "outputs of its operations are headed to its layout (None: none)."),
    FLAG(backward, T_BOOL, "Autograd's engine is running a backward pass."),
    FLAG(checks, T_BOOL, "Collective mismatch checks (mpitensor.debug)."),
    FLAG(log_debug, T_BOOL, "The mpitensor logger is at DEBUG."),
    FLAG(log_info, T_BOOL, "The mpitensor logger is at INFO (gathers are logged)."),
    FLAG(gather_warning, T_BOOL, "Gathers an operation needs warn (set_gather_warning)."),
    FLAG(implicit_replication, T_INT, "Depth of implicit_replication() blocks."),
    FLAG(listeners, T_INT, "Entered CommDebugModes."),
    {NULL, 0, 0, 0, NULL},
};

static PyObject *get_tracing(PyObject *self, void *unused) {
  return PyBool_FromLong(mt_ext_tracing((mt_ext_modes *)self));
}

static PyObject *get_gather_report(PyObject *self, void *unused) {
  const mt_ext_modes *m = (const mt_ext_modes *)self;
  return PyBool_FromLong(m->gather_warning || m->log_info);
}

static PyObject *get_events(PyObject *self, void *unused) {
  return PyBool_FromLong(mt_ext_events((mt_ext_modes *)self));
}

static PyGetSetDef modes_getset[] = {
    {"tracing", get_tracing, NULL, "Some tool listens (checks, debug logs, a gather "
     "warning, a CommDebugMode).", NULL},
    {"gather_report", get_gather_report, NULL, "Gathers an operation needs are reported.",
     NULL},
    {"events", get_events, NULL, "The executor emits trace events.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static void modes_dealloc(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  Py_CLEAR(((mt_ext_modes *)self)->want);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static PyType_Slot modes_slots[] = {
    {Py_tp_dealloc, modes_dealloc},
    {Py_tp_members, modes_members},
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
  m->grad_enabled = 1, m->grad_priced = 0, m->want = NULL, m->backward = 0, m->checks = 0, m->log_debug = 0;
  m->log_info = 0, m->gather_warning = 0, m->implicit_replication = 0, m->listeners = 0;
  st->dispatch->modes = m;
  return PyModule_AddObjectRef(module, "modes", (PyObject *)m);
}
