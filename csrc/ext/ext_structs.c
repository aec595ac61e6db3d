/* The layout of every C struct that Python reads or fills through ctypes, as this
 * compiler lays it out: mpitensor._clib builds each ctypes Structure from these
 * rows and checks every offset and size against them at import, so Python never
 * holds a copy of a struct that could drift from its header. The structs belong
 * to every library and to the extension itself (its modes), and only the
 * extension sees all their headers: hence the table lives here. A struct Python
 * reads is one block below; tests/python/test_structs.py checks that each block
 * names every field its header declares. */
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
 * pointer's, which is what a row records (a NOLINT below says so to clang-tidy
 * where the pointee is a struct). */
#define POINTER(T, m) {AT(T, m), "void *", {0, 0}}
#define OBJECT(T, m) {AT(T, m), "PyObject *", {0, 0}}
#define END {NULL, 0, 0, NULL, {0, 0}}

static const field error[] = {SCALAR(mt_error, code), ARRAY(mt_error, msg), END};
static const field placement[] = {SCALAR(mt_placement, kind), SCALAR(mt_placement, dim),
                                  SCALAR(mt_placement, reduce_op),
                                  SCALAR(mt_placement, split_factor), END};
static const field box[] = {SCALAR(mt_box, ndim), ARRAY(mt_box, offset),
                            ARRAY(mt_box, shape), END};
static const field layout[] = {SCALAR(mt_layout, ndim), ARRAY(mt_layout, shape),
                               SCALAR(mt_layout, mesh_ndim), ARRAY(mt_layout, mesh_shape),
                               ARRAY(mt_layout, placements), END};
static const field selection[] = {SCALAR(mt_selection, ndim), ARRAY(mt_selection, start),
                                  ARRAY(mt_selection, step), ARRAY(mt_selection, count),
                                  END};
static const field lanes[] = {SCALAR(mt_lanes, outer), SCALAR(mt_lanes, n),
                              SCALAR(mt_lanes, inner), END};
static const field dimmap[] = {
    SCALAR(mt_dimmap, ninputs),        SCALAR(mt_dimmap, nlabels),
    ARRAY(mt_dimmap, in_ndim),         ARRAY2(mt_dimmap, in_labels),
    ARRAY(mt_dimmap, in_bcast),        SCALAR(mt_dimmap, out_ndim),
    ARRAY(mt_dimmap, out_labels),      ARRAY(mt_dimmap, label_kind),
    ARRAY(mt_dimmap, label_reduce_op), SCALAR(mt_dimmap, even_only),
    SCALAR(mt_dimmap, partial_rule),   SCALAR(mt_dimmap, partial_inputs),
    SCALAR(mt_dimmap, partial_ops),    SCALAR(mt_dimmap, sized_labels),
    ARRAY(mt_dimmap, label_size),      SCALAR(mt_dimmap, out_resized),
    ARRAY(mt_dimmap, out_size),        ARRAY(mt_dimmap, reduce_first),
    END};
static const field memo_stats[] = {
    SCALAR(mt_memo_stats, hits),           SCALAR(mt_memo_stats, misses),
    SCALAR(mt_memo_stats, decisions),      SCALAR(mt_memo_stats, plans),
    SCALAR(mt_memo_stats, decision_limit), SCALAR(mt_memo_stats, plan_limit),
    END};
static const field time_model[] = {
    ARRAY(mt_time_model, alpha), ARRAY(mt_time_model, beta),
    SCALAR(mt_time_model, call), SCALAR(mt_time_model, copy),
    SCALAR(mt_time_model, reduce), SCALAR(mt_time_model, ranks_per_node),
    END};
static const field step[] = {
    SCALAR(mt_step, kind),         SCALAR(mt_step, mesh_dim),
    SCALAR(mt_step, src),          SCALAR(mt_step, dst),
    SCALAR(mt_step, itemsize),     SCALAR(mt_step, bytes),
    SCALAR(mt_step, messages),     SCALAR(mt_step, rank_bytes),
    SCALAR(mt_step, vector_bytes), SCALAR(mt_step, rank_messages),
    SCALAR(mt_step, copy_bytes),   SCALAR(mt_step, reduce_bytes),
    SCALAR(mt_step, net_bytes),    SCALAR(mt_step, node_bytes),
    SCALAR(mt_step, rank_net_messages), SCALAR(mt_step, rank_shm_messages),
    SCALAR(mt_step, node_layout),  SCALAR(mt_step, node_group),
    SCALAR(mt_step, time),         END};
static const field mesh_nodes[] = {
    SCALAR(mt_mesh_nodes, kind), SCALAR(mt_mesh_nodes, count),
    SCALAR(mt_mesh_nodes, smallest), SCALAR(mt_mesh_nodes, largest), END};
static const field comm_totals[] = {ARRAY(mt_comm_totals, calls),
                                    ARRAY(mt_comm_totals, bytes), END};
static const field io_array[] = {SCALAR(mt_io_array, ndim), ARRAY(mt_io_array, shape),
                                 SCALAR(mt_io_array, itemsize),
                                 SCALAR(mt_io_array, offset), END};
static const field io_options[] = {
    SCALAR(mt_io_options, chunk_bytes), SCALAR(mt_io_options, io_thread),
    SCALAR(mt_io_options, durable),
    POINTER(mt_io_options, counters),  // NOLINT(bugprone-sizeof-expression)
    END};
static const field blas[] = {POINTER(mt_blas, sgemm), POINTER(mt_blas, dgemm),
                             POINTER(mt_blas, sgemm64), POINTER(mt_blas, dgemm64), END};
static const field attn_operand[] = {
    POINTER(mt_attn_operand, data), SCALAR(mt_attn_operand, batch_stride),
    SCALAR(mt_attn_operand, head_stride), SCALAR(mt_attn_operand, row_stride), END};
static const field attn_shape[] = {
    SCALAR(mt_attn_shape, batch), SCALAR(mt_attn_shape, heads), SCALAR(mt_attn_shape, L),
    SCALAR(mt_attn_shape, S),     SCALAR(mt_attn_shape, E),     SCALAR(mt_attn_shape, Ev),
    END};
static const field adam_hyper[] = {
    SCALAR(mt_adam_hyper, decay),     SCALAR(mt_adam_hyper, l2),
    SCALAR(mt_adam_hyper, beta1),     SCALAR(mt_adam_hyper, beta2),
    SCALAR(mt_adam_hyper, step_size), SCALAR(mt_adam_hyper, bias_correction2_sqrt),
    SCALAR(mt_adam_hyper, eps),       SCALAR(mt_adam_hyper, maximize),
    END};
static const field modes[] = {
    SCALAR(mt_ext_modes, grad_enabled), SCALAR(mt_ext_modes, backward),
    SCALAR(mt_ext_modes, checks),       SCALAR(mt_ext_modes, log_debug),
    SCALAR(mt_ext_modes, log_info),     SCALAR(mt_ext_modes, gather_warning),
    SCALAR(mt_ext_modes, grad_priced),
    OBJECT(mt_ext_modes, want),  // NOLINT(bugprone-sizeof-expression)
    SCALAR(mt_ext_modes, implicit_replication), SCALAR(mt_ext_modes, listeners),
    END};

static const field lapack[] = {
    POINTER(mt_lapack, sgeqrf),  POINTER(mt_lapack, dgeqrf),  POINTER(mt_lapack, cgeqrf),
    POINTER(mt_lapack, zgeqrf),  POINTER(mt_lapack, stpqrt),  POINTER(mt_lapack, dtpqrt),
    POINTER(mt_lapack, ctpqrt),  POINTER(mt_lapack, ztpqrt),  POINTER(mt_lapack, stpmqrt),
    POINTER(mt_lapack, dtpmqrt), POINTER(mt_lapack, ctpmqrt), POINTER(mt_lapack, ztpmqrt),
    POINTER(mt_lapack, sormqr),  POINTER(mt_lapack, dormqr),  POINTER(mt_lapack, cormqr),
    POINTER(mt_lapack, zormqr),  SCALAR(mt_lapack, ilp64),    END};

#define STRUCT(T, fields) {#T, sizeof(T), fields}

/* A struct nested in another comes before it, so that Python meets it first. */
static const struct {
  const char *name;
  size_t size;
  const field *fields;
} structs[] = {
    STRUCT(mt_error, error),
    STRUCT(mt_placement, placement),
    STRUCT(mt_box, box),
    STRUCT(mt_layout, layout),
    STRUCT(mt_selection, selection),
    STRUCT(mt_lanes, lanes),
    STRUCT(mt_dimmap, dimmap),
    STRUCT(mt_memo_stats, memo_stats),
    STRUCT(mt_time_model, time_model),
    STRUCT(mt_step, step),
    STRUCT(mt_mesh_nodes, mesh_nodes),
    STRUCT(mt_comm_totals, comm_totals),
    STRUCT(mt_io_array, io_array),
    STRUCT(mt_io_options, io_options),
    STRUCT(mt_blas, blas),
    STRUCT(mt_lapack, lapack),
    STRUCT(mt_attn_operand, attn_operand),
    STRUCT(mt_attn_shape, attn_shape),
    STRUCT(mt_adam_hyper, adam_hyper),
    STRUCT(mt_ext_modes, modes),
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
