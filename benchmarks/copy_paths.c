/* The copy of csrc/core/copy.c, built from that very source into a small library
 * for benchmarks/transport.py, beside the libc copy it stands in for: each entry
 * copies `n` runs of `run` bytes, the i-th from s + i*ss to d + i*ds.
 *
 *   cc -O3 -shared -fPIC -Icsrc/include -Icsrc/core -o build/copy_paths.so \
 *      benchmarks/copy_paths.c
 *
 * (transport.py builds it itself.) */
#include <string.h>

#include "../csrc/core/copy.c"

/* What the library does: mt__copy_runs picks the copy for this CPU and size. */
void bench_library(char *d, const char *s, int64_t n, int64_t ds, int64_t ss, int64_t run,
                   int64_t dst_bytes) {
  mt__copy_runs(d, s, n, ds, ss, run, dst_bytes);
}

/* glibc's memcpy on every run: the path the streaming stores replace. */
void bench_memcpy(char *d, const char *s, int64_t n, int64_t ds, int64_t ss, int64_t run) {
  for (int64_t i = 0; i < n; ++i) memcpy(d + i * ds, s + i * ss, (size_t)run);
}

/* Whether mt__copy_runs streams these runs on this CPU. */
int bench_streams(const char *d, int64_t ds, int64_t run, int64_t dst_bytes) {
#if MT__STREAM_COPY
  return streams(d, ds, run, dst_bytes);
#else
  (void)d, (void)ds, (void)run, (void)dst_bytes;
  return 0;
#endif
}
