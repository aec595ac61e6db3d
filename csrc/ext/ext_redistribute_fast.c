/* DTensor.redistribute's C path: a call whose move the mesh's decision memo holds
 * runs its plan and wraps the result without any Python code, the way the
 * dispatch's C path runs an operation (ext_dispatch.c). The move is a decision
 * like an operation's: keyed by the source's layout id and the target placements,
 * holding the plan (checked and ranked by the mesh's time model, as _C.Plan is)
 * and the id of the output's layout. Anything else (async_op, forward_dtype, a
 * tensor autograd records, a tool listening, a rank outside the mesh, placements
 * that are not the interned ones or would be refused) goes to the Python
 * implementation, DTensor._redistribute, which raises every error. */
#include "ext.h"

/* The key's word of target placements: 6 bits per mesh dim (kind, then the shard
 * dim or the reduce op), 48 bits for MT_MAX_MESH_NDIM dims. */
enum { AUX_BITS = 6 };

/* The code of an interned placement object (the only ones the C path takes):
 * 1, or 0 for any other object. */
static int interned_code(const mt_ext_dispatch *d, const PyObject *p, mt_placement *out) {
  if (p == d->replicate) {
    *out = (mt_placement){MT_PLACEMENT_REPLICATE, 0, 0};
    return 1;
  }
  for (int i = 0; i < MT_MAX_NDIM; ++i) {
    if (p != d->shard[i]) continue;
    *out = (mt_placement){MT_PLACEMENT_SHARD, i, 0};
    return 1;
  }
  for (int op = 0; op < MT_REDUCE_COUNT; ++op) {
    if (p != d->partial[op]) continue;
    *out = (mt_placement){MT_PLACEMENT_PARTIAL, 0, op};
    return 1;
  }
  return 0;
}

/* The target placements of a call the C path takes, and the key's word for them:
 * one interned placement per mesh dim, shard dims inside the tensor, and a Partial
 * only where the source has that same Partial (creating one, or changing its op,
 * is the Python path's to refuse). *same: the target is the source. 1, or 0. */
static int read_targets(const mt_ext_dispatch *d, PyObject *placements, PyObject *src,
                        int mesh_ndim, int ndim, mt_placement *dst, int64_t *aux,
                        int *same) {
  PyObject *const *items;
  Py_ssize_t n;
  if (PyList_CheckExact(placements)) {
    items = ((PyListObject *)placements)->ob_item, n = PyList_GET_SIZE(placements);
  } else if (PyTuple_CheckExact(placements)) {
    items = ((PyTupleObject *)placements)->ob_item, n = PyTuple_GET_SIZE(placements);
  } else {
    return 0;
  }
  if (n != mesh_ndim) return 0;
  *aux = 0, *same = 1;
  for (int m = 0; m < mesh_ndim; ++m) {
    PyObject *p = items[m];
    if (!interned_code(d, p, &dst[m])) return 0;
    int is_src = p == PyTuple_GET_ITEM(src, m);
    if (dst[m].kind == MT_PLACEMENT_SHARD && dst[m].dim >= ndim) return 0;
    if (dst[m].kind == MT_PLACEMENT_PARTIAL && !is_src) return 0;
    *same &= is_src;
    int64_t arg = dst[m].kind == MT_PLACEMENT_SHARD ? dst[m].dim : dst[m].reduce_op;
    *aux |= (int64_t)(dst[m].kind | arg << 2) << (AUX_BITS * m);
  }
  return 1;
}

/* The output's layout (the source's with the target placements: same shape,
 * dtype and strides, as the Python path's spec) interned: its id, slot and Python
 * form (a new reference), recorded in the memo's decision of `mk` when it is
 * still there. -1 with an exception. */
static int output_layout(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *spec,
                         const mt_placement *dst, const mt_memo_key *mk, int64_t *id,
                         PyObject **layout) {
  mt_layout_key key;
  if (mt_ext_spec_key(d, mb, spec, &key) < 0) return -1;
  memcpy(key.placements, dst, (size_t)mb->mesh_ndim * sizeof *dst);
  int64_t slot;
  mt_error err = {0};
  int rc = mt_layout_table_intern(mb->layouts, &key, id, &slot, &err);
  if (rc != MT_OK) {
    mt_ext_raise(rc, &err);
    return -1;
  }
  *layout = mt_ext_py_layout(d, mb, *id, slot, &key, PyTuple_GET_ITEM(spec, 3));
  if (*layout == NULL) return -1;
  mt_decision *live = mt_memo_peek(mb->memo, mk);
  if (live != NULL) live->out_id = *id, live->out_slot = slot;
  return 0;
}

/* A miss: the move checked and planned by the core (mt_memo_decide_targets: the
 * check and plan of _C.Plan, with the mesh's time model) and stored. NULL with
 * no exception when the core refuses the move (the Python path raises it), or
 * with one for anything else. */
static mt_decision *decide(mt_ext_dispatch *d, mt_ext_mesh_base *mb, PyObject *spec,
                           const mt_placement *dst, const mt_memo_key *mk) {
  mt_layout_key key;
  if (mt_ext_spec_key(d, mb, spec, &key) < 0) return NULL;
  int dtype = mt_ext_descr_dtype((PyArray_Descr *)PyTuple_GET_ITEM(spec, 3));
  if (dtype < 0) return NULL;
  mt_prop_inputs in;
  memset(&in, 0, sizeof in);
  in.ninputs = 1, in.mesh_ndim = mb->mesh_ndim, in.ndim[0] = key.ndim;
  in.itemsize[0] = key.itemsize;
  memcpy(in.mesh_shape, mb->mesh_shape, sizeof in.mesh_shape);
  memcpy(in.shape[0], key.shape, sizeof key.shape);
  memcpy(in.placements[0], key.placements, sizeof key.placements);
  mt_placement targets[1][MT_MAX_MESH_NDIM];
  memset(targets, 0, sizeof targets);
  memcpy(targets[0], dst, (size_t)mb->mesh_ndim * sizeof *dst);
  mt_decision outcome;
  memset(&outcome, 0, sizeof outcome);
  outcome.out_ndim = key.ndim;
  memcpy(outcome.out_shape, key.shape, sizeof key.shape);
  memcpy(outcome.out_placements, targets[0], sizeof targets[0]);
  mt_decision *dec = NULL;
  mt_error err = {0};
  int rc = mt_memo_decide_targets(mb->memo, mk, &in, &dtype,
                                  (const mt_placement(*)[MT_MAX_MESH_NDIM])targets,
                                  &outcome, &dec, &err);
  if (rc == MT_ENOMEM) PyErr_NoMemory();
  return rc == MT_OK ? dec : NULL;
}

int mt_ext_redistribute_fast(mt_ext_dispatch *d, PyObject *self, const PyObject *mesh,
                             PyObject *placements, PyObject **out) {
  if (!d->enabled || d->tracing || !mt_ext_plain_dtensor(d, self)) return 0;
  mt_ext_dtensor *b = (mt_ext_dtensor *)self;
  PyObject *spec = b->spec;
  mt_ext_mesh_base *mb = mt_ext_spec_mesh(d, spec);
  if (mb == NULL || !mb->member || mb->handle == NULL) return 0;
  if (mesh != Py_None && mesh != (PyObject *)mb) return 0;
  /* Another thread than the mesh's: the Python path refuses every move there, with
   * or without communication, so the answer does not depend on the plan. */
  if (mt_ext_mesh_check_thread(mb->handle) < 0) {
    PyErr_Clear();
    return 0;
  }
  mt_placement dst[MT_MAX_MESH_NDIM];
  int same;
  mt_memo_key mk;
  mk.op = d->redistribute_op, mk.noperands = 1;
  /* A spec with a layout id has been read as one (mt_ext_spec_key): its
   * placements and shape are tuples of the mesh's and the tensor's ndim. */
  if (mt_ext_layout_id(d, mb, b, NULL, &mk.operand[0]) < 0) return -1;
  if (!read_targets(d, placements, PyTuple_GET_ITEM(spec, 1), mb->mesh_ndim,
                    (int)PyTuple_GET_SIZE(PyTuple_GET_ITEM(spec, 2)), dst, &mk.aux, &same))
    return 0;
  mt_decision *dec = mt_memo_find(mb->memo, &mk);
  if (dec == NULL) {
    dec = decide(d, mb, spec, dst, &mk);
    if (dec == NULL) return PyErr_Occurred() ? -1 : 0;
  }
  /* What the call needs from the decision, taken before anything runs that may
   * change the memo (the plan is held: a collective releases the GIL). */
  mt_plan *plan = dec->plan[0];
  int64_t id = dec->out_id, slot = dec->out_slot;
  PyObject *layout = NULL, *out_spec;
  if (same) {
    out_spec = Py_NewRef(spec);
  } else {
    layout = id != 0 ? mt_ext_py_layout(d, mb, id, slot, NULL, NULL) : NULL;
    if (layout == NULL && (PyErr_Occurred() ||
                           output_layout(d, mb, spec, dst, &mk, &id, &layout) < 0))
      return -1;
    out_spec = mt_ext_make_spec(d, (PyObject *)mb, layout);
    Py_DECREF(layout);
    if (out_spec == NULL) return -1;
  }
  PyObject *local;
  if (plan == NULL) {
    local = same ? Py_NewRef(b->local) : (PyObject *)mt_ext_contiguous(b->local);
  } else {
    mt_plan_retain(plan);
    local = mt_ext_run_plan(d->module, mt_ext_mesh_get_unchecked(mb->handle), plan,
                            b->local);
    mt_plan_destroy(plan);
  }
  mt_ext_dtensor *res = local != NULL ? (mt_ext_dtensor *)d->dtensor->tp_alloc(d->dtensor, 0)
                                      : NULL;
  if (res == NULL) {
    Py_XDECREF(local);
    Py_DECREF(out_spec);
    return -1;
  }
  res->local = local, res->spec = out_spec, res->layout_id = same ? mk.operand[0] : id;
  d->redistribute_c_calls++;
  *out = (PyObject *)res;
  return 1;
}
