/* Placements as text: the names torch gives them, for error messages. */
#include <stdio.h>

#include "core-private.h"

const char *mt__reduce_name(int op) {
  static const char *const names[MT_REDUCE_COUNT] = {"sum", "avg", "product", "max",
                                                     "min"};
  return op >= 0 && op < MT_REDUCE_COUNT ? names[op] : "?";
}

const char *mt__placement_text(const mt_placement *p, int brief, char *buf,
                               size_t len) {
  if (p->kind == MT_PLACEMENT_SHARD)
    snprintf(buf, len, brief ? "S(%d)" : "Shard(dim=%d)", p->dim);
  else if (p->kind == MT_PLACEMENT_STRIDED)
    snprintf(buf, len, brief ? "_S(%d, %d)" : "_StridedShard(dim=%d, sf=%d)", p->dim,
             p->split_factor);
  else if (p->kind == MT_PLACEMENT_PARTIAL)
    snprintf(buf, len, brief ? "P(%s)" : "Partial(%s)", mt__reduce_name(p->reduce_op));
  else
    snprintf(buf, len, brief ? "R" : "Replicate()");
  return buf;
}
