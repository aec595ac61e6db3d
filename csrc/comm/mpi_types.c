/* MPI datatypes and reduction operations for mpitensor's element types.
 *
 * Data movement never needs typed MPI: boxes travel as bytes. Reductions do, and
 * MPI lacks float16, bfloat16 and NumPy's NaN-propagating max/min, so those go through
 * user-defined operations that call the core's own reduction kernel. So do sums of
 * 8- and 16-bit integers, which must wrap as in NumPy: Open MPI 4.1's AVX
 * operations saturate them instead (open-mpi/ompi#8045, closed as wontfix). */
#include <limits.h>
#include <stdatomic.h>

#include "comm-private.h"
#include "mpi-types-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/pack.h"
#include "mpitensor/core/plan.h"

enum { USER_SUM, USER_PRODUCT, USER_MAX, USER_MIN, USER_WRAP_SUM, USER_COUNT };

/* The user-defined operations are MPI objects of the process: created once, on
 * the first reduction that needs one, and freed by MPI_Finalize (an attribute
 * of MPI_COMM_SELF), so they are process-wide state by nature. Thread-safe: the
 * first caller creates them while `user_state` is 1 and others spin until it is 2
 * (ready) or back to 0 (creation failed; the next caller tries again). */
static MPI_Op user_ops[USER_COUNT];
static atomic_int user_state; /* 0 none, 1 being created, 2 ready */

/* float16 travels as MPI_UINT16_T and bfloat16 as MPI_INT16_T: these operations
 * see those types for no other dtype (16-bit integer sums wrap in their own). */
static int dtype_of(MPI_Datatype t) {
  if (t == MPI_UINT16_T) return MT_DTYPE_FLOAT16;
  if (t == MPI_INT16_T) return MT_DTYPE_BFLOAT16;
  if (t == MPI_FLOAT) return MT_DTYPE_FLOAT32;
  return MT_DTYPE_FLOAT64;
}

static void apply(void *in, void *inout, const int *len, const MPI_Datatype *t, int op) {
  mt_reduce(inout, in, *len, dtype_of(*t), op, NULL);
}

/* Narrow integers reach only the wrapping sum, under their own MPI types. */
static int narrow_dtype_of(MPI_Datatype t) {
  if (t == MPI_INT8_T) return MT_DTYPE_INT8;
  if (t == MPI_UINT8_T) return MT_DTYPE_UINT8;
  if (t == MPI_INT16_T) return MT_DTYPE_INT16;
  return MT_DTYPE_UINT16;
}

static int is_narrow_int(int dtype) {
  return dtype == MT_DTYPE_INT8 || dtype == MT_DTYPE_UINT8 || dtype == MT_DTYPE_INT16 ||
         dtype == MT_DTYPE_UINT16;
}

static void user_wrap_sum(void *in, void *io, int *len, MPI_Datatype *t) {
  mt_reduce(io, in, *len, narrow_dtype_of(*t), MT_REDUCE_SUM, NULL);
}

static void user_sum(void *in, void *io, int *len, MPI_Datatype *t) {
  apply(in, io, len, t, MT_REDUCE_SUM);
}
static void user_product(void *in, void *io, int *len, MPI_Datatype *t) {
  apply(in, io, len, t, MT_REDUCE_PRODUCT);
}
static void user_max(void *in, void *io, int *len, MPI_Datatype *t) {
  apply(in, io, len, t, MT_REDUCE_MAX);
}
static void user_min(void *in, void *io, int *len, MPI_Datatype *t) {
  apply(in, io, len, t, MT_REDUCE_MIN);
}

/* Frees the operations when MPI_Finalize deletes MPI_COMM_SELF's attributes. */
static int free_user_ops(MPI_Comm comm, int keyval, void *value, void *extra) {
  (void)comm, (void)keyval, (void)value, (void)extra;
  for (int i = 0; i < USER_COUNT; ++i) MPI_Op_free(&user_ops[i]);
  atomic_store(&user_state, 0);
  return MPI_SUCCESS;
}

static int create_user_ops(mt_error *err) {
  MPI_User_function *fns[USER_COUNT] = {user_sum, user_product, user_max, user_min,
                                        user_wrap_sum};
  for (int i = 0; i < USER_COUNT; ++i) {
    MT__MPI_TRY(MPI_Op_create(fns[i], 1, &user_ops[i]), "MPI_Op_create");
  }
  int keyval;
  MT__MPI_TRY(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_user_ops, &keyval, NULL),
              "MPI_Comm_create_keyval");
  MT__MPI_TRY(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, NULL), "MPI_Comm_set_attr");
  /* The attribute keeps the keyval alive until MPI_Finalize deletes it. */
  MT__MPI_TRY(MPI_Comm_free_keyval(&keyval), "MPI_Comm_free_keyval");
  return MT_OK;
}

static int ensure_user_ops(mt_error *err) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&user_state, &expected, 1)) {
    int rc = create_user_ops(err);
    atomic_store(&user_state, rc == MT_OK ? 2 : 0);
    return rc;
  }
  while (atomic_load(&user_state) == 1) {
  }
  return atomic_load(&user_state) == 2
             ? MT_OK
             : mt_error_set(err, MT_EMPI, "MPI operations unavailable");
}

static MPI_Datatype builtin_type(int dtype) {
  switch (dtype) {
    case MT_DTYPE_BOOL: return MPI_C_BOOL;
    case MT_DTYPE_INT8: return MPI_INT8_T;
    case MT_DTYPE_INT16: return MPI_INT16_T;
    case MT_DTYPE_INT32: return MPI_INT32_T;
    case MT_DTYPE_INT64: return MPI_INT64_T;
    case MT_DTYPE_UINT8: return MPI_UINT8_T;
    case MT_DTYPE_UINT16: return MPI_UINT16_T;
    case MT_DTYPE_UINT32: return MPI_UINT32_T;
    case MT_DTYPE_UINT64: return MPI_UINT64_T;
    case MT_DTYPE_FLOAT16: return MPI_UINT16_T;
    case MT_DTYPE_FLOAT32: return MPI_FLOAT;
    case MT_DTYPE_FLOAT64: return MPI_DOUBLE;
    case MT_DTYPE_COMPLEX64: return MPI_C_FLOAT_COMPLEX;
    case MT_DTYPE_COMPLEX128: return MPI_C_DOUBLE_COMPLEX;
    case MT_DTYPE_BFLOAT16: return MPI_INT16_T;
    default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op builtin_op(int dtype, int op) {
  if (dtype == MT_DTYPE_BOOL) {
    return (op == MT_REDUCE_PRODUCT || op == MT_REDUCE_MIN) ? MPI_LAND : MPI_LOR;
  }
  switch (op) {
    case MT_REDUCE_SUM:
    case MT_REDUCE_AVG: return MPI_SUM;
    case MT_REDUCE_PRODUCT: return MPI_PROD;
    case MT_REDUCE_MAX: return MPI_MAX;
    default: return MPI_MIN;
  }
}

int mt__reduce_type(int dtype, int op, MPI_Datatype *type, MPI_Op *mop, mt_error *err) {
  int rc = mt_partial_check(dtype, op, err);
  if (rc != MT_OK) return rc;
  *type = builtin_type(dtype);
  int is_float = dtype == MT_DTYPE_FLOAT32 || dtype == MT_DTYPE_FLOAT64;
  int nan_order = is_float && (op == MT_REDUCE_MAX || op == MT_REDUCE_MIN);
  int wrap = is_narrow_int(dtype) && op == MT_REDUCE_SUM;
  int narrow_float = dtype == MT_DTYPE_FLOAT16 || dtype == MT_DTYPE_BFLOAT16;
  if (!narrow_float && !nan_order && !wrap) {
    *mop = builtin_op(dtype, op);
    return MT_OK;
  }
  rc = ensure_user_ops(err);
  if (rc != MT_OK) return rc;
  int slot = wrap                      ? USER_WRAP_SUM
             : op == MT_REDUCE_PRODUCT ? USER_PRODUCT
             : op == MT_REDUCE_MAX     ? USER_MAX
             : op == MT_REDUCE_MIN     ? USER_MIN
                                       : USER_SUM;
  *mop = user_ops[slot];
  return MT_OK;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b != 0) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* A committed contiguous datatype of `bytes` bytes, nested when `bytes` itself
 * exceeds an int: blocks of its largest power-of-two divisor up to 2**30. */
static int unit_type(int64_t bytes, MPI_Datatype *type, mt_error *err) {
  int64_t inner = bytes & -bytes;
  if (inner > ((int64_t)1 << 30)) inner = (int64_t)1 << 30;
  if (bytes <= INT_MAX) inner = bytes;
  if (bytes / inner > INT_MAX) {
    return mt_error_set(err, MT_EOVERFLOW,
                        "a unit of %lld bytes cannot be expressed as an "
                        "MPI datatype",
                        (long long)bytes);
  }
  MPI_Datatype block;
  MT__MPI_TRY(MPI_Type_contiguous((int)inner, MPI_BYTE, &block), "MPI_Type_contiguous");
  int rc = MPI_Type_contiguous((int)(bytes / inner), block, type);
  MPI_Type_free(&block);
  if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Type_contiguous");
  MT__MPI_TRY(MPI_Type_commit(type), "MPI_Type_commit");
  return MT_OK;
}

int mt__byte_unit(const int64_t *values, int64_t n, MPI_Datatype *type, int64_t *unit,
                  mt_error *err) {
  int64_t g = 0, big = 0;
  for (int64_t i = 0; i < n; ++i) {
    g = gcd64(g, values[i]);
    if (values[i] > big) big = values[i];
  }
  *type = MPI_BYTE, *unit = 1;
  if (big <= INT_MAX) return MT_OK;
  if (big / g > INT_MAX) {
    return mt_error_set(err, MT_EOVERFLOW,
                        "blocks of %lld bytes share no unit that brings "
                        "their count under MPI's int limit",
                        (long long)big);
  }
  int rc = unit_type(g, type, err);
  if (rc == MT_OK) *unit = g;
  return rc;
}
