/* Basic indexing's exchange (mt_selection_exchange): the picked elements each rank
 * lacks, from the ranks that hold them, in one MPI_Alltoallw, after the members
 * agree on the key. */
#include "count-private.h"
#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/redistribute.h"
#include "redistribute-private.h"

/* The exchange of a selection: every peer's boxes, then its datatypes. */
static int selection_build(const exec_ctx *c, const mt_layout *src,
                           const mt_selection *sel, const mt_layout *dst,
                           mt__exchange *x, mt_error *err) {
  mt__exchange_scratch sc;
  int rc = mt__exchange_scratch_init(c->mesh, c->coord, -1, &sc, err);
  if (rc != MT_OK) return rc;
  rc = mt_selection_exchange_boxes(src, sel, dst, c->coord, sc.n, sc.send, sc.recv, err);
  if (rc == MT_OK) {
    mt_box own, sb, tb;
    mt__exec_box(c, src, -1, 0, &own);
    mt_selection_image(sel, &own, &sb);
    mt__exec_box(c, dst, -1, 0, &tb);
    rc = mt__exchange_build(&sb, &tb, sc.send, sc.recv, sc.lin, (int)sc.n, sc.me,
                            c->itemsize, NULL, x, err);
  }
  mt__exchange_scratch_free(&sc);
  return rc;
}

int mt_selection_exchange(mt_mesh *mesh, const mt_layout *src, const mt_selection *sel,
                          uint64_t key, const mt_layout *dst, int dtype, const void *in,
                          void *out, mt_error *err) {
  exec_ctx c;
  int rc = mt__ctx_base(&c, mesh, dtype, err);
  if (rc == MT_OK) rc = mt__check_mesh_shape(mesh, src, err);
  if (rc == MT_ESTATE) return rc; /* not a member: no agreement to take part in */
  uint64_t picked = mt__fnv1a(MT__FNV_START, &sel->ndim, sizeof sel->ndim);
  picked = mt__fnv1a(picked, sel->start, (size_t)sel->ndim * sizeof *sel->start);
  picked = mt__fnv1a(picked, sel->step, (size_t)sel->ndim * sizeof *sel->step);
  picked = mt__fnv1a(picked, sel->count, (size_t)sel->ndim * sizeof *sel->count);
  picked = mt__fnv1a(picked, &key, sizeof key);
  rc = mt__agree_before_move(&c, "indexing", src, dst, picked, "keys", MT__AGREE_ALWAYS,
                             out, rc, err);
  if (rc != MT_OK) return rc;
  MPI_Comm comm = MPI_COMM_NULL;
  mt__exchange x = {0};
  rc = selection_build(&c, src, sel, dst, &x, err);
  if (rc == MT_OK) rc = mt_mesh_comm(mesh, &comm, err);
  if (rc == MT_OK) rc = mt__exchange_post(&x, in, out, comm, NULL, err);
  if (rc == MT_OK) mt__count(mesh, MT_COLL_ALL_TO_ALL, x.sent);
  mt__exchange_free(&x);
  return rc;
}
