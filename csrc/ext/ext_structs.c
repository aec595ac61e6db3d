/* The layout of every C struct that Python reads or fills through ctypes, as this
 * compiler lays it out: mpitensor._clib builds each ctypes Structure from these
 * rows and checks every offset and size against them at import, so Python never
 * holds a copy of a struct that could drift from its header. The structs belong
 * to every library and to the extension itself (its modes), and only the
 * extension sees all their headers: hence the table lives here. A struct Python
 * reads is one line of the list below; its rows are generated from its header
 * (tests/python/test_structs.py checks they name every field it declares). */
#include <stddef.h>
#include <string.h>

#include "ext.h"
#include "mpitensor/kernels/kernels.h"
#include "mpitensor/linalg/tsqr.h"

typedef struct field {
  const char *name;
  size_t offset, size;
  const char *type; /* of the elements: a scalar's C name or a struct of the table */
  int64_t dims[2];  /* extents: {0, 0} a scalar, {n, 0} an array, {n, m} n arrays */
} field;

/* The C name of an element type: a type missing here fails the build, rather than
 * reaching Python as something it would guess. */
#define CTYPE(x)                                                                     \
  _Generic((x), bool: "bool", char: "char", int: "int", unsigned int: "unsigned int", \
           long: "long", unsigned long: "unsigned long", long long: "long long",      \
           unsigned long long: "unsigned long long", double: "double",                \
           mt_placement: "mt_placement", mt_layout: "mt_layout",                       \
           mt_ext_modes: "mt_ext_modes")
#define MEMBER(T, m) (((T *)0)->m)
#define COUNT(a) (int64_t)(sizeof(a) / sizeof((a)[0]))
#define AT(T, m) #m, offsetof(T, m), sizeof MEMBER(T, m)
#define SCALAR(T, m) {AT(T, m), CTYPE(MEMBER(T, m)), {0, 0}}
#define ARRAY(T, m) {AT(T, m), CTYPE(MEMBER(T, m)[0]), {COUNT(MEMBER(T, m)), 0}}
#define ARRAY2(T, m)                          \
  {AT(T, m), CTYPE(MEMBER(T, m)[0][0]),       \
   {COUNT(MEMBER(T, m)), COUNT(MEMBER(T, m)[0])}}
/* Any data or function pointer, which Python passes as an address. Its size is the
 * pointer's, which is what a row records (the generated rows say so to clang-tidy,
 * where the pointee is a struct). */
#define POINTER(T, m) {AT(T, m), "void *", {0, 0}}
#define OBJECT(T, m) {AT(T, m), "PyObject *", {0, 0}}
#define END {NULL, 0, 0, NULL, {0, 0}}

/* fields_T[], the rows of each struct T listed below, one per member its header
 * declares: csrc/tools/struct_fields.py writes them at build time, into the build
 * directory (hence <>), from the headers: a field is written once, in its header. */
#include <struct_fields.inc>

#define STRUCT(T) {#T, sizeof(T), fields_##T}

/* A struct nested in another comes before it, so that Python meets it first. */
static const struct {
  const char *name;
  size_t size;
  const field *fields;
} structs[] = {
    STRUCT(mt_error),
    STRUCT(mt_placement),
    STRUCT(mt_box),
    STRUCT(mt_layout),
    STRUCT(mt_selection),
    STRUCT(mt_lanes),
    STRUCT(mt_dimmap),
    STRUCT(mt_memo_stats),
    STRUCT(mt_time_model),
    STRUCT(mt_step),
    STRUCT(mt_mesh_nodes),
    STRUCT(mt_comm_totals),
    STRUCT(mt_io_array),
    STRUCT(mt_io_options),
    STRUCT(mt_blas),
    STRUCT(mt_lapack),
    STRUCT(mt_attn_operand),
    STRUCT(mt_attn_shape),
    STRUCT(mt_adam_hyper),
    STRUCT(mt_ext_modes),
};

/* What each exported capsule points to: a member of the module state (or of its
 * dispatch state) read in place, or something Python only hands back to C. */
#define EXPORT(T, m) {"mpitensor._C." #m, 0, sizeof MEMBER(T, m), CTYPE(MEMBER(T, m)), {0, 0}}
#define EXPORT_ARRAY(T, m)                                                          \
  {"mpitensor._C." #m, 0, sizeof MEMBER(T, m), CTYPE(MEMBER(T, m)[0]),              \
   {COUNT(MEMBER(T, m)), 0}}
#define EXPORT_OPAQUE(name) {"mpitensor._C." name, 0, 0, "opaque", {0, 0}}
static const field exports[] = {
    EXPORT(mt_ext_state, modes),
    EXPORT_ARRAY(mt_ext_dispatch, hook_calls),
    EXPORT_OPAQUE("comm_counters"),
    EXPORT_OPAQUE("io_counters"),
    EXPORT_OPAQUE("memo"),
    EXPORT_OPAQUE("layout_table"),
    END};

PyObject *mt_ext_export(const char *name, void *p) {
  for (const field *f = exports; f->name != NULL; ++f)
    if (strcmp(f->name, name) == 0) return PyCapsule_New(p, f->name, NULL);
  return PyErr_Format(PyExc_SystemError, "%s is not in the table of exports", name);
}

/* A row's extents as Python reads them: a tuple of the nonzero ones. */
static PyObject *extents(const int64_t *dims) {
  return mt_ext_int_tuple(dims, (dims[0] != 0) + (dims[1] != 0));
}

/* {name: (size, ((field, type, offset, size, extents), ...))} of the structs. */
static PyObject *struct_table(void) {
  PyObject *out = PyDict_New();
  for (size_t i = 0; out != NULL && i < sizeof structs / sizeof structs[0]; ++i) {
    PyObject *rows = PyList_New(0);
    for (const field *f = structs[i].fields; rows != NULL && f->name != NULL; ++f) {
      PyObject *row = Py_BuildValue("(ssnnN)", f->name, f->type, (Py_ssize_t)f->offset,
                                    (Py_ssize_t)f->size, extents(f->dims));
      if (row == NULL || PyList_Append(rows, row) < 0) Py_CLEAR(rows);
      Py_XDECREF(row);
    }
    PyObject *entry = rows ? Py_BuildValue("(nN)", (Py_ssize_t)structs[i].size,
                                           PyList_AsTuple(rows)) : NULL;
    if (entry == NULL || PyDict_SetItemString(out, structs[i].name, entry) < 0) Py_CLEAR(out);
    Py_XDECREF(entry);
    Py_XDECREF(rows);
  }
  return out;
}

/* {capsule name: (type, size, extents)} of the exports. */
static PyObject *export_table(void) {
  PyObject *out = PyDict_New();
  for (const field *f = exports; out != NULL && f->name != NULL; ++f) {
    PyObject *entry = Py_BuildValue("(snN)", f->type, (Py_ssize_t)f->size, extents(f->dims));
    if (entry == NULL || PyDict_SetItemString(out, f->name, entry) < 0) Py_CLEAR(out);
    Py_XDECREF(entry);
  }
  return out;
}

int mt_ext_structs_exec(PyObject *module) {
  PyObject *structs_ = struct_table(), *exports_ = export_table();
  int rc = structs_ && exports_ && PyModule_AddObjectRef(module, "STRUCTS", structs_) == 0 &&
                   PyModule_AddObjectRef(module, "EXPORTS", exports_) == 0
               ? 0 : -1;
  Py_XDECREF(structs_);
  Py_XDECREF(exports_);
  return rc;
}
