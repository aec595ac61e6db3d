/* The agreements' all-reduce through memory the members of a one-node mesh share
 * (comm-private.h, mt__shm_*). Every call a program makes on DTensors is agreed
 * first, so the few int64 values of an agreement cross once per call; through MPI
 * an all-reduce costs a message round per step, here a cache line per member.
 *
 * Each member owns two slots, used by rounds of alternating parity: a member that
 * finished round r writes round r + 1 into its other slot, and cannot reach round
 * r + 2 (its first slot again) before every member has written r + 1, that is,
 * has read all of round r. A slot is written, then its round number stored with
 * release order; a reader waits for that number with acquire order, then reads. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "comm-private.h"
#include "mpitensor/comm/agree.h"

/* A slot: the round it holds and the values, on cache lines of its own. */
typedef struct slot {
  _Atomic uint64_t round;
  int64_t v[MT__SHM_MAX_VALUES];
  char pad[128 - 8 - 8 * MT__SHM_MAX_VALUES];
} slot;

_Static_assert(sizeof(slot) == 128, "a slot is two cache lines");

struct mt__shm {
  slot *slots; /* members x 2 */
  size_t bytes;
  int members, me;
  uint64_t round; /* the last round this member took part in */
};

/* Spins a reader makes before it yields the core: a peer a few microseconds late
 * is met without a system call. */
#define SPINS 4096

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Collective on `comm`. The cores the members may run on, all together: the union
 * of their affinity masks (which MPI's binding and a container's CPU set limit),
 * the same number on every member; 0 where a mask cannot be read. */
static int shared_cores(MPI_Comm comm, int *cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int readable = sched_getaffinity(0, sizeof set, &set) == 0, all = 0;
  int rc = MT__BLOCKING("MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, &set, (int)sizeof set,
                                                        MPI_BYTE, MPI_BOR, comm));
  if (rc == MPI_SUCCESS)
    rc = MT__BLOCKING("MPI_Allreduce",
                      MPI_Allreduce(&readable, &all, 1, MPI_INT, MPI_MIN, comm));
  *cores = all ? CPU_COUNT(&set) : 0;
  return rc;
}

/* A name no other segment has: the creator's pid, the address its mesh keeps the
 * segment at (distinct among the live meshes of a process) and the clock. The
 * segment is unlinked once every member has mapped it. */
static void segment_name(char *name, size_t n, const void *owner) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(name, n, "/mpitensor-%ld-%lx-%lx", (long)getpid(), (unsigned long)(uintptr_t)owner,
           (unsigned long)ts.tv_nsec);
}

static slot *map(const char *name, int create, size_t bytes) {
  int fd = shm_open(name, create ? O_CREAT | O_EXCL | O_RDWR : O_RDWR, 0600);
  if (fd < 0) return NULL;
  void *p = MAP_FAILED;
  if (!create || ftruncate(fd, (off_t)bytes) == 0)
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? NULL : p;
}

int mt__shm_create(MPI_Comm comm, mt__shm **out, mt_error *err) {
  *out = NULL;
  int members = 0, me = 0;
  MT__MPI_TRY(MPI_Comm_size(comm, &members), "MPI_Comm_size");
  MT__MPI_TRY(MPI_Comm_rank(comm, &me), "MPI_Comm_rank");
  size_t bytes = (size_t)members * 2 * sizeof(slot);
  char name[64] = {0};
  slot *slots = NULL;
  if (me == 0) {
    segment_name(name, sizeof name, out);
    if ((slots = map(name, 1, bytes)) == NULL) name[0] = '\0';
  }
  int rc = MT__BLOCKING("MPI_Bcast", MPI_Bcast(name, (int)sizeof name, MPI_CHAR, 0, comm));
  if (rc == MPI_SUCCESS && me != 0 && name[0] != '\0') slots = map(name, 0, bytes);
  mt__shm *s = malloc(sizeof *s);
  /* Every member uses the segment, or none does (MPI's all-reduce then): none
   * where the members are more than the cores they may run on, since a member
   * spinning for another would take the core that one needs; Open MPI's progress
   * loop yields at once when it finds itself oversubscribed. */
  int cores = 0;
  if (rc == MPI_SUCCESS) rc = shared_cores(comm, &cores);
  int mapped = slots != NULL && s != NULL && members <= cores, all = 0;
  if (rc == MPI_SUCCESS)
    rc = MT__BLOCKING("MPI_Allreduce",
                      MPI_Allreduce(&mapped, &all, 1, MPI_INT, MPI_MIN, comm));
  if (me == 0 && name[0] != '\0') shm_unlink(name); /* every member has opened it */
  if (rc != MPI_SUCCESS || !all || s == NULL) { /* all: every member's s too */
    if (slots != NULL) munmap(slots, bytes);
    free(s);
    return rc == MPI_SUCCESS ? MT_OK : mt_mpi_error(err, rc, "MPI_Allreduce");
  }
  *s = (mt__shm){slots, bytes, members, me, 0};
  *out = s;
  return MT_OK;
}

void mt__shm_destroy(mt__shm *s) {
  if (s == NULL) return;
  munmap(s->slots, s->bytes);
  free(s);
}

void mt__shm_allreduce(mt__shm *s, int64_t *values, int n, int op) {
  uint64_t r = ++s->round;
  size_t parity = (size_t)(r & 1);
  slot *mine = &s->slots[2 * (size_t)s->me + parity];
  memcpy(mine->v, values, (size_t)n * sizeof *values);
  atomic_store_explicit(&mine->round, r, memory_order_release);
  int64_t acc[MT__SHM_MAX_VALUES];
  memcpy(acc, values, (size_t)n * sizeof *values);
  mt__wait_begin("the agreement's all-reduce in shared memory");
  for (int k = 0; k < s->members; ++k) {
    if (k == s->me) continue;
    const slot *theirs = &s->slots[2 * (size_t)k + parity];
    for (long spins = 0; atomic_load_explicit(&theirs->round, memory_order_acquire) != r;
         ++spins) {
      if (spins < SPINS) relax();
      else sched_yield();
    }
    for (int i = 0; i < n; ++i) {
      int64_t x = theirs->v[i];
      acc[i] = op == MT__SHM_OR ? acc[i] | x : x < acc[i] ? x : acc[i];
    }
  }
  mt__wait_end(0);
  memcpy(values, acc, (size_t)n * sizeof *values);
}
