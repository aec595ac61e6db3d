/* Direct copies between the processes of one node (direct-private.h). */
#include "mpitensor/comm/direct.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm-private.h"
#include "direct-private.h"
#include "mpitensor/comm/agree.h"

#if defined(__linux__)
#include <sys/uio.h>
#define MT__HAVE_DIRECT 1
#else
#define MT__HAVE_DIRECT 0
#endif

/* ---- the runs of a box inside an array ------------------------------------- */

/* The contiguous byte runs that a box occupies in the C-contiguous array of
 * another box, in the box's C order: `len` bytes each, `count` of them. */
typedef struct runs {
  int outer;                 /* dims that step from run to run */
  int64_t idx[MT_MAX_NDIM];  /* the current run's position over those dims */
  int64_t ext[MT_MAX_NDIM];  /* the box's extents over them */
  int64_t step[MT_MAX_NDIM]; /* the array's byte stride for each */
  int64_t start;             /* byte offset of the first run */
  int64_t len, count, next;  /* run bytes, runs, index of the run to come */
  int64_t taken;             /* bytes of the current run already handed out */
} runs;

static void runs_init(runs *r, const mt_box *array, const mt_box *part, int64_t isz) {
  int nd = part->ndim, j = nd - 1;
  /* Trailing dims the part spans whole join the run. */
  while (j > 0 && part->shape[j] == array->shape[j]) --j;
  int64_t stride = isz;
  memset(r, 0, sizeof *r);
  r->len = isz, r->count = 1;
  for (int d = nd - 1; d >= 0; --d) {
    r->start += (part->offset[d] - array->offset[d]) * stride;
    if (d >= j) r->len *= part->shape[d];
    if (d < j) r->step[d] = stride, r->ext[d] = part->shape[d], r->count *= part->shape[d];
    stride *= array->shape[d];
  }
  r->outer = nd > 0 ? j : 0;
  if (r->len == 0) r->count = 0;
}

static int64_t runs_offset(const runs *r) {
  int64_t at = r->start;
  for (int d = 0; d < r->outer; ++d) at += r->idx[d] * r->step[d];
  return at + r->taken;
}

static void runs_advance(runs *r) {
  r->taken = 0;
  ++r->next;
  for (int d = r->outer - 1; d >= 0; --d) {
    if (++r->idx[d] < r->ext[d]) return;
    r->idx[d] = 0;
  }
}

/* Runs of the part in an array: fewer on the side a copy addresses in the other
 * process, whose pages the kernel pins run by run. */
static int64_t runs_count(const mt_box *array, const mt_box *part, int64_t isz) {
  runs r;
  runs_init(&r, array, part, isz);
  return r.count;
}

int mt__direct_pulls(const mt_box *part, const mt_box *src, const mt_box *dst,
                     int64_t itemsize) {
  return runs_count(src, part, itemsize) <= runs_count(dst, part, itemsize);
}

int mt__direct_cheap(const mt_box *part, const mt_box *src, const mt_box *dst,
                     int64_t itemsize) {
  int pulls = mt__direct_pulls(part, src, dst, itemsize);
  int64_t bytes = mt_box_numel(part) * itemsize;
  int64_t remote = runs_count(pulls ? src : dst, part, itemsize);
  int64_t local = runs_count(pulls ? dst : src, part, itemsize);
  return remote == 0 || (bytes / remote >= MT__DIRECT_MIN_RUN &&
                         bytes / local >= MT__DIRECT_MIN_LOCAL_RUN);
}

#if MT__HAVE_DIRECT
/* Iovecs and bytes per system call: IOV_MAX is 1024 on Linux, and the kernel
 * moves at most about 2 GiB per call (a longer one would stop short). */
#define BATCH 512
#define BATCH_BYTES ((int64_t)1 << 30)

/* An address as a peer sent it, or this process's own: never dereferenced here
 * when it is a peer's, only handed to the kernel. */
static char *address(uint64_t a) {
  return (char *)(uintptr_t)a; /* NOLINT(performance-no-int-to-ptr) */
}

/* Fills up to BATCH iovecs from `r` at `base` with at most `limit` bytes; returns
 * the bytes listed. Leaves `r` where the last one ends (inside a run if cut). */
static int64_t fill(runs *r, char *base, struct iovec *iov, int *n, int64_t limit) {
  int64_t total = 0;
  *n = 0;
  while (*n < BATCH && r->next < r->count && total < limit) {
    int64_t left = r->len - r->taken, take = left < limit - total ? left : limit - total;
    iov[*n].iov_base = base + runs_offset(r);
    iov[*n].iov_len = (size_t)take;
    ++*n;
    total += take;
    r->taken += take;
    if (r->taken == r->len) runs_advance(r);
  }
  return total;
}
#endif

/* Copies this process still fails on purpose (mt_direct_fail_next). */
static atomic_int failures_asked;

int mt_direct_fail_next(int n) { return atomic_exchange(&failures_asked, n); }

/* Copies `part` (a global box) between this process's C-contiguous array at
 * address `local`, of box `local_box`, and process `pid`'s array at address
 * `remote`, of box `remote_box`: from there to here (push 0) or from here to
 * there (push 1), in calls of at most BATCH runs a side and BATCH_BYTES. Returns
 * 0, or the errno of the failed call (one that stops short counts as EFAULT;
 * ENOSYS off Linux). */
static int copy_part(int64_t pid, int push, uint64_t local, const mt_box *local_box,
                     uint64_t remote, const mt_box *remote_box, const mt_box *part,
                     int64_t itemsize) {
  if (atomic_load(&failures_asked) > 0 && atomic_fetch_sub(&failures_asked, 1) > 0)
    return EFAULT;
#if MT__HAVE_DIRECT
  runs l, r;
  runs_init(&l, local_box, part, itemsize);
  runs_init(&r, remote_box, part, itemsize);
  struct iovec liov[BATCH], riov[BATCH];
  while (r.next < r.count) {
    /* Each list stops at BATCH entries; the batch is as long as the shorter. */
    int nl = 0, nr = 0;
    runs l0 = l;
    int64_t have = fill(&l, address(local), liov, &nl, BATCH_BYTES);
    int64_t want = fill(&r, address(remote), riov, &nr, have);
    if (want < have) {
      l = l0;
      have = fill(&l, address(local), liov, &nl, want);
    }
    if (have != want || want == 0) return EFAULT; /* the lists disagree: never loop */
    ssize_t got = push ? process_vm_writev((pid_t)pid, liov, (unsigned long)nl, riov,
                                           (unsigned long)nr, 0)
                       : process_vm_readv((pid_t)pid, liov, (unsigned long)nl, riov,
                                          (unsigned long)nr, 0);
    if (got < 0) return errno != 0 ? errno : EFAULT;
    if ((int64_t)got != want) return EFAULT;
  }
  return 0;
#else
  (void)pid, (void)push, (void)local, (void)local_box, (void)remote, (void)remote_box;
  (void)part, (void)itemsize;
  return ENOSYS;
#endif
}

/* ---- a direct step's framing ----------------------------------------------- */

int mt__direct_begin(MPI_Comm comm, int g, uint64_t in, uint64_t out, int ready,
                     mt__direct_peer *peers, mt_error *err) {
  mt__direct_peer me = {(int64_t)getpid(), in, out, ready != 0};
  int rc = MT__BLOCKING("MPI_Allgather", MPI_Allgather(&me, 4, MPI_INT64_T, peers, 4,
                                                       MPI_INT64_T, comm));
  if (rc != MPI_SUCCESS) {
    mt_mpi_error(err, rc, "MPI_Allgather");
    return -1;
  }
  for (int q = 0; q < g; ++q) {
    if (!peers[q].ready) return 0;
  }
  return 1;
}

int mt__direct_end(MPI_Comm comm, int failed, mt_error *err) {
  int64_t ok = failed == 0;
  int rc = mt_agree_comm(comm, MT_OK, &ok, 1, err);
  if (rc != MT_OK) return -1;
  return ok == 1;
}

/* Whether every copy this member makes in the step addresses few enough runs in
 * the other process (mt__direct_cheap). */
static int cheap_step(const mt__direct_parts *d, int g, int me, int64_t isz) {
  for (int q = 0; q < g; ++q) {
    if (q == me) continue;
    if (mt_box_numel(&d->recv[q]) > 0 &&
        !mt__direct_cheap(&d->recv[q], &d->recv_src[q], d->dst, isz)) {
      return 0;
    }
    if (mt_box_numel(&d->send[q]) > 0 &&
        !mt__direct_cheap(&d->send[q], d->src, &d->send_dst[q], isz)) {
      return 0;
    }
  }
  return 1;
}

int mt__direct_step(MPI_Comm comm, int g, int me, const void *in,
                    void *out, const mt__direct_parts *d, int64_t itemsize,
                    mt_error *err) {
  /* On the stack, so that no member can fail to allocate it where others did not. */
  mt__direct_peer peers[MT__DIRECT_MAX_GROUP];
  if (g > MT__DIRECT_MAX_GROUP) return 0;
  int all = mt__direct_begin(comm, g, (uint64_t)(uintptr_t)in, (uint64_t)(uintptr_t)out,
                             cheap_step(d, g, me, itemsize), peers, err);
  int failed = 0;
  /* Each part is copied once, by the side that pulls it or the side that pushes;
   * member me starts with me + 1, so that no peer is everyone's first. */
  for (int i = 1; all == 1 && i < g && failed == 0; ++i) {
    int q = (me + i) % g;
    const mt_box *part = &d->recv[q];
    if (mt_box_numel(part) > 0 && mt__direct_pulls(part, &d->recv_src[q], d->dst, itemsize)) {
      failed = copy_part(peers[q].pid, 0, peers[me].out, d->dst, peers[q].in, &d->recv_src[q],
                          part, itemsize);
    }
    part = &d->send[q];
    if (failed == 0 && mt_box_numel(part) > 0 &&
        !mt__direct_pulls(part, d->src, &d->send_dst[q], itemsize)) {
      failed = copy_part(peers[q].pid, 1, peers[me].in, d->src, peers[q].out,
                          &d->send_dst[q], part, itemsize);
    }
  }
  if (all <= 0) return all;
  return mt__direct_end(comm, failed, err);
}

/* ---- the probe ------------------------------------------------------------- */

/* This process's token (process_token): its pid, the clock at first use and the
 * token's own address, so that no other process holds the same value at the same
 * place. It names the process, so it is process-wide by nature: set once (an
 * atomic compare-and-swap from 0, so concurrent first uses agree on it), read
 * after. */
static _Atomic int64_t token;

/* The token's address; peers read the value there. Thread-safe. */
static const int64_t *process_token(void) {
  if (atomic_load(&token) == 0) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    int64_t t = ((int64_t)getpid() << 32) ^ (int64_t)ts.tv_nsec ^
                ((int64_t)ts.tv_sec << 20) ^ (int64_t)(intptr_t)&token;
    int64_t zero = 0;
    atomic_compare_exchange_strong(&token, &zero, t != 0 ? t : 1);
  }
  /* Peers read the bytes at this address with process_vm_readv. */
  return (const int64_t *)&token;
}

/* Whether process `pid` holds `expect` at address `token_at` (what it published
 * from process_token): that the pid names that process, and not another of the
 * same pid on another node or in another pid namespace, and that this process
 * may read its memory (no ptrace restriction or seccomp rule against it). */
static int reads_back(int64_t pid, uint64_t token_at, int64_t expect) {
  int64_t got = 0;
  mt_box one = {.ndim = 1, .offset = {0}, .shape = {1}};
  return copy_part(pid, 0, (uint64_t)(uintptr_t)&got, &one, token_at, &one, &one,
                   sizeof got) == 0 &&
         got == expect;
}

/* Whether this process leaves direct copies off: MPITENSOR_DIRECT_READ=0, or,
 * unless MPITENSOR_DIRECT_READ=1 asks for them, a CPU where benchmarks/transport.py
 * has not measured them faster than MPI's shared-memory transport (only AMD's
 * have been). */
static int disabled_here(void) {
  const char *v = getenv("MPITENSOR_DIRECT_READ");
  if (v != NULL && strcmp(v, "0") == 0) return 1;
  if (v != NULL && strcmp(v, "1") == 0) return 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return !__builtin_cpu_is("amd");
#else
  return 1;
#endif
}

int mt__direct_probe(MPI_Comm comm, int n, int *ok, mt_error *err) {
  *ok = 0;
  mt__direct_peer *peers = malloc((size_t)n * sizeof *peers);
  int failed = peers == NULL || disabled_here() || !MT__HAVE_DIRECT;
  int64_t ready = !failed;
  int rc = mt_agree_comm(comm, MT_OK, &ready, 1, err);
  if (rc != MT_OK || ready != 1 || peers == NULL) {
    free(peers);
    return rc;
  }
  /* The all-gather carries each token's address as `in` and its value as `out`. */
  const int64_t *mine = process_token();
  int all = mt__direct_begin(comm, n, (uint64_t)(uintptr_t)mine, (uint64_t)*mine, 1, peers,
                             err);
  int me = 0;
  MPI_Comm_rank(comm, &me);
  for (int q = 0; all == 1 && q < n && !failed; ++q) {
    if (q != me) failed = !reads_back(peers[q].pid, peers[q].in, (int64_t)peers[q].out);
  }
  free(peers);
  if (all < 0) return MT_EMPI;
  int agreed = mt__direct_end(comm, failed || all != 1, err);
  if (agreed < 0) return MT_EMPI;
  *ok = agreed;
  return MT_OK;
}
