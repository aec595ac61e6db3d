/* The byte copy behind every box copy, pack and staging move of the library.
 *
 * It is memcpy, except for one case: on AMD CPUs with AVX2, a destination array
 * larger than a core's share of the caches is written with streaming stores. An
 * ordinary store first reads the line it writes into the cache, which for an
 * output that cannot stay there is a second pass over memory for nothing; a
 * smaller output may stay in the cache between uses, and there ordinary stores
 * are the faster ones. Where memcpy itself avoids that read, or where streaming
 * costs more than it saves, the runs go by memcpy too (the thresholds below).
 *
 * Streaming stays only where benchmarks/transport.py measures it at least 1.2
 * times faster than memcpy on the same bytes, on the CPU where it is switched
 * on: other CPUs (Intel's among them, and x86-64 CPUs without AVX2) and other
 * architectures use memcpy throughout until a run there shows the same. */
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/pack.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MT__STREAM_COPY 1
#else
#define MT__STREAM_COPY 0
#endif

/* Destinations from this size on may be streamed: larger than the L2 and than a
 * core's share of the L3 on the CPUs we know. A run of this size or more (a
 * whole block) is streamed at any alignment. */
#define STREAM_MIN ((int64_t)16 << 20)
/* Runs of whole aligned vectors are streamed from LINED_MIN bytes up to
 * LINED_MAX: memcpy's own path for longer aligned runs is about as fast. */
#define LINED_MIN ((int64_t)512)
#define LINED_MAX ((int64_t)4 << 10)
/* Other runs from RUN_MIN up to RUN_MAX: a run that starts or ends inside a line
 * writes that line with ordinary stores as well, which costs more than streaming
 * saves in shorter runs; from RUN_MAX memcpy's own path is about as fast. */
#define RUN_MIN ((int64_t)64 << 10)
#define RUN_MAX ((int64_t)1 << 20)

#if MT__STREAM_COPY
#define AVX2 __attribute__((target("avx2")))

/* Bytes from `d` up to its next 32-byte boundary, at most `n`: streaming stores
 * need an aligned destination, so that head goes by memcpy. */
static int64_t head_of(const char *d, int64_t n) {
  int64_t head = (int64_t)((uintptr_t)32 - (uintptr_t)d % 32) % 32;
  return head < n ? head : n;
}

/* 128 bytes a turn by unaligned loads (rows of a box start anywhere) and
 * streaming stores from an aligned destination; the head and tail by memcpy. */
AVX2 static void stream_avx2(char *d, const char *s, int64_t n) {
  int64_t head = head_of(d, n), i = 0;
  memcpy(d, s, (size_t)head);
  d += head, s += head, n -= head;
  for (; i + 128 <= n; i += 128) {
    __m256i v[4];
    for (int64_t k = 0; k < 4; ++k)
      v[k] = _mm256_loadu_si256((const __m256i *)(const void *)(s + i + 32 * k));
    for (int64_t k = 0; k < 4; ++k)
      _mm256_stream_si256((__m256i *)(void *)(d + i + 32 * k), v[k]);
  }
  memcpy(d + i, s + i, (size_t)(n - i));
}

/* Whether runs of `run` bytes placed `ds` apart from `d` on, into a destination
 * array of `dst_bytes`, are streamed on this CPU. */
static int streams(const char *d, int64_t ds, int64_t run, int64_t dst_bytes) {
  int lined = ((uint64_t)(uintptr_t)d | (uint64_t)ds | (uint64_t)run) % 32 == 0;
  int fits = run >= STREAM_MIN || (lined ? run >= LINED_MIN && run < LINED_MAX
                                         : run >= RUN_MIN && run < RUN_MAX);
  return dst_bytes >= STREAM_MIN && fits && __builtin_cpu_is("amd") &&
         __builtin_cpu_supports("avx2");
}

#endif

void mt__copy_run_stream(char *d, const char *s, int64_t n) {
#if MT__STREAM_COPY
  stream_avx2(d, s, n);
  _mm_sfence();
#else
  memcpy(d, s, (size_t)n);
#endif
}

void mt__copy_runs(char *d, const char *s, int64_t n, int64_t ds, int64_t ss,
                   int64_t run, int64_t dst_bytes) {
#if MT__STREAM_COPY
  if (streams(d, ds, run, dst_bytes)) {
    for (int64_t i = 0; i < n; ++i) stream_avx2(d + i * ds, s + i * ss, run);
    /* Streaming stores are weakly ordered: they must be visible before anything
     * that follows hands the destination to another process. */
    _mm_sfence();
    return;
  }
#else
  (void)dst_bytes;
#endif
  for (int64_t i = 0; i < n; ++i) memcpy(d + i * ds, s + i * ss, (size_t)run);
}

void mt_copy_bytes(void *dst, const void *src, int64_t n) {
  if (n > 0) mt__copy_runs(dst, src, 1, 0, 0, n, n);
}
