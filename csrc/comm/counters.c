/* Communication counters (counters.h): atomic cells in a struct the caller owns, so
 * counting costs a few ns and keeps no state in the library. */
#include "mpitensor/comm/counters.h"

void mt_comm_count(mt_comm_counters *counters, int coll, int64_t nbytes) {
  if (counters == NULL || coll < 0 || coll >= MT_COLL_COUNT) return;
  atomic_fetch_add_explicit(&counters->calls[coll], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&counters->bytes[coll], nbytes, memory_order_relaxed);
}

void mt_comm_counters_read(const mt_comm_counters *counters, mt_comm_totals *out) {
  for (int k = 0; k < MT_COLL_COUNT; ++k) {
    out->calls[k] = counters == NULL ? 0
                                     : atomic_load_explicit(&counters->calls[k],
                                                            memory_order_relaxed);
    out->bytes[k] = counters == NULL ? 0
                                     : atomic_load_explicit(&counters->bytes[k],
                                                            memory_order_relaxed);
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
