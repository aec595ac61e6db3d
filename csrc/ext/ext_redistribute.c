/* Running a plan on this rank's local array (blocking, or started), and a plan
 * handed to Python (the trace events) as a capsule that mpitensor._plan reads. */
#include "ext.h"

#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/redistribute.h"

/* This rank's box of `l`: 0, or -1 with the exception (RuntimeError off the mesh). */
static int my_box(const mt_mesh *mesh, const mt_layout *l, mt_box *box) {
  mt_error err = {0};
  return mt_ext_ok(mt_mesh_local_box(mesh, l, box, &err), &err);
}

static PyArrayObject *new_box_array(PyObject *module, const mt_box *box,
                                    PyArrayObject *like) {
  npy_intp dims[MT_MAX_NDIM];
  for (int i = 0; i < box->ndim; ++i) dims[i] = (npy_intp)box->shape[i];
  return mt_ext_new_array(module, PyArray_DESCR(like), box->ndim, dims);
}

/* A local array must be exactly this rank's box (the core's check and words). */
static int check_local(PyArrayObject *a, const mt_box *box) {
  int64_t shape[MT_MAX_NDIM];
  int n = PyArray_NDIM(a);
  for (int i = 0; i < n && i < MT_MAX_NDIM; ++i) shape[i] = PyArray_DIM(a, i);
  mt_error err = {0};
  return mt_ext_ok(mt_box_check_local(box, n, shape, &err), &err);
}

typedef struct call_args {
  mt_mesh *mesh;
  const mt_plan *plan;
  PyArrayObject *src;
  PyArrayObject *dst;
  int dtype;
  int no_memory; /* dst could not be allocated: the executor agrees on that */
} call_args;

/* Checks `local` against the source layout of the plan (which has steps) and
 * allocates the destination. */
static int prepare_run(PyObject *module, mt_mesh *mesh, const mt_plan *plan, PyObject *local,
                       call_args *c) {
  memset(c, 0, sizeof *c);
  c->mesh = mesh, c->plan = plan;
  mt_box sb, tb;
  const mt_layout *src = &mt_plan_step(plan, 0)->src;
  const mt_layout *dst = &mt_plan_step(plan, mt_plan_nsteps(plan) - 1)->dst;
  if (my_box(mesh, src, &sb) < 0 || my_box(mesh, dst, &tb) < 0) return -1;
  c->src = mt_ext_contiguous(local);
  if (c->src == NULL) return -1;
  c->dtype = mt_ext_dtype(c->src);
  if (check_local(c->src, &sb) < 0) return -1;
  c->dst = new_box_array(module, &tb, c->src);
  /* A rank that cannot allocate its box still takes part, with no buffer, in the
   * agreement the executor starts with, so that every rank raises MemoryError. */
  if (c->dst == NULL && PyErr_ExceptionMatches(PyExc_MemoryError)) {
    PyErr_Clear();
    c->no_memory = 1;
  }
  return c->dst == NULL && !c->no_memory ? -1 : 0;
}

static void release(call_args *c) {
  Py_XDECREF(c->src);
  Py_XDECREF(c->dst);
}

/* Runs a prepared plan, blocking; the new local array, or NULL with an exception. */
static PyObject *execute(call_args *c) {
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

PyObject *mt_ext_run_plan(PyObject *module, mt_mesh *mesh, const mt_plan *plan,
                          PyObject *local) {
  if (mt_plan_nsteps(plan) == 0) return Py_NewRef(local);
  call_args c;
  if (prepare_run(module, mesh, plan, local, &c) < 0) {
    release(&c);
    return NULL;
  }
  return execute(&c);
}

/* The plan (with steps) started on this rank's local array: a _C.Request whose
 * wait() gives the new local array. Collective on the mesh. */
PyObject *mt_ext_start_plan(PyObject *module, mt_ext_mesh_base *mb, const mt_plan *plan,
                            PyObject *local) {
  mt_mesh *mesh = mb->mesh;
  call_args c;
  if (prepare_run(module, mesh, plan, local, &c) < 0) {
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
  PyObject *p = rc == MT_OK ? mt_ext_plan_wrap((mt_plan *)plan) : NULL;
  /* The target too, which the request's owner frees only after the exchange;
   * not the source: the executor reads it before returning. */
  PyObject *target = c.dst != NULL ? (PyObject *)c.dst : Py_None;
  PyObject *keep = p != NULL ? PyTuple_Pack(3, (PyObject *)mb, p, target) : NULL;
  PyObject *out = NULL;
  if (rc != MT_OK) mt_ext_raise(rc, &err);
  else if (keep == NULL) mt_request_wait(req, &err); /* nothing owns it: completed here */
  else out = mt_ext_request_new(mt_ext_dispatch_module(module), req, keep, (PyObject *)c.dst);
  Py_XDECREF(keep);
  Py_XDECREF(p);
  release(&c);
  return out;
}
