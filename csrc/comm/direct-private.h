/* Direct copies between the processes of one node (direct.c): a rank reads the
 * part it needs straight out of a peer's array into its own, one pass in all,
 * where MPI would pack a strided part, copy it through shared memory and unpack
 * it (three passes). Linux's process_vm_readv does the reading; whether it works
 * between the mesh's processes (one node, same user, no seccomp rule against it)
 * is probed once when the mesh is made. */
#ifndef MPITENSOR_DIRECT_PRIVATE_H
#define MPITENSOR_DIRECT_PRIVATE_H

#include <mpi.h>
#include <stdint.h>

#include "mpitensor/core/layout.h"
#include "mpitensor/core/status.h"

/* Each step moves at least this much per member on average before it copies
 * directly: below, the two small collectives that frame the copies cost about as
 * much as the passes they spare, or more. */
#define MT__DIRECT_MIN_BYTES ((int64_t)32 << 10)

/* The largest group that reads directly (the peers' addresses live on the
 * stack); larger groups go through MPI. */
#define MT__DIRECT_MAX_GROUP 64

/* Collective on `comm` (`n` members, all on one node). Sets *ok to 1 on every
 * member when each could read every other one's memory and found what it held (a
 * token compared, so a process of another pid namespace never passes), else 0 on
 * every member; 0 without trying where some member leaves them off (its CPU, or
 * MPITENSOR_DIRECT_READ=0; =1 switches them on whatever the CPU).
 * MT_EMPI when the collectives themselves fail. */
int mt__direct_probe(MPI_Comm comm, int n, int *ok, mt_error *err);

/* A copy addresses at least this many bytes per run, on average, in the other
 * process: the kernel pins the other side's pages run by run, which costs more
 * than MPI's extra passes over runs shorter than a page. */
#define MT__DIRECT_MIN_RUN ((int64_t)4 << 10)

/* And at least this many on its own side: the kernel copies run by run, and
 * below this MPI's packing loops move short runs faster. */
#define MT__DIRECT_MIN_LOCAL_RUN ((int64_t)512)

/* Where a member's arrays live, as its peers need them. */
typedef struct mt__direct_peer {
  int64_t pid;
  uint64_t in, out; /* the addresses of its step's input and output */
  int64_t ready;    /* 1: it takes part in the direct copies */
} mt__direct_peer;

/* Local. Whether a part (a global box) moving from an array of box `src` to one
 * of box `dst` is pulled by its receiver (1) or pushed by its sender (0): the
 * side with fewer contiguous runs is the one addressed in the other process. Both
 * sides compute it alike. */
int mt__direct_pulls(const mt_box *part, const mt_box *src, const mt_box *dst,
                     int64_t itemsize);

/* Local. Whether that copy addresses runs of MT__DIRECT_MIN_RUN bytes or more on
 * average in the other process, and of MT__DIRECT_MIN_LOCAL_RUN in its own. */
int mt__direct_cheap(const mt_box *part, const mt_box *src, const mt_box *dst,
                     int64_t itemsize);

/* Collective on `comm` (`g` members). Gathers every member's pid and its `in`
 * and `out` (the addresses of its step's arrays) into peers[g]; returns 1 on every member when every
 * member passed `ready` (else the step goes through MPI), 0 otherwise, and -1
 * with *err set when the all-gather fails. */
int mt__direct_begin(MPI_Comm comm, int g, uint64_t in, uint64_t out, int ready,
                     mt__direct_peer *peers, mt_error *err);

/* Collective on `comm`. Closes a direct step: every member passes the errno of
 * its copies (0 when all succeeded); returns 1 on every member when all
 * succeeded, and 0 otherwise, when the step must move its data through MPI
 * instead (every input is unchanged, and every part of every output is written
 * again, so that is still right). Also the point after which no peer touches this
 * member's arrays any more. -1 with *err when the agreement itself fails. */
int mt__direct_end(MPI_Comm comm, int failed, mt_error *err);

/* What one member moves in a step, as global boxes, g of each: recv[q] comes
 * from peer q's array of box recv_src[q]; send[q] goes to peer q's array of box
 * send_dst[q]; `src` and `dst` are this member's own arrays' boxes. */
typedef struct mt__direct_parts {
  const mt_box *recv, *recv_src, *send, *send_dst;
  const mt_box *src, *dst;
} mt__direct_parts;

/* Blocking, collective on `comm` (g members, this one `me`), a communicator of a
 * mesh with mt_mesh_direct_read true. The direct form of a step that moves the
 * parts `d` between the members' C-contiguous arrays `in` and `out` (its own
 * part, q == me, is the caller's to copy): each part is pulled by its receiver
 * or pushed by its sender (mt__direct_pulls). Returns 1 when done; 0 when the
 * step must go through MPI: a member's copies would address runs too short
 * (mt__direct_cheap), the group is larger than MT__DIRECT_MAX_GROUP, or a copy
 * failed somewhere; -1 with *err when a collective fails. The same answer on
 * every member of `comm`. */
int mt__direct_step(MPI_Comm comm, int g, int me, const void *in,
                    void *out, const mt__direct_parts *d, int64_t itemsize,
                    mt_error *err);

#endif
