/* The C call path's two inline steps, for the entry points that take it
 * (ext_dispatch.c, ext_decision.c): gather the operands, then find the decision
 * in the memo or make it (ext_decide.c). Apart from ext.h so that ext_decide.c,
 * which defines what they fall back to, does not include them. */
#ifndef MPITENSOR_EXT_CALL_H
#define MPITENSOR_EXT_CALL_H

#include "ext.h"

/* mt_ext_call_gather(strict) of 1 to MT_MEMO_MAX_OPERANDS operands, inline for
 * the common call: DTensors that all have a layout id. */
static inline int mt_ext_call_gather_c(mt_ext_dispatch *d, PyObject *const *ops, int n,
                                       mt_ext_call *c) {
  c->mb = NULL, c->ntensors = 0, c->tensors = 0;
  c->key.op = 0, c->key.aux = 0;
  c->key.noperands = c->noperands = n;
  for (int i = 0; i < n; ++i)
    if (!mt_ext_known_tensor(d, ops[i], i, c)) return mt_ext_call_gather(d, ops, n, 1, c);
  return c->ntensors > 0;
}

/* The decision for the call: the memo's (*hit = 1), else mt_ext_call_miss's. */
static inline mt_decision *mt_ext_call_decide(mt_ext_dispatch *d, mt_ext_sig *sig,
                                              const mt_ext_call *c, uint32_t axes,
                                              int keepdims, int *hit) {
  mt_decision *dec = mt_memo_find(c->mb->memo, &c->key);
  *hit = dec != NULL;
  return dec != NULL ? dec : mt_ext_call_miss(d, sig, c, axes, keepdims);
}

#endif
