/* _C.Plan (a plan as data, for tools and benchmarks), the running of a plan on
 * this rank's local array (blocking, or started), distribute and the selection
 * exchange of basic indexing. */
#include "ext.h"

#include "mpitensor/comm/distribute.h"
#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/redistribute.h"

typedef struct {
  PyObject_HEAD
  mt_plan *plan;
  mt_layout src, dst;
  mt_time_model model;
  int64_t itemsize;
} PlanObject;

/* ---- Plan ------------------------------------------------------------------------ */

/* Plan(shape, mesh_shape, src_placements, dst_placements, dtype[, model]): the
 * move checked first (mt_plan_check: no Partial created, no reduction the dtype
 * lacks), then planned for elements of dtype's size and ranked by `model` (a
 * time model tuple, mt_ext_time_model; the default when absent or None). Local. */
static PyObject *plan_new(PyTypeObject *tp, PyObject *args, PyObject *kwds) {
  PyObject *shape, *mesh_shape, *src, *dst, *model_obj = Py_None;
  PyArray_Descr *descr;
  if (!PyArg_ParseTuple(args, "OOOOO&|O:Plan", &shape, &mesh_shape, &src, &dst,
                        PyArray_DescrConverter, &descr, &model_obj))
    return NULL;
  mt_time_model model = mt_time_model_default();
  if (model_obj != Py_None && mt_ext_time_model(model_obj, &model) < 0) {
    Py_DECREF(descr);
    return NULL;
  }
  int dtype = mt_ext_descr_dtype(descr);
  int64_t itemsize = (int64_t)PyDataType_ELSIZE(descr);
  Py_DECREF(descr);
  PlanObject *self = (PlanObject *)tp->tp_alloc(tp, 0);
  if (self == NULL) return NULL;
  if (mt_ext_layout(shape, mesh_shape, src, &self->src) < 0 ||
      mt_ext_layout(shape, mesh_shape, dst, &self->dst) < 0) {
    Py_DECREF(self);
    return NULL;
  }
  self->model = model, self->itemsize = itemsize;
  mt_error err = {0};
  int rc = mt_plan_check(&self->src, &self->dst, dtype, &err);
  if (rc == MT_OK)
    rc = mt_plan_create_timed(&self->src, &self->dst, itemsize, &model, &self->plan, &err);
  if (rc != MT_OK) {
    Py_DECREF(self);
    return mt_ext_raise(rc, &err);
  }
  return (PyObject *)self;
}

static void plan_dealloc(PlanObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  mt_plan_destroy(self->plan);
  tp->tp_free((PyObject *)self);
  Py_DECREF(tp);
}

static const char *const step_names[] = {"all_gather", "all_to_all", "chunk",
                                         "all_reduce", "reduce_scatter", "direct",
                                         "all_reduce_nodes"};
#define NKINDS ((int)(sizeof step_names / sizeof step_names[0]))

static PyObject *codes_of(const mt_layout *l) {
  PyObject *out = PyTuple_New(l->mesh_ndim);
  for (int m = 0; out != NULL && m < l->mesh_ndim; ++m) {
    mt_placement p = l->placements[m];
    PyObject *t = Py_BuildValue("(iii)", p.kind, p.dim, p.reduce_op);
    if (t == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, m, t);
  }
  return out;
}

/* steps() -> [(kind, mesh_dim, src_codes, dst_codes, bytes, messages, seconds,
 * copy_bytes, reduce_bytes, net_bytes)] */
static PyObject *plan_steps(PlanObject *self, PyObject *unused) {
  int n = mt_plan_nsteps(self->plan);
  PyObject *out = PyList_New(n);
  for (int i = 0; out != NULL && i < n; ++i) {
    const mt_step *s = mt_plan_step(self->plan, i);
    PyObject *t = Py_BuildValue("(siNNLLdLLL)", step_names[s->kind], s->mesh_dim,
                                codes_of(&s->src), codes_of(&s->dst),
                                (long long)s->bytes, (long long)s->messages, s->time,
                                (long long)s->copy_bytes, (long long)s->reduce_bytes,
                                (long long)s->net_bytes);
    if (t == NULL) Py_CLEAR(out);
    else PyList_SET_ITEM(out, i, t);
  }
  return out;
}

static PyObject *plan_get_nsteps(PlanObject *self, void *c) {
  return PyLong_FromLong(mt_plan_nsteps(self->plan));
}
static PyObject *plan_get_bytes(PlanObject *self, void *c) {
  return PyLong_FromLongLong(mt_plan_bytes(self->plan));
}
static PyObject *plan_get_messages(PlanObject *self, void *c) {
  return PyLong_FromLongLong(mt_plan_messages(self->plan));
}
static PyObject *plan_get_time(PlanObject *self, void *c) {
  return PyFloat_FromDouble(mt_plan_time(self->plan));
}
static PyObject *plan_get_net_bytes(PlanObject *self, void *c) {
  return PyLong_FromLongLong(mt_plan_net_bytes(self->plan));
}

/* torch() -> the Plan of torch's own per-mesh-dim steps for the same move under
 * the same model (mt_plan_create_torch), or None where one of them is no valid
 * collective here. */
static PyObject *plan_torch(PlanObject *self, PyObject *unused) {
  PlanObject *t = (PlanObject *)Py_TYPE(self)->tp_alloc(Py_TYPE(self), 0);
  if (t == NULL) return NULL;
  t->src = self->src, t->dst = self->dst, t->model = self->model;
  t->itemsize = self->itemsize;
  mt_error err = {0};
  int rc = mt_plan_create_torch(&t->src, &t->dst, t->itemsize, &t->model, &t->plan, &err);
  if (rc == MT_OK) return (PyObject *)t;
  Py_DECREF(t);
  if (rc == MT_ENOTSUP) Py_RETURN_NONE;
  return mt_ext_raise(rc, &err);
}

/* torch_bytes() -> (bytes, net_bytes) of torch's per-mesh-dim steps for the same
 * move, priced as this plan's steps under its model (mt_plan_torch_bytes). */
static PyObject *plan_torch_bytes(PlanObject *self, PyObject *unused) {
  int64_t bytes = 0, net = 0;
  mt_error err = {0};
  int rc = mt_plan_torch_bytes(&self->src, &self->dst, self->itemsize, &self->model,
                               &bytes, &net, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  return Py_BuildValue("(LL)", (long long)bytes, (long long)net);
}

/* predict(model) -> seconds the time model tuple predicts for this plan's steps */
static PyObject *plan_predict(PlanObject *self, PyObject *arg) {
  mt_time_model m;
  if (mt_ext_time_model(arg, &m) < 0) return NULL;
  return PyFloat_FromDouble(mt_plan_predict(self->plan, &m));
}

static PyMethodDef plan_methods[] = {
    {"predict", (PyCFunction)plan_predict, METH_O,
     "predict(model) -> the seconds the time model tuple predicts for these steps. "
     "Local."},
    {"steps", (PyCFunction)plan_steps, METH_NOARGS,
     "[(kind, mesh_dim, src_codes, dst_codes, bytes, messages, seconds, copy_bytes, "
     "reduce_bytes, net_bytes)] of every step: bytes and messages over all ranks, the "
     "local copies and reductions of the busiest rank, the bytes between nodes over "
     "all ranks. Local."},
    {"torch", (PyCFunction)plan_torch, METH_NOARGS,
     "torch() -> the Plan of torch's per-mesh-dim steps for the same move, priced by "
     "the same model, or None where one of them is no valid collective here. Local."},
    {"torch_bytes", (PyCFunction)plan_torch_bytes, METH_NOARGS,
     "torch_bytes() -> (bytes, net_bytes) that torch's per-mesh-dim steps move for the "
     "same redistribution, over all ranks, priced as this plan's steps. Local."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"nsteps", (getter)plan_get_nsteps, NULL, "number of steps", NULL},
    {"bytes", (getter)plan_get_bytes, NULL, "bytes received from other ranks, all ranks", NULL},
    {"messages", (getter)plan_get_messages, NULL, "point-to-point messages, all ranks", NULL},
    {"time", (getter)plan_get_time, NULL, "predicted seconds (the time model)", NULL},
    {"net_bytes", (getter)plan_get_net_bytes, NULL,
     "bytes received from ranks of other nodes, all ranks (the model's ranks_per_node)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot plan_slots[] = {
    {Py_tp_new, plan_new},
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_methods, plan_methods},
    {Py_tp_getset, plan_getset},
    {Py_tp_doc, "Plan(shape, mesh_shape, src, dst, dtype[, model]): a redistribution "
                "plan ranked by the time model tuple (alpha_shm, beta_shm, alpha_net, "
                "beta_net, call, copy, reduce, ranks_per_node), the move checked first "
                "(RuntimeError: creating a Partial; TypeError: a reduction the dtype "
                "lacks). Local."},
    {0, NULL},
};

static PyType_Spec plan_spec = {
    .name = "mpitensor._C.Plan",
    .basicsize = sizeof(PlanObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = plan_slots,
};

/* ---- helpers ---------------------------------------------------------------------- */

static int my_box(mt_mesh *mesh, const mt_layout *l, mt_box *box) {
  int64_t coord[MT_MAX_MESH_NDIM];
  if (!mt_mesh_coordinate(mesh, coord)) {
    PyErr_SetString(PyExc_RuntimeError, "this rank is not a member of the mesh");
    return -1;
  }
  mt_error err = {0};
  int rc = mt_layout_local_box(l, coord, box, &err);
  if (rc != MT_OK) mt_ext_raise(rc, &err);
  return rc == MT_OK ? 0 : -1;
}

static PyArrayObject *new_box_array(PyObject *module, const mt_box *box,
                                    PyArrayObject *like) {
  npy_intp dims[MT_MAX_NDIM];
  for (int i = 0; i < box->ndim; ++i) dims[i] = (npy_intp)box->shape[i];
  return mt_ext_new_array(module, PyArray_DESCR(like), box->ndim, dims);
}

/* A local array must be exactly this rank's box: anything else would make MPI read
 * or write outside it. */
static int check_local(PyArrayObject *a, const mt_box *box) {
  int ok = PyArray_NDIM(a) == box->ndim;
  for (int i = 0; ok && i < box->ndim; ++i) ok = PyArray_DIM(a, i) == box->shape[i];
  if (!ok) {
    PyObject *shape = PyObject_GetAttrString((PyObject *)a, "shape");
    PyErr_Format(PyExc_ValueError, "the local array of shape %R is not this rank's shard "
                 "(%d dims) of the DTensor; was it built with from_local from "
                 "uneven shards without shape= and stride=?", shape, box->ndim);
    Py_XDECREF(shape);
  }
  return ok ? 0 : -1;
}

typedef struct call_args {
  mt_mesh *mesh;
  const mt_plan *plan;
  PyArrayObject *src;
  PyArrayObject *dst;
  int dtype;
  int no_memory; /* dst could not be allocated: the executor agrees on that */
} call_args;

/* Checks `local` against the plan's source layout and allocates the destination
 * (none when the plan has no step). */
static int prepare_run(PyObject *module, mt_mesh *mesh, const mt_plan *plan,
                       const mt_layout *src, const mt_layout *dst, PyObject *local,
                       call_args *c) {
  memset(c, 0, sizeof *c);
  c->mesh = mesh, c->plan = plan;
  mt_box sb, tb;
  if (my_box(mesh, src, &sb) < 0 || my_box(mesh, dst, &tb) < 0) return -1;
  c->src = mt_ext_contiguous(local);
  if (c->src == NULL) return -1;
  c->dtype = mt_ext_dtype(c->src);
  if (check_local(c->src, &sb) < 0) return -1;
  if (mt_plan_nsteps(plan) == 0) return 0;
  c->dst = new_box_array(module, &tb, c->src);
  /* A rank that cannot allocate its box still takes part, with no buffer, in the
   * agreement the executor starts with, so that every rank raises MemoryError. */
  if (c->dst == NULL && PyErr_ExceptionMatches(PyExc_MemoryError)) {
    PyErr_Clear();
    c->no_memory = 1;
  }
  return c->dst == NULL && !c->no_memory ? -1 : 0;
}

/* Parses (mesh, plan, array) for prepare_run. */
static int prepare(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                   call_args *c) {
  memset(c, 0, sizeof *c);
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "expected (mesh, plan, array)");
    return -1;
  }
  mt_mesh *mesh = mt_ext_mesh_for_collective(module, args[0]);
  if (mesh == NULL) return -1;
  if (!PyObject_TypeCheck(args[1], mt_ext_state_of(module)->plan_type)) {
    PyErr_SetString(PyExc_TypeError, "expected a _C.Plan");
    return -1;
  }
  PlanObject *p = (PlanObject *)args[1];
  return prepare_run(module, mesh, p->plan, &p->src, &p->dst, args[2], c);
}

static void release(call_args *c) {
  Py_XDECREF(c->src);
  Py_XDECREF(c->dst);
}

/* Runs a prepared plan, blocking; the new local array, or NULL with an exception. */
static PyObject *execute(call_args *c) {
  /* No step: the data is already there. */
  if (c->dst == NULL && !c->no_memory) return (PyObject *)c->src;
  mt_error err = {0};
  int rc;
  void *dst = c->dst != NULL ? PyArray_DATA(c->dst) : NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_redistribute(c->mesh, c->plan, c->dtype, PyArray_DATA(c->src), dst, &err);
  Py_END_ALLOW_THREADS
  if (rc != MT_OK) {
    release(c);
    return mt_ext_raise(rc, &err);
  }
  Py_DECREF(c->src);
  return (PyObject *)c->dst;
}

/* ---- redistribute ------------------------------------------------------------------- */

/* redistribute(mesh, plan, local) -> new local array. Collective on the mesh. */
static PyObject *redistribute(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  call_args c;
  if (prepare(module, args, nargs, &c) < 0) {
    release(&c);
    return NULL;
  }
  return execute(&c);
}

PyObject *mt_ext_run_plan(PyObject *module, mt_mesh *mesh, const mt_plan *plan,
                          PyObject *local) {
  int n = mt_plan_nsteps(plan);
  if (n == 0) return Py_NewRef(local);
  call_args c;
  if (prepare_run(module, mesh, plan, &mt_plan_step(plan, 0)->src,
                  &mt_plan_step(plan, n - 1)->dst, local, &c) < 0) {
    release(&c);
    return NULL;
  }
  return execute(&c);
}

PyObject *mt_ext_plan_wrap(PyObject *module, mt_plan *plan) {
  PyTypeObject *tp = mt_ext_state_of(module)->plan_type;
  int n = mt_plan_nsteps(plan);
  if (n == 0) {
    PyErr_SetString(PyExc_SystemError, "a plan without steps is not wrapped");
    return NULL;
  }
  PlanObject *self = (PlanObject *)tp->tp_alloc(tp, 0);
  if (self == NULL) return NULL;
  mt_plan_retain(plan);
  self->plan = plan;
  self->src = mt_plan_step(plan, 0)->src;
  self->dst = mt_plan_step(plan, n - 1)->dst;
  return (PyObject *)self;
}

/* The plan (with steps) started on this rank's local array: a _C.Request whose
 * wait() gives the new local array. Collective on the mesh. */
PyObject *mt_ext_start_plan(PyObject *module, PyObject *mesh_obj, const mt_plan *plan,
                            PyObject *local) {
  int n = mt_plan_nsteps(plan);
  mt_mesh *mesh = mt_ext_mesh_get_unchecked(mesh_obj);
  call_args c;
  if (prepare_run(module, mesh, plan, &mt_plan_step(plan, 0)->src,
                  &mt_plan_step(plan, n - 1)->dst, local, &c) < 0) {
    release(&c);
    return NULL;
  }
  mt_request *req = NULL;
  mt_error err = {0};
  int rc;
  void *dst = c.dst != NULL ? PyArray_DATA(c.dst) : NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_redistribute_start(mesh, plan, c.dtype, PyArray_DATA(c.src), dst, &req, &err);
  Py_END_ALLOW_THREADS
  PyObject *p = rc == MT_OK ? mt_ext_plan_wrap(module, (mt_plan *)plan) : NULL;
  PyObject *keep = p != NULL ? PyTuple_Pack(3, mesh_obj, p, (PyObject *)c.src) : NULL;
  PyObject *out = keep != NULL ? mt_ext_request_new(module, req, NULL, keep,
                                                    (PyObject *)c.dst)
                               : NULL;
  if (rc != MT_OK) mt_ext_raise(rc, &err);
  else if (out == NULL && req != NULL) mt_request_wait(req, &err);
  Py_XDECREF(keep);
  Py_XDECREF(p);
  release(&c);
  return out;
}

/* A layout of `shape` placed by `codes` on the mesh's shape. */
static int mesh_layout(mt_mesh *mesh, const int64_t *shape, int ndim, PyObject *codes,
                       mt_layout *out) {
  mt_placement pl[MT_MAX_MESH_NDIM];
  int64_t mshape[MT_MAX_MESH_NDIM];
  int np = 0, nm = mt_mesh_ndim(mesh);
  if (mt_ext_placements(codes, pl, &np) < 0) return -1;
  if (np != nm) {
    PyErr_Format(PyExc_ValueError, "%d placements for a %d-D mesh", np, nm);
    return -1;
  }
  for (int m = 0; m < nm; ++m) mshape[m] = mt_mesh_dim_size(mesh, m);
  mt_error err = {0};
  int rc = mt_layout_init(out, ndim, shape, nm, mshape, pl, &err);
  if (rc != MT_OK) mt_ext_raise(rc, &err);
  return rc == MT_OK ? 0 : -1;
}

/* ---- distribute ---------------------------------------------------------------------- */

/* distribute(mesh, placements, full[, src]) -> this rank's box of `full`, whose
 * copy at coordinate `src` (0) of every mesh dim is the source of truth.
 * Collective on the mesh. */
static PyObject *distribute(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3 && nargs != 4)
    return PyErr_Format(PyExc_TypeError, "distribute(mesh, placements, full[, src])");
  long long src = 0;
  if (nargs == 4) {
    src = PyLong_AsLongLong(args[3]);
    if (src == -1 && PyErr_Occurred()) return NULL;
  }
  mt_mesh *mesh = mt_ext_mesh_for_collective(module, args[0]);
  if (mesh == NULL) return NULL;
  PyArrayObject *full = mt_ext_contiguous(args[2]);
  if (full == NULL) return NULL;
  int64_t shape[MT_MAX_NDIM];
  int ndim = PyArray_NDIM(full) <= MT_MAX_NDIM ? PyArray_NDIM(full) : MT_MAX_NDIM + 1;
  for (int i = 0; i < ndim && i < MT_MAX_NDIM; ++i) shape[i] = PyArray_DIM(full, i);
  mt_layout layout;
  mt_box box;
  PyArrayObject *local = NULL;
  int ok = mesh_layout(mesh, shape, ndim, args[1], &layout) == 0 &&
           my_box(mesh, &layout, &box) == 0;
  if (ok) local = new_box_array(module, &box, full);
  /* A rank that cannot allocate its shard still takes part, with no buffer, in
   * the agreement mt_distribute starts with, so every rank raises MemoryError. */
  if (ok && local == NULL && PyErr_ExceptionMatches(PyExc_MemoryError)) PyErr_Clear();
  if (ok && !PyErr_Occurred()) {
    mt_error err = {0};
    int rc;
    void *out = local != NULL ? PyArray_DATA(local) : NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = mt_distribute_from(mesh, &layout, mt_ext_dtype(full), (int64_t)src,
                            PyArray_DATA(full), out, &err);
    Py_END_ALLOW_THREADS
    if (rc != MT_OK) {
      Py_CLEAR(local);
      mt_ext_raise(rc, &err);
    }
  }
  Py_DECREF(full);
  return (PyObject *)local;
}

/* ---- plan_check ----------------------------------------------------------------- */

/* plan_check(src_codes, dst_codes, dtype) -> None: raises what a redistribution
 * between these placements of `dtype` elements refuses (mt_plan_check), before any
 * communication. Local. */
static PyObject *plan_check(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) return PyErr_Format(PyExc_TypeError, "plan_check(src, dst, dtype)");
  mt_layout src, dst;
  memset(&src, 0, sizeof src);
  memset(&dst, 0, sizeof dst);
  PyArray_Descr *descr = NULL;
  if (mt_ext_placements(args[0], src.placements, &src.mesh_ndim) < 0 ||
      mt_ext_placements(args[1], dst.placements, &dst.mesh_ndim) < 0 ||
      !PyArray_DescrConverter(args[2], &descr)) {
    return NULL;
  }
  int dtype = mt_ext_descr_dtype(descr);
  Py_DECREF(descr);
  mt_error err = {0};
  int rc = mt_plan_check(&src, &dst, dtype, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  Py_RETURN_NONE;
}

/* ---- counters ------------------------------------------------------------------------ */

/* comm_counters() -> {name: (calls, bytes)} of every mesh of this module since it
 * was loaded. Local. */
static PyObject *comm_counters(PyObject *module, PyObject *unused) {
  mt_comm_totals c;
  mt_comm_counters_read(&mt_ext_state_of(module)->comm_counters, &c);
  PyObject *out = PyDict_New();
  for (int k = 0; out != NULL && k < MT_COLL_COUNT; ++k) {
    PyObject *v = Py_BuildValue("(LL)", (long long)c.calls[k], (long long)c.bytes[k]);
    if (v == NULL || PyDict_SetItemString(out, mt_coll_name(k), v) < 0) Py_CLEAR(out);
    Py_XDECREF(v);
  }
  return out;
}

/* ---- selection exchange (basic indexing) ---------------------------------------- */

/* The selection from (starts, steps, counts). */
static int read_selection(PyObject *const *args, int ndim, mt_selection *sel) {
  int n[3] = {0, 0, 0};
  memset(sel, 0, sizeof *sel);
  if (mt_ext_int64s(args[0], sel->start, MT_MAX_NDIM, &n[0], "starts") < 0 ||
      mt_ext_int64s(args[1], sel->step, MT_MAX_NDIM, &n[1], "steps") < 0 ||
      mt_ext_int64s(args[2], sel->count, MT_MAX_NDIM, &n[2], "counts") < 0)
    return -1;
  if (n[0] != ndim || n[1] != ndim || n[2] != ndim) {
    PyErr_SetString(PyExc_ValueError, "starts, steps and counts need one entry per dim");
    return -1;
  }
  sel->ndim = ndim;
  return 0;
}

/* select_exchange(mesh, shape, src_codes, dst_codes, starts, steps, counts, piece)
 *   -> this rank's box of the selection laid out by dst_codes. `piece` is the
 * rank's local array indexed by the selection. Collective on the mesh. */
static PyObject *select_exchange(PyObject *module, PyObject *const *args,
                                 Py_ssize_t nargs) {
  if (nargs != 8)
    return PyErr_Format(PyExc_TypeError, "select_exchange(mesh, shape, src_codes, "
                        "dst_codes, starts, steps, counts, piece)");
  mt_mesh *mesh = mt_ext_mesh_for_collective(module, args[0]);
  int64_t shape[MT_MAX_NDIM];
  int ndim = 0;
  mt_selection sel;
  mt_layout src, dst;
  if (mesh == NULL || mt_ext_int64s(args[1], shape, MT_MAX_NDIM, &ndim, "shape") < 0 ||
      read_selection(args + 4, ndim, &sel) < 0 ||
      mesh_layout(mesh, shape, ndim, args[2], &src) < 0 ||
      mesh_layout(mesh, sel.count, ndim, args[3], &dst) < 0)
    return NULL;
  mt_error err = {0};
  int rc = mt_selection_check(&sel, ndim, shape, &err);
  if (rc != MT_OK) return mt_ext_raise(rc, &err);
  mt_box sb, image, tb;
  if (my_box(mesh, &src, &sb) < 0 || my_box(mesh, &dst, &tb) < 0) return NULL;
  mt_selection_image(&sel, &sb, &image);
  PyArrayObject *in = mt_ext_contiguous(args[7]);
  if (in == NULL) return NULL;
  if (check_local(in, &image) < 0) {
    Py_DECREF(in);
    return NULL;
  }
  PyArrayObject *out = new_box_array(module, &tb, in);
  /* A rank that cannot allocate its box takes part in the agreement the exchange
   * starts with, with no buffer, so that every rank raises MemoryError. */
  if (out == NULL && !PyErr_ExceptionMatches(PyExc_MemoryError)) {
    Py_DECREF(in);
    return NULL;
  }
  PyErr_Clear();
  void *buf = out != NULL ? PyArray_DATA(out) : NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_selection_exchange(mesh, &src, &sel, &dst, mt_ext_dtype(in), PyArray_DATA(in),
                             buf, &err);
  Py_END_ALLOW_THREADS
  Py_DECREF(in);
  if (rc == MT_OK) return (PyObject *)out;
  Py_XDECREF(out);
  return mt_ext_raise(rc, &err);
}

PyMethodDef mt_ext_redistribute_methods[] = {
    {"select_exchange", (PyCFunction)(void (*)(void))select_exchange, METH_FASTCALL,
     "select_exchange(mesh, shape, src_codes, dst_codes, starts, steps, counts, piece) "
     "-> this rank's box of a selection moved to dst_codes. Collective."},
    {"redistribute", (PyCFunction)(void (*)(void))redistribute, METH_FASTCALL,
     "redistribute(mesh, plan, local) -> local array of the plan's target. Collective."},
    {"distribute", (PyCFunction)(void (*)(void))distribute, METH_FASTCALL,
     "distribute(mesh, placements, full[, src]) -> this rank's box. Collective."},
    {"plan_check", (PyCFunction)(void (*)(void))plan_check, METH_FASTCALL,
     "plan_check(src_codes, dst_codes, dtype) -> None: raises what redistributing "
     "src to dst placements of dtype refuses (RuntimeError: creating a Partial; "
     "TypeError: a reduction the dtype lacks). Local, no communication."},
    {"comm_counters", comm_counters, METH_NOARGS,
     "{collective name: (calls, bytes sent)} since the process started. Local."},
    {NULL, NULL, 0, NULL},
};

int mt_ext_redistribute_exec(PyObject *module) {
  mt_ext_state *st = mt_ext_state_of(module);
  st->plan_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &plan_spec, NULL);
  if (st->plan_type == NULL) return -1;
  if (PyModule_AddObjectRef(module, "Plan", (PyObject *)st->plan_type) < 0) return -1;
  PyObject *kinds = PyTuple_New(NKINDS);
  for (int k = 0; kinds != NULL && k < NKINDS; ++k) {
    PyObject *name = PyUnicode_FromString(step_names[k]);
    if (name == NULL) Py_CLEAR(kinds);
    else PyTuple_SET_ITEM(kinds, k, name);
  }
  if (kinds == NULL || PyModule_AddObjectRef(module, "STEP_KINDS", kinds) < 0) {
    Py_XDECREF(kinds);
    return -1;
  }
  Py_DECREF(kinds);
  return 0;
}
