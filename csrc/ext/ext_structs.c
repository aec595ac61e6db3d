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

const char *mt_ext_struct_at(int i, int64_t *size) {
  if (i < 0 || i >= (int)(sizeof structs / sizeof structs[0])) return NULL;
  *size = (int64_t)structs[i].size;
  return structs[i].name;
}

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

const char *mt_ext_export_at(int i, const char **type, int64_t *size, int64_t *dims) {
  if (i < 0 || i >= (int)(sizeof exports / sizeof exports[0]) - 1) return NULL;
  const field *f = &exports[i];
  *type = f->type, *size = (int64_t)f->size, dims[0] = f->dims[0], dims[1] = f->dims[1];
  return f->name;
}

PyObject *mt_ext_export(const char *name, void *p) {
  for (const field *f = exports; f->name != NULL; ++f)
    if (strcmp(f->name, name) == 0) return PyCapsule_New(p, f->name, NULL);
  return PyErr_Format(PyExc_SystemError, "%s is not in the table of exports", name);
}

const char *mt_ext_field_at(int i, int j, const char **type, int64_t *offset,
                            int64_t *size, int64_t *dims) {
  int64_t ignored;
  if (j < 0 || mt_ext_struct_at(i, &ignored) == NULL) return NULL;
  const field *f = structs[i].fields;
  for (int k = 0; k < j; ++k)
    if (f[k].name == NULL) return NULL;
  f += j;
  if (f->name == NULL) return NULL;
  *type = f->type, *offset = (int64_t)f->offset, *size = (int64_t)f->size;
  dims[0] = f->dims[0], dims[1] = f->dims[1];
  return f->name;
}
