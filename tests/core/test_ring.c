/* Ring exchanges over MPI_COMM_WORLD at whatever size mpiexec gave: a full turn
 * of shifts with blocks of different sizes, the uneven all-gather, the handle of
 * an exchange in flight, the metadata all-gather, the counters, and bad input. */
#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mpitensor/comm/mesh.h"
#include "mpitensor/comm/pending.h"
#include "mpitensor/comm/redistribute.h"
#include "mpitensor/comm/ring.h"
#include "world_mesh.h"

static int world_rank, world_size;

/* Rank r's block has r + 2 bytes, each the byte 10 * r + i, so a block names its
 * origin and a misplaced or truncated one shows. */
static int64_t block_len(int r) { return r + 2; }

static void fill_block(int r, unsigned char *buf) {
  for (int64_t i = 0; i < block_len(r); ++i) buf[i] = (unsigned char)(10 * r + i);
}

static int block_ok(int r, const unsigned char *buf) {
  for (int64_t i = 0; i < block_len(r); ++i) {
    if (buf[i] != (unsigned char)(10 * r + i)) return 0;
  }
  return 1;
}

/* After step s every rank holds the block of rank (me - s) mod n; after n steps
 * its own again. Each shift moves two blocks: the origin's block and, reversed in
 * size order, a second one of 1 + origin bytes, so a swapped pair shows. */
static void test_shift_turn(mt_mesh *m) {
  unsigned char cur[64], next[64], cur2[64], next2[64];
  int holder = world_rank;
  fill_block(holder, cur);
  memset(cur2, holder, sizeof cur2);
  mt_comm_totals before, after;
  mt_comm_counters_read(&test_counters, &before);
  for (int s = 1; s <= world_size; ++s) {
    int from = (holder + world_size - 1) % world_size;
    const void *send[2] = {cur, cur2};
    void *recv[2] = {next, next2};
    int64_t send_bytes[2] = {block_len(holder), 1 + holder};
    int64_t recv_bytes[2] = {block_len(from), 1 + from};
    mt_exchange *ex = NULL;
    mt_error err = {0};
    memset(next2, 0xff, sizeof next2);
    CHECK_MSG(mt_ring_shift_start(m, 0, 2, send, send_bytes, recv, recv_bytes, &ex,
                                  &err) == MT_OK, "%s", err.msg);
    int done = 0;
    CHECK(mt_exchange_test(ex, &done, &err) == MT_OK);
    CHECK(mt_exchange_wait(ex, &err) == MT_OK);
    holder = from;
    CHECK(block_ok(holder, next));
    CHECK(next2[0] == holder && next2[holder] == holder && next2[holder + 1] == 0xff);
    memcpy(cur, next, sizeof cur);
    memcpy(cur2, next2, sizeof cur2);
  }
  CHECK(holder == world_rank);
  mt_comm_counters_read(&test_counters, &after);
  int64_t calls = after.calls[MT_COLL_ALL_TO_ALL] - before.calls[MT_COLL_ALL_TO_ALL];
  CHECK(calls == (world_size > 1 ? world_size : 0));
}

static void test_allgatherv(mt_mesh *m) {
  int64_t bytes[8], total = 0;
  for (int r = 0; r < world_size; ++r) total += (bytes[r] = block_len(r));
  unsigned char mine[64], all[512];
  fill_block(world_rank, mine);
  mt_exchange *ex = NULL;
  mt_error err = {0};
  CHECK_MSG(mt_ring_allgatherv_start(m, 0, mine, bytes[world_rank], all, total, bytes,
                                     world_size, &ex, &err) == MT_OK,
            "%s", err.msg);
  CHECK(mt_exchange_wait(ex, &err) == MT_OK);
  int64_t off = 0;
  for (int r = 0; r < world_size; ++r) {
    CHECK(block_ok(r, all + off));
    off += bytes[r];
  }
  CHECK(off == total);
}

static mt_pending *started_allgather(mt_mesh *m, unsigned char *mine, unsigned char *all,
                                     int64_t *bytes) {
  int64_t total = 0;
  for (int r = 0; r < world_size; ++r) total += (bytes[r] = block_len(r));
  fill_block(world_rank, mine);
  mt_exchange *ex = NULL;
  mt_pending *p = NULL;
  mt_error err = {0};
  CHECK(mt_ring_allgatherv_start(m, 0, mine, bytes[world_rank], all, total, bytes,
                                 world_size, &ex, &err) == MT_OK);
  CHECK(mt_pending_create(NULL, ex, &p, &err) == MT_OK && !mt_pending_done(p));
  return p;
}

static void *wait_on(void *p) {
  mt_error err = {0};
  return mt_pending_wait(p, &err) == MT_OK ? p : NULL;
}

/* The handle of an exchange in flight: tested until done, completed by the first
 * wait (a second finds it complete), destroyed unwaited after completing it, and
 * waited on by several threads at once (here one without an exchange, so that no
 * thread but the main one calls MPI). */
static void test_pending(mt_mesh *m) {
  unsigned char mine[64], all[512];
  int64_t bytes[8];
  mt_error err = {0};
  mt_pending *p = started_allgather(m, mine, all, bytes);
  for (int done = 0; !done;) CHECK(mt_pending_test(p, &done, &err) == MT_OK);
  CHECK(mt_pending_wait(p, &err) == MT_OK && mt_pending_done(p));
  CHECK(block_ok(world_rank, all + world_rank * (world_rank + 3) / 2));
  int done = 0;
  CHECK(mt_pending_wait(p, &err) == MT_OK && mt_pending_test(p, &done, &err) == MT_OK && done);
  mt_pending_destroy(p);
  mt_pending_destroy(started_allgather(m, mine, all, bytes));
  CHECK(block_ok(0, all));
  CHECK(mt_pending_create(NULL, NULL, &p, &err) == MT_OK);
  pthread_t threads[3];
  for (int i = 0; i < 3; ++i) CHECK(pthread_create(&threads[i], NULL, wait_on, p) == 0);
  for (int i = 0; i < 3; ++i) {
    void *got = NULL;
    CHECK(pthread_join(threads[i], &got) == 0 && got == p);
  }
  CHECK(mt_pending_done(p));
  mt_pending_destroy(p);
  mt_pending_destroy(NULL);
}

static void test_allgather_int64(mt_mesh *m) {
  int64_t mine[2] = {world_rank, (int64_t)1 << 40}, out[16];
  CHECK(mt_ring_allgather_int64(m, 0, mine, 2, out, NULL) == MT_OK);
  for (int r = 0; r < world_size; ++r) {
    CHECK(out[2 * r] == r && out[2 * r + 1] == (int64_t)1 << 40);
  }
}

static void test_bad_input(mt_mesh *m) {
  unsigned char a[4] = {0}, b[4] = {0};
  mt_exchange *ex = NULL;
  mt_error err = {0};
  const void *send[1] = {a};
  void *recv[1] = {b};
  int64_t one[1] = {1}, minus[1] = {-1};
  CHECK(mt_ring_shift_start(m, 1, 1, send, one, recv, one, &ex, &err) == MT_EINDEX);
  CHECK(strstr(err.msg, "out of range") != NULL);
  CHECK(mt_ring_shift_start(m, 0, 1, send, minus, recv, one, &ex, &err) == MT_EINVAL);
  CHECK(mt_ring_shift_start(m, 0, 0, send, one, recv, one, &ex, &err) == MT_EINVAL);
  CHECK(mt_ring_shift_start(m, 0, MT_RING_MAX_BLOCKS + 1, send, one, recv, one, &ex,
                            &err) == MT_EINVAL);
  int64_t bytes[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
  CHECK(mt_ring_allgatherv_start(m, 0, a, -1, b, -world_size, bytes, world_size, &ex,
                                 &err) == MT_EINVAL);
  CHECK(ex == NULL);
  /* Counts that do not fit the buffers, or one count short, are refused before
   * any communication. */
  for (int r = 0; r < 8; ++r) bytes[r] = 1;
  CHECK(mt_ring_allgatherv_start(m, 0, a, 1, b, world_size + 1, bytes, world_size, &ex,
                                 &err) == MT_EINVAL);
  CHECK(strstr(err.msg, "do not match") != NULL && ex == NULL);
  CHECK(mt_ring_allgatherv_start(m, 0, a, 1, b, world_size, bytes, world_size + 1, &ex,
                                 &err) == MT_EINVAL);
  CHECK(strstr(err.msg, "byte counts for a mesh dim") != NULL && ex == NULL);
  if (world_size == 1) {
    int64_t two[1] = {2}, three[1] = {3};
    CHECK(mt_ring_shift_start(m, 0, 1, send, two, recv, three, &ex, &err) == MT_EINVAL);
  }
  CHECK(mt_exchange_wait(NULL, &err) == MT_OK);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size <= 8) {
    mt_mesh *m = world_mesh();
    test_shift_turn(m);
    test_allgatherv(m);
    test_pending(m);
    test_allgather_int64(m);
    test_bad_input(m);
    mt_mesh_destroy(m);
  }
  CHECK(mt_comm_live_count() == 0);
  int failed = mt_test_exit("test_ring") != 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
