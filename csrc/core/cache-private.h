/* A bounded hash table with CLOCK eviction, private to the core: the layout table
 * and the decision memo are built on it.
 *
 * Keys are fixed-length arrays of int64 words, hashed and compared up to their
 * last nonzero word (so they have no padding, and a short key in long words
 * costs what it holds); values are fixed-size blocks the cache stores. Entries
 * live in numbered slots that stay put until the entry goes; storage grows by
 * doubling up to the capacity, so a cache that holds little costs little. When
 * full, adding evicts one entry by CLOCK (second chance: an entry found since the
 * hand last passed survives one more round). Every value the cache lets go
 * (evicted, cleared, destroyed) is first handed to `drop`.
 *
 * Pointers into the cache are valid until the next add, evict, clear or resize.
 * Not thread-safe: the owner serialises calls. */
#ifndef MPITENSOR_CACHE_PRIVATE_H
#define MPITENSOR_CACHE_PRIVATE_H

#include <stddef.h>
#include <stdint.h>

#include "mpitensor/core/status.h"

typedef struct mt__cache mt__cache;

/* Called with each value the cache lets go, and the cache's `ctx`. */
typedef void (*mt__cache_drop)(void *value, void *ctx);

/* A cache of at most `capacity` (>= 1) entries of `key_words` (>= 1) key words
 * and `value_size` bytes. `drop` may be NULL. */
int mt__cache_create(int key_words, size_t value_size, int64_t capacity,
                     mt__cache_drop drop, void *ctx, mt__cache **out, mt_error *err);

/* Drops every value and frees the cache; accepts NULL. */
void mt__cache_destroy(mt__cache *c);

/* The value of `key`, marked as used, or NULL. Its slot goes to *slot if given. */
void *mt__cache_find(mt__cache *c, const int64_t *key, int64_t *slot);

/* As mt__cache_find for a key given by its first `words` words, the rest being
 * zero (they are not read). */
void *mt__cache_find_prefix(mt__cache *c, const int64_t *key, int words, int64_t *slot);

/* Adds `key`, which must be absent, with a zeroed value, evicting one entry when
 * the cache is full; returns the value (its slot in *slot if given), or NULL when
 * growing the storage fails (MT_ENOMEM in err). */
void *mt__cache_add(mt__cache *c, const int64_t *key, int64_t *slot, mt_error *err);

/* The value in `slot`, or NULL when the slot is free or out of range. */
void *mt__cache_at(const mt__cache *c, int64_t slot);

/* The key in `slot`, which must hold an entry. */
const int64_t *mt__cache_key_at(const mt__cache *c, int64_t slot);

/* Evicts one entry by CLOCK; 0 when the cache is empty, else 1. */
int mt__cache_evict_one(mt__cache *c);

/* Drops every entry. */
void mt__cache_clear(mt__cache *c);

/* Empties the cache and sets its capacity (>= 1). */
int mt__cache_set_capacity(mt__cache *c, int64_t capacity, mt_error *err);

int64_t mt__cache_count(const mt__cache *c);
int64_t mt__cache_capacity(const mt__cache *c);

#endif
