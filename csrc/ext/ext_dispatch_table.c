/* _C.DispatchTable: one mesh's recorded decisions for the fast path of NumPy
 * operations (ext_dispatch.c), and the one layout tuple of each layout on it.
 *
 * Each DeviceMesh holds one (``mesh._dispatch``). A layout is the tuple
 * (placements, shape, dtype, stride) of a DTensorSpec without its mesh; the table
 * hands every DTensor of equal layout the same tuple. An entry maps (operation, one
 * key per operand: the layout of a DTensor or the type of a scalar, an int for
 * static arguments) to the output's layout. Keys are compared by identity; the
 * entry holds a reference to each, so an address is never reused while its entry
 * lives. Nothing here references the mesh: no cycle, and the table dies with its
 * mesh. Open addressing with linear probing, kept at most half full; past
 * MAX_SLOTS it is emptied whole. */
#include "ext.h"

enum { FIRST_SLOTS = 64, MAX_SLOTS = 4096, MAX_LAYOUTS = 4096 };

struct mt_ext_table {
  PyObject_HEAD
  int cap, used;
  mt_ext_entry *slots; /* cap entries; op == NULL marks an empty one */
  PyObject *layouts;   /* layout -> the table's one equal layout tuple */
};

static void entry_clear(mt_ext_entry *e) {
  Py_CLEAR(e->op);
  Py_CLEAR(e->key[0]);
  Py_CLEAR(e->key[1]);
  Py_CLEAR(e->out);
  Py_CLEAR(e->axes);
}

static size_t slot_of(const mt_ext_table *t, PyObject *op, PyObject *k0, PyObject *k1,
                      long long aux) {
  uint64_t h = (uint64_t)(uintptr_t)op * 0x9E3779B97F4A7C15u;
  h ^= (uint64_t)(uintptr_t)k0 * 0xC2B2AE3D27D4EB4Fu;
  h ^= (uint64_t)(uintptr_t)k1 * 0x165667B19E3779F9u;
  h ^= (uint64_t)aux * 0x27D4EB2F165667C5u;
  return (size_t)(h >> 32) & (size_t)(t->cap - 1);
}

/* The entry of the key, or the empty slot where it would go. */
static mt_ext_entry *probe(mt_ext_table *t, PyObject *op, PyObject *k0, PyObject *k1,
                           long long aux) {
  size_t i = slot_of(t, op, k0, k1, aux);
  for (;;) {
    mt_ext_entry *e = &t->slots[i];
    if (e->op == NULL ||
        (e->op == op && e->key[0] == k0 && e->key[1] == k1 && e->aux == aux))
      return e;
    i = (i + 1) & (size_t)(t->cap - 1);
  }
}

mt_ext_entry *mt_ext_table_lookup(mt_ext_table *t, PyObject *op, PyObject *k0,
                                  PyObject *k1, long long aux) {
  if (t->slots == NULL) return NULL;
  mt_ext_entry *e = probe(t, op, k0, k1, aux);
  return e->op != NULL ? e : NULL;
}

static void table_clear_entries(mt_ext_table *t) {
  for (int i = 0; t->slots != NULL && i < t->cap; ++i) entry_clear(&t->slots[i]);
  t->used = 0;
}

/* Room for one more entry: allocates, doubles (moving the entries, references
 * and all) or, at MAX_SLOTS, empties the table. -1 with MemoryError. */
static int make_room(mt_ext_table *t) {
  if (t->slots != NULL && 2 * (t->used + 1) <= t->cap) return 0;
  if (t->slots != NULL && t->cap >= MAX_SLOTS) {
    table_clear_entries(t);
    return 0;
  }
  mt_ext_entry *old = t->slots;
  int old_cap = old == NULL ? 0 : t->cap; /* no array yet: no entries to move */
  int cap = old == NULL ? FIRST_SLOTS : 2 * old_cap;
  t->slots = PyMem_Calloc((size_t)cap, sizeof(mt_ext_entry));
  if (t->slots == NULL) {
    t->slots = old;
    PyErr_NoMemory();
    return -1;
  }
  t->cap = cap;
  for (int i = 0; i < old_cap; ++i) {
    mt_ext_entry *e = &old[i];
    if (e->op != NULL) *probe(t, e->op, e->key[0], e->key[1], e->aux) = *e;
  }
  PyMem_Free(old);
  return 0;
}

int mt_ext_table_insert(mt_ext_table *t, PyObject *op, PyObject *k0, PyObject *k1,
                        long long aux, PyObject *out, PyObject *axes) {
  if (make_room(t) < 0) return -1;
  mt_ext_entry *e = probe(t, op, k0, k1, aux);
  if (e->op == NULL) {
    t->used++;
    e->op = Py_NewRef(op);
    e->key[0] = Py_NewRef(k0);
    e->key[1] = Py_XNewRef(k1);
    e->aux = aux;
  }
  Py_XSETREF(e->out, Py_NewRef(out));
  Py_XSETREF(e->axes, Py_XNewRef(axes));
  return 0;
}

PyObject *mt_ext_table_intern(mt_ext_table *t, PyObject *spec) {
  PyObject *key = PyTuple_GetSlice(spec, 1, 5);
  if (key == NULL) return NULL;
  PyObject *found = PyDict_GetItemWithError(t->layouts, key);
  if (found != NULL) {
    Py_DECREF(key);
    return Py_NewRef(found);
  }
  if (PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
      Py_DECREF(key);
      return NULL;
    }
    PyErr_Clear(); /* an unhashable field: this layout is simply not shared */
    return key;
  }
  if (PyDict_GET_SIZE(t->layouts) >= MAX_LAYOUTS) PyDict_Clear(t->layouts);
  if (PyDict_SetItem(t->layouts, key, key) < 0) Py_CLEAR(key);
  return key;
}

static PyObject *table_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
    PyErr_SetString(PyExc_TypeError, "DispatchTable() takes no arguments");
    return NULL;
  }
  mt_ext_table *t = (mt_ext_table *)tp->tp_alloc(tp, 0);
  if (t == NULL) return NULL;
  t->layouts = PyDict_New();
  if (t->layouts == NULL) Py_CLEAR(t);
  return (PyObject *)t;
}

static int table_traverse(PyObject *self, visitproc visit, void *arg) {
  mt_ext_table *t = (mt_ext_table *)self;
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(t->layouts);
  for (int i = 0; t->slots != NULL && i < t->cap; ++i) {
    mt_ext_entry *e = &t->slots[i];
    Py_VISIT(e->op);
    Py_VISIT(e->key[0]);
    Py_VISIT(e->key[1]);
    Py_VISIT(e->out);
    Py_VISIT(e->axes);
  }
  return 0;
}

static int table_clear(PyObject *self) {
  mt_ext_table *t = (mt_ext_table *)self;
  table_clear_entries(t);
  if (t->layouts != NULL) PyDict_Clear(t->layouts);
  return 0;
}

static void table_dealloc(PyObject *self) {
  mt_ext_table *t = (mt_ext_table *)self;
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  table_clear(self);
  Py_CLEAR(t->layouts);
  PyMem_Free(t->slots);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static PyObject *table_clear_method(PyObject *self, PyObject *unused) {
  table_clear(self);
  Py_RETURN_NONE;
}

static Py_ssize_t table_len(PyObject *self) { return ((mt_ext_table *)self)->used; }

static PyMethodDef table_methods[] = {
    {"clear", table_clear_method, METH_NOARGS,
     "Forgets every recorded decision and shared layout of this mesh. Local."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot table_slots[] = {
    {Py_tp_doc, "One mesh's decisions for the C fast path of NumPy operations "
                "(mpitensor._ops._fast); len() is the number of entries. Local."},
    {Py_tp_new, table_new},
    {Py_tp_dealloc, table_dealloc},
    {Py_tp_traverse, table_traverse},
    {Py_tp_clear, table_clear},
    {Py_tp_methods, table_methods},
    {Py_mp_length, table_len},
    {0, NULL},
};

static PyType_Spec table_spec = {
    .name = "mpitensor._C.DispatchTable",
    .basicsize = sizeof(mt_ext_table),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = table_slots,
};

int mt_ext_table_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->table_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &table_spec, NULL);
  if (st->table_type == NULL) return -1;
  return PyModule_AddObjectRef(module, "DispatchTable", (PyObject *)st->table_type);
}
