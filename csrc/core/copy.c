/* The byte copy behind every box copy, pack and staging move of the library.
 *
 * glibc's memcpy moves blocks from about 4 KiB up to the size of the L2 cache
 * with the string instruction (`rep movsb`). On AMD Zen cores that instruction
 * runs several times slower than plain vector moves whenever the destination
 * sits at an unlucky distance from the source, which the rows of a strided box
 * hit all the time: an all-gather along an inner dim, an all-to-all's pack and
 * unpack, the chunk a rank keeps. On AMD CPUs with AVX2, copies of runs in that
 * range therefore go through an unrolled loop of 32-byte loads and stores here,
 * as fast as the string instruction where that is fast. Shorter runs keep
 * memcpy's own vector paths, which are as fast as the loop there.
 *
 * On the same CPUs a destination array larger than a core's caches is written
 * with streaming stores: an ordinary store first reads the line it writes into
 * the cache, which for an output that cannot stay there is a second pass over
 * memory for nothing.
 *
 * Each of these stays only where benchmarks/transport.py measures it at least
 * 1.2 times faster than memcpy on the same bytes: other CPUs (Intel's among
 * them, and x86-64 CPUs without AVX2) and other architectures use memcpy
 * throughout until a run there shows the same. */
#include <stdint.h>
#include <string.h>

#include "core-private.h"
#include "mpitensor/core/pack.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MT__VECTOR_COPY 1
#else
#define MT__VECTOR_COPY 0
#endif

/* Below this, memcpy's vector paths are the fastest there are; from here up to
 * the L2 size, glibc takes the string instruction. */
#define VECTOR_MIN ((int64_t)4 << 10)
/* Destinations from this size on are streamed (larger than the L2 and than a
 * core's share of the L3 on the CPUs we know), in runs of at least STREAM_RUN
 * bytes, or of STREAM_RUN_LINED when every run is whole aligned vectors: a run
 * that starts or ends inside a line writes that line with ordinary stores as
 * well, which costs more than streaming saves unless the run is long. */
#define STREAM_MIN ((int64_t)4 << 20)
#define STREAM_RUN ((int64_t)4 << 10)
#define STREAM_RUN_LINED ((int64_t)512)

#if MT__VECTOR_COPY
#define AVX2 __attribute__((target("avx2")))

/* Bytes from `d` up to its next `align`-byte boundary, at most `n`: streaming
 * stores need an aligned destination, so that head goes by memcpy. */
static int64_t head_of(const char *d, int64_t align, int64_t n) {
  int64_t head = (int64_t)((uintptr_t)align - (uintptr_t)d % (uintptr_t)align) % align;
  return head < n ? head : n;
}

/* 128 bytes a turn, the rest by memcpy; unaligned loads and stores, since rows
 * of a box start anywhere, or streaming stores from an aligned destination. */
AVX2 static void copy_avx2(char *d, const char *s, int64_t n, int stream) {
  int64_t head = stream ? head_of(d, 32, n) : 0, i = 0;
  memcpy(d, s, (size_t)head);
  d += head, s += head, n -= head;
  for (; i + 128 <= n; i += 128) {
    __m256i v[4];
    for (int64_t k = 0; k < 4; ++k)
      v[k] = _mm256_loadu_si256((const __m256i *)(const void *)(s + i + 32 * k));
    for (int64_t k = 0; k < 4; ++k) {
      if (stream)
        _mm256_stream_si256((__m256i *)(void *)(d + i + 32 * k), v[k]);
      else
        _mm256_storeu_si256((__m256i *)(void *)(d + i + 32 * k), v[k]);
    }
  }
  memcpy(d + i, s + i, (size_t)(n - i));
}

#endif

void mt__copy_run_avx2(char *d, const char *s, int64_t n, int stream) {
#if MT__VECTOR_COPY
  copy_avx2(d, s, n, stream);
#else
  (void)stream;
  memcpy(d, s, (size_t)n);
#endif
}

void mt__copy_runs(char *d, const char *s, int64_t n, int64_t ds, int64_t ss,
                   int64_t run, int64_t dst_bytes) {
#if MT__VECTOR_COPY
  int lined = ((uint64_t)(uintptr_t)d | (uint64_t)ds | (uint64_t)run) % 32 == 0;
  int stream = dst_bytes >= STREAM_MIN &&
               (run >= STREAM_RUN || (lined && run >= STREAM_RUN_LINED));
  if ((stream || run >= VECTOR_MIN) && __builtin_cpu_is("amd") &&
      __builtin_cpu_supports("avx2")) {
    for (int64_t i = 0; i < n; ++i) copy_avx2(d + i * ds, s + i * ss, run, stream);
    /* Streaming stores are weakly ordered: they must be visible before anything
     * that follows hands the destination to another process. */
    if (stream) _mm_sfence();
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
