/* The decision memo (memo.h) on the core's bounded cache. The cache bounds the
 * decisions; this file bounds the plans they hold, evicting by the same clock. */
#include "mpitensor/core/memo.h"

#include <stdlib.h>
#include <string.h>

#include "cache-private.h"
#include "core-private.h"

/* op, aux, operand count, then the operands. */
enum { HEAD_WORDS = 4, KEY_WORDS = HEAD_WORDS + MT_MEMO_MAX_OPERANDS };

/* A direct-mapped front of the cache, by op: the decision an op found last,
 * tried before the key is hashed (an op mostly meets the same layouts again).
 * An entry is valid while the memo's epoch stays: every insert, clear or new
 * bound, which may move or drop decisions, starts a new epoch. An entry found
 * here is not marked for the clock, which is right: the first find of each
 * epoch, which every insert starts, goes to the cache and marks it. */
enum { FRONT = 64 };

typedef struct front {
  uint64_t epoch;
  mt_decision *decision;
  int64_t key[KEY_WORDS]; /* packed, the words the key uses */
} front;

struct mt_memo {
  mt__cache *cache;
  int64_t plans, plan_limit;
  int64_t hits, misses;
  uint64_t epoch; /* from 1: a zeroed front entry is invalid */
  front front[FRONT];
  mt_time_model model; /* ranks the plans of its decisions */
};

static int count_plans(const mt_decision *d) {
  int n = 0;
  for (int i = 0; i < d->ninputs; ++i) n += d->plan[i] != NULL;
  return n;
}

/* The cache lets a decision go: its plans go with it. */
static void drop(void *value, void *ctx) {
  mt_decision *d = value;
  mt_memo *memo = ctx;
  for (int i = 0; i < d->ninputs; ++i) {
    if (d->plan[i] == NULL) continue;
    mt_plan_destroy(d->plan[i]);
    memo->plans--;
  }
}

/* The key's word for its operands: their count, and which want a gradient. */
static int64_t count_word(const mt_memo_key *key) {
  return (int64_t)key->noperands | (int64_t)key->grad << 8;
}

static int pack(const mt_memo_key *key, int64_t *w, mt_error *err) {
  if (key->noperands < 0 || key->noperands > MT_MEMO_MAX_OPERANDS)
    return mt__fail(err, MT_EINVAL, "A memo key has 0 to %d operands, got %d",
                    MT_MEMO_MAX_OPERANDS, key->noperands);
  memset(w, 0, KEY_WORDS * sizeof *w);
  w[0] = key->op, w[1] = key->aux, w[2] = count_word(key), w[3] = key->want;
  for (int i = 0; i < key->noperands; ++i) w[HEAD_WORDS + i] = key->operand[i];
  return MT_OK;
}

int mt_memo_create(int64_t decisions, int64_t plans, mt_memo **out, mt_error *err) {
  if (plans < 1) return mt__fail(err, MT_EINVAL, "A memo holds at least one plan");
  mt_memo *memo = calloc(1, sizeof *memo);
  if (memo == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory creating a memo");
  int rc = mt__cache_create(KEY_WORDS, sizeof(mt_decision), decisions, drop, memo,
                            &memo->cache, err);
  if (rc != MT_OK) {
    free(memo);
    return rc;
  }
  memo->plan_limit = plans, memo->epoch = 1;
  memo->model = mt_time_model_default();
  *out = memo;
  return MT_OK;
}

void mt_memo_destroy(mt_memo *memo) {
  if (memo == NULL) return;
  mt__cache_destroy(memo->cache);
  free(memo);
}

/* The words of `key` it uses into w (the rest of a packed key is zero); 0 when
 * the count of operands is out of range. */
static int pack_used(const mt_memo_key *key, int64_t *w) {
  int n = key->noperands;
  if (n < 0 || n > MT_MEMO_MAX_OPERANDS) return 0;
  w[0] = key->op, w[1] = key->aux, w[2] = count_word(key), w[3] = key->want;
  for (int i = 0; i < n; ++i) w[HEAD_WORDS + i] = key->operand[i];
  return HEAD_WORDS + n;
}

mt_decision *mt_memo_peek(mt_memo *memo, const mt_memo_key *key) {
  int64_t w[KEY_WORDS];
  int words = pack_used(key, w);
  return words == 0 ? NULL : mt__cache_find_prefix(memo->cache, w, words, NULL);
}

/* Whether the front entry f holds `key`. */
static int front_holds(const front *f, const mt_memo_key *key) {
  if (f->key[0] != key->op || f->key[1] != key->aux || f->key[2] != count_word(key) ||
      f->key[3] != key->want)
    return 0;
  for (int i = 0; i < key->noperands; ++i)
    if (f->key[HEAD_WORDS + i] != key->operand[i]) return 0;
  return 1;
}

mt_decision *mt_memo_find(mt_memo *memo, const mt_memo_key *key) {
  front *f = &memo->front[(uint64_t)key->op % FRONT];
  if (f->epoch == memo->epoch && front_holds(f, key)) {
    memo->hits++;
    return f->decision;
  }
  int64_t w[KEY_WORDS];
  int words = pack_used(key, w);
  mt_decision *d = words == 0 ? NULL : mt__cache_find_prefix(memo->cache, w, words, NULL);
  if (d == NULL) {
    memo->misses++;
    return NULL;
  }
  memo->hits++;
  f->epoch = memo->epoch, f->decision = d;
  memcpy(f->key, w, (size_t)words * sizeof *w);
  return d;
}

/* Stores `decision` in the fresh value `slot`, retaining its plans. */
static mt_decision *store(mt_memo *memo, mt_decision *slot, const mt_decision *decision) {
  *slot = *decision;
  slot->nplans = 0;
  slot->partitioned = 0;
  for (int i = 0; i < slot->ninputs; ++i) {
    slot->partitioned |= slot->partition[i];
    if (slot->plan[i] == NULL) continue;
    mt_plan_retain(slot->plan[i]);
    memo->plans++, slot->nplans++;
  }
  return slot;
}

mt_decision *mt_memo_insert(mt_memo *memo, const mt_memo_key *key,
                            const mt_decision *decision, mt_error *err) {
  int64_t w[KEY_WORDS], slot;
  if (pack(key, w, err) != MT_OK) return NULL;
  memo->epoch++;
  if (decision->ninputs < 0 || decision->ninputs > MT_PROP_MAX_INPUTS) {
    mt__fail(err, MT_EINVAL, "A decision has 0 to %d inputs", MT_PROP_MAX_INPUTS);
    return NULL;
  }
  mt_decision *old = mt__cache_find(memo->cache, w, &slot);
  if (old != NULL) {
    drop(old, memo);
    return store(memo, old, decision);
  }
  int64_t need = count_plans(decision);
  while (memo->plans + need > memo->plan_limit && mt__cache_evict_one(memo->cache)) {
  }
  mt_decision *fresh = mt__cache_add(memo->cache, w, NULL, err);
  return fresh == NULL ? NULL : store(memo, fresh, decision);
}

int mt_memo_set_time_model(mt_memo *memo, const mt_time_model *model, mt_error *err) {
  int rc = mt_time_model_check(model, err);
  if (rc != MT_OK) return rc;
  memo->model = *model;
  mt_memo_clear(memo);
  return MT_OK;
}

const mt_time_model *mt_memo_time_model(const mt_memo *memo) { return &memo->model; }

void mt_memo_clear(mt_memo *memo) {
  memo->epoch++;
  mt__cache_clear(memo->cache);
}

int mt_memo_set_limits(mt_memo *memo, int64_t decisions, int64_t plans, mt_error *err) {
  if (plans < 1) return mt__fail(err, MT_EINVAL, "A memo holds at least one plan");
  memo->epoch++;
  int rc = mt__cache_set_capacity(memo->cache, decisions, err);
  if (rc == MT_OK) memo->plan_limit = plans;
  return rc;
}

void mt_memo_stats_get(const mt_memo *memo, mt_memo_stats *out) {
  out->hits = memo->hits, out->misses = memo->misses;
  out->decisions = mt__cache_count(memo->cache);
  out->plans = memo->plans;
  out->decision_limit = mt__cache_capacity(memo->cache);
  out->plan_limit = memo->plan_limit;
}
