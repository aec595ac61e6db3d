/* An index from addresses to small ints, for a caller that keeps records in an
 * array and finds them by an object's address (the extension: the signature of a
 * registered ufunc or reduction by the function's address). Open addressing,
 * kept at most half full, so a lookup of an absent address ends soon. Not
 * thread-safe: the owner serialises calls. */
#ifndef MPITENSOR_PTR_INDEX_H
#define MPITENSOR_PTR_INDEX_H

#include "mpitensor/core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_ptr_index mt_ptr_index;

/* Local. An empty index. MT_ENOMEM. */
int mt_ptr_index_create(mt_ptr_index **out, mt_error *err);

/* Local. Frees the index. Accepts NULL. */
void mt_ptr_index_destroy(mt_ptr_index *ix);

/* Local. The value of `key`, or -1 when the index does not hold it.
 *
 *   int i = mt_ptr_index_find(ix, func);   // -1: not registered
 */
int mt_ptr_index_find(const mt_ptr_index *ix, const void *key);

/* Local. Adds `key` (not NULL) with `value` (>= 0). MT_EINVAL when the index
 * holds `key` already, MT_ENOMEM when it cannot grow; unchanged then. */
int mt_ptr_index_add(mt_ptr_index *ix, const void *key, int value, mt_error *err);

/* Local. Forgets every key. */
void mt_ptr_index_clear(mt_ptr_index *ix);

#ifdef __cplusplus
}
#endif
#endif
