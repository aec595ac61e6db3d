/* Helpers shared by the comm library's translation units (mesh, executors,
 * distribute, ring, agreement); not part of the public API. */
#ifndef MPITENSOR_COMM_PRIVATE_H
#define MPITENSOR_COMM_PRIVATE_H

#include <assert.h>
#include <mpi.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "mpitensor/comm/agree.h" /* MT_AGREE_MAX_VALUES */
#include "mpitensor/comm/mesh.h"  /* mt_mpi_error */
#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

/* Where this process waits, for the collective watchdog (watchdog.c): the name of
 * the blocking MPI call it is in (NULL: none) and how many it has entered; and the
 * name of the other library's routine it last entered (mt_watchdog_wait_begin),
 * which `mt__waiting_in` equals while it is in there. */
extern _Atomic(const char *) mt__waiting_in;
extern _Atomic uint64_t mt__waits;
extern _Atomic(const char *) mt__routine_in;

static inline void mt__wait_begin(const char *what) {
  atomic_store_explicit(&mt__waits,
                        atomic_load_explicit(&mt__waits, memory_order_relaxed) + 1,
                        memory_order_relaxed);
  atomic_store_explicit(&mt__waiting_in, what, memory_order_relaxed);
}

static inline int mt__wait_end(int rc) {
  atomic_store_explicit(&mt__waiting_in, NULL, memory_order_relaxed);
  return rc;
}

/* Whether a notice has come that some rank left the job, or failed in the work
 * this process runs now (departure.c), or had an MPI call fail while this process
 * had entered `waits` blocking calls or one fewer: its rank then goes to *rank and
 * what it did ("has left the job: ..." or "failed: ...") to `reason` (n bytes).
 * Called by the watchdog thread at each look, with this process's count of
 * blocking calls (mt__waits). */
int mt__departure_heard(uint64_t waits, int *rank, char *reason, size_t n);

/* Whether another process's watchdog ended the job and it said where it is
 * (departure.c): the lowest such rank goes to *first; how many of the *others
 * processes have said so or left the job, to *done (*others is 0 when this
 * process does not listen). Called by the watchdog thread. */
int mt__stuck_heard(int *first, int *done, int *others);

/* Tells every other process that this one's watchdog ends the job and that it
 * has said where it is, so that each says where it is too. Nothing when this
 * process does not listen. */
void mt__stuck_tell(void);

/* Called by mt_mpi_error with the sentence of each MPI failure it reports, when
 * set: departure.c sets it when this process starts listening, to tell the other
 * processes (a pointer, since departure.c reports its own failures through
 * mt_mpi_error). */
extern void (*_Atomic mt__mpi_failure_hook)(const char *reason);

/* An MPI call that may block, seen by the watchdog: evaluates to its return code. */
#define MT__BLOCKING(what, call) (mt__wait_begin(what), mt__wait_end(call))

/* Returns from the enclosing function with MT_EMPI when an MPI call fails; the
 * function must have an `mt_error *err` in scope. The watchdog sees the call. */
#define MT__MPI_TRY(call, what)                                                \
  do {                                                                         \
    int mt_mpi_rc_ = MT__BLOCKING(what, call);                                 \
    if (mt_mpi_rc_ != MPI_SUCCESS) return mt_mpi_error(err, mt_mpi_rc_, what); \
  } while (0)

/* The agreements' all-reduce through memory the members of a mesh on one node
 * share (agree_shm.c): the lowest failing rank and the values of mt_agree_comm,
 * or mt_mesh_any's flag. */
typedef struct mt__shm mt__shm;
#define MT__SHM_MAX_VALUES (1 + MT_AGREE_MAX_VALUES)
enum { MT__SHM_MIN = 0, MT__SHM_OR = 1 };

/* Collective on `comm`, whose members share a node: *out is a segment that every
 * member mapped, or NULL on every member (no shared memory to be had: MPI's
 * all-reduce serves). MT_EMPI when the collectives fail. */
int mt__shm_create(MPI_Comm comm, mt__shm **out, mt_error *err);

/* Local. Unmaps the segment (no MPI call); accepts NULL. */
void mt__shm_destroy(mt__shm *s);

/* Collective on the segment's members, which call it in the same order: the `n`
 * values (at most MT__SHM_MAX_VALUES) become their elementwise MT__SHM_MIN or
 * MT__SHM_OR over the members. Waits as a blocking MPI call does, seen by the
 * watchdog. */
void mt__shm_allreduce(mt__shm *s, int64_t *values, int n, int op);

/* Local. The segment of a mesh this rank is a member of, made when the mesh was
 * created on one node; NULL for a slice, a mesh over nodes, or no segment. */
mt__shm *mt__mesh_shm(const mt_mesh *mesh);

/* Collective on `comm` (or on `shm`'s members, the same ranks, when not NULL):
 * mt_agree_fingerprint_comm, whose all-reduces go through `shm`, carrying `n`
 * values (at most MT_AGREE_MAX_VALUES - 2) back as their minima (mt_agree_with). */
int mt__agree_fingerprint(MPI_Comm comm, mt__shm *shm, int status, uint64_t fingerprint,
                          int64_t *values, int n, mt_error *err);

/* The box of the rank whose coordinate is `coord` with mesh dim `m` set to `k`
 * (m < 0: `coord` itself), for a layout already validated: the member boxes of a
 * group along one mesh dim, as the executors walk them. */
static inline void mt__box_at(const mt_layout *layout, const int64_t *coord, int m,
                              int64_t k, mt_box *out) {
  int64_t at[MT_MAX_MESH_NDIM];
  memcpy(at, coord, (size_t)layout->mesh_ndim * sizeof *at);
  if (m >= 0) at[m] = k;
  int rc = mt_layout_local_box(layout, at, out, NULL);
  assert(rc == MT_OK);
  (void)rc;
}

/* FNV-1a of `n` bytes, continuing from `h` (start from MT__FNV_START): the
 * fingerprints that ranks agree on (mt_agree), the same in every process. */
#define MT__FNV_START 14695981039346656037ULL
static inline uint64_t mt__fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = (const unsigned char *)data;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

/* A layout's global shape and placements (the fields each placement kind uses)
 * into an FNV-1a fingerprint. */
static inline uint64_t mt__layout_fnv(uint64_t h, const mt_layout *l) {
  h = mt__fnv1a(h, &l->ndim, sizeof l->ndim);
  h = mt__fnv1a(h, l->shape, (size_t)l->ndim * sizeof *l->shape);
  for (int m = 0; m < l->mesh_ndim; ++m) {
    const mt_placement *p = &l->placements[m];
    int64_t code = p->kind * 1024 + (p->kind == MT_PLACEMENT_SHARD     ? p->dim
                                     : p->kind == MT_PLACEMENT_PARTIAL ? p->reduce_op
                                                                       : 0);
    h = mt__fnv1a(h, &code, sizeof code);
  }
  return h;
}

#endif
