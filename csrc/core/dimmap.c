/* The dim maps of the operation families the extension registers (elementwise
 * with broadcasting, matmul, reductions), built from shapes and an op's signature
 * (prop.h). Python-driven operations (einsum, reshape, ...) build their own maps. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/prop.h"

static int popcount(uint32_t mask) {
  int n = 0;
  for (; mask != 0; mask &= mask - 1) ++n;
  return n;
}

/* NumPy's text of a shape, "(8,6)" or "(3,)", for messages. */
static const char *shape_text(int ndim, const int64_t *shape, char *buf, size_t len) {
  int at = snprintf(buf, len, "(");
  for (int d = 0; d < ndim && at > 0 && (size_t)at < len; ++d)
    at += snprintf(buf + at, len - (size_t)at, d ? ",%" PRId64 : "%" PRId64, shape[d]);
  if (at > 0 && (size_t)at < len) snprintf(buf + at, len - (size_t)at, ndim == 1 ? ",)" : ")");
  return buf;
}

/* The broadcast shape of `n` shapes into out (ndim *out_ndim), NumPy's rule. */
static int broadcast(int n, const int *ndim, const int64_t (*shape)[MT_MAX_NDIM],
                     int *out_ndim, int64_t *out, mt_error *err) {
  int nd = 0;
  for (int i = 0; i < n; ++i) nd = ndim[i] > nd ? ndim[i] : nd;
  for (int o = 0; o < nd; ++o) out[o] = 1;
  for (int i = 0; i < n; ++i) {
    for (int d = 0; d < ndim[i]; ++d) {
      int o = nd - ndim[i] + d;
      int64_t s = shape[i][d];
      if (s == out[o] || s == 1) continue;
      if (out[o] == 1) {
        out[o] = s;
        continue;
      }
      char a[160], b[160];
      return mt__fail(err, MT_EINVAL, "operands could not be broadcast together with "
                      "shapes %s %s", shape_text(ndim[0], shape[0], a, sizeof a),
                      shape_text(ndim[i], shape[i], b, sizeof b));
    }
  }
  *out_ndim = nd;
  return MT_OK;
}

/* Input i labelled by the output dims it aligns with; broadcast dims marked. */
static void align(mt_dimmap *map, int i, int ndim, const int64_t *shape, int first,
                  const int64_t *out_shape) {
  map->in_ndim[i] = ndim;
  for (int d = 0; d < ndim; ++d) {
    map->in_labels[i][d] = first + d;
    if (shape[d] == 1 && out_shape[first + d] != 1) map->in_bcast[i] |= 1u << d;
  }
}

/* The partial rule of an elementwise op for the operands that are tensors. */
static void elementwise_rule(mt_dimmap *map, int kind, int noperands, uint32_t tensors) {
  int all = tensors == (noperands >= 32 ? 0xffffffffu : (1u << noperands) - 1u);
  int one = map->ninputs == 1;
  switch (kind) {
    case MT_ELEMENTWISE_ADD:
      map->partial_rule = !all ? MT_PARTIAL_NONE
                          : one ? MT_PARTIAL_LINEAR_ALL
                                : MT_PARTIAL_ADDITIVE;
      break;
    case MT_ELEMENTWISE_MUL:
      map->partial_rule = one ? MT_PARTIAL_LINEAR_ALL : MT_PARTIAL_LINEAR_ONE;
      map->partial_inputs = one ? 0 : (1u << map->ninputs) - 1u;
      break;
    case MT_ELEMENTWISE_DIV:
      map->partial_rule = !bit(tensors, 0) ? MT_PARTIAL_NONE
                          : one            ? MT_PARTIAL_LINEAR_ALL
                                           : MT_PARTIAL_LINEAR_ONE;
      map->partial_inputs = one ? 0 : 1u;
      break;
    case MT_ELEMENTWISE_MAX:
    case MT_ELEMENTWISE_MIN:
      map->partial_rule = all && !one ? MT_PARTIAL_MONOTONE : MT_PARTIAL_SAME_OP;
      map->partial_ops = 1u << (kind == MT_ELEMENTWISE_MAX ? MT_REDUCE_MAX : MT_REDUCE_MIN);
      break;
    case MT_ELEMENTWISE_NEG:
      map->partial_rule = all && one ? MT_PARTIAL_NEGATE : MT_PARTIAL_NONE;
      break;
    case MT_ELEMENTWISE_INCREASING:
      map->partial_rule = all && one ? MT_PARTIAL_SAME_OP : MT_PARTIAL_NONE;
      map->partial_ops = all && one ? (1u << MT_REDUCE_MAX) | (1u << MT_REDUCE_MIN) : 0;
      break;
    default:
      map->partial_rule = MT_PARTIAL_NONE;
  }
}

int mt_dimmap_elementwise(int kind, int noperands, uint32_t tensors, const int *ndim,
                          const int64_t (*shape)[MT_MAX_NDIM], mt_dimmap *out,
                          mt_error *err) {
  if (kind < 0 || kind >= MT_ELEMENTWISE_COUNT)
    return mt__fail(err, MT_EINVAL, "Unknown elementwise kind %d", kind);
  if (noperands < 1 || noperands > MT_PROP_MAX_INPUTS || tensors == 0 ||
      (tensors >> noperands) != 0)
    return mt__fail(err, MT_EINVAL, "An elementwise op of 1 to %d operands, at least one "
                    "a tensor, was expected", MT_PROP_MAX_INPUTS);
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = popcount(tensors);
  for (int i = 0; i < map.ninputs; ++i) {
    if (ndim[i] < 0 || ndim[i] > MT_MAX_NDIM)
      return mt__fail(err, MT_EINVAL, "Input %d has %d dims", i, ndim[i]);
  }
  int64_t out_shape[MT_MAX_NDIM];
  int rc = broadcast(map.ninputs, ndim, shape, &map.out_ndim, out_shape, err);
  if (rc != MT_OK) return rc;
  map.nlabels = map.out_ndim;
  for (int o = 0; o < map.out_ndim; ++o) map.out_labels[o] = o;
  for (int i = 0; i < map.ninputs; ++i)
    align(&map, i, ndim[i], shape[i], map.out_ndim - ndim[i], out_shape);
  elementwise_rule(&map, kind, noperands, tensors);
  *out = map;
  return MT_OK;
}

/* A new label of `kind`; returns it. */
static int new_label(mt_dimmap *map, int kind) {
  map->label_kind[map->nlabels] = kind;
  return map->nlabels++;
}

/* The batch dims of a matmul operand (all but its last two, none for 1-D). */
static int batch_ndim(int ndim) { return ndim >= 2 ? ndim - 2 : 0; }

/* The broadcast batch shape of both operands into map's first labels. */
static int matmul_batch(mt_dimmap *map, const int *nd, const int64_t (*sh)[MT_MAX_NDIM],
                        int64_t *batch, mt_error *err) {
  int nb = 0;
  int rc = broadcast(2, nd, sh, &nb, batch, err);
  if (rc != MT_OK) return rc;
  for (int b = 0; b < nb; ++b) new_label(map, MT_LABEL_KEEP);
  for (int t = 0; t < 2; ++t) align(map, t, nd[t], sh[t], nb - nd[t], batch);
  return MT_OK;
}

int mt_dimmap_matmul(int a_ndim, const int64_t *a_shape, int b_ndim,
                     const int64_t *b_shape, int transpose_b, mt_dimmap *out,
                     mt_error *err) {
  if (a_ndim < 1 || b_ndim < 1 || a_ndim > MT_MAX_NDIM || b_ndim > MT_MAX_NDIM)
    return mt__fail(err, MT_EINVAL, "operands must have at least one dim (scalars: use *)");
  if (transpose_b && b_ndim != 2)
    return mt__fail(err, MT_EINVAL, "a @ b.T needs a 2-D b, got %d dims", b_ndim);
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = 2;
  const int nd[2] = {batch_ndim(a_ndim), batch_ndim(b_ndim)};
  int64_t sh[2][MT_MAX_NDIM] = {{0}}, batch[MT_MAX_NDIM];
  memcpy(sh[0], a_shape, (size_t)nd[0] * sizeof(int64_t));
  memcpy(sh[1], b_shape, (size_t)nd[1] * sizeof(int64_t));
  int rc = matmul_batch(&map, nd, (const int64_t(*)[MT_MAX_NDIM])sh, batch, err);
  if (rc != MT_OK) return rc;
  int nb = map.nlabels, k = new_label(&map, MT_LABEL_CONTRACT);
  int i = a_ndim >= 2 ? new_label(&map, MT_LABEL_KEEP) : -1;
  int j = b_ndim >= 2 ? new_label(&map, MT_LABEL_KEEP) : -1;
  int *la = &map.in_labels[0][nd[0]], *lb = &map.in_labels[1][nd[1]];
  if (i >= 0) *la++ = i;
  *la = k;
  if (j < 0) lb[0] = k;
  else if (transpose_b) lb[0] = j, lb[1] = k;
  else lb[0] = k, lb[1] = j;
  map.in_ndim[0] = a_ndim, map.in_ndim[1] = b_ndim;
  for (int b = 0; b < nb; ++b) map.out_labels[map.out_ndim++] = b;
  if (i >= 0) map.out_labels[map.out_ndim++] = i;
  if (j >= 0) map.out_labels[map.out_ndim++] = j;
  map.partial_rule = MT_PARTIAL_LINEAR_ONE;
  map.partial_inputs = 3u;
  *out = map;
  return MT_OK;
}

/* Complex values have no order: nothing keeps a Partial(max|min) through a
 * monotone op of them (negative keeps its linear rule). */
static void unordered(mt_dimmap *map) {
  if (map->partial_rule == MT_PARTIAL_NEGATE) map->partial_rule = MT_PARTIAL_LINEAR_ALL;
  if (map->partial_rule == MT_PARTIAL_SAME_OP && map->ninputs == 1 &&
      map->partial_ops == ((1u << MT_REDUCE_MAX) | (1u << MT_REDUCE_MIN)))
    map->partial_rule = MT_PARTIAL_NONE, map->partial_ops = 0;
}

/* Max and min of complex values have no order, so they do not combine; those of
 * bool values are not combined here either (their reduced dims are made whole).
 * All and any (`logical`) combine their bool results whatever the input's dtype. */
static int combinable(int op, int dtype, int logical) {
  if (logical || (op != MT_REDUCE_MAX && op != MT_REDUCE_MIN)) return op >= 0;
  return dtype != MT_DTYPE_BOOL && dtype != MT_DTYPE_COMPLEX64 &&
         dtype != MT_DTYPE_COMPLEX128;
}

int mt_dimmap_reduction(const mt_reduction_rule *rule, int ndim, uint32_t axes,
                        int keepdims, int dtype, mt_dimmap *out, mt_error *err) {
  if (rule == NULL || ndim < 0 || ndim > MT_MAX_NDIM || (axes >> ndim) != 0)
    return mt__fail(err, MT_EINVAL, "A reduction of a 0- to %d-d input over its own "
                    "dims was expected", MT_MAX_NDIM);
  int op = combinable(rule->reduce_op, dtype, rule->logical) ? rule->reduce_op : -1;
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = 1, map.in_ndim[0] = ndim, map.nlabels = ndim;
  for (int d = 0; d < ndim; ++d) {
    map.in_labels[0][d] = d;
    if (!bit(axes, d)) continue;
    map.label_kind[d] = op < 0 ? MT_LABEL_REPLICATE : MT_LABEL_REDUCE;
    map.label_reduce_op[d] = op < 0 ? 0 : op;
    if (op >= 0 && rule->even_only) map.even_only |= 1u << d;
    if (op >= 0 && rule->logical) map.empty_identity |= 1u << d;
  }
  for (int d = 0; d < ndim; ++d) {
    if (!bit(axes, d)) {
      map.out_labels[map.out_ndim++] = d;
    } else if (keepdims) {
      int l = new_label(&map, MT_LABEL_REPLICATE);
      map.sized_labels |= 1u << l;
      map.label_size[l] = 1;
      map.out_labels[map.out_ndim++] = l;
    }
  }
  map.partial_rule = op < 0 ? MT_PARTIAL_NONE : rule->partial_rule;
  map.partial_ops = op < 0 ? 0 : rule->partial_ops;
  *out = map;
  return MT_OK;
}

int mt_dimmap_join(int ninputs, const int *ndim, const int64_t (*shape)[MT_MAX_NDIM],
                   int axis, mt_dimmap *out, mt_error *err) {
  if (ninputs < 1 || ninputs > MT_PROP_MAX_INPUTS)
    return mt__fail(err, MT_EINVAL, "a join takes 1 to %d inputs, got %d", MT_PROP_MAX_INPUTS,
                    ninputs);
  const int n = ndim[0];
  if (n < 1 || n > MT_MAX_NDIM || n + ninputs > MT_PROP_MAX_LABELS || axis < 0 || axis >= n)
    return mt__fail(err, MT_EINVAL, "cannot join %d-dim inputs along axis %d", n, axis);
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = ninputs, map.out_ndim = n, map.nlabels = n + ninputs;
  for (int k = 0; k < n; ++k) {
    map.out_labels[k] = k;
    map.label_kind[k] = k == axis ? MT_LABEL_REPLICATE : MT_LABEL_KEEP;
  }
  int64_t total = 0;
  for (int t = 0; t < ninputs; ++t) {
    if (ndim[t] != n)
      return mt__fail(err, MT_EINVAL, "all the input arrays must have the same number of "
                      "dimensions");
    for (int k = 0; k < n; ++k) {
      if (k != axis && shape[t][k] != shape[0][k])
        return mt__fail(err, MT_EINVAL, "all the input array dimensions except for the "
                        "concatenation axis must match exactly");
      map.in_labels[t][k] = k == axis ? n + t : k;
    }
    map.in_ndim[t] = n;
    map.label_kind[n + t] = MT_LABEL_REPLICATE;
    total += shape[t][axis];
  }
  map.partial_rule = MT_PARTIAL_ADDITIVE;
  map.sized_labels = 1u << axis, map.label_size[axis] = total;
  int rc = mt_dimmap_check(&map, err);
  if (rc == MT_OK) *out = map;
  return rc;
}

int mt_dimmap_stack(int ninputs, const int *ndim, const int64_t (*shape)[MT_MAX_NDIM],
                    int axis, mt_dimmap *out, mt_error *err) {
  if (ninputs < 1 || ninputs > MT_PROP_MAX_INPUTS)
    return mt__fail(err, MT_EINVAL, "a stack takes 1 to %d inputs, got %d",
                    MT_PROP_MAX_INPUTS, ninputs);
  const int n = ndim[0];
  if (n < 0 || n >= MT_MAX_NDIM || axis < 0 || axis > n)
    return mt__fail(err, MT_EINVAL, "cannot stack %d-dim inputs along a new axis %d", n, axis);
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = ninputs, map.out_ndim = n + 1, map.nlabels = n + 1;
  for (int t = 0; t < ninputs; ++t) {
    int same = ndim[t] == n;
    for (int k = 0; same && k < n; ++k) same = shape[t][k] == shape[0][k];
    if (!same) return mt__fail(err, MT_EINVAL, "all input arrays must have the same shape");
    map.in_ndim[t] = n;
    for (int k = 0; k < n; ++k) map.in_labels[t][k] = k;
  }
  for (int k = 0; k <= n; ++k) map.out_labels[k] = k < axis ? k : k == axis ? n : k - 1;
  map.label_kind[n] = MT_LABEL_REPLICATE;
  map.partial_rule = MT_PARTIAL_ADDITIVE;
  map.sized_labels = 1u << n, map.label_size[n] = ninputs;
  int rc = mt_dimmap_check(&map, err);
  if (rc == MT_OK) *out = map;
  return rc;
}

int mt_dimmap_lanes(int ndim, const int64_t *shape, int axis, int64_t shorten,
                    mt_dimmap *out, mt_error *err) {
  if (ndim < 1 || ndim >= MT_MAX_NDIM || axis < 0 || axis >= ndim || shorten < 0)
    return mt__fail(err, MT_EINVAL, "cannot work along axis %d of a %d-dim input, %lld "
                    "shorter", axis, ndim, (long long)shorten);
  mt_dimmap map;
  memset(&map, 0, sizeof map);
  map.ninputs = 1, map.in_ndim[0] = ndim, map.out_ndim = ndim, map.nlabels = ndim + 1;
  for (int k = 0; k < ndim; ++k) {
    map.in_labels[0][k] = k;
    map.out_labels[k] = k == axis ? ndim : k;
  }
  map.label_kind[axis] = MT_LABEL_REPLICATE;
  map.label_kind[ndim] = MT_LABEL_REPLICATE;
  map.sized_labels = 1u << ndim;
  map.label_size[ndim] = shape[axis] > shorten ? shape[axis] - shorten : 0;
  map.partial_rule = MT_PARTIAL_NONE;
  int rc = mt_dimmap_check(&map, err);
  if (rc == MT_OK) *out = map;
  return rc;
}

/* The one dim of a join's, a stack's or a lanes op's `axes`, or -1. */
static int one_axis(uint32_t axes) {
  for (int axis = 0; axis < MT_MAX_NDIM; ++axis)
    if (axes == 1u << axis) return axis;
  return -1;
}

int mt_op_dimmap(const mt_op_sig *sig, const mt_op_args *args, const mt_prop_inputs *in,
                 int dtype, mt_dimmap *out, mt_error *err) {
  const int n = in->ninputs;
  switch (sig->family) {
    case MT_OP_ELEMENTWISE: {
      int rc = mt_dimmap_elementwise(sig->kind, args->noperands, args->tensors, in->ndim,
                                     (const int64_t(*)[MT_MAX_NDIM])in->shape, out, err);
      if (rc == MT_OK && (dtype == MT_DTYPE_COMPLEX64 || dtype == MT_DTYPE_COMPLEX128))
        unordered(out);
      return rc;
    }
    case MT_OP_MATMUL:
      if (n != 2)
        return mt__fail(err, MT_EINVAL, "takes two DTensors; for a scalar factor use *");
      return mt_dimmap_matmul(in->ndim[0], in->shape[0], in->ndim[1], in->shape[1], 0, out,
                              err);
    case MT_OP_REDUCTION:
      if (n != 1) return mt__fail(err, MT_EINVAL, "a reduction takes one tensor");
      return mt_dimmap_reduction(&sig->rule, in->ndim[0], args->axes, args->keepdims, dtype,
                                 out, err);
    case MT_OP_JOIN:
    case MT_OP_STACK:
    case MT_OP_LANES: {
      int axis = one_axis(args->axes);
      if (axis < 0) return mt__fail(err, MT_EINVAL, "a join, a stack or a lanes op has one axis");
      const int64_t(*shape)[MT_MAX_NDIM] = (const int64_t(*)[MT_MAX_NDIM])in->shape;
      if (sig->family == MT_OP_LANES) {
        if (n != 1) return mt__fail(err, MT_EINVAL, "a lanes op takes one tensor");
        return mt_dimmap_lanes(in->ndim[0], shape[0], axis, args->shorten, out, err);
      }
      return sig->family == MT_OP_JOIN ? mt_dimmap_join(n, in->ndim, shape, axis, out, err)
                                       : mt_dimmap_stack(n, in->ndim, shape, axis, out, err);
    }
    default:
      return mt__fail(err, MT_EINVAL, "Unknown operation family %d", sig->family);
  }
}

/* The NumPy kind of an mt_dtype code: 'b', 'i', 'u', 'f' (bfloat16 too), 'c', or
 * 0 for a code the core does not know. */
static char kind_of(int dtype) {
  switch (dtype) {
    case MT_DTYPE_BOOL: return 'b';
    case MT_DTYPE_INT8:
    case MT_DTYPE_INT16:
    case MT_DTYPE_INT32:
    case MT_DTYPE_INT64: return 'i';
    case MT_DTYPE_UINT8:
    case MT_DTYPE_UINT16:
    case MT_DTYPE_UINT32:
    case MT_DTYPE_UINT64: return 'u';
    case MT_DTYPE_FLOAT16:
    case MT_DTYPE_FLOAT32:
    case MT_DTYPE_FLOAT64:
    case MT_DTYPE_BFLOAT16: return 'f';
    case MT_DTYPE_COMPLEX64:
    case MT_DTYPE_COMPLEX128: return 'c';
    default: return 0;
  }
}

static int inexact(char kind) { return kind == 'f' || kind == 'c'; }
static int integral(char kind) { return kind == 'i' || kind == 'u'; }

/* Whether float or complex dtype `out` holds the range and precision of `in`
 * (of its real part, for a complex `in` cast to a float), so that casting the
 * parts of a sum rounds them at most: a narrower one would overflow where their
 * sum does not. */
static int widens(int in, int out) {
  size_t a = mt_dtype_size(in) / (kind_of(in) == 'c' ? 2 : 1);
  size_t b = mt_dtype_size(out) / (kind_of(out) == 'c' ? 2 : 1);
  int half = in == MT_DTYPE_FLOAT16 || out == MT_DTYPE_FLOAT16;
  int brain = in == MT_DTYPE_BFLOAT16 || out == MT_DTYPE_BFLOAT16;
  return b > a || (b == a && !(half && brain));
}

/* Whether every value of integer dtype `in` is one of integer dtype `out`. */
static int holds(int in, int out) {
  size_t a = mt_dtype_size(in), b = mt_dtype_size(out);
  char ka = kind_of(in), kb = kind_of(out);
  return ka == kb ? b >= a : ka == 'u' && b > a;
}

int mt_partial_exact(int op, int in, int out, int arithmetic) {
  if (kind_of(in) == 0 || kind_of(out) == 0) return in == out;
  char a = kind_of(in), b = kind_of(out);
  switch (op) {
    case MT_REDUCE_SUM:
    case MT_REDUCE_PRODUCT:
      if (in == out || (inexact(a) && inexact(b) && widens(in, out))) return 1;
      return integral(a) && integral(b) && mt_dtype_size(out) <= mt_dtype_size(in);
    case MT_REDUCE_AVG: return inexact(a) && inexact(b) && widens(in, out);
    case MT_REDUCE_MAX:
    case MT_REDUCE_MIN:
      if (arithmetic) return b == 'f';
      return in == out || a == 'b' || (b == 'f' && a != 'c') ||
             (integral(a) && integral(b) && holds(in, out));
    default: return 0;
  }
}

/* Whether shards' averages in `dtype` average to NumPy's mean: not integers, each
 * shard's mean would be rounded first. */
static int averages(int dtype) { return dtype < 0 || inexact(kind_of(dtype)); }

void mt_dimmap_dtypes(mt_dimmap *map, const int *in_dtypes, int out_dtype) {
  int arithmetic = map->partial_rule == MT_PARTIAL_NEGATE ||
                   map->partial_rule == MT_PARTIAL_ADDITIVE;
  for (int l = 0; l < map->nlabels && !averages(out_dtype); ++l) {
    if (map->label_kind[l] == MT_LABEL_REDUCE &&
        map->label_reduce_op[l] == MT_REDUCE_AVG)
      map->label_kind[l] = MT_LABEL_REPLICATE;
  }
  for (int i = 0; i < map->ninputs; ++i) {
    int out = out_dtype < 0 ? in_dtypes[i] : out_dtype;
    map->reduce_first[i] = 0;
    for (int op = 0; op < MT_REDUCE_COUNT; ++op) {
      if (!mt_partial_exact(op, in_dtypes[i], out, arithmetic))
        map->reduce_first[i] |= 1u << op;
    }
  }
}
