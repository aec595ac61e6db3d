/* The core's bounded hash table with CLOCK eviction (cache-private.h).
 *
 * Entries sit in one array of fixed-size records (a header, the key words, the
 * value); an index of slot numbers, open addressing with linear probing at most
 * half full, finds them by key, and removal shifts the probe chain back, so the
 * index needs no tombstones. Freed slots go on a stack and are reused first. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache-private.h"
#include "core-private.h"

enum { FIRST_SLOTS = 8 };

typedef struct header {
  uint32_t used;
  uint32_t ref;   /* found since the clock hand last passed */
  uint32_t words; /* the key's length without its trailing zero words */
  uint32_t unused;
} header;

struct mt__cache {
  int key_words;
  size_t value_size, stride;
  int64_t capacity, allocated, count, hand;
  unsigned char *records; /* allocated records of `stride` bytes */
  int64_t *free_slots;    /* stack of free slots below `allocated` */
  int64_t nfree;
  int64_t *index; /* mask + 1 entries: a slot, or -1 */
  uint64_t mask;
  mt__cache_drop drop;
  void *ctx;
};

static header *head_of(const mt__cache *c, int64_t slot) {
  return (header *)(c->records + (size_t)slot * c->stride);
}

static int64_t *key_of(const mt__cache *c, int64_t slot) {
  return (int64_t *)(c->records + (size_t)slot * c->stride + sizeof(header));
}

static void *value_of(const mt__cache *c, int64_t slot) {
  return (unsigned char *)key_of(c, slot) + (size_t)c->key_words * sizeof(int64_t);
}

/* A key's length without its trailing zero words: keys are hashed and compared
 * over that much only, so that a short key in long words costs what it holds. */
static int key_len(const int64_t *key, int words) {
  while (words > 0 && key[words - 1] == 0) --words;
  return words;
}

/* One multiply per word (keys are mostly small integers); the final fold brings
 * the product's high bits down to the index's low ones. */
static uint64_t hash_key(const int64_t *key, int words) {
  uint64_t h = 0;
  for (int i = 0; i < words; ++i) h = (h ^ (uint64_t)key[i]) * 0x9E3779B97F4A7C15u;
  return h ^ (h >> 32);
}

/* Whether slot s holds `key` of `len` (key_len) words. */
static int holds(const mt__cache *c, int64_t s, const int64_t *key, int len) {
  const header *h = head_of(c, s);
  if (!h->used || (int)h->words != len) return 0;
  const int64_t *have = key_of(c, s);
  for (int w = 0; w < len; ++w)
    if (have[w] != key[w]) return 0;
  return 1;
}

/* The index position of `key` of `len` (key_len) words, or of the empty cell
 * where it would go. */
static uint64_t probe_len(const mt__cache *c, const int64_t *key, int len) {
  uint64_t i = hash_key(key, len) & c->mask;
  while (c->index[i] >= 0 && !holds(c, c->index[i], key, len)) i = (i + 1) & c->mask;
  return i;
}

static uint64_t probe(const mt__cache *c, const int64_t *key) {
  return probe_len(c, key, key_len(key, c->key_words));
}

/* Removes index cell i and shifts the rest of its probe chain back. */
static void unindex(mt__cache *c, uint64_t i) {
  uint64_t j = i;
  for (;;) {
    j = (j + 1) & c->mask;
    if (c->index[j] < 0) break;
    int64_t s = c->index[j];
    uint64_t home = hash_key(key_of(c, s), (int)head_of(c, s)->words) & c->mask;
    /* Cell j may move to i unless its home lies cyclically in (i, j]. */
    int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    c->index[i] = c->index[j];
    i = j;
  }
  c->index[i] = -1;
}

static int64_t *new_index(uint64_t cells) {
  int64_t *index = malloc((size_t)cells * sizeof *index);
  if (index != NULL) memset(index, 0xff, (size_t)cells * sizeof *index);
  return index;
}

/* Room for `want` records (at most the capacity) and an index twice as large. */
static int grow(mt__cache *c, int64_t want, mt_error *err) {
  uint64_t cells = 16;
  while (cells < (uint64_t)(2 * want)) cells *= 2;
  unsigned char *records = realloc(c->records, (size_t)want * c->stride);
  if (records != NULL) c->records = records;
  int64_t *free_slots = realloc(c->free_slots, (size_t)want * sizeof *free_slots);
  if (free_slots != NULL) c->free_slots = free_slots;
  int64_t *index = new_index(cells);
  if (records == NULL || free_slots == NULL || index == NULL) {
    free(index);
    return mt__fail(err, MT_ENOMEM, "Out of memory growing a cache to %lld entries",
                    (long long)want);
  }
  memset(c->records + (size_t)c->allocated * c->stride, 0,
         (size_t)(want - c->allocated) * c->stride);
  free(c->index);
  c->index = index, c->mask = cells - 1;
  for (int64_t s = want - 1; s >= c->allocated; --s) c->free_slots[c->nfree++] = s;
  c->allocated = want;
  for (int64_t s = 0; s < c->allocated; ++s)
    if (head_of(c, s)->used) c->index[probe(c, key_of(c, s))] = s;
  return MT_OK;
}

int mt__cache_create(int key_words, size_t value_size, int64_t capacity,
                     mt__cache_drop drop, void *ctx, mt__cache **out, mt_error *err) {
  if (key_words < 1 || capacity < 1)
    return mt__fail(err, MT_EINVAL, "A cache needs keys and a capacity of at least 1");
  mt__cache *c = calloc(1, sizeof *c);
  if (c == NULL) return mt__fail(err, MT_ENOMEM, "Out of memory creating a cache");
  c->key_words = key_words, c->value_size = value_size;
  c->stride = sizeof(header) + (size_t)key_words * sizeof(int64_t) +
              (value_size + 7) / 8 * 8;
  c->capacity = capacity, c->drop = drop, c->ctx = ctx;
  *out = c;
  return MT_OK;
}

static void release(mt__cache *c, int64_t slot) {
  if (c->drop != NULL) c->drop(value_of(c, slot), c->ctx);
  memset(head_of(c, slot), 0, c->stride);
  c->free_slots[c->nfree++] = slot;
  c->count--;
}

void mt__cache_clear(mt__cache *c) {
  for (int64_t s = 0; s < c->allocated; ++s)
    if (head_of(c, s)->used) release(c, s);
  if (c->index != NULL) memset(c->index, 0xff, (size_t)(c->mask + 1) * sizeof *c->index);
  c->hand = 0;
}

void mt__cache_destroy(mt__cache *c) {
  if (c == NULL) return;
  mt__cache_clear(c);
  free(c->records);
  free(c->free_slots);
  free(c->index);
  free(c);
}

void *mt__cache_find(mt__cache *c, const int64_t *key, int64_t *slot) {
  return mt__cache_find_prefix(c, key, c->key_words, slot);
}

void *mt__cache_find_prefix(mt__cache *c, const int64_t *key, int words, int64_t *slot) {
  if (c->count == 0) return NULL;
  int64_t s = c->index[probe_len(c, key, key_len(key, words))];
  if (s < 0) return NULL;
  head_of(c, s)->ref = 1;
  if (slot != NULL) *slot = s;
  return value_of(c, s);
}

int mt__cache_evict_one(mt__cache *c) {
  if (c->count == 0) return 0;
  for (;;) {
    int64_t s = c->hand;
    c->hand = (c->hand + 1) % c->allocated;
    header *h = head_of(c, s);
    if (!h->used) continue;
    if (h->ref) {
      h->ref = 0;
      continue;
    }
    unindex(c, probe(c, key_of(c, s)));
    release(c, s);
    return 1;
  }
}

void *mt__cache_add(mt__cache *c, const int64_t *key, int64_t *slot, mt_error *err) {
  if (c->count >= c->capacity) mt__cache_evict_one(c);
  if (c->nfree == 0) {
    int64_t want = c->allocated < FIRST_SLOTS ? FIRST_SLOTS : 2 * c->allocated;
    if (grow(c, want < c->capacity ? want : c->capacity, err) != MT_OK) return NULL;
  }
  int64_t s = c->free_slots[--c->nfree];
  header *h = head_of(c, s);
  h->used = 1, h->ref = 0, h->words = (uint32_t)key_len(key, c->key_words);
  memcpy(key_of(c, s), key, (size_t)c->key_words * sizeof(int64_t));
  c->index[probe(c, key)] = s;
  c->count++;
  if (slot != NULL) *slot = s;
  return value_of(c, s);
}

void *mt__cache_at(const mt__cache *c, int64_t slot) {
  if (slot < 0 || slot >= c->allocated || !head_of(c, slot)->used) return NULL;
  return value_of(c, slot);
}

const int64_t *mt__cache_key_at(const mt__cache *c, int64_t slot) { return key_of(c, slot); }

int mt__cache_set_capacity(mt__cache *c, int64_t capacity, mt_error *err) {
  if (capacity < 1) return mt__fail(err, MT_EINVAL, "A cache's capacity is at least 1");
  mt__cache_clear(c);
  free(c->records);
  free(c->free_slots);
  free(c->index);
  c->records = NULL, c->free_slots = NULL, c->index = NULL;
  c->allocated = 0, c->nfree = 0, c->mask = 0, c->hand = 0;
  c->capacity = capacity;
  return MT_OK;
}

int64_t mt__cache_count(const mt__cache *c) { return c->count; }

int64_t mt__cache_capacity(const mt__cache *c) { return c->capacity; }
