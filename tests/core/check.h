/* A minimal test harness: CHECK records a failure with its location and goes on,
 * so one run reports every broken case; main returns mt_test_exit(). */
#ifndef MPITENSOR_TEST_CHECK_H
#define MPITENSOR_TEST_CHECK_H

#include <stdio.h>

static int mt_test_failures = 0;
static long mt_test_checks = 0;

#define CHECK(cond)                                                         \
  do {                                                                      \
    ++mt_test_checks;                                                       \
    if (!(cond)) {                                                          \
      ++mt_test_failures;                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                       \
  } while (0)

#define CHECK_MSG(cond, ...)                                                \
  do {                                                                      \
    ++mt_test_checks;                                                       \
    if (!(cond)) {                                                          \
      ++mt_test_failures;                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                         \
      fputc('\n', stderr);                                                  \
    }                                                                       \
  } while (0)

static inline int mt_test_exit(const char *name) {
  printf("%s: %ld checks, %d failed\n", name, mt_test_checks, mt_test_failures);
  return mt_test_failures == 0 ? 0 : 1;
}

#endif
