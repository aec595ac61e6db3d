/* Redistribution and distribute_tensor over MPI_COMM_WORLD at whatever size mpiexec
 * gave. Every plan between random and fixed layouts, run blocking, nonblocking and
 * with two requests in flight, must leave each rank exactly its box of labelled
 * data; the counters must agree with the plan step by step; bad input must fail on
 * every rank before any communication; slices must run their exchanges and give
 * their communicators back.
 *
 * Partial sources are built so that every order of reduction yields the label (see
 * src_value), which lets one exact comparison check layouts with several Partial
 * mesh dims, kept or reduced. `test_redistribute --quick` runs fewer random cases,
 * for valgrind. */
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/comm/distribute.h"
#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/redistribute.h"
#include "mpitensor/core/dtype.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/pack.h"
#include "mpitensor/core/plan.h"

static int world_rank, world_size;
static int quick = 0;
/* How many ALLREDUCE_NODES steps the plans run so far held. */
static int nodes_steps = 0;

/* What every mesh of the test counts into. */
static mt_comm_counters test_counters;

/* ---- Placements, layouts and meshes. ---------------------------------------- */

static mt_placement R(void) {
  return (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0, 0};
}
static mt_placement S(int dim) {
  return (mt_placement){MT_PLACEMENT_SHARD, dim, 0, 0};
}
static mt_placement P(int op) {
  return (mt_placement){MT_PLACEMENT_PARTIAL, 0, op, 0};
}

static int is_partial(const mt_layout* l, int m) {
  return l->placements[m].kind == MT_PLACEMENT_PARTIAL;
}

/* Parses "S0,Ps,R" (Ps sum, Pa avg, Pm max, Pn min, Pp product) into placements. */
static int parse(const char* s, mt_placement* out) {
  int n = 0;
  for (; *s != '\0'; ++s) {
    if (*s == 'R') out[n++] = R();
    if (*s == 'S') out[n++] = S(*++s - '0');
    if (*s != 'P') continue;
    const char* ops = "sapmn"; /* in mt_reduce_op order */
    out[n++] = P((int)(strchr(ops, *++s) - ops));
  }
  return n;
}

static mt_layout make_layout(int ndim, const int64_t* shape, int mesh_ndim,
                             const int64_t* mesh_shape, const mt_placement* pl) {
  mt_layout l;
  mt_error err = {0};
  memset(&l, 0, sizeof l);
  int rc = mt_layout_init(&l, ndim, shape, mesh_ndim, mesh_shape, pl, &err);
  CHECK_MSG(rc == MT_OK, "layout: %s", err.msg);
  return l;
}

static mt_layout parse_layout(int ndim, const int64_t* shape, const int64_t* mesh_shape,
                              const char* text) {
  mt_placement pl[MT_MAX_MESH_NDIM];
  int mesh_ndim = parse(text, pl);
  return make_layout(ndim, shape, mesh_ndim, mesh_shape, pl);
}

/* A mesh over the first `n` world ranks in order, or in reverse order. */
static mt_mesh* make_mesh(int ndim, const int64_t* shape, int reversed) {
  int ranks[64];
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  for (int i = 0; i < n; ++i) ranks[i] = reversed ? (int)n - 1 - i : i;
  mt_mesh* mesh = NULL;
  mt_error err = {0};
  int rc = mt_mesh_create(MPI_COMM_WORLD, ndim, shape, ranks, &mesh, &err);
  CHECK_MSG(rc == MT_OK, "mesh: %s", err.msg);
  if (mesh != NULL) mt_mesh_set_counters(mesh, &test_counters);
  return mesh;
}

/* The mesh shapes whose size is the world size: 1-D, and every ordered
 * factorisation into 2 or 3 dims (size-1 dims included). Returns how many. */
static int mesh_shapes(int64_t shapes[][3], int* ndims) {
  int n = 0, w = world_size;
  shapes[n][0] = w, ndims[n++] = 1;
  for (int a = 1; a <= w; ++a) {
    if (w % a != 0) continue;
    shapes[n][0] = a, shapes[n][1] = w / a, ndims[n++] = 2;
    for (int b = 1; b <= w / a; ++b) {
      if ((w / a) % b != 0) continue;
      shapes[n][0] = a, shapes[n][1] = b, shapes[n][2] = w / a / b, ndims[n++] = 3;
    }
  }
  return n;
}

/* ---- Deterministic randomness: the same sequence on every rank. -------------- */

static uint64_t rng_state = 0x243F6A8885A308D3u;

static int rnd(int n) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15u);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
  return (int)((z ^ (z >> 31)) % (uint64_t)n);
}

/* ---- Descriptions for failure messages. --------------------------------------- */

static void append(char* buf, size_t len, const char* fmt, ...) {
  size_t used = strlen(buf);
  if (used >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, len - used, fmt, ap);
  va_end(ap);
}

static void append_placements(char* buf, size_t len, const mt_layout* l) {
  static const char* const ops[MT_REDUCE_COUNT] = {"sum", "avg", "product", "max",
                                                   "min"};
  append(buf, len, "[");
  for (int m = 0; m < l->mesh_ndim; ++m) {
    const mt_placement* p = &l->placements[m];
    const char* sep = m + 1 < l->mesh_ndim ? "," : "";
    if (p->kind == MT_PLACEMENT_SHARD) append(buf, len, "S(%d)%s", p->dim, sep);
    if (p->kind == MT_PLACEMENT_PARTIAL)
      append(buf, len, "P(%s)%s", ops[p->reduce_op], sep);
    if (p->kind == MT_PLACEMENT_REPLICATE) append(buf, len, "R%s", sep);
  }
  append(buf, len, "]");
}

/* "float32 shape (3,4) mesh (2,2) [S(0),P(sum)] -> [R,S(1)]". */
static void describe(char* buf, size_t len, const mt_layout* src, const mt_layout* dst,
                     int dtype) {
  buf[0] = '\0';
  append(buf, len, "%s shape (", mt_dtype_name(dtype));
  for (int d = 0; d < src->ndim; ++d)
    append(buf, len, d ? ",%lld" : "%lld", (long long)src->shape[d]);
  append(buf, len, ") mesh (");
  for (int m = 0; m < src->mesh_ndim; ++m) {
    append(buf, len, m ? ",%lld" : "%lld", (long long)src->mesh_shape[m]);
  }
  append(buf, len, ") ");
  append_placements(buf, len, src);
  if (dst == NULL) return;
  append(buf, len, " -> ");
  append_placements(buf, len, dst);
}

/* ---- Byte counters, checked once for many calls. ------------------------------ */

/* What one call counted on this rank and what the whole job should have counted. */
typedef struct record {
  int64_t got[MT_COLL_COUNT];
  int64_t want[MT_COLL_COUNT];
  char what[192];
} record;

static record* records;
static int nrecords, records_cap;

static void add_record(const mt_comm_totals* before, const mt_comm_totals* after,
                       const int64_t* want, const char* what) {
  if (nrecords == records_cap) {
    records_cap = records_cap ? 2 * records_cap : 256;
    records = realloc(records, (size_t)records_cap * sizeof *records);
  }
  record* r = &records[nrecords++];
  for (int k = 0; k < MT_COLL_COUNT; ++k) {
    r->got[k] = after->bytes[k] - before->bytes[k];
    r->want[k] = want[k];
  }
  snprintf(r->what, sizeof r->what, "%s", what);
}

/* Sums every record's bytes over all ranks (one MPI_Allreduce) and compares. Every
 * rank records the same calls in the same order, so the records line up. */
static void flush_records(void) {
  int64_t n = (int64_t)nrecords * MT_COLL_COUNT;
  int64_t *got = malloc((size_t)n * sizeof *got + 1),
          *sum = malloc((size_t)n * sizeof *sum + 1);
  for (int i = 0; i < nrecords; ++i)
    memcpy(got + i * MT_COLL_COUNT, records[i].got, sizeof records[i].got);
  MPI_Allreduce(got, sum, (int)n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < nrecords; ++i) {
    for (int k = 0; k < MT_COLL_COUNT; ++k) {
      int64_t g = sum[i * MT_COLL_COUNT + k], w = records[i].want[k];
      CHECK_MSG(g == w, "%s: %s bytes summed over ranks %lld, expected %lld",
                records[i].what, mt_coll_name(k), (long long)g, (long long)w);
    }
  }
  free(got);
  free(sum);
  nrecords = 0;
}

/* The counter kind of a plan step, or -1 for a chunk (no communication). */
static int coll_of(int kind) {
  switch (kind) {
    case MT_STEP_ALLGATHER:
      return MT_COLL_ALL_GATHER;
    case MT_STEP_ALLTOALL:
    case MT_STEP_DIRECT:
      return MT_COLL_ALL_TO_ALL;
    case MT_STEP_ALLREDUCE:
    case MT_STEP_ALLREDUCE_NODES:
      return MT_COLL_ALL_REDUCE;
    case MT_STEP_REDUCE_SCATTER:
      return MT_COLL_REDUCE_SCATTER;
    default:
      return -1;
  }
}

/* How many disjoint copies of a step's mesh cover the world: a slice runs the
 * same plan on each of its sibling slices at once. */
static int64_t copies(const mt_step* s) {
  int64_t n = 1;
  for (int m = 0; m < s->src.mesh_ndim; ++m) n *= s->src.mesh_shape[m];
  return world_size / n;
}

/* Off while a plan runs on elements of another size than it was planned for: its
 * step bytes then count the planned size, the counters the moved one. */
static int plan_counts_bytes = 1;

/* Calls on this rank must equal `times` runs of the plan's steps of each kind;
 * bytes are recorded against the plan's step bytes for flush_records. */
static void check_counters(const mt_plan* plan, int times, const mt_comm_totals* before,
                           const mt_comm_totals* after, const char* what) {
  int64_t calls[MT_COLL_COUNT] = {0}, bytes[MT_COLL_COUNT] = {0}, total = 0;
  for (int i = 0; i < mt_plan_nsteps(plan); ++i) {
    const mt_step* s = mt_plan_step(plan, i);
    int k = coll_of(s->kind);
    if (k < 0) continue;
    calls[k] += times, bytes[k] += times * copies(s) * s->bytes, total += s->bytes;
  }
  CHECK_MSG(total == mt_plan_bytes(plan), "%s: step bytes %lld, plan bytes %lld", what,
            (long long)total, (long long)mt_plan_bytes(plan));
  for (int k = 0; k < MT_COLL_COUNT; ++k) {
    int64_t got = after->calls[k] - before->calls[k];
    CHECK_MSG(got == calls[k], "%s: %lld %s calls, expected %lld", what, (long long)got,
              mt_coll_name(k), (long long)calls[k]);
  }
  if (plan_counts_bytes) add_record(before, after, bytes, what);
}

/* ---- Labelled values. ----------------------------------------------------------- */

/* 8- and 16-bit integers: Partial(sum) only, where sums must wrap. */
static int is_narrow(int dtype) {
  return dtype == MT_DTYPE_INT8 || dtype == MT_DTYPE_UINT8 || dtype == MT_DTYPE_INT16 ||
         dtype == MT_DTYPE_UINT16;
}

/* The label of global element i: its flat index, scaled so that narrow integers
 * wrap when it is stored, or folded to 0/1 for bool. */
static int64_t label(int dtype, int64_t i) {
  if (dtype == MT_DTYPE_BOOL) return i % 3 != 1;
  if (is_narrow(dtype)) return i * (mt_dtype_size(dtype) == 1 ? 37 : 997);
  return i;
}

/* Stores an integer value as an element of `dtype` (complex: re + im i). */
static void put_raw(int dtype, char* p, int64_t re, int64_t im) {
  uint8_t b = (uint8_t)(dtype == MT_DTYPE_BOOL ? re != 0 : re & 0xff);
  uint16_t u16 = (uint16_t)(re & 0xffff);
  int32_t i32 = (int32_t)re;
  uint16_t h = mt_float_to_half((float)re);
  float f = (float)re;
  double z[2] = {(double)re, (double)im};
  switch (dtype) {
    case MT_DTYPE_BOOL:
    case MT_DTYPE_INT8:
    case MT_DTYPE_UINT8:
      memcpy(p, &b, 1);
      break;
    case MT_DTYPE_INT16:
    case MT_DTYPE_UINT16:
      memcpy(p, &u16, 2);
      break;
    case MT_DTYPE_INT32:
      memcpy(p, &i32, 4);
      break;
    case MT_DTYPE_INT64:
      memcpy(p, &re, 8);
      break;
    case MT_DTYPE_FLOAT16:
      memcpy(p, &h, 2);
      break;
    case MT_DTYPE_FLOAT32:
      memcpy(p, &f, 4);
      break;
    case MT_DTYPE_FLOAT64:
      memcpy(p, z, 8);
      break;
    case MT_DTYPE_COMPLEX128:
      memcpy(p, z, 16);
      break;
    default:
      CHECK_MSG(0, "the test does not store %s", mt_dtype_name(dtype));
  }
}

/* Complex values carry -2 v as imaginary part, so both halves are checked. */
static void put(int dtype, char* p, int64_t v) {
  put_raw(dtype, p, v, -2 * v);
}

/* How the source values of one case are built. On a reduced Partial(sum) dim the
 * rank at coordinate 0 holds the label and the others 0, plus `split` terms that
 * sum to zero over the dim (so narrow integer sums wrap and others carry signs). On a
 * reduced Partial(max) dim the others hold `low`, below any real value; Partial(avg)
 * dims hold the same everywhere. A rank off coordinate 0 on a reduced max dim holds
 * `low` whatever its other coordinates, so reductions in any order give the
 * label. A kept Partial dim adds its coordinate times (2m + 1): reductions move it
 * unchanged except that each reduced sum dim multiplies it by its size. */
typedef struct model {
  const mt_layout* src;
  const mt_layout* dst;
  int64_t split;
  int64_t low;
  int64_t unit; /* 0 for bool, whose values cannot carry offsets */
} model;

static int reduced(const model* md, int m, int op) {
  return is_partial(md->src, m) && !is_partial(md->dst, m) &&
         md->src->placements[m].reduce_op == op;
}

static model make_model(const mt_layout* src, const mt_layout* dst, int dtype) {
  model md = {src, dst, 0, 0, dtype != MT_DTYPE_BOOL};
  int has_max = 0;
  for (int m = 0; m < src->mesh_ndim; ++m) has_max |= reduced(&md, m, MT_REDUCE_MAX);
  switch (dtype) {
    case MT_DTYPE_INT8:
    case MT_DTYPE_UINT8:
      md.split = 100;
      break;
    case MT_DTYPE_INT16:
    case MT_DTYPE_UINT16:
      md.split = 20000;
      break;
    case MT_DTYPE_INT32:
      md.split = 1000, md.low = -1000000;
      break;
    case MT_DTYPE_INT64:
      md.split = (int64_t)1 << 35, md.low = -((int64_t)1 << 40);
      break;
    case MT_DTYPE_FLOAT16:
      md.split = 1, md.low = -1;
      break;
    case MT_DTYPE_FLOAT32:
    case MT_DTYPE_FLOAT64:
    case MT_DTYPE_COMPLEX128:
      md.split = 3, md.low = -1000;
      break;
    default:
      break;
  }
  if (has_max) md.split = 0;
  return md;
}

/* The value the rank at `coord` holds in its source buffer for label L. Reduced
 * Partial(product) dims hold 1 off coordinate 0; cases with one have no other
 * Partial dim, since products and sums do not commute. */
static int64_t src_value(const model* md, const int64_t* coord, int64_t L) {
  int zeroed = 0, low = 0, ones = 0;
  int64_t split = 0, off = 0;
  for (int m = 0; m < md->src->mesh_ndim; ++m) {
    int64_t c = coord[m], g = md->src->mesh_shape[m];
    if (!is_partial(md->src, m)) continue;
    if (is_partial(md->dst, m)) off += c * (2 * m + 1);
    if (reduced(md, m, MT_REDUCE_SUM))
      zeroed |= c != 0, split += md->split * (c ? 1 : 1 - g);
    if (reduced(md, m, MT_REDUCE_MAX)) low |= c != 0;
    if (reduced(md, m, MT_REDUCE_PRODUCT)) ones |= c != 0;
  }
  off *= md->unit;
  if (ones) return 1;
  if (low) return md->low + off;
  return (zeroed ? 0 : L) + split + off;
}

/* The value the rank at `coord` must hold in its target buffer for label L. */
static int64_t dst_value(const model* md, const int64_t* coord, int64_t L) {
  int64_t off = 0, scale = 1;
  for (int m = 0; m < md->src->mesh_ndim; ++m) {
    if (is_partial(md->dst, m)) off += coord[m] * (2 * m + 1);
    if (reduced(md, m, MT_REDUCE_SUM)) scale *= md->src->mesh_shape[m];
  }
  return L + off * md->unit * scale;
}

/* The global flat index of local element e of `box` in a tensor of shape `gshape`. */
static int64_t global_index(const mt_box* box, const int64_t* gshape, int64_t e) {
  int64_t flat = 0, stride = 1;
  for (int d = box->ndim - 1; d >= 0; --d) {
    int64_t j = e % box->shape[d];
    e /= box->shape[d];
    flat += (box->offset[d] + j) * stride;
    stride *= gshape[d];
  }
  return flat;
}

/* Fills this rank's buffer of box `b`: source values, or the expected target. */
static void fill(const model* md, const mt_box* b, const int64_t* coord, int dtype,
                 int target, char* buf) {
  int64_t isz = (int64_t)mt_dtype_size(dtype), n = mt_box_numel(b);
  for (int64_t e = 0; e < n; ++e) {
    int64_t L = label(dtype, global_index(b, md->src->shape, e));
    put(dtype, buf + e * isz,
        target ? dst_value(md, coord, L) : src_value(md, coord, L));
  }
}

/* ---- One redistribution case. ------------------------------------------------- */

typedef struct buffers {
  int64_t coord[MT_MAX_MESH_NDIM];
  mt_box sbox, tbox;
  int64_t sbytes, tbytes;
  char *src, *keep, *want, *got, *got2;
} buffers;

static void buffers_init(buffers* b, mt_mesh* mesh, const model* md, int dtype) {
  int64_t isz = (int64_t)mt_dtype_size(dtype);
  CHECK(mt_mesh_coordinate(mesh, b->coord) == 1);
  CHECK(mt_layout_local_box(md->src, b->coord, &b->sbox, NULL) == MT_OK);
  CHECK(mt_layout_local_box(md->dst, b->coord, &b->tbox, NULL) == MT_OK);
  b->sbytes = mt_box_numel(&b->sbox) * isz, b->tbytes = mt_box_numel(&b->tbox) * isz;
  b->src = malloc((size_t)b->sbytes + 1), b->keep = malloc((size_t)b->sbytes + 1);
  b->want = malloc((size_t)b->tbytes + 1), b->got = malloc((size_t)b->tbytes + 1);
  b->got2 = malloc((size_t)b->tbytes + 1);
  fill(md, &b->sbox, b->coord, dtype, 0, b->src);
  fill(md, &b->tbox, b->coord, dtype, 1, b->want);
  memcpy(b->keep, b->src, (size_t)b->sbytes);
}

static void buffers_free(buffers* b) {
  free(b->src), free(b->keep), free(b->want), free(b->got), free(b->got2);
}

static int box_eq(const mt_box* a, const mt_box* b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->offset[d] != b->offset[d] || a->shape[d] != b->shape[d]) return 0;
  }
  return 1;
}

/* An empty plan moves nothing: the caller's source already is its target (the
 * Python layer returns it as is), so the executor leaves `dst` alone. */
static void check_result(const mt_plan* plan, const buffers* b, const char* out,
                         int dtype, const char* mode, const char* what) {
  if (mt_plan_nsteps(plan) == 0) {
    CHECK_MSG(box_eq(&b->sbox, &b->tbox), "%s: empty plan, boxes differ", what);
    out = b->src;
  }
  int64_t isz = (int64_t)mt_dtype_size(dtype);
  for (int64_t e = 0; e * isz < b->tbytes; ++e) {
    if (memcmp(out + e * isz, b->want + e * isz, (size_t)isz) == 0) continue;
    uint64_t got = 0, want = 0;
    memcpy(&got, out + e * isz, (size_t)(isz < 8 ? isz : 8));
    memcpy(&want, b->want + e * isz, (size_t)(isz < 8 ? isz : 8));
    CHECK_MSG(0, "rank %d: %s, %s: element %lld of %lld is 0x%llx, expected 0x%llx",
              world_rank, what, mode, (long long)e, (long long)(b->tbytes / isz),
              (unsigned long long)got, (unsigned long long)want);
    return;
  }
  CHECK_MSG(memcmp(b->src, b->keep, (size_t)b->sbytes) == 0, "%s: source modified",
            what);
}

static void run_blocking(mt_mesh* mesh, const mt_plan* plan, int dtype, buffers* b,
                         const char* what) {
  mt_comm_totals before, after;
  mt_error err = {0};
  memset(b->got, 0xA5, (size_t)b->tbytes);
  mt_comm_counters_read(&test_counters, &before);
  int rc = mt_redistribute(mesh, plan, dtype, b->src, b->got, &err);
  mt_comm_counters_read(&test_counters, &after);
  CHECK_MSG(rc == MT_OK, "%s: mt_redistribute: %s", what, err.msg);
  check_counters(plan, 1, &before, &after, what);
  check_result(plan, b, b->got, dtype, "blocking", what);
}

/* Nonblocking; with `two`, a second request of the same plan is started before the
 * first is waited for, so both are in flight on the same communicators. The source
 * is overwritten while they are: a result is the one of its values at the start. */
static void run_nonblocking(mt_mesh* mesh, const mt_plan* plan, int dtype, buffers* b,
                            int two, const char* what) {
  mt_comm_totals before, after;
  mt_error err = {0};
  mt_request *r1 = NULL, *r2 = NULL;
  memset(b->got, 0x5A, (size_t)b->tbytes);
  memset(b->got2, 0x3C, (size_t)b->tbytes);
  mt_comm_counters_read(&test_counters, &before);
  int rc = mt_redistribute_start(mesh, plan, dtype, b->src, b->got, &r1, &err);
  CHECK_MSG(rc == MT_OK, "%s: mt_redistribute_start: %s", what, err.msg);
  if (two)
    CHECK(mt_redistribute_start(mesh, plan, dtype, b->src, b->got2, &r2, &err) ==
          MT_OK);
  memset(b->src, 0xC3, (size_t)b->sbytes);
  if (r1 != NULL)
    CHECK_MSG(mt_request_wait(r1, &err) == MT_OK, "%s: wait: %s", what, err.msg);
  if (r2 != NULL)
    CHECK_MSG(mt_request_wait(r2, &err) == MT_OK, "%s: wait: %s", what, err.msg);
  memcpy(b->src, b->keep, (size_t)b->sbytes);
  mt_comm_counters_read(&test_counters, &after);
  check_counters(plan, 1 + two, &before, &after, what);
  check_result(plan, b, b->got, dtype, two ? "first of two requests" : "nonblocking",
               what);
  if (two) check_result(plan, b, b->got2, dtype, "second of two requests", what);
}

/* Plans src -> dst under `tm` (NULL: the default) and runs the plan blocking and
 * nonblocking on `mesh`. */
static void run_case_timed(mt_mesh* mesh, const mt_layout* src, const mt_layout* dst,
                           int dtype, int two, const mt_time_model* tm) {
  char what[160];
  describe(what, sizeof what, src, dst, dtype);
  if (tm != NULL) append(what, sizeof what, " on nodes of %lld", (long long)tm->ranks_per_node);
  mt_plan* plan = NULL;
  mt_error err = {0};
  int rc = mt_plan_create_timed(src, dst, (int64_t)mt_dtype_size(dtype), tm, &plan, &err);
  CHECK_MSG(rc == MT_OK, "%s: plan: %s", what, err.msg);
  if (rc != MT_OK) return;
  model md = make_model(src, dst, dtype);
  buffers b;
  buffers_init(&b, mesh, &md, dtype);
  run_blocking(mesh, plan, dtype, &b, what);
  run_nonblocking(mesh, plan, dtype, &b, two, what);
  buffers_free(&b);
  for (int i = 0; i < mt_plan_nsteps(plan); ++i)
    nodes_steps += mt_plan_step(plan, i)->kind == MT_STEP_ALLREDUCE_NODES;
  mt_plan_destroy(plan);
}

static void run_case(mt_mesh* mesh, const mt_layout* src, const mt_layout* dst,
                     int dtype, int two) {
  run_case_timed(mesh, src, dst, dtype, two, NULL);
}

/* ---- Random and fixed redistribution cases. ------------------------------------- */

static const int all_dtypes[] = {
    MT_DTYPE_INT32,   MT_DTYPE_INT64,      MT_DTYPE_FLOAT32, MT_DTYPE_FLOAT64,
    MT_DTYPE_FLOAT16, MT_DTYPE_COMPLEX128, MT_DTYPE_BOOL,    MT_DTYPE_INT8,
    MT_DTYPE_INT16,   MT_DTYPE_UINT8,      MT_DTYPE_UINT16};
#define NDTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

/* The Partial ops whose reduction of `dtype` src_value makes exact: no min (the
 * NaN test covers it), no max where sums wrap, no average of integers, no order
 * on complex numbers, whose product src_value's 1 - 2i would break. */
static int op_ok(int dtype, int op) {
  if (op == MT_REDUCE_MIN) return 0;
  if (dtype == MT_DTYPE_COMPLEX128) return op == MT_REDUCE_SUM || op == MT_REDUCE_AVG;
  if (is_narrow(dtype)) return op == MT_REDUCE_SUM || op == MT_REDUCE_PRODUCT;
  int exact =
      dtype == MT_DTYPE_INT32 || dtype == MT_DTYPE_INT64 || dtype == MT_DTYPE_BOOL;
  return !(exact && op == MT_REDUCE_AVG);
}

static int layout_ok(const mt_layout* l, int dtype) {
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (is_partial(l, m) && !op_ok(dtype, l->placements[m].reduce_op)) return 0;
  }
  return 1;
}

static mt_placement random_src(int ndim, int dtype) {
  int r = rnd(6);
  if (r < 3 && ndim > 0) return S(rnd(ndim));
  if (r < 4) return R();
  int op;
  do op = rnd(MT_REDUCE_COUNT);
  while (!op_ok(dtype, op) || op == MT_REDUCE_PRODUCT);
  return P(op);
}

static mt_placement random_dst(int ndim, mt_placement from) {
  if (from.kind == MT_PLACEMENT_PARTIAL && rnd(3) == 0) return from;
  return rnd(3) < 2 && ndim > 0 ? S(rnd(ndim)) : R();
}

static void random_case_timed(mt_mesh* mesh, int mesh_ndim, const int64_t* mesh_shape,
                              int dtype, const mt_time_model* tm) {
  int ndim = rnd(4);
  int64_t shape[3];
  for (int d = 0; d < ndim; ++d) shape[d] = rnd(12) == 0 ? 0 : 1 + rnd(7);
  mt_placement a[3], b[3];
  for (int m = 0; m < mesh_ndim; ++m) {
    a[m] = random_src(ndim, dtype);
    b[m] = random_dst(ndim, a[m]);
  }
  mt_layout src = make_layout(ndim, shape, mesh_ndim, mesh_shape, a);
  mt_layout dst = make_layout(ndim, shape, mesh_ndim, mesh_shape, b);
  run_case_timed(mesh, &src, &dst, dtype, rnd(8) == 0, tm);
}

static void random_case(mt_mesh* mesh, int mesh_ndim, const int64_t* mesh_shape,
                        int dtype) {
  random_case_timed(mesh, mesh_ndim, mesh_shape, dtype, NULL);
}

typedef struct fixed {
  int ndim;
  int64_t shape[3];
  const char *from, *to;
} fixed;

static const fixed fixed_1d[] = {
    {2, {5, 3}, "S0", "R"},  {2, {5, 3}, "R", "S1"},     {2, {5, 3}, "S0", "S1"},
    {2, {5, 3}, "S1", "S0"}, {2, {5, 3}, "Ps", "R"},     {2, {5, 3}, "Ps", "S0"},
    {2, {5, 3}, "Ps", "S1"}, {2, {5, 3}, "Pm", "S0"},    {2, {5, 3}, "Pa", "R"},
    {2, {5, 3}, "Pa", "S1"}, {2, {5, 3}, "Ps", "Ps"},    {0, {0}, "Ps", "R"},
    {0, {0}, "Pm", "R"},     {0, {0}, "Pa", "R"},        {0, {0}, "R", "R"},
    {1, {1}, "S0", "R"},     {1, {1}, "Ps", "S0"},       {2, {0, 3}, "S0", "S1"},
    {2, {0, 3}, "Ps", "S1"}, {3, {2, 3, 4}, "S2", "S0"}, {1, {7}, "S0", "S0"},
    {2, {5, 3}, "Pp", "R"},  {2, {5, 3}, "Pp", "S1"},
};

static const fixed fixed_2d[] = {
    {2, {4, 5}, "S0,S1", "S1,S0"},    {2, {4, 5}, "S0,S0", "R,R"},
    {2, {4, 5}, "R,R", "S0,S0"},      {2, {4, 5}, "S1,S0", "S0,S0"},
    {2, {4, 5}, "Ps,S0", "S0,R"},     {2, {4, 5}, "Ps,Pm", "R,R"},
    {2, {4, 5}, "Ps,S1", "Ps,S0"},    {2, {4, 5}, "Pa,Ps", "S1,S0"},
    {2, {4, 5}, "S0,Pm", "R,Pm"},     {2, {4, 5}, "Ps,Ps", "S0,S0"},
    {0, {0}, "Ps,Pm", "R,R"},         {0, {0}, "Ps,Pa", "R,Pa"},
    {3, {3, 1, 2}, "S0,S2", "S2,S0"}, {2, {4, 5}, "Pp,Pp", "R,S0"},
    {2, {4, 5}, "Pp,S0", "S1,R"},
};

static const fixed fixed_3d[] = {
    {3, {3, 4, 5}, "S0,S1,S2", "S2,S0,S1"}, {3, {3, 4, 5}, "Ps,R,S0", "S0,S1,R"},
    {3, {3, 4, 5}, "S0,S0,S0", "R,R,R"},    {2, {6, 2}, "Ps,Pm,Pa", "S0,R,S1"},
    {2, {6, 2}, "Pm,S0,Ps", "Pm,S1,R"},
};

/* Every fixed case on `mesh`, once per dtype whose Partial ops it can check. */
static void run_fixed(mt_mesh* mesh, const int64_t* mesh_shape, const fixed* cases,
                      int n) {
  for (int i = 0; i < n; ++i) {
    mt_layout src =
        parse_layout(cases[i].ndim, cases[i].shape, mesh_shape, cases[i].from);
    mt_layout dst =
        parse_layout(cases[i].ndim, cases[i].shape, mesh_shape, cases[i].to);
    for (int t = 0; t < NDTYPES; ++t) {
      if (quick && t % 3 != i % 3) continue;
      if (layout_ok(&src, all_dtypes[t]))
        run_case(mesh, &src, &dst, all_dtypes[t], t == i % NDTYPES);
    }
  }
}

/* Random cases on every mesh shape of the world size, fixed ones on the first
 * mesh of each dimensionality. Odd meshes take the world ranks in reverse. */
static void test_redistribute(void) {
  int64_t shapes[32][3];
  int ndims[32], seen[4] = {0};
  int n = mesh_shapes(shapes, ndims);
  for (int i = 0; i < n; ++i) {
    mt_mesh* mesh = make_mesh(ndims[i], shapes[i], i % 2);
    int per_mesh = quick ? 8 : 120;
    for (int c = 0; c < per_mesh; ++c) {
      random_case(mesh, ndims[i], shapes[i], all_dtypes[(c + i) % NDTYPES]);
    }
    if (!seen[ndims[i]]++) {
      const fixed* f = ndims[i] == 1 ? fixed_1d : ndims[i] == 2 ? fixed_2d : fixed_3d;
      int nf = ndims[i] == 1   ? (int)(sizeof fixed_1d / sizeof *f)
               : ndims[i] == 2 ? (int)(sizeof fixed_2d / sizeof *f)
                               : (int)(sizeof fixed_3d / sizeof *f);
      run_fixed(mesh, shapes[i], f, nf);
    }
    mt_mesh_destroy(mesh);
  }
  flush_records();
}

/* Plans made for the world's ranks on simulated nodes of 1 and 2 ranks (the time
 * model's ranks_per_node; this machine's MPI needs not agree), with a network so
 * slow that reductions across nodes split within nodes first wherever they can:
 * every move still leaves each rank its box, whatever the steps, and at 4 ranks
 * some plans hold ALLREDUCE_NODES steps. */
static void test_simulated_nodes(void) {
  int64_t shapes[32][3];
  int ndims[32];
  int n = mesh_shapes(shapes, ndims), before = nodes_steps;
  mt_time_model tm = mt_time_model_default();
  tm.alpha[MT_LINK_NET] = tm.alpha[MT_LINK_SHM];
  tm.beta[MT_LINK_NET] = 1000.0 * tm.beta[MT_LINK_SHM];
  for (int per_node = 1; per_node <= 2; ++per_node) {
    if (world_size % per_node != 0 || world_size <= per_node) continue;
    tm.ranks_per_node = per_node;
    for (int i = 0; i < n; ++i) {
      mt_mesh* mesh = make_mesh(ndims[i], shapes[i], 0);
      for (int c = 0; c < (quick ? 6 : 60); ++c)
        random_case_timed(mesh, ndims[i], shapes[i], all_dtypes[(c + i) % NDTYPES], &tm);
      /* An all-reduce of a (4,) mesh over nodes of 2: always split. */
      const int64_t shape[2] = {5, 3};
      mt_layout src = parse_layout(2, shape, shapes[i], ndims[i] == 1 ? "Pa" : "Ps,R");
      mt_layout dst = parse_layout(2, shape, shapes[i], ndims[i] == 1 ? "R" : "R,R");
      for (int t = 0; ndims[i] <= 2 && t < NDTYPES; ++t) {
        if (layout_ok(&src, all_dtypes[t]))
          run_case_timed(mesh, &src, &dst, all_dtypes[t], t % 3 == 0, &tm);
      }
      mt_mesh_destroy(mesh);
    }
  }
  if (world_size == 4) CHECK_MSG(nodes_steps > before, "no ALLREDUCE_NODES step ran");
  flush_records();
}

/* ---- Plans own what they compile. --------------------------------------------- */

/* Runs `plan` blocking and with two requests in flight on `mesh`. */
static void run_on(mt_mesh* mesh, const mt_plan* plan, const mt_layout* src,
                   const mt_layout* dst, int dtype, const char* where) {
  char what[200];
  describe(what, sizeof what, src, dst, dtype);
  append(what, sizeof what, " %s", where);
  model md = make_model(src, dst, dtype);
  buffers b;
  buffers_init(&b, mesh, &md, dtype);
  plan_counts_bytes = mt_dtype_size(dtype) == 8; /* the plans here are for 8 bytes */
  run_blocking(mesh, plan, dtype, &b, what);
  run_nonblocking(mesh, plan, dtype, &b, 1, what);
  plan_counts_bytes = 1;
  buffers_free(&b);
}

/* The creator drops the plan while a request of it is in flight: the request owns
 * it (MPI reads its compiled counts) until the wait, which frees it. */
static void drop_in_flight(mt_mesh* mesh, const mt_layout* src, const mt_layout* dst) {
  mt_plan *plan = NULL, *twin = NULL;
  CHECK(mt_plan_create(src, dst, 8, &plan, NULL) == MT_OK);
  CHECK(mt_plan_create(src, dst, 8, &twin, NULL) == MT_OK);
  model md = make_model(src, dst, MT_DTYPE_FLOAT64);
  buffers b;
  buffers_init(&b, mesh, &md, MT_DTYPE_FLOAT64);
  mt_request* req = NULL;
  mt_error err = {0};
  CHECK(mt_redistribute_start(mesh, plan, MT_DTYPE_FLOAT64, b.src, b.got, &req, &err) ==
        MT_OK);
  mt_plan_destroy(plan);
  CHECK_MSG(mt_request_wait(req, &err) == MT_OK, "wait: %s", err.msg);
  check_result(twin, &b, b.got, MT_DTYPE_FLOAT64, "plan dropped in flight", "S0->S1");
  buffers_free(&b);
  mt_plan_destroy(twin);
}

/* One plan on meshes where this rank has other coordinates (the world in order and
 * reversed), for two item sizes, twice over: the plan keeps the first compiled
 * part it gets and every other run compiles its own, so every result is exact. */
static void test_compiled_plans(void) {
  int64_t mesh_shape[1] = {world_size};
  int64_t shape[2] = {2 * world_size + 1, 3 * world_size + 2};
  mt_mesh *in_order = make_mesh(1, mesh_shape, 0), *reversed = make_mesh(1, mesh_shape, 1);
  static const char* cases[][2] = {{"S0", "S1"}, {"S1", "R"}, {"Ps", "S1"}};
  static const int dtypes[2] = {MT_DTYPE_FLOAT64, MT_DTYPE_INT16};
  for (int i = 0; i < 3; ++i) {
    mt_layout src = parse_layout(2, shape, mesh_shape, cases[i][0]);
    mt_layout dst = parse_layout(2, shape, mesh_shape, cases[i][1]);
    mt_plan* plan = NULL;
    CHECK(mt_plan_create(&src, &dst, 8, &plan, NULL) == MT_OK);
    for (int round = 0; plan != NULL && round < 2; ++round) {
      for (int t = 0; t < 2; ++t) {
        run_on(in_order, plan, &src, &dst, dtypes[t], "on the world in order");
        run_on(reversed, plan, &src, &dst, dtypes[t], "on the world reversed");
      }
    }
    mt_plan_destroy(plan);
  }
  mt_layout s0 = parse_layout(2, shape, mesh_shape, "S0");
  mt_layout s1 = parse_layout(2, shape, mesh_shape, "S1");
  drop_in_flight(reversed, &s0, &s1);
  flush_records();
  mt_mesh_destroy(in_order);
  mt_mesh_destroy(reversed);
}

/* ---- NaN through max and min. ---------------------------------------------- */

/* Stores a quiet NaN as an element of a float `dtype`. */
static void put_nan(int dtype, char* p) {
  double d = NAN;
  float f = NAN;
  uint16_t h = 0x7E00;
  if (dtype == MT_DTYPE_FLOAT64) memcpy(p, &d, sizeof d);
  if (dtype == MT_DTYPE_FLOAT32) memcpy(p, &f, sizeof f);
  if (dtype == MT_DTYPE_FLOAT16) memcpy(p, &h, sizeof h);
}

static int is_nan(int dtype, const char* p) {
  double d;
  float f;
  uint16_t h;
  if (dtype == MT_DTYPE_FLOAT64) return memcpy(&d, p, sizeof d), isnan(d);
  if (dtype == MT_DTYPE_FLOAT32) return memcpy(&f, p, sizeof f), isnan(f);
  return memcpy(&h, p, sizeof h), isnan(mt_half_to_float(h));
}

/* NumPy's maximum and minimum propagate NaN: a NaN on the last rank wins over the
 * numbers on the others, through the user-defined MPI operations. */
static void nan_case(mt_mesh* mesh, const int64_t* mesh_shape, int dtype, int op) {
  int64_t shape[1] = {3}, isz = (int64_t)mt_dtype_size(dtype);
  mt_placement a[1] = {P(op)}, b[1] = {R()};
  mt_layout src = make_layout(1, shape, 1, mesh_shape, a);
  mt_layout dst = make_layout(1, shape, 1, mesh_shape, b);
  mt_plan* plan = NULL;
  CHECK(mt_plan_create(&src, &dst, isz, &plan, NULL) == MT_OK);
  char in[24], out[24], two[8];
  for (int i = 0; i < 3; ++i) put(dtype, in + i * isz, i + 1);
  if (world_rank == world_size - 1) put_nan(dtype, in);
  memcpy(out, in, sizeof out);
  if (mt_plan_nsteps(plan) > 0) {
    CHECK(mt_redistribute(mesh, plan, dtype, in, out, NULL) == MT_OK);
  }
  CHECK_MSG(is_nan(dtype, out), "%s Partial(%s): the NaN was lost",
            mt_dtype_name(dtype), op == MT_REDUCE_MAX ? "max" : "min");
  put(dtype, two, 2);
  CHECK(memcmp(out + isz, two, (size_t)isz) == 0);
  mt_plan_destroy(plan);
}

static void test_nan(void) {
  int64_t mesh_shape[1] = {world_size};
  mt_mesh* mesh = make_mesh(1, mesh_shape, 0);
  const int types[3] = {MT_DTYPE_FLOAT64, MT_DTYPE_FLOAT32, MT_DTYPE_FLOAT16};
  for (int t = 0; t < 3; ++t) {
    nan_case(mesh, mesh_shape, types[t], MT_REDUCE_MAX);
    nan_case(mesh, mesh_shape, types[t], MT_REDUCE_MIN);
  }
  mt_mesh_destroy(mesh);
}

/* ---- distribute_tensor. ------------------------------------------------------ */

/* Element i of the full tensor rank r passes: different on every rank, so a rank
 * that keeps its own copy instead of coordinate 0's is caught. */
static int64_t dist_value(int dtype, int64_t i, int r) {
  if (dtype == MT_DTYPE_BOOL) return (label(dtype, i) + r) & 1;
  if (dtype == MT_DTYPE_FLOAT16) return i % 64 + 256 * r;
  return i + 1000 * r;
}

/* What the rank at `coord` must hold: the source's box, or the identity of a
 * Partial(sum|product) dim on which it is off coordinate 0. */
static void dist_expected(const mt_layout* l, const mt_box* box, const int64_t* coord,
                          int dtype, int source, char* buf) {
  int64_t isz = (int64_t)mt_dtype_size(dtype), ident = -1;
  for (int m = 0; m < l->mesh_ndim; ++m) {
    if (!is_partial(l, m) || coord[m] == 0) continue;
    if (l->placements[m].reduce_op == MT_REDUCE_SUM) ident = 0;
    if (l->placements[m].reduce_op == MT_REDUCE_PRODUCT) ident = 1;
  }
  for (int64_t e = 0; e < mt_box_numel(box); ++e) {
    if (ident >= 0) {
      put_raw(dtype, buf + e * isz, ident, 0);
    } else {
      put(dtype, buf + e * isz,
          dist_value(dtype, global_index(box, l->shape, e), source));
    }
  }
}

/* On a 1-D mesh every byte's path is known: a Shard scatters all but the root's
 * box, Replicate and Partial(avg|max|min) broadcast the whole tensor to G - 1
 * ranks, and Partial(sum|product) only writes identities. */
static void dist_bytes_1d(const mt_layout* l, int64_t isz, int64_t* want) {
  int64_t numel = 1, zero[1] = {0};
  for (int d = 0; d < l->ndim; ++d) numel *= l->shape[d];
  memset(want, 0, MT_COLL_COUNT * sizeof *want);
  const mt_placement* p = &l->placements[0];
  mt_box root;
  CHECK(mt_layout_local_box(l, zero, &root, NULL) == MT_OK);
  if (p->kind == MT_PLACEMENT_SHARD) {
    want[MT_COLL_SCATTER] = (numel - mt_box_numel(&root)) * isz;
  } else if (p->kind == MT_PLACEMENT_REPLICATE ||
             (p->reduce_op != MT_REDUCE_SUM && p->reduce_op != MT_REDUCE_PRODUCT)) {
    want[MT_COLL_BROADCAST] = numel * isz * (l->mesh_shape[0] - 1);
  }
}

/* Only scatters and broadcasts may have been counted. */
static void dist_counters(const mt_layout* l, int64_t isz, const mt_comm_totals* before,
                          const mt_comm_totals* after, const char* what) {
  for (int k = 0; k < MT_COLL_COUNT; ++k) {
    if (k == MT_COLL_SCATTER || k == MT_COLL_BROADCAST) continue;
    CHECK_MSG(
        after->calls[k] == before->calls[k] && after->bytes[k] == before->bytes[k],
        "%s: mt_distribute counted %s", what, mt_coll_name(k));
  }
  if (l->mesh_ndim != 1) return;
  int64_t want[MT_COLL_COUNT];
  dist_bytes_1d(l, isz, want);
  add_record(before, after, want, what);
}

/* Every rank passes its own full tensor; the one at mesh position 0 (world rank
 * `source`) is the truth. */
static void dist_case(mt_mesh* mesh, const mt_layout* l, int dtype, int source) {
  char what[160];
  describe(what, sizeof what, l, NULL, dtype);
  append(what, sizeof what, " distribute");
  int64_t isz = (int64_t)mt_dtype_size(dtype), numel = 1, coord[MT_MAX_MESH_NDIM];
  for (int d = 0; d < l->ndim; ++d) numel *= l->shape[d];
  mt_box box;
  CHECK(mt_mesh_coordinate(mesh, coord) == 1);
  CHECK(mt_layout_local_box(l, coord, &box, NULL) == MT_OK);
  size_t nbytes = (size_t)(mt_box_numel(&box) * isz);
  char *full = malloc((size_t)(numel * isz) + 1), *local = malloc(nbytes + 1);
  char* want = malloc(nbytes + 1);
  for (int64_t i = 0; i < numel; ++i)
    put(dtype, full + i * isz, dist_value(dtype, i, world_rank));
  dist_expected(l, &box, coord, dtype, source, want);
  memset(local, 0xA5, nbytes);
  mt_comm_totals before, after;
  mt_error err = {0};
  mt_comm_counters_read(&test_counters, &before);
  int rc = mt_distribute(mesh, l, dtype, full, local, &err);
  mt_comm_counters_read(&test_counters, &after);
  CHECK_MSG(rc == MT_OK, "%s: %s", what, err.msg);
  CHECK_MSG(memcmp(local, want, nbytes) == 0, "rank %d: %s: wrong box", world_rank,
            what);
  dist_counters(l, isz, &before, &after, what);
  free(full), free(local), free(want);
}

static const char* const dist_fixed_1d[] = {"S0", "S1", "R", "Ps", "Pp", "Pm", "Pa"};
static const char* const dist_fixed_2d[] = {"S0,S1", "S1,S0", "S0,S0", "R,S0",  "Ps,S1",
                                            "S0,Pp", "Pm,R",  "Ps,Pm", "Pp,Pm", "R,R"};

/* Placements of distribute: Shard, Replicate and Partial(sum|product|max), with
 * at most one of sum and product (whose identities differ) per layout. */
static void random_dist_layout(int ndim, int mesh_ndim, mt_placement* pl) {
  int ident = -1;
  for (int m = 0; m < mesh_ndim; ++m) {
    int r = rnd(5);
    pl[m] = r < 2 && ndim > 0 ? S(rnd(ndim)) : r < 3 ? R() : P(MT_REDUCE_MAX);
    if (r < 4) continue;
    if (ident < 0) ident = rnd(2) ? MT_REDUCE_SUM : MT_REDUCE_PRODUCT;
    pl[m] = P(ident);
  }
}

static void dist_on_mesh(int mesh_ndim, const int64_t* mesh_shape, int reversed) {
  static const int types[] = {MT_DTYPE_INT64, MT_DTYPE_FLOAT64, MT_DTYPE_FLOAT16,
                              MT_DTYPE_INT32, MT_DTYPE_BOOL,    MT_DTYPE_COMPLEX128};
  mt_mesh* mesh = make_mesh(mesh_ndim, mesh_shape, reversed);
  int source = reversed ? world_size - 1 : 0, t = 0;
  const char* const* fx = mesh_ndim == 1 ? dist_fixed_1d : dist_fixed_2d;
  int nfx = mesh_ndim == 1 ? 7 : 10;
  int64_t shape[3] = {5, 3, 4}, zero_d[1] = {0};
  for (int i = 0; i < nfx; ++i) {
    mt_layout l = parse_layout(2, shape, mesh_shape, fx[i]);
    dist_case(mesh, &l, types[t++ % 6], source);
  }
  mt_layout scalar =
      parse_layout(0, zero_d, mesh_shape, mesh_ndim == 1 ? "Ps" : "Pp,R");
  dist_case(mesh, &scalar, MT_DTYPE_FLOAT64, source);
  for (int c = 0; c < (quick ? 4 : 40); ++c) {
    int ndim = rnd(4);
    for (int d = 0; d < ndim; ++d) shape[d] = rnd(10) == 0 ? 0 : 1 + rnd(7);
    mt_placement pl[2];
    random_dist_layout(ndim, mesh_ndim, pl);
    mt_layout l = make_layout(ndim, shape, mesh_ndim, mesh_shape, pl);
    dist_case(mesh, &l, types[t++ % 6], source);
  }
  mt_mesh_destroy(mesh);
}

static void test_distribute(void) {
  int w = world_size, a = w % 2 == 0 && w > 2 ? 2 : 1;
  int64_t one_d[1] = {w}, rows[2] = {1, w}, cols[2] = {w, 1}, grid[2] = {a, w / a};
  dist_on_mesh(1, one_d, 0);
  dist_on_mesh(1, one_d, 1);
  dist_on_mesh(2, rows, 0);
  dist_on_mesh(2, cols, 1);
  if (a > 1) dist_on_mesh(2, grid, 0);
  flush_records();
}

/* ---- Errors: the same status on every rank, before any communication. ----- */

static mt_plan* make_plan(int ndim, const int64_t* shape, const int64_t* mesh_shape,
                          const char* from, const char* to, int64_t itemsize) {
  mt_layout src = parse_layout(ndim, shape, mesh_shape, from);
  mt_layout dst = parse_layout(ndim, shape, mesh_shape, to);
  mt_plan* plan = NULL;
  mt_error err = {0};
  CHECK_MSG(mt_plan_create(&src, &dst, itemsize, &plan, &err) == MT_OK, "plan: %s",
            err.msg);
  return plan;
}

/* Both entry points return `code` (with a message) and count nothing. */
static void expect_status(mt_mesh* mesh, const mt_plan* plan, int dtype, int code,
                          const char* what) {
  static double src[512], dst[512];
  mt_comm_totals before, after;
  mt_error err = {0};
  mt_comm_counters_read(&test_counters, &before);
  int rc = mt_redistribute(mesh, plan, dtype, src, dst, &err);
  CHECK_MSG(rc == code, "%s: mt_redistribute gave %s, expected %s", what,
            mt_status_name(rc), mt_status_name(code));
  CHECK_MSG(code == MT_OK || strlen(err.msg) > 0, "%s: no message", what);
  mt_request* req = NULL;
  rc = mt_redistribute_start(mesh, plan, dtype, src, dst, &req, &err);
  CHECK_MSG(rc == code, "%s: mt_redistribute_start gave %s, expected %s", what,
            mt_status_name(rc), mt_status_name(code));
  CHECK_MSG((req == NULL) == (rc != MT_OK), "%s: request", what);
  if (req != NULL) CHECK(mt_request_wait(req, NULL) == MT_OK);
  mt_comm_counters_read(&test_counters, &after);
  if (code != MT_OK) {
    CHECK_MSG(memcmp(&before, &after, sizeof before) == 0, "%s: communicated", what);
  }
}

/* Reductions the dtype cannot do fail on every rank; on a mesh of one rank the
 * Partial is already reduced, so the plan is empty and nothing fails. */
static void test_reduce_errors(mt_mesh* mesh, const int64_t* mesh_shape) {
  int64_t shape[2] = {6, 5};
  int fail = world_size > 1 ? MT_ETYPE : MT_OK;
  mt_plan* p = make_plan(2, shape, mesh_shape, "Pm", "R", 16);
  expect_status(mesh, p, MT_DTYPE_COMPLEX128, fail, "complex Partial(max)");
  expect_status(mesh, p, MT_DTYPE_COMPLEX64, fail, "complex64 Partial(max)");
  mt_plan_destroy(p);
  p = make_plan(2, shape, mesh_shape, "Pn", "S0", 16);
  expect_status(mesh, p, MT_DTYPE_COMPLEX128, fail, "complex Partial(min) to Shard");
  mt_plan_destroy(p);
  p = make_plan(2, shape, mesh_shape, "Pa", "R", 4);
  expect_status(mesh, p, MT_DTYPE_INT32, fail, "int32 Partial(avg)");
  mt_plan_destroy(p);
  p = make_plan(2, shape, mesh_shape, "Pa", "S1", 1);
  expect_status(mesh, p, MT_DTYPE_BOOL, fail, "bool Partial(avg) to Shard");
  mt_plan_destroy(p);
  p = make_plan(2, shape, mesh_shape, "S0", "R", 8);
  expect_status(mesh, p, MT_DTYPE_COUNT, MT_ETYPE, "unknown dtype");
  expect_status(mesh, p, -1, MT_ETYPE, "negative dtype");
  mt_plan_destroy(p);
}

/* A plan for another mesh shape fails on every rank: another size, another
 * number of dims. */
static void test_mesh_mismatch(mt_mesh* mesh) {
  int64_t shape[2] = {6, 5}, bigger[1] = {world_size + 1}, two_d[2] = {2, world_size};
  mt_plan* p = make_plan(2, shape, bigger, "S0", "R", 8);
  CHECK(mt_plan_nsteps(p) > 0);
  expect_status(mesh, p, MT_DTYPE_INT64, MT_EINVAL, "plan for a larger 1-D mesh");
  mt_plan_destroy(p);
  p = make_plan(2, shape, two_d, "S0,R", "R,R", 8);
  CHECK(mt_plan_nsteps(p) > 0);
  expect_status(mesh, p, MT_DTYPE_INT64, MT_EINVAL, "plan for a 2-D mesh");
  mt_plan_destroy(p);
}

/* A mixed plan whose second reduction the dtype cannot do fails before the first
 * one runs. Needs a (2, 2) mesh. */
static void test_late_error(void) {
  if (world_size != 4) return;
  int64_t grid[2] = {2, 2}, shape[2] = {4, 4};
  mt_mesh* mesh = make_mesh(2, grid, 0);
  mt_plan* p = make_plan(2, shape, grid, "Ps,Pm", "R,R", 16);
  CHECK(mt_plan_nsteps(p) == 2);
  expect_status(mesh, p, MT_DTYPE_COMPLEX128, MT_ETYPE, "complex [Ps,Pm]");
  mt_plan_destroy(p);
  mt_mesh_destroy(mesh);
}

/* A mesh of world rank 0 alone: the others are not members and get MT_ESTATE
 * from every entry point; the member runs normally. */
static void test_non_member(void) {
  if (world_size == 1) return;
  int ranks[1] = {0};
  int64_t one[1] = {1}, shape[1] = {3};
  mt_mesh* mesh = NULL;
  CHECK(mt_mesh_create(MPI_COMM_WORLD, 1, one, ranks, &mesh, NULL) == MT_OK);
  mt_mesh_set_counters(mesh, &test_counters);
  mt_plan* p = make_plan(1, shape, one, "Ps", "R", 8);
  int member = world_rank == 0;
  expect_status(mesh, p, MT_DTYPE_FLOAT64, member ? MT_OK : MT_ESTATE, "non-member");
  mt_layout l = parse_layout(1, shape, one, "S0");
  double full[3] = {1.0, 2.0, 3.0}, local[3] = {0.0, 0.0, 0.0};
  mt_error err = {0};
  int rc = mt_distribute(mesh, &l, MT_DTYPE_FLOAT64, full, local, &err);
  CHECK_MSG(rc == (member ? MT_OK : MT_ESTATE), "distribute on a non-member: %s",
            err.msg);
  CHECK(!member || (local[0] == 1.0 && local[2] == 3.0));
  mt_plan_destroy(p);
  mt_mesh_destroy(mesh);
}

static void test_errors(void) {
  int64_t mesh_shape[1] = {world_size};
  mt_mesh* mesh = make_mesh(1, mesh_shape, 0);
  test_reduce_errors(mesh, mesh_shape);
  test_mesh_mismatch(mesh);
  mt_layout l = parse_layout(1, mesh_shape, mesh_shape, "S0");
  int64_t two[2] = {1, world_size};
  mt_layout l2 = parse_layout(1, mesh_shape, two, "R,S0");
  double buf[8];
  CHECK(mt_distribute(mesh, &l, MT_DTYPE_COUNT, buf, buf, NULL) == MT_ETYPE);
  CHECK(mt_distribute(mesh, &l2, MT_DTYPE_FLOAT64, buf, buf, NULL) == MT_EINVAL);
  int64_t bigger[1] = {world_size + 1};
  mt_layout l3 = parse_layout(1, mesh_shape, bigger, "S0");
  CHECK(mt_distribute(mesh, &l3, MT_DTYPE_FLOAT64, buf, buf, NULL) == MT_EINVAL);
  mt_mesh_destroy(mesh);
  test_late_error();
  test_non_member();
  flush_records();
}

/* ---- Slices. ----------------------------------------------------------------------
 */

static int plan_has(const mt_layout* src, const mt_layout* dst, int kind) {
  mt_plan* plan = NULL;
  int found = 0;
  CHECK(mt_plan_create(src, dst, 8, &plan, NULL) == MT_OK);
  for (int i = 0; i < mt_plan_nsteps(plan); ++i)
    found |= mt_plan_step(plan, i)->kind == kind;
  mt_plan_destroy(plan);
  return found;
}

/* A DIRECT exchange on `mesh` (2-D) and an all-to-all on its 1-D slices. */
static void direct_and_slices(mt_mesh* mesh, const int64_t* grid, int dtype) {
  int64_t shape[2] = {5, 6};
  mt_layout a = parse_layout(2, shape, grid, "S0,S1"),
            b = parse_layout(2, shape, grid, "S1,S0");
  if (grid[0] > 1 && grid[1] > 1) CHECK(plan_has(&a, &b, MT_STEP_DIRECT));
  run_case(mesh, &a, &b, dtype, 1);
  mt_layout c = parse_layout(2, shape, grid, "Ps,S1"),
            d = parse_layout(2, shape, grid, "S1,S0");
  run_case(mesh, &c, &d, dtype, 0);
  for (int dim = 0; dim < 2; ++dim) {
    mt_mesh* line = NULL;
    CHECK(mt_mesh_slice(mesh, 1, &dim, &line, NULL) == MT_OK);
    mt_layout s = parse_layout(2, shape, &grid[dim], "S0"),
              t = parse_layout(2, shape, &grid[dim], "S1");
    if (grid[dim] > 1) CHECK(plan_has(&s, &t, MT_STEP_ALLTOALL));
    run_case(line, &s, &t, dtype, 1);
    mt_mesh_destroy(line);
  }
}

/* The root (a, b) mesh, and the same grid as the (a, 1, b) mesh's slice over dims
 * 0 and 2, whose DIRECT exchange needs a communicator of its own (created on first
 * use). Parents are destroyed before their slices. */
static void test_slices(void) {
  int64_t live = mt_comm_live_count();
  int a = world_size % 2 == 0 ? 2 : 1, dims[2] = {0, 2}, last[1] = {1};
  int64_t grid[2] = {a, world_size / a}, cube[3] = {a, 1, world_size / a};
  mt_mesh *root = make_mesh(2, grid, 0), *mesh3 = make_mesh(3, cube, 1), *sl = NULL;
  direct_and_slices(root, grid, MT_DTYPE_INT64);
  CHECK(mt_mesh_slice(mesh3, 2, dims, &sl, NULL) == MT_OK);
  mt_mesh_destroy(mesh3);
  int64_t before = mt_comm_live_count();
  direct_and_slices(sl, grid, MT_DTYPE_FLOAT32);
  int direct = a > 1 && grid[1] > 1;
  CHECK_MSG(mt_comm_live_count() == before + direct, "live %lld, before %lld",
            (long long)mt_comm_live_count(), (long long)before);
  mt_mesh* line = NULL;
  CHECK(mt_mesh_slice(sl, 1, last, &line, NULL) == MT_OK);
  mt_mesh_destroy(sl);
  int64_t shape[1] = {7};
  mt_layout s = parse_layout(1, shape, &grid[1], "S0"),
            r = parse_layout(1, shape, &grid[1], "R");
  run_case(line, &s, &r, MT_DTYPE_INT32, 1);
  mt_mesh_destroy(line);
  mt_mesh_destroy(root);
  CHECK_MSG(mt_comm_live_count() == live, "live %lld, at start %lld",
            (long long)mt_comm_live_count(), (long long)live);
  flush_records();
}

/* ---- Selection exchange (basic indexing) --------------------------------------- */

/* The value every rank holds at input element `flat`: the element, and on each
 * Partial mesh dim the rank's coordinate there (a Partial's ranks differ). */
static int64_t sel_value(const mt_layout* l, const int64_t* coord, int64_t flat) {
  int64_t v = flat * 64;
  for (int m = 0; m < l->mesh_ndim; ++m)
    if (is_partial(l, m)) v += coord[m] * (m + 1) * 7;
  return v;
}

/* Input flat index of output index `k` (per dim) of a selection. */
static int64_t sel_source(const mt_layout* l, const mt_selection* sel, const int64_t* k) {
  int64_t flat = 0;
  for (int d = 0; d < l->ndim; ++d) flat = flat * l->shape[d] + sel->start[d] + k[d] * sel->step[d];
  return flat;
}

/* Output index of element e of box b (row-major within the box). */
static void box_index(const mt_box* b, int64_t e, int64_t* k) {
  for (int d = b->ndim - 1; d >= 0; --d) {
    k[d] = b->offset[d] + e % b->shape[d];
    e /= b->shape[d];
  }
}

static void random_selection(mt_selection* sel, int ndim, const int64_t* shape) {
  memset(sel, 0, sizeof *sel);
  sel->ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    sel->step[d] = rnd(3) ? 1 + rnd(3) : -1 - rnd(3);
    if (shape[d] == 0) continue;
    int64_t span = sel->step[d] > 0 ? sel->step[d] : -sel->step[d];
    sel->start[d] = rnd((int)shape[d]);
    int64_t room = (sel->step[d] > 0 ? shape[d] - 1 - sel->start[d] : sel->start[d]) / span;
    sel->count[d] = rnd((int)room + 2);
  }
}

/* One random selection moved on `mesh`: every rank's target box holds the picked
 * elements, with its own Partial contributions. */
static void selection_case(mt_mesh* mesh, int mesh_ndim, const int64_t* mesh_shape) {
  int ndim = 1 + rnd(3);
  int64_t shape[3], coord[MT_MAX_MESH_NDIM], k[MT_MAX_NDIM];
  for (int d = 0; d < ndim; ++d) shape[d] = rnd(7);
  mt_selection sel;
  random_selection(&sel, ndim, shape);
  mt_placement a[3], b[3];
  for (int m = 0; m < mesh_ndim; ++m) {
    int c = rnd(ndim + 2);
    a[m] = c < ndim ? S(c) : (c == ndim ? R() : P(MT_REDUCE_SUM));
    b[m] = a[m].kind == MT_PLACEMENT_SHARD && rnd(3) ? R() : a[m];
  }
  mt_layout src = make_layout(ndim, shape, mesh_ndim, mesh_shape, a);
  mt_layout dst = make_layout(ndim, sel.count, mesh_ndim, mesh_shape, b);
  mt_box sb, img, tb;
  CHECK(mt_mesh_coordinate(mesh, coord));
  mt_layout_local_box(&src, coord, &sb, NULL);
  mt_selection_image(&sel, &sb, &img);
  mt_layout_local_box(&dst, coord, &tb, NULL);
  int64_t ni = mt_box_numel(&img), nt = mt_box_numel(&tb);
  int64_t* in = malloc((size_t)(ni + 1) * sizeof *in);
  int64_t* out = malloc((size_t)(nt + 1) * sizeof *out);
  for (int64_t e = 0; e < ni; ++e) {
    box_index(&img, e, k);
    in[e] = sel_value(&src, coord, sel_source(&src, &sel, k));
  }
  mt_error err = {0};
  int rc = mt_selection_exchange(mesh, &src, &sel, 0, &dst, MT_DTYPE_INT64, in, out, &err);
  CHECK_MSG(rc == MT_OK, "selection exchange: %s", err.msg);
  for (int64_t e = 0; rc == MT_OK && e < nt; ++e) {
    box_index(&tb, e, k);
    int64_t want = sel_value(&src, coord, sel_source(&src, &sel, k));
    CHECK_MSG(out[e] == want, "element %lld: %lld, want %lld", (long long)e,
              (long long)out[e], (long long)want);
  }
  free(in);
  free(out);
}

static void test_selection(void) {
  int64_t shapes[32][3];
  int ndims[32], n = mesh_shapes(shapes, ndims);
  for (int i = 0; i < n; ++i) {
    mt_mesh* mesh = make_mesh(ndims[i], shapes[i], i % 2);
    for (int c = 0; c < (quick ? 20 : 150); ++c) selection_case(mesh, ndims[i], shapes[i]);
    mt_mesh_destroy(mesh);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  test_redistribute();
  test_simulated_nodes();
  test_compiled_plans();
  test_nan();
  test_distribute();
  test_errors();
  test_slices();
  test_selection();
  CHECK(mt_comm_live_count() == 0);
  int failed = mt_test_exit("test_redistribute") != 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
