/* The address index: values found by address, absent addresses missed, duplicates
 * and bad input refused, growth that keeps every entry, and clearing. */
#include <stdint.h>

#include "check.h"
#include "mpitensor/core/ptr_index.h"

static char objects[4096][16];

int main(void) {
  mt_ptr_index *ix = NULL;
  mt_error err = {0};
  CHECK(mt_ptr_index_create(&ix, &err) == MT_OK);
  CHECK(mt_ptr_index_find(ix, objects[0]) == -1);
  /* Many more than the first table holds, so it grows several times. */
  for (int i = 0; i < 1000; ++i) CHECK(mt_ptr_index_add(ix, objects[3 * i], i, &err) == MT_OK);
  int found = 1;
  for (int i = 0; i < 1000; ++i) {
    found &= mt_ptr_index_find(ix, objects[3 * i]) == i;
    found &= mt_ptr_index_find(ix, objects[3 * i + 1]) == -1;
  }
  CHECK(found);
  CHECK(mt_ptr_index_add(ix, objects[3], 7, &err) == MT_EINVAL && err.msg[0] != '\0');
  CHECK(mt_ptr_index_find(ix, objects[3]) == 1);
  CHECK(mt_ptr_index_add(ix, NULL, 1, NULL) == MT_EINVAL);
  CHECK(mt_ptr_index_add(ix, objects[1], -1, NULL) == MT_EINVAL);
  mt_ptr_index_clear(ix);
  CHECK(mt_ptr_index_find(ix, objects[3]) == -1);
  CHECK(mt_ptr_index_add(ix, objects[3], 5, NULL) == MT_OK && mt_ptr_index_find(ix, objects[3]) == 5);
  mt_ptr_index_destroy(ix);
  mt_ptr_index_destroy(NULL);
  return mt_test_exit("test_ptr_index");
}
