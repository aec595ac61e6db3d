/* Process-wide communication counters: one atomic cell per collective kind, so a
 * CommDebugMode sees every collective of every mesh, and counting costs a few ns. */
#include <stdatomic.h>

#include "comm-private.h"

static atomic_llong calls[MT_COLL_COUNT];
static atomic_llong bytes[MT_COLL_COUNT];

void mt__count(int kind, int64_t nbytes) {
  if (kind < 0 || kind >= MT_COLL_COUNT) return;
  atomic_fetch_add_explicit(&calls[kind], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&bytes[kind], (long long)nbytes, memory_order_relaxed);
}

void mt_comm_counters_get(mt_comm_counters *out) {
  for (int k = 0; k < MT_COLL_COUNT; ++k) {
    out->calls[k] = (int64_t)atomic_load_explicit(&calls[k], memory_order_relaxed);
    out->bytes[k] = (int64_t)atomic_load_explicit(&bytes[k], memory_order_relaxed);
  }
}

const char *mt_coll_name(int coll) {
  switch (coll) {
#define MT__COLL_TEXT(name, text) \
  case MT_COLL_##name:            \
    return text;
    MT_COLL_MAP(MT__COLL_TEXT)
#undef MT__COLL_TEXT
    default:
      return "unknown";
  }
}
