/* DTensor.redistribute in the executor: a move is a decision like an operation's,
 * keyed in the mesh's memo by the source's layout id and the target placements,
 * holding the plan (checked and ranked by the mesh's time model) and the output's
 * layout. Then, as for every operation: the plan runs (blocking, or started as a
 * mpitensor._comm.Request kept in the DTensor's local slot), the result is wrapped, autograd
 * records it (the gradient goes back to the source's placements), and the trace
 * events go out while a tool listens. Arguments that are not the interned
 * placements go through the placements hook first, which raises torch's errors. */
#include "ext.h"

#include <string.h>

#include "mpitensor/comm/agree.h"
#include "mpitensor/core/strided.h"
#include "mpitensor/core/strided_route.h"

/* The key's word of target placements: 6 bits per mesh dim (kind, then the shard
 * dim or the reduce op). */
enum { AUX_BITS = 6 };

/* Target placements given as interned objects, one per mesh dim, shard dims inside
 * the tensor (and, when `strict`, a Partial only where the source has it): their
 * codes, the key's word and whether they are the source's. 1, or 0 for anything
 * else (the placements hook normalises it, and raises torch's errors). */
static int read_targets(const mt_ext_dispatch *d, PyObject *placements, PyObject *src,
                        int ndim, int strict, mt_placement *dst, int64_t *aux, int *same) {
  if (!PyList_CheckExact(placements) && !PyTuple_CheckExact(placements)) return 0;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(placements);
  PyObject *const *items = PySequence_Fast_ITEMS(placements);
  if (n != PyTuple_GET_SIZE(src)) return 0;
  *aux = 0, *same = 1;
  for (Py_ssize_t m = 0; m < n; ++m) {
    if (!mt_ext_interned_code(d, items[m], &dst[m])) return 0;
    if (dst[m].kind == MT_PLACEMENT_SHARD && dst[m].dim >= ndim) return 0;
    int kept = items[m] == PyTuple_GET_ITEM(src, m);
    if (strict && dst[m].kind == MT_PLACEMENT_PARTIAL && !kept) return 0;
    *same &= kept;
    int64_t arg = dst[m].kind == MT_PLACEMENT_SHARD ? dst[m].dim : dst[m].reduce_op;
    *aux |= (int64_t)(dst[m].kind | arg << 2) << (AUX_BITS * m);
  }
  return 1;
}

/* Whether the target placements hold a strided shard. */
static int strided_targets(const mt_ext_dispatch *d, PyObject *placements) {
  if (!PyList_CheckExact(placements) && !PyTuple_CheckExact(placements)) return 0;
  for (Py_ssize_t m = 0; m < PySequence_Fast_GET_SIZE(placements); ++m)
    if (mt_ext_placement_strided(d, PySequence_Fast_ITEMS(placements)[m])) return 1;
  return 0;
}

/* A miss: the move checked and planned by the core and stored. */
static mt_decision *decide(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *spec,
                           const mt_placement *dst, const mt_memo_key *mk) {
  mt_layout_key key;
  if (mt_ext_spec_key(d, mb, spec, &key) < 0) return NULL;
  int dtype = mt_ext_descr_dtype((PyArray_Descr *)PyTuple_GET_ITEM(spec, 3));
  mt_decision *dec = NULL;
  mt_error err = {0};
  int rc = mt_memo_decide_move(mb->memo, mk, &key, dtype, mb->mesh_shape, dst, &dec, &err);
  return rc == MT_OK ? dec : (mt_decision *)mt_ext_raise(rc, &err);
}

/* The output's layout: the source's with the target placements (same shape,
 * dtype and strides), interned, and remembered in the decision. */
static PyObject *out_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *spec,
                            const mt_placement *dst, const mt_memo_key *mk, int64_t *id) {
  mt_decision *live = mt_memo_peek(mb->memo, mk);
  if (live != NULL && live->out_id != 0) {
    PyObject *have = mt_ext_py_layout(d, mb, live->out_id, live->out_slot, NULL, NULL);
    if (have != NULL || PyErr_Occurred()) return *id = live->out_id, have;
  }
  mt_layout_key key;
  if (mt_ext_spec_key(d, mb, spec, &key) < 0) return NULL;
  memcpy(key.placements, dst, (size_t)mb->mesh_ndim * sizeof *dst);
  return mt_ext_output_layout(d, mb, mk, &key, PyTuple_GET_ITEM(spec, 3), id);
}

/* The normalised arguments (the placements hook): placements as interned objects,
 * the forward and backward dtypes or None. -1 with the hook's exception. */
static int normalise(mt_ext_dispatch *d, PyObject *self, PyObject *mesh, PyObject **pl,
                     PyObject **fwd, PyObject **bwd, PyObject **holder) {
  PyObject *fn = PyDict_GetItemString(d->hooks, "placements");
  if (fn == NULL) return PyErr_SetString(PyExc_RuntimeError, "no placements hook"), -1;
  PyObject *args[5] = {self, mesh, *pl, *fwd, *bwd};
  *holder = mt_ext_hook(d, MT_HOOK_PLACEMENTS, fn, args, 5, NULL);
  if (*holder == NULL) return -1;
  if (!PyTuple_Check(*holder) || PyTuple_GET_SIZE(*holder) != 3)
    return PyErr_SetString(PyExc_TypeError, "the placements hook gives 3 values"), -1;
  *pl = PyTuple_GET_ITEM(*holder, 0);
  *fwd = PyTuple_GET_ITEM(*holder, 1), *bwd = PyTuple_GET_ITEM(*holder, 2);
  return 0;
}

/* `self` cast to `dtype` for the move (its spec with that dtype). */
static PyObject *cast(mt_ext_dispatch *d, mt_ext_dtensor *b, PyObject *dtype) {
  PyObject *items[5];
  for (Py_ssize_t i = 0; i < 5; ++i) items[i] = i == 3 ? dtype : PyTuple_GET_ITEM(b->spec, i);
  Py_INCREF(dtype);
  PyObject *local = PyArray_CastToType((PyArrayObject *)b->local, (PyArray_Descr *)dtype, 0);
  return mt_ext_new_dtensor(d, local, local ? mt_ext_spec_new(d, items) : NULL, 0, 0);
}

/* The local array of the output: the plan run (or started) on this rank's. */
static PyObject *moved_local(mt_ext_dispatch *d, mt_ext_mesh_base *mb, mt_ext_dtensor *b,
                             mt_plan *plan, int same, int async) {
  if (!mb->member || same) return Py_NewRef(b->local);
  /* Checked on every rank that moves, even where its own part stays: on another
   * rank or a larger mesh the same move communicates. */
  if (mt_ext_mesh_check(mb) < 0) return NULL;
  if (plan == NULL) return (PyObject *)mt_ext_contiguous(b->local);
  if (async) return mt_ext_start_plan(d->module, mb, plan, b->local);
  return mt_ext_run_plan(d->module, mb->mesh, plan, b->local);
}

/* Records the move: the gradient goes back to the source's placements. */
static PyObject *record_move(mt_ext_dispatch *d, PyObject *self, PyObject *out,
                             PyObject *bwd) {
  PyObject *bw = d->move_grad;
  if (bw == NULL) return out;
  PyObject *aux = PyTuple_Pack(1, bwd);
  if (aux == NULL) return Py_DECREF(out), NULL;
  out = mt_ext_record(d, PyTuple_GET_ITEM(bw, 0), PyTuple_GET_ITEM(bw, 1), out, &self, 1,
                      NULL, aux);
  Py_DECREF(aux);
  return out;
}

/* An explicit redistribute is collective by contract, so it is agreed on before
 * anything moves, over the source's mesh (which every rank has, whatever it
 * passed): one rank's bad argument (`dst` NULL, with its exception pending) becomes
 * every rank's exception, and targets, async_op or forward_dtype that differ between
 * ranks raise instead of pairing different collectives, also where one rank's move
 * is none. After the decision, so that a target the core refuses on one rank is
 * agreed too; `spec` is the moved tensor's (cast to forward_dtype). 0, or -1 with
 * the agreed exception. */
static int agree_on_move(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *spec,
                         const mt_placement *dst, int async) {
  /* Under collective checks the checker compares every call on a communicator of
   * its own, at the move's event: a second agreement here would pair with it on
   * a rank whose operation moves an input where the others redistribute. */
  if (!mb->member || mt_ext_mesh_size(mb) == 1 || d->modes->checks)
    return dst != NULL ? 0 : -1;
  mt_error err = {0};
  int rc = mt_mesh_check(mb->mesh, &err);
  if (rc != MT_OK) {
    PyErr_Clear();
    return mt_ext_raise(rc, &err), -1;
  }
  if (dst == NULL) rc = mt_ext_fetch_status(&err);
  mt_layout_key key;
  mt_layout from;
  if (mt_ext_spec_key(d, mb, spec, &key) < 0) {
    if (rc == MT_OK) rc = mt_ext_fetch_status(&err);
    else PyErr_Clear();
    memset(&key, 0, sizeof key);
    key.mesh_ndim = mb->mesh_ndim;
  }
  /* Hashed on every rank, so a layout the core refuses is hashed as zeros. */
  memset(&from, 0, sizeof from);
  int init = mt_strided_init(&from, key.ndim, key.shape, mb->mesh_ndim, mb->mesh_shape,
                             key.placements, rc == MT_OK ? &err : NULL);
  if (rc == MT_OK) rc = init;
  Py_BEGIN_ALLOW_THREADS
  rc = mt_agree_move(mb->mesh, rc, &from, dst, key.dtype, async, &err);
  Py_END_ALLOW_THREADS
  return mt_ext_ok(rc, &err);
}

/* The move of `src` (self, or its cast) to `dst`: decision, plan, wrap. */
static PyObject *run_move(mt_ext_dispatch *d, mt_ext_mesh_base *mb, mt_ext_dtensor *src,
                          const mt_placement *dst, int64_t aux, int same, int async,
                          PyObject *what) {
  int explicit = what == d->str[MT_S_REDISTRIBUTE];
  mt_memo_key mk;
  mk.op = d->redistribute_op, mk.noperands = 1, mk.aux = aux, mk.grad = 0, mk.want = 0;
  mt_decision *dec = NULL;
  if (mt_ext_layout_id(d, mb, src, NULL, &mk.operand[0]) == 0 &&
      (dec = mt_memo_find(mb->memo, &mk)) == NULL)
    dec = decide(d, mb, src->spec, dst, &mk);
  if (dec == NULL) {
    if (explicit) agree_on_move(d, mb, src->spec, NULL, async);
    return NULL;
  }
  /* Held: a collective releases the GIL, and events run Python. */
  mt_plan *plan = dec->plan[0];
  if (plan != NULL) mt_plan_retain(plan);
  int64_t id = mk.operand[0];
  PyObject *spec = NULL, *local = NULL, *layout = NULL, *out;
  if (same) spec = Py_NewRef(src->spec);
  else if ((layout = out_layout(d, mb, src->spec, dst, &mk, &id)) != NULL)
    spec = mt_ext_make_spec(d, (PyObject *)mb, layout);
  if (explicit && agree_on_move(d, mb, src->spec, spec != NULL ? dst : NULL, async) < 0)
    Py_CLEAR(spec);
  if (spec != NULL && mt_ext_events(d->modes) && mb->member &&
      mt_ext_move_event(d, src->spec, plan, same, what, PyTuple_GET_ITEM(spec, 1)) < 0)
    Py_CLEAR(spec);
  if (spec != NULL) local = moved_local(d, mb, src, plan, same, async);
  Py_XDECREF(layout);
  int fresh = plan != NULL ? !async && mb->member && d->modes->backward : src->fresh;
  out = mt_ext_new_dtensor(d, local, spec, id, fresh);
  if (out != NULL && plan == NULL) src->fresh = 0; /* the array changes hands */
  if (plan != NULL) mt_plan_destroy(plan);
  d->hook_calls[MT_HOOK_RUNS]++;
  return out;
}

/* ---- Strided shards: plain moves of reshaped local arrays. ---- */

/* Whether redistribute's arguments need no normalising: the DTensor's own mesh
 * (or none), no dtypes, and a tuple of placements, one per mesh dim, each an
 * interned one or a strided shard, their dims inside the tensor. */
static int normal_args(const mt_ext_dispatch *d, const mt_ext_mesh_base *mb,
                       const PyObject *mesh, PyObject *placements, const PyObject *fwd,
                       const PyObject *bwd, int ndim) {
  if ((mesh != Py_None && mesh != (const PyObject *)mb) || fwd != Py_None || bwd != Py_None ||
      !PyTuple_CheckExact(placements) || PyTuple_GET_SIZE(placements) != mb->mesh_ndim)
    return 0;
  for (Py_ssize_t m = 0; m < mb->mesh_ndim; ++m) {
    mt_placement c;
    if (mt_ext_placement_code(d, PyTuple_GET_ITEM(placements, m), &c) < 0)
      return PyErr_Clear(), 0;
    int cuts = c.kind == MT_PLACEMENT_SHARD || c.kind == MT_PLACEMENT_STRIDED;
    if (cuts && (c.dim < 0 || c.dim >= ndim)) return 0;
  }
  return 1;
}

/* A move from or to a strided shard, by its route (mpitensor/core/strided_route.h):
 * one plain move of the reshaped local arrays, or a move to a plain layout, as
 * torch passes through Replicate, and the route from there; each move is one of
 * its own, recorded for autograd as such. Runs blocking. */
static PyObject *strided_move(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *self,
                              PyObject *mesh, PyObject *placements, PyObject *fwd,
                              PyObject *bwd, PyObject *what) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  int explicit = what == d->str[MT_S_REDISTRIBUTE], hops = 0, rc = MT_OK;
  PyObject *holder = NULL, *spec = b->spec, *out = NULL;
  mt_layout src, dst, from, to, mid;
  mt_error err = {0};
  int ndim = (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 2));
  int normal = normal_args(d, mb, mesh, placements, fwd, bwd, ndim);
  if (mt_ext_complete(d, b) < 0 ||
      (!normal && normalise(d, self, mesh, &placements, &fwd, &bwd, &holder) < 0) ||
      mt_ext_strided_layout(d, mb, PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(spec, 1), &src) < 0 ||
      mt_ext_strided_layout(d, mb, PyTuple_GET_ITEM(spec, 2), placements, &dst) < 0 ||
      (rc = mt_strided_route(&src, &dst, &from, &to, &mid, &hops, &err)) != MT_OK) {
    if (rc != MT_OK) mt_ext_raise(rc, &err);
    if (explicit) agree_on_move(d, mb, spec, NULL, 0);
    Py_XDECREF(holder);
    return NULL;
  }
  if (hops == 1) {
    PyObject *view = mt_ext_as_layout(d, mb, spec, b->local, &from, NULL);
    PyObject *target = mt_ext_placement_objects(d, to.placements, to.mesh_ndim);
    PyObject *moved = view && target ? mt_ext_move(d, view, Py_None, target, 0, fwd, Py_None,
                                                   what)
                                     : NULL;
    if (moved != NULL)
      out = mt_ext_as_layout(d, mb, ((mt_ext_dtensor *)moved)->spec, ((mt_ext_dtensor *)moved)->local,
                      &dst, placements);
    Py_XDECREF(view);
    Py_XDECREF(target);
    Py_XDECREF(moved);
    if (out != NULL && b->requires_grad && d->modes->grad_enabled)
      out = record_move(d, self, out, bwd);
  } else {
    PyObject *m = mt_ext_placement_objects(d, mid.placements, mid.mesh_ndim);
    PyObject *x = m ? mt_ext_move(d, self, Py_None, m, 0, fwd, bwd, what) : NULL;
    out = x ? mt_ext_move(d, x, Py_None, placements, 0, Py_None, Py_None, what) : NULL;
    Py_XDECREF(m);
    Py_XDECREF(x);
  }
  Py_XDECREF(holder);
  return out;
}

PyObject *mt_ext_move(mt_ext_dispatch *d, PyObject *self, PyObject *mesh,
                      PyObject *placements, int async, PyObject *fwd, PyObject *bwd,
                      PyObject *what) {
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  mt_ext_mesh_base *mb = mt_ext_spec_mesh(d, b->spec);
  if (mb == NULL) return PyErr_Format(PyExc_TypeError, "a DTensor's spec names its mesh");
  if (mt_ext_strided(d, self) || strided_targets(d, placements))
    return strided_move(d, mb, self, mesh, placements, fwd, bwd, what);
  if (mt_ext_complete(d, b) < 0) return NULL;
  PyObject *holder = NULL;
  mt_placement dst[MT_MAX_MESH_NDIM];
  int64_t aux;
  int same, ndim = (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(b->spec, 2));
  int explicit = what == d->str[MT_S_REDISTRIBUTE];
  /* Each failure before the move, on one rank, is agreed (agree_on_move). */
  if ((mesh != Py_None && mesh != (PyObject *)mb) || fwd != Py_None || bwd != Py_None ||
      !read_targets(d, placements, PyTuple_GET_ITEM(b->spec, 1), ndim, 1, dst, &aux, &same)) {
    if (normalise(d, self, mesh, &placements, &fwd, &bwd, &holder) < 0) {
      if (explicit) agree_on_move(d, mb, b->spec, NULL, async);
      return NULL;
    }
    if (!read_targets(d, placements, PyTuple_GET_ITEM(b->spec, 1), ndim, 0, dst, &aux,
                      &same)) {
      PyErr_Format(PyExc_ValueError, "placements %R are not valid here", placements);
      if (explicit) agree_on_move(d, mb, b->spec, NULL, async);
      Py_DECREF(holder);
      return NULL;
    }
  }
  PyObject *src = self;
  if (fwd != Py_None && fwd != PyTuple_GET_ITEM(b->spec, 3)) {
    src = cast(d, b, fwd);
    same = 0;
  }
  if (src == NULL && explicit) agree_on_move(d, mb, b->spec, NULL, async);
  PyObject *out = src == NULL ? NULL
                              : run_move(d, mb, (mt_ext_dtensor *)src, dst, aux, same, async,
                                         what);
  if (src != self) Py_XDECREF(src);
  if (out != NULL && b->requires_grad && d->modes->grad_enabled)
    out = record_move(d, self, out, bwd);
  Py_XDECREF(holder);
  return out;
}

/* move(dtensor, placements, what): see the method table. */
static PyObject *move(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  mt_ext_dispatch *d = mt_ext_dispatch_module(module);
  if (nargs != 3 || !mt_ext_is_dtensor(d, args[0]) || !PyUnicode_Check(args[2]))
    return PyErr_Format(PyExc_TypeError, "move(dtensor, placements, what: str)");
  return mt_ext_move(d, args[0], Py_None, args[1], 0, Py_None, Py_None, args[2]);
}

PyMethodDef mt_ext_move_methods[] = {
    {"move", (PyCFunction)(void (*)(void))move, METH_FASTCALL,
     "move(dtensor, placements, what) -> DTensor: a redistribute an operation needs, "
     "named `what` in the trace (checked only when it communicates). Collective on "
     "the mesh.\n\nExample: _C.move(dt, (Replicate(),), 'numpy.sort')"},
    {NULL, NULL, 0, NULL},
};
