/* The copy loops of csrc/core/copy.c, built from that very source into a small
 * library for benchmarks/transport.py, beside the libc copy they stand in for:
 * each entry copies `n` runs of `run` bytes, the i-th from s + i*ss to d + i*ds.
 *
 *   cc -O3 -shared -fPIC -Icsrc/include -Icsrc/core -o build/copy_paths.so \
 *      benchmarks/copy_paths.c
 *
 * (transport.py builds it itself.) */
#include <string.h>

#include "../csrc/core/copy.c"

/* What the library does: mt__copy_runs picks the loop for this CPU and size. */
void bench_library(char *d, const char *s, int64_t n, int64_t ds, int64_t ss, int64_t run,
                   int64_t dst_bytes) {
  mt__copy_runs(d, s, n, ds, ss, run, dst_bytes);
}

/* glibc's memcpy on every run: the path the loops replace. */
void bench_memcpy(char *d, const char *s, int64_t n, int64_t ds, int64_t ss, int64_t run) {
  for (int64_t i = 0; i < n; ++i) memcpy(d + i * ds, s + i * ss, (size_t)run);
}

/* The AVX2 loop forced, whatever the CPU's vendor, with streaming stores or not. */
void bench_loop(char *d, const char *s, int64_t n, int64_t ds, int64_t ss, int64_t run,
                int stream) {
  for (int64_t i = 0; i < n; ++i) mt__copy_run_avx2(d + i * ds, s + i * ss, run, stream);
#if MT__VECTOR_COPY
  if (stream) _mm_sfence();
#endif
}

/* Whether this CPU can run the AVX2 loop (bench_loop). */
int bench_has_avx2(void) {
#if MT__VECTOR_COPY
  return __builtin_cpu_supports("avx2");
#else
  return 0;
#endif
}
