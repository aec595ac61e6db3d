/* Device meshes: the communicators behind a DeviceMesh.
 *
 * A mesh splits the user's communicator once into a communicator of its members
 * (ordered by their row-major mesh position) and that one into one communicator per
 * mesh dim. Every communicator gets MPI_ERRORS_RETURN so an MPI failure comes back
 * as a status instead of killing the job. */
#include "mpitensor/comm/mesh.h"

#include <limits.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "comm-private.h"
#include "direct-private.h"
#include "mpitensor/comm/agree.h"
#include "mpitensor/comm/counters.h"

struct mt_mesh {
  int refcount;    /* Slices hold a reference to their parent. */
  uint64_t owner;  /* the thread that made it (thread_serial): the only one that may
                      run its collectives */
  mt_comm_counters *counters; /* the caller's, or NULL; slices inherit it */
  mt_mesh *parent; /* Non-NULL for a slice, which owns only its mesh_comm. */
  mt_mesh *root;   /* The mesh that was created; itself for a created mesh. */
  int root_dims[MT_MAX_MESH_NDIM]; /* For a slice: its dims among the root's. */
  int ndim;
  int64_t shape[MT_MAX_MESH_NDIM];
  int in_mesh;
  int64_t coord[MT_MAX_MESH_NDIM];
  MPI_Comm mesh_comm;
  MPI_Comm dim_comm[MT_MAX_MESH_NDIM];
  mt_time_model model; /* plans on this mesh are ranked by it */
  mt_mesh_nodes nodes; /* a created mesh: how its members lie on nodes */
  int direct; /* a created mesh: its members read each other's arrays (direct.c) */
  mt__shm *shm; /* a created mesh on one node: the agreements' all-reduce (agree_shm.c) */
  /* What mt_mesh_check reads: each communicator the mesh owns carries an
   * attribute (of a created mesh's `keyval`) whose delete callback marks `lost`
   * when someone else frees it (mesh.get_group().Free()), and MPI_COMM_SELF one
   * that marks it when MPI is finalized. `closing` while the mesh frees its own. */
  int keyval;
  _Atomic int lost;
  int closing;
  /* A created mesh: per dim, its groups split into runs of `split_run` members
   * (split[d][0]) and the members that far apart (split[d][1]), made when a step
   * that reduces across nodes first needs them (mt_mesh_node_comms). */
  int64_t split_run[MT_MAX_MESH_NDIM];
  MPI_Comm split[MT_MAX_MESH_NDIM][2];
};

/* What `lost` records. */
enum { LOST_FREED = 1, LOST_FINALIZED = 2 };

/* Communicators are a scarce, process-wide MPI resource, so their count is
 * process-wide too (the one mutable global of the meshes): it lets long-job tests
 * prove that meshes give theirs back. Atomic, so meshes made and freed in several
 * threads keep it exact. */
static atomic_llong live_comms;

int64_t mt_comm_live_count(void) { return (int64_t)atomic_load(&live_comms); }

/* How many threads have asked for their number (thread_serial): process-wide, as
 * threads are; atomic, since any thread may make a mesh. */
static atomic_ullong threads_numbered;

/* A number for the calling thread, never given to another one: thread ids are
 * reused once a thread ends, and whether a new thread got a dead creator's id
 * would differ across ranks. */
static uint64_t thread_serial(void) {
  static _Thread_local uint64_t mine = 0;
  /* cppcheck-suppress knownConditionTrueFalse ; a thread-local keeps its value */
  if (mine == 0) mine = (uint64_t)atomic_fetch_add(&threads_numbered, 1) + 1;
  return mine;
}

/* The delete callback of a mesh's attribute (`value` is the mesh that owns the
 * communicator, or a created mesh for MPI_COMM_SELF): a communicator freed by
 * someone else is forgotten, so the mesh never touches it again, and the mesh is
 * marked lost; MPI_COMM_SELF's runs when MPI is finalized. */
static int on_comm_delete(MPI_Comm comm, int keyval, void *value, void *extra) {
  (void)keyval, (void)extra;
  mt_mesh *m = value;
  if (m->closing) return MPI_SUCCESS;
  if (comm == MPI_COMM_SELF) {
    atomic_fetch_or(&m->lost, LOST_FINALIZED);
    return MPI_SUCCESS;
  }
  if (m->mesh_comm == comm) m->mesh_comm = MPI_COMM_NULL;
  for (int d = 0; m->parent == NULL && d < m->ndim; ++d) {
    if (m->dim_comm[d] == comm) m->dim_comm[d] = MPI_COMM_NULL;
  }
  atomic_fetch_sub(&live_comms, 1);
  atomic_fetch_or(&m->lost, LOST_FREED);
  return MPI_SUCCESS;
}

/* Attaches the created mesh `root`'s attribute, with `owner` as its value. */
static int watch_comm(const mt_mesh *root, MPI_Comm comm, mt_mesh *owner,
                      mt_error *err) {
  if (comm == MPI_COMM_NULL) return MT_OK;
  MT__MPI_TRY(MPI_Comm_set_attr(comm, root->keyval, owner), "MPI_Comm_set_attr");
  return MT_OK;
}

/* A created mesh's keyval, and its attribute on MPI_COMM_SELF and on every
 * communicator it made. */
static int watch_mesh(mt_mesh *m, mt_error *err) {
  MT__MPI_TRY(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_comm_delete,
                                     &m->keyval, NULL),
              "MPI_Comm_create_keyval");
  int rc = watch_comm(m, MPI_COMM_SELF, m, err);
  if (rc == MT_OK) rc = watch_comm(m, m->mesh_comm, m, err);
  for (int d = 0; rc == MT_OK && d < m->ndim; ++d) rc = watch_comm(m, m->dim_comm[d], m, err);
  return rc;
}

/* Two threads issuing collectives on one mesh would pair them in whatever order
 * each rank's scheduler ran them: wrong data, then a hang. Which thread made a
 * mesh is decided by the program, the same on every rank, so refusing every other
 * thread raises on the same calls everywhere, before any communication;
 * serialising the threads per mesh would not fix the order across ranks. */
int mt_mesh_check(const mt_mesh *mesh, mt_error *err) {
  if (mesh->owner != thread_serial()) {
    return mt_error_set(err, MT_ESTATE,
                        "a DeviceMesh's collectives must run on the thread that created "
                        "it: two threads communicating on one mesh would pair different "
                        "operations across ranks (create a mesh in the thread that uses "
                        "it)");
  }
  int lost = atomic_load_explicit(&mesh->lost, memory_order_relaxed) |
             atomic_load_explicit(&mesh->root->lost, memory_order_relaxed);
  if (lost & LOST_FINALIZED) {
    return mt_error_set(err, MT_ESTATE,
                        "MPI has been finalized (MPI.Finalize(), or the interpreter is "
                        "exiting): this DeviceMesh can no longer communicate");
  }
  if (lost & LOST_FREED) {
    return mt_error_set(err, MT_ESTATE,
                        "a communicator of this DeviceMesh was freed outside mpitensor "
                        "(mesh.get_group().Free()?): the mesh can no longer communicate; "
                        "the communicators of get_group() belong to the mesh, so create "
                        "a new mesh, and Dup() a group to own a communicator");
  }
  return MT_OK;
}

static void free_comm(MPI_Comm *comm) {
  if (*comm != MPI_COMM_NULL) {
    MPI_Comm_free(comm);
    atomic_fetch_sub(&live_comms, 1);
    *comm = MPI_COMM_NULL;
  }
}

/* Checks everything that can be checked without communicating, so bad input fails
 * identically on every rank before any collective starts. */
static int check_args(int comm_size, int ndim, const int64_t *shape, const int *ranks,
                      int64_t *numel, mt_error *err) {
  if (ndim < 1 || ndim > MT_MAX_MESH_NDIM) {
    return mt_error_set(err, MT_EINVAL, "a mesh needs 1 to %d dims, got %d",
                        MT_MAX_MESH_NDIM, ndim);
  }
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 1) {
      return mt_error_set(err, MT_EINVAL,
                          "mesh dim %d has size %lld; sizes must be >= 1", d,
                          (long long)shape[d]);
    }
    n *= shape[d];
    if (n > comm_size) {
      return mt_error_set(err, MT_EINVAL,
                          "the mesh needs more ranks than the communicator has (%d)",
                          comm_size);
    }
  }
  char *seen = calloc((size_t)comm_size, 1);
  if (seen == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  int rc = MT_OK;
  for (int64_t i = 0; i < n && rc == MT_OK; ++i) {
    if (ranks[i] < 0 || ranks[i] >= comm_size) {
      rc = mt_error_set(err, MT_EINVAL,
                        "mesh rank %d is not a rank of the communicator "
                        "(size %d)",
                        ranks[i], comm_size);
    } else if (seen[ranks[i]]++) {
      rc = mt_error_set(err, MT_EINVAL, "rank %d appears twice in the mesh", ranks[i]);
    }
  }
  free(seen);
  *numel = n;
  return rc;
}

/* Position of this rank in the mesh, from its row-major linear index. */
static void set_coordinate(mt_mesh *m, int64_t linear) {
  for (int d = m->ndim - 1; d >= 0; --d) {
    m->coord[d] = linear % m->shape[d];
    linear /= m->shape[d];
  }
}

/* The row-major index of this rank's line along `dim`: its coordinate with the
 * `dim` entry zeroed. Ranks on one line share a dim communicator. */
static int line_color(const mt_mesh *m, int dim) {
  int64_t color = 0;
  for (int d = 0; d < m->ndim; ++d) {
    color = color * m->shape[d] + (d == dim ? 0 : m->coord[d]);
  }
  return (int)color;
}

static int split_comm(MPI_Comm from, int color, int key, MPI_Comm *out, mt_error *err) {
  MT__MPI_TRY(MPI_Comm_split(from, color, key, out), "MPI_Comm_split");
  if (*out == MPI_COMM_NULL) return MT_OK;
  atomic_fetch_add(&live_comms, 1);
  MT__MPI_TRY(MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return MT_OK;
}

static mt_mesh *mesh_alloc(int ndim, const int64_t *shape) {
  mt_mesh *m = calloc(1, sizeof *m);
  if (m == NULL) return NULL;
  m->refcount = 1;
  m->owner = thread_serial();
  m->root = m;
  m->keyval = MPI_KEYVAL_INVALID;
  m->ndim = ndim;
  memcpy(m->shape, shape, (size_t)ndim * sizeof *shape);
  m->mesh_comm = MPI_COMM_NULL;
  for (int d = 0; d < MT_MAX_MESH_NDIM; ++d) {
    m->dim_comm[d] = m->split[d][0] = m->split[d][1] = MPI_COMM_NULL;
  }
  m->model = mt_time_model_default();
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) numel *= shape[d];
  m->nodes = (mt_mesh_nodes){MT_NODES_ONE, 1, numel, numel};
  return m;
}

/* How the members lie on nodes from each mesh position's node (`node[i]`, the
 * lowest mesh position on the same node): the nodes, their smallest and largest,
 * and whether each holds consecutive positions. */
static mt_mesh_nodes nodes_of(const int *node, int64_t n) {
  mt_mesh_nodes out = {MT_NODES_BLOCKS, 0, n, 0};
  int consecutive = 1;
  for (int64_t i = 0, run = 0; i < n; ++i) {
    if (node[i] == i) { /* the first position of a node: the run before it ends */
      ++out.count;
      if (run > 0) out.smallest = run < out.smallest ? run : out.smallest;
      out.largest = run > out.largest ? run : out.largest;
      run = 0;
    } else if (node[i] != node[i - 1]) {
      consecutive = 0;
    }
    ++run;
    if (i == n - 1) {
      out.smallest = run < out.smallest ? run : out.smallest;
      out.largest = run > out.largest ? run : out.largest;
    }
  }
  if (out.count == 1) out.kind = MT_NODES_ONE;
  else if (!consecutive) out.kind = MT_NODES_INTERLEAVED;
  else if (out.smallest != out.largest) out.kind = MT_NODES_UNEQUAL;
  if (out.kind == MT_NODES_INTERLEAVED) out.smallest = out.largest = 0;
  return out;
}

/* The time model's ranks per node for a node layout: the size of equal blocks;
 * 0 on one node; any other layout is priced as if every rank had a node of its
 * own (1), so no group is taken for shared memory that is not. */
static int64_t ranks_per_node(const mt_mesh_nodes *nodes) {
  if (nodes->kind == MT_NODES_ONE) return 0;
  return nodes->kind == MT_NODES_BLOCKS ? nodes->largest : 1;
}

/* Collective on the mesh's members. Which members share a node
 * (MPI_Comm_split_type SHARED), gathered once into the mesh's node layout and the
 * model's ranks_per_node.
 * The position table may fail to allocate on some ranks only, so the members
 * agree on it before gathering. */
static int learn_nodes(mt_mesh *m, int64_t linear, mt_error *err) {
  int64_t n = 1;
  for (int d = 0; d < m->ndim; ++d) n *= m->shape[d];
  if (n == 1) return MT_OK;
  MPI_Comm node_comm = MPI_COMM_NULL;
  MT__MPI_TRY(MPI_Comm_split_type(m->mesh_comm, MPI_COMM_TYPE_SHARED, (int)linear,
                                  MPI_INFO_NULL, &node_comm),
              "MPI_Comm_split_type");
  int me = (int)linear, leader = 0;
  int rc = MT__BLOCKING("MPI_Allreduce",
                        MPI_Allreduce(&me, &leader, 1, MPI_INT, MPI_MIN, node_comm));
  MPI_Comm_free(&node_comm);
  if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Allreduce");
  int *node = malloc((size_t)n * sizeof *node);
  mt_error e = {0};
  int st = node != NULL ? MT_OK : mt_error_set(&e, MT_ENOMEM, "out of memory learning "
                                                                "which ranks share a node");
  st = mt_agree_fingerprint_comm(m->mesh_comm, st, 0, &e);
  if (st != MT_OK || node == NULL) {
    free(node);
    if (err != NULL) *err = e;
    return st;
  }
  rc = MT__BLOCKING("MPI_Allgather",
                    MPI_Allgather(&leader, 1, MPI_INT, node, 1, MPI_INT, m->mesh_comm));
  if (rc == MPI_SUCCESS) {
    m->nodes = nodes_of(node, n);
    m->model.ranks_per_node = ranks_per_node(&m->nodes);
  }
  free(node);
  if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Allgather");
  /* Every member sees the same table, so all probe or none does. */
  if (m->model.ranks_per_node != 0) return MT_OK;
  rc = mt__direct_probe(m->mesh_comm, (int)n, &m->direct, err);
  return rc == MT_OK ? mt__shm_create(m->mesh_comm, &m->shm, err) : rc;
}

/* What every rank must pass alike: the shape and the ranks. */
static uint64_t mesh_fingerprint(int ndim, const int64_t *shape, const int *ranks,
                                 int64_t n) {
  uint64_t h = mt__fnv1a(MT__FNV_START, &ndim, sizeof ndim);
  h = mt__fnv1a(h, shape, (size_t)ndim * sizeof *shape);
  return mt__fnv1a(h, ranks, (size_t)n * sizeof *ranks);
}

static int64_t find_linear(int me, const int *ranks, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (ranks[i] == me) return i;
  }
  return -1;
}

static int build_comms(mt_mesh *m, MPI_Comm comm, int64_t linear, mt_error *err) {
  int color = linear >= 0 ? 0 : MPI_UNDEFINED;
  int rc = split_comm(comm, color, (int)(linear >= 0 ? linear : 0), &m->mesh_comm, err);
  for (int d = 0; rc == MT_OK && m->in_mesh && d < m->ndim; ++d) {
    rc = split_comm(m->mesh_comm, line_color(m, d), (int)m->coord[d], &m->dim_comm[d],
                    err);
  }
  return rc;
}

int mt_mesh_create(MPI_Comm comm, int ndim, const int64_t *shape, const int *ranks,
                   mt_mesh **out, mt_error *err) {
  return mt_mesh_create_agreed(comm, ndim, shape, ranks, MT_OK, 0, out, err);
}

int mt_mesh_create_agreed(MPI_Comm comm, int ndim, const int64_t *shape,
                          const int *ranks, int status, uint64_t fingerprint,
                          mt_mesh **out, mt_error *err) {
  int size = 0, me = 0;
  MT__MPI_TRY(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  MT__MPI_TRY(MPI_Comm_rank(comm, &me), "MPI_Comm_rank");
  int64_t n = 0;
  mt_error e = {0};
  if (status != MT_OK && err != NULL) e = *err;
  int rc = status != MT_OK ? status : check_args(size, ndim, shape, ranks, &n, &e);
  /* A rank given another mesh would pair its splits with the others' and leave
   * holes or a hang: every rank checks every rank's arguments, always (a mesh is
   * made rarely, and it is one small all-reduce). */
  if (rc == MT_OK) {
    snprintf(e.msg, sizeof e.msg,
             "the ranks of the communicator passed different meshes (their shapes or "
             "rank lists differ): every rank must create the mesh with the same "
             "arguments");
  }
  rc = mt_agree_fingerprint_comm(comm, rc,
                                 rc == MT_OK ? mesh_fingerprint(ndim, shape, ranks, n) ^ fingerprint : 0,
                                 &e);
  if (rc != MT_OK) {
    if (err != NULL) *err = e;
    return rc;
  }
  mt_mesh *m = mesh_alloc(ndim, shape);
  if (m == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  int64_t linear = find_linear(me, ranks, n);
  m->in_mesh = linear >= 0;
  if (m->in_mesh) set_coordinate(m, linear);
  rc = build_comms(m, comm, linear, err);
  if (rc == MT_OK) rc = watch_mesh(m, err);
  if (rc == MT_OK && m->in_mesh) rc = learn_nodes(m, linear, err);
  if (rc != MT_OK) {
    mt_mesh_destroy(m);
    return rc;
  }
  *out = m;
  return MT_OK;
}

/* A slice's ranks in its own row-major order: on one node when each of its dims
 * stays within a node in the parent; the parent's blocks when it keeps the
 * parent's trailing dims (its positions run through the parent's in order);
 * otherwise priced as one rank per node. */
static int64_t slice_ranks_per_node(const mt_mesh *parent, int n, const int *dims) {
  const mt_time_model *pm = &parent->model;
  int64_t numel = 1, stride[MT_MAX_MESH_NDIM];
  for (int d = parent->ndim - 1; d >= 0; --d) stride[d] = numel, numel *= parent->shape[d];
  int local = 1, trailing = dims[n - 1] == parent->ndim - 1;
  for (int i = 0; i < n; ++i) {
    local &= mt_time_link(pm, numel, parent->shape[dims[i]], stride[dims[i]]) ==
             MT_LINK_SHM;
    if (i > 0) trailing &= dims[i] == dims[i - 1] + 1;
  }
  if (local) return 0;
  return trailing ? pm->ranks_per_node : 1;
}

int mt_mesh_slice(mt_mesh *parent, int n, const int *dims, mt_mesh **out,
                  mt_error *err) {
  if (n < 1 || n > parent->ndim) {
    return mt_error_set(err, MT_EINVAL, "a slice needs 1 to %d mesh dims, got %d",
                        parent->ndim, n);
  }
  for (int i = 0; i < n; ++i) {
    if (dims[i] < 0 || dims[i] >= parent->ndim || (i > 0 && dims[i] <= dims[i - 1])) {
      return mt_error_set(err, MT_EINVAL,
                          "slice dims must be distinct, ascending and in "
                          "[0, %d)",
                          parent->ndim);
    }
  }
  mt_mesh *m = calloc(1, sizeof *m);
  if (m == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  m->refcount = 1;
  m->owner = thread_serial();
  m->keyval = MPI_KEYVAL_INVALID;
  m->counters = parent->counters;
  m->parent = parent;
  m->root = parent->root;
  parent->refcount++;
  m->ndim = n;
  m->in_mesh = parent->in_mesh;
  m->mesh_comm = MPI_COMM_NULL;
  for (int d = n; d < MT_MAX_MESH_NDIM; ++d) m->dim_comm[d] = MPI_COMM_NULL;
  for (int i = 0; i < n; ++i) {
    m->root_dims[i] = parent == parent->root ? dims[i] : parent->root_dims[dims[i]];
    m->shape[i] = parent->shape[dims[i]];
    m->coord[i] = parent->coord[dims[i]];
    m->dim_comm[i] = parent->dim_comm[dims[i]];
  }
  m->model = parent->model;
  m->model.ranks_per_node = slice_ranks_per_node(parent, n, dims);
  *out = m;
  return MT_OK;
}

const mt_time_model *mt_mesh_time_model(const mt_mesh *mesh) { return &mesh->model; }

void mt_mesh_nodes_of(const mt_mesh *mesh, mt_mesh_nodes *out) { *out = mesh->root->nodes; }

int mt_mesh_direct_read(const mt_mesh *mesh) { return mesh->root->direct; }

mt__shm *mt__mesh_shm(const mt_mesh *mesh) { return mesh == mesh->root ? mesh->shm : NULL; }

int mt_mesh_shared_agreement(const mt_mesh *mesh) {
  return mesh->in_mesh && mt__mesh_shm(mesh) != NULL;
}

int mt_mesh_set_time_model(mt_mesh *mesh, const mt_time_model *model, mt_error *err) {
  mt_time_model next = *model;
  next.ranks_per_node = mesh->model.ranks_per_node;
  int rc = mt_time_model_check(&next, err);
  if (rc == MT_OK) mesh->model = next;
  return rc;
}

void mt_mesh_destroy(mt_mesh *mesh) {
  if (mesh == NULL || --mesh->refcount > 0) return;
  /* At interpreter exit MPI may already be finalized; the communicators died
   * with it and must not be touched. */
  int finalized = 0;
  MPI_Finalized(&finalized);
  mesh->closing = 1;
  if (!finalized) free_comm(&mesh->mesh_comm);
  if (mesh->parent != NULL) {
    mt_mesh_destroy(mesh->parent);
  } else {
    for (int d = 0; d < mesh->ndim && !finalized; ++d) {
      free_comm(&mesh->dim_comm[d]);
      free_comm(&mesh->split[d][0]);
      free_comm(&mesh->split[d][1]);
    }
    mt__shm_destroy(mesh->shm);
    if (!finalized && mesh->keyval != MPI_KEYVAL_INVALID) {
      MPI_Comm_delete_attr(MPI_COMM_SELF, mesh->keyval);
      MPI_Comm_free_keyval(&mesh->keyval);
    }
  }
  free(mesh);
}

int mt_mesh_node_comms(const mt_mesh *mesh, int dim, int64_t run, MPI_Comm *inside,
                       MPI_Comm *across, mt_error *err) {
  if (dim < 0 || dim >= mesh->ndim || !mesh->in_mesh || run < 1 ||
      mesh->shape[dim] % run != 0) {
    return mt_error_set(err, MT_EINVAL, "no split of mesh dim %d into runs of %lld "
                        "members", dim, (long long)run);
  }
  mt_mesh *root = mesh->root;
  int d = mesh == root ? dim : mesh->root_dims[dim];
  if (root->split_run[d] != run) {
    /* Made by every member of the dim's group at the same step of the same plan.
     * A step with another run (a plan made under another node layout) replaces
     * them; the steps before it have completed. */
    free_comm(&root->split[d][0]);
    free_comm(&root->split[d][1]);
    root->split_run[d] = 0;
    int at = (int)mesh->coord[dim], r = (int)run;
    int rc = split_comm(mesh->dim_comm[dim], at / r, at % r, &root->split[d][0], err);
    if (rc == MT_OK)
      rc = split_comm(mesh->dim_comm[dim], at % r, at / r, &root->split[d][1], err);
    if (rc != MT_OK) return rc;
    root->split_run[d] = run;
  }
  *inside = root->split[d][0];
  *across = root->split[d][1];
  return MT_OK;
}

int mt_mesh_ndim(const mt_mesh *mesh) { return mesh->ndim; }

void mt_mesh_set_counters(mt_mesh *mesh, mt_comm_counters *counters) {
  mesh->counters = counters;
}

mt_comm_counters *mt_mesh_counters(const mt_mesh *mesh) {
  return mesh->counters;
}

int64_t mt_mesh_dim_size(const mt_mesh *mesh, int dim) {
  return (dim >= 0 && dim < mesh->ndim) ? mesh->shape[dim] : 0;
}

int mt_mesh_coordinate(const mt_mesh *mesh, int64_t *coord) {
  if (!mesh->in_mesh) return 0;
  memcpy(coord, mesh->coord, (size_t)mesh->ndim * sizeof *coord);
  return 1;
}

int mt_mesh_local_box(const mt_mesh *mesh, const mt_layout *layout, mt_box *box,
                      mt_error *err) {
  if (!mesh->in_mesh)
    return mt_error_set(err, MT_ESTATE, "this rank is not a member of the mesh");
  return mt_layout_local_box(layout, mesh->coord, box, err);
}

MPI_Comm mt_mesh_dim_comm(const mt_mesh *mesh, int dim) {
  return (dim >= 0 && dim < mesh->ndim) ? mesh->dim_comm[dim] : MPI_COMM_NULL;
}

/* Above INT_MAX bytes MPI counts overflow, so whole gigabyte blocks travel as one
 * derived element and the remainder as bytes. */
static int bcast_bytes(char *buf, int64_t nbytes, int root, MPI_Comm comm,
                       mt_error *err) {
  const int64_t block = (int64_t)1 << 30;
  if (nbytes > INT_MAX) {
    MPI_Datatype gib;
    MT__MPI_TRY(MPI_Type_contiguous((int)block, MPI_BYTE, &gib), "MPI_Type_contiguous");
    MT__MPI_TRY(MPI_Type_commit(&gib), "MPI_Type_commit");
    int rc = MT__BLOCKING("MPI_Bcast", MPI_Bcast(buf, (int)(nbytes / block), gib, root, comm));
    MPI_Type_free(&gib);
    if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Bcast");
    buf += (nbytes / block) * block;
    nbytes %= block;
  }
  MT__MPI_TRY(MPI_Bcast(buf, (int)nbytes, MPI_BYTE, root, comm), "MPI_Bcast");
  return MT_OK;
}

int mt_mesh_bcast(const mt_mesh *mesh, int dim, void *buf, int64_t nbytes,
                  mt_error *err) {
  return mt_mesh_bcast_from(mesh, dim, 0, buf, nbytes, err);
}

int mt_mesh_bcast_from(const mt_mesh *mesh, int dim, int64_t root, void *buf,
                       int64_t nbytes, mt_error *err) {
  if (dim < 0 || dim >= mesh->ndim) {
    return mt_error_set(err, MT_EINDEX, "mesh dim %d is out of range for a %d-D mesh",
                        dim, mesh->ndim);
  }
  if (nbytes < 0) return mt_error_set(err, MT_EINVAL, "negative byte count");
  if (root < 0 || root >= mesh->shape[dim]) {
    return mt_error_set(err, MT_EINDEX, "root %lld is out of range for mesh dim %d of "
                        "size %lld", (long long)root, dim, (long long)mesh->shape[dim]);
  }
  if (!mesh->in_mesh || mesh->shape[dim] == 1) return MT_OK;
  int rc = bcast_bytes(buf, nbytes, (int)root, mesh->dim_comm[dim], err);
  if (rc == MT_OK)
    mt_comm_count(mesh->counters, MT_COLL_BROADCAST,
                  mesh->coord[dim] == root ? nbytes * (mesh->shape[dim] - 1) : 0);
  return rc;
}

int mt_mesh_allgather_i64(const mt_mesh *mesh, int dim, int64_t value, int64_t *out,
                          mt_error *err) {
  if (dim < 0 || dim >= mesh->ndim) {
    return mt_error_set(err, MT_EINDEX, "mesh dim %d is out of range for a %d-D mesh",
                        dim, mesh->ndim);
  }
  if (!mesh->in_mesh)
    return mt_error_set(err, MT_EINVAL, "this rank is not in the mesh");
  if (mesh->shape[dim] == 1) {
    out[0] = value;
    return MT_OK;
  }
  MT__MPI_TRY(MPI_Allgather(&value, 1, MPI_INT64_T, out, 1, MPI_INT64_T,
                            mesh->dim_comm[dim]),
              "MPI_Allgather");
  mt_comm_count(mesh->counters, MT_COLL_ALL_GATHER,
                (int64_t)sizeof value * (mesh->shape[dim] - 1));
  return MT_OK;
}

/* The root-mesh ranks of a slice's members: the slice varies its own dims and
 * keeps this rank's root coordinate on the others. */
static void slice_members(const mt_mesh *m, int *ranks) {
  const mt_mesh *root = m->root;
  int64_t coord[MT_MAX_MESH_NDIM], n = 1;
  memcpy(coord, root->coord, sizeof coord);
  for (int d = 0; d < m->ndim; ++d) n *= m->shape[d];
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, linear = 0;
    for (int d = m->ndim - 1; d >= 0; --d) {
      coord[m->root_dims[d]] = rest % m->shape[d];
      rest /= m->shape[d];
    }
    for (int d = 0; d < root->ndim; ++d) linear = linear * root->shape[d] + coord[d];
    ranks[i] = (int)linear;
  }
}

/* MPI_Comm_create_group is collective over the slice's members only, which are
 * exactly the ranks that reach this point together in an SPMD program. */
static int create_slice_comm(mt_mesh *m, mt_error *err) {
  int64_t n = 1;
  for (int d = 0; d < m->ndim; ++d) n *= m->shape[d];
  int *ranks = malloc((size_t)n * sizeof *ranks);
  if (ranks == NULL) return mt_error_set(err, MT_ENOMEM, "out of memory");
  slice_members(m, ranks);
  MPI_Group all, sub;
  int rc = MPI_Comm_group(m->root->mesh_comm, &all);
  if (rc == MPI_SUCCESS) rc = MPI_Group_incl(all, (int)n, ranks, &sub);
  if (rc == MPI_SUCCESS) {
    rc = MT__BLOCKING("MPI_Comm_create_group",
                       MPI_Comm_create_group(m->root->mesh_comm, sub, 0, &m->mesh_comm));
    MPI_Group_free(&sub);
  }
  MPI_Group_free(&all);
  free(ranks);
  if (rc != MPI_SUCCESS) return mt_mpi_error(err, rc, "MPI_Comm_create_group");
  atomic_fetch_add(&live_comms, 1);
  MT__MPI_TRY(MPI_Comm_set_errhandler(m->mesh_comm, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");
  return watch_comm(m->root, m->mesh_comm, m, err);
}

int mt_mesh_comm(mt_mesh *mesh, MPI_Comm *out, mt_error *err) {
  if (!mesh->in_mesh) {
    return mt_error_set(err, MT_ESTATE, "this rank is not a member of the mesh");
  }
  if (mesh->mesh_comm == MPI_COMM_NULL) {
    int rc = create_slice_comm(mesh, err);
    if (rc != MT_OK) return rc;
  }
  *out = mesh->mesh_comm;
  return MT_OK;
}

int mt_mesh_any(const mt_mesh *mesh, int flag, int *result, mt_error *err) {
  mt__shm *shm = mesh->in_mesh ? mt__mesh_shm(mesh) : NULL;
  if (shm != NULL) {
    int64_t v = flag;
    mt__shm_allreduce(shm, &v, 1, MT__SHM_OR);
    *result = (int)v;
    return MT_OK;
  }
  int value = flag;
  /* OR along dim 0, then dim 1, ...: after the last dim every rank holds the OR
   * over the whole grid. */
  for (int d = 0; mesh->in_mesh && d < mesh->ndim; ++d) {
    if (mesh->shape[d] == 1) continue;
    MT__MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_BOR, mesh->dim_comm[d]),
            "MPI_Allreduce");
  }
  *result = value;
  return MT_OK;
}

int mt_mpi_library_version(char *buf, int buflen, mt_error *err) {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MT__MPI_TRY(MPI_Get_library_version(text, &len), "MPI_Get_library_version");
  if (buflen < 1) return mt_error_set(err, MT_EINVAL, "empty buffer");
  int n = len < buflen - 1 ? len : buflen - 1;
  memcpy(buf, text, (size_t)n);
  buf[n] = '\0';
  return MT_OK;
}
