/* The time model (timemodel.h): alpha-beta per link class, collectives priced by
 * the algorithm Open MPI's tuned component picks.
 *
 * The decisions follow coll_tuned_decision_fixed.c's classic rules, which the 4.1
 * tables refine per group size without changing their shape: small all-gathers
 * and all-reduces take log2 G rounds and large ones a ring; small or power-of-two
 * reduce-scatters halve recursively, large ones use a ring. The executor runs
 * all-to-all steps and direct exchanges with MPI_Alltoallw, which the tuned
 * component always runs linearly (every peer posted at once), so no Bruck or
 * pairwise all-to-all is priced. A group that spans nodes pays the network's
 * alpha in every round of a ring (each waits for its links that cross) and in the
 * rounds of recursive doubling whose partners are on other nodes; the bytes that
 * cross pass the node's one network link together with those of every other rank
 * of the node (the max-rate model of Gropp, Olson and Samfass, EuroMPI 2016), so a
 * mesh dim whose groups take one rank of each node pays for all of a node's ranks
 * at once. With one rank per node this is the per-rank alpha-beta model. */
#include "mpitensor/core/timemodel.h"

#include <math.h>
#include <stdint.h>

#include "core-private.h"
#include "mpitensor/core/status.h"

/* Total bytes under which Open MPI gathers and reduces in log2 G rounds. */
#define ALLGATHER_SMALL 50000
#define ALLREDUCE_SMALL 10000
/* Reduce-scatter halves recursively up to this total, and up to LARGE on a
 * power-of-two group. */
#define REDSCAT_SMALL ((int64_t)12 * 1024)
#define REDSCAT_LARGE ((int64_t)256 * 1024)

mt_time_model mt_time_model_default(void) {
  mt_time_model m = {{1.0e-6, 20.0e-6}, {1.0 / 5.0e9, 1.0 / 1.25e9}, 2.0e-6,
                     1.0 / 10.0e9, 1.0 / 8.0e9, 0};
  return m;
}

static int bad_number(double v) { return !isfinite(v) || v < 0.0; }

int mt_time_model_check(const mt_time_model *model, mt_error *err) {
  if (model == NULL) return mt__fail(err, MT_EINVAL, "The time model is required");
  static const char *const names[MT_NLINKS] = {"shared memory", "network"};
  for (int l = 0; l < MT_NLINKS; ++l) {
    if (bad_number(model->alpha[l]) || bad_number(model->beta[l]))
      return mt__fail(err, MT_EINVAL,
                      "The %s link's alpha (%g s per message) and beta (%g s per byte) "
                      "must be finite and >= 0",
                      names[l], model->alpha[l], model->beta[l]);
  }
  if (model->alpha[MT_LINK_NET] < model->alpha[MT_LINK_SHM] ||
      model->beta[MT_LINK_NET] < model->beta[MT_LINK_SHM])
    return mt__fail(err, MT_EINVAL,
                    "The network link (alpha %g, beta %g) must not be faster than "
                    "shared memory (alpha %g, beta %g)",
                    model->alpha[MT_LINK_NET], model->beta[MT_LINK_NET],
                    model->alpha[MT_LINK_SHM], model->beta[MT_LINK_SHM]);
  if (bad_number(model->call))
    return mt__fail(err, MT_EINVAL, "The time model's call cost (%g s per step) must be "
                    "finite and >= 0", model->call);
  if (bad_number(model->copy) || bad_number(model->reduce))
    return mt__fail(err, MT_EINVAL, "The time model's copy (%g s per byte) and reduce "
                    "(%g s per byte) costs must be finite and >= 0", model->copy,
                    model->reduce);
  if (model->ranks_per_node < 0)
    return mt__fail(err, MT_EINVAL, "ranks_per_node is %lld; it must be >= 0",
                    (long long)model->ranks_per_node);
  return MT_OK;
}

int mt_time_link(const mt_time_model *model, int64_t numel, int64_t group,
                 int64_t stride) {
  int64_t p = model->ranks_per_node;
  if (group <= 1 || p == 0 || p >= numel) return MT_LINK_SHM;
  /* A group spans `group * stride` consecutive positions (its members and the
   * groups interleaved with it): within one node exactly when such spans tile
   * the nodes. */
  if (stride > INT64_MAX / group) return MT_LINK_NET;
  int64_t span = group * stride;
  return span <= p && p % span == 0 ? MT_LINK_SHM : MT_LINK_NET;
}

static int is_pow2(int64_t g) { return g > 0 && (g & (g - 1)) == 0; }

static double log2_ceil(int64_t g) {
  double r = 0.0;
  for (int64_t v = 1; v < g; v <<= 1) r += 1.0;
  return r;
}

mt_coll_alg mt_time_coll_alg(int kind, int64_t group, int64_t bytes) {
  if (group <= 1) return MT_ALG_NONE;
  switch (kind) {
    case MT_TIME_ALLGATHER:
      if (group == 2) return MT_ALG_TWO_PROC;
      return bytes < ALLGATHER_SMALL ? MT_ALG_RECURSIVE : MT_ALG_RING;
    case MT_TIME_ALLREDUCE:
      return bytes < ALLREDUCE_SMALL ? MT_ALG_RECURSIVE : MT_ALG_RING;
    case MT_TIME_REDUCE_SCATTER:
      if (bytes <= REDSCAT_SMALL || (bytes <= REDSCAT_LARGE && is_pow2(group)))
        return MT_ALG_RECURSIVE;
      return MT_ALG_RING;
    default:
      return MT_ALG_LINEAR;
  }
}

/* The rounds of collective `kind` by algorithm `alg` over `group` ranks on
 * `bytes`, and what one rank receives in all of them (`received` for the ones
 * that receive the others' data). */
typedef struct coll_shape {
  double rounds;
  double received;
} coll_shape;

static coll_shape shape_of(int kind, int alg, int64_t group, int64_t bytes,
                           int64_t received) {
  double g = (double)group, n = (double)bytes, rounds = log2_ceil(group);
  /* The others' data a rank takes in; an all-reduce's share of its vector. */
  double others = kind == MT_TIME_ALLREDUCE ? n * (g - 1.0) / g : (double)received;
  coll_shape s = {0.0, 0.0};
  switch (alg) {
    case MT_ALG_TWO_PROC:
      s.rounds = 1.0, s.received = others;
      break;
    case MT_ALG_RECURSIVE:
      /* An all-reduce by recursive doubling sends the whole vector each round. */
      s.rounds = rounds, s.received = kind == MT_TIME_ALLREDUCE ? rounds * n : others;
      break;
    case MT_ALG_RING:
      if (kind == MT_TIME_ALLREDUCE) {
        s.rounds = 2.0 * (g - 1.0), s.received = 2.0 * others;
      } else {
        /* Open MPI's neighbour exchange halves the rounds of an even group. */
        s.rounds = kind == MT_TIME_ALLGATHER && group % 2 == 0 ? g / 2.0 : g - 1.0;
        s.received = others;
      }
      break;
    case MT_ALG_LINEAR:
      s.rounds = g - 1.0, s.received = (double)received;
      break;
    default:
      break;
  }
  return s;
}

double mt_time_coll(const mt_time_model *model, int kind, int64_t group, int64_t bytes,
                    int64_t received, int link) {
  if (group <= 1) return 0.0;
  coll_shape s = shape_of(kind, mt_time_coll_alg(kind, group, bytes), group, bytes,
                          received);
  return model->call + s.rounds * model->alpha[link] + s.received * model->beta[link];
}

int64_t mt_time_members_per_node(const mt_time_model *model, int64_t numel,
                                 int64_t group, int64_t stride) {
  int64_t k = model->ranks_per_node;
  if (mt_time_link(model, numel, group, stride) == MT_LINK_SHM) return group;
  if (stride < k && k % stride == 0 && group % (k / stride) == 0) return k / stride;
  return 1;
}

/* Rounds of recursive doubling or halving whose partners share a node: those
 * closer than `local` members, when runs of `local` (a power of two) align with
 * the rounds; otherwise none is counted. */
static double rounds_inside(int64_t local) {
  return is_pow2(local) ? log2_ceil(local) : 0.0;
}

double mt_time_net_share(int kind, int64_t group, int64_t local, int64_t bytes) {
  if (group <= 1 || local >= group) return 0.0;
  double g = (double)group, l = (double)local;
  switch (mt_time_coll_alg(kind, group, bytes)) {
    case MT_ALG_RING:
      return 1.0 / l;
    case MT_ALG_RECURSIVE:
      if (!is_pow2(local)) return 1.0;
      if (kind == MT_TIME_ALLREDUCE) return 1.0 - rounds_inside(local) / log2_ceil(group);
      return (g - l) / (g - 1.0);
    case MT_ALG_LINEAR:
      return (g - l) / (g - 1.0);
    default:
      return 1.0;
  }
}

double mt_time_coll_nodes(const mt_time_model *model, int kind, int64_t group,
                          int64_t local, int64_t bytes, int64_t received) {
  if (group <= 1) return 0.0;
  if (local >= group || model->ranks_per_node == 0)
    return mt_time_coll(model, kind, group, bytes, received, MT_LINK_SHM);
  int alg = mt_time_coll_alg(kind, group, bytes);
  coll_shape s = shape_of(kind, alg, group, bytes, received);
  double share = mt_time_net_share(kind, group, local, bytes);
  const double *a = model->alpha, *b = model->beta;
  /* Every rank of the node sends its share across the node's one link at once. */
  double link = (double)model->ranks_per_node * share * s.received * b[MT_LINK_NET];
  double t = model->call;
  switch (alg) {
    case MT_ALG_RECURSIVE: {
      /* Rounds one after another: the close partners' over shared memory. */
      double inside = is_pow2(local) ? rounds_inside(local) : 0.0;
      return t + inside * a[MT_LINK_SHM] + (s.rounds - inside) * a[MT_LINK_NET] +
             (1.0 - share) * s.received * b[MT_LINK_SHM] + link;
    }
    case MT_ALG_LINEAR: {
      /* Every message posted at once: the node's peers and the others'. */
      double l = (double)local;
      double shm = (1.0 - share) * s.received * b[MT_LINK_SHM];
      return t + (l - 1.0) * a[MT_LINK_SHM] + ((double)group - l) * a[MT_LINK_NET] +
             (shm > link ? shm : link);
    }
    default: {
      /* A ring's round waits for its links that cross; the members whose
       * neighbour shares their node receive as much over shared memory. */
      double shm = s.received * b[MT_LINK_SHM];
      return t + s.rounds * a[MT_LINK_NET] + (shm > link ? shm : link);
    }
  }
}

double mt_time_linear(const mt_time_model *model, int64_t messages, int64_t bytes,
                      int link) {
  return model->call + (double)messages * model->alpha[link] +
         (double)bytes * model->beta[link];
}

double mt_time_local(const mt_time_model *model, int64_t copied, int64_t reduced) {
  return (double)copied * model->copy + (double)reduced * model->reduce;
}
