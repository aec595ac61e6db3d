/* The names of the core's codes that Python reads (names.h): a constant Python
 * needs is one line of this table rather than a copy in Python or in the
 * extension. */
#include "mpitensor/core/names.h"

#include <stddef.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/prop.h"

#define NAMED(name) {#name, MT_##name}

static const struct {
  const char *name;
  int value;
} constants[] = {
    NAMED(LABEL_KEEP), NAMED(LABEL_CONTRACT), NAMED(LABEL_REDUCE), NAMED(LABEL_REPLICATE),
    NAMED(PARTIAL_NONE), NAMED(PARTIAL_LINEAR_ALL), NAMED(PARTIAL_LINEAR_ONE),
    NAMED(PARTIAL_SAME_OP), NAMED(PARTIAL_ADDITIVE),
    NAMED(REDUCE_SUM), NAMED(REDUCE_AVG), NAMED(REDUCE_PRODUCT), NAMED(REDUCE_MAX),
    NAMED(REDUCE_MIN), NAMED(REDUCE_COUNT),
    NAMED(PLACEMENT_REPLICATE), NAMED(PLACEMENT_SHARD), NAMED(PLACEMENT_PARTIAL),
    NAMED(PLACEMENT_STRIDED),
    NAMED(ELEMENTWISE_NONE), NAMED(ELEMENTWISE_ADD), NAMED(ELEMENTWISE_MUL),
    NAMED(ELEMENTWISE_DIV), NAMED(ELEMENTWISE_MAX), NAMED(ELEMENTWISE_MIN),
    NAMED(ELEMENTWISE_NEG), NAMED(ELEMENTWISE_INCREASING),
    /* Python's name of an op family is FAMILY_, the core's MT_OP_. */
    {"FAMILY_ELEMENTWISE", MT_OP_ELEMENTWISE}, {"FAMILY_MATMUL", MT_OP_MATMUL},
    NAMED(PROP_MAX_INPUTS), NAMED(PROP_MAX_LABELS), NAMED(MAX_NDIM), NAMED(MAX_MESH_NDIM),
};

const char *mt_enum_at(int i, int *value) {
  if (i < 0 || i >= (int)(sizeof constants / sizeof constants[0])) return NULL;
  *value = constants[i].value;
  return constants[i].name;
}

const char *mt_reduce_op_name(int op) {
  static const char *const names[MT_REDUCE_COUNT] = {"sum", "avg", "product", "max", "min"};
  return op >= 0 && op < MT_REDUCE_COUNT ? names[op] : NULL;
}
