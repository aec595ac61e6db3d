/* Status codes and the error record every fallible mpitensor call fills in. */
#ifndef MPITENSOR_STATUS_H
#define MPITENSOR_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Each error is named once here; mt_strerror() and mt_status_name() are generated
 * from this list so the three can never disagree. */
#define MT_ERRNO_MAP(X)                                   \
  X(EINVAL, -1, "invalid argument")                       \
  X(EINDEX, -2, "index out of range")                     \
  X(ETYPE, -3, "unsupported type")                        \
  X(ENOMEM, -4, "out of memory")                          \
  X(EMPI, -5, "MPI call failed")                          \
  X(ESTATE, -6, "invalid state")                          \
  X(EOVERFLOW, -7, "size overflow")                       \
  X(ENOTSUP, -8, "not supported")                        \
  X(EIO, -9, "I/O error")                                 \
  X(EFLOAT, -10, "floating-point error")

typedef enum mt_status {
  MT_OK = 0,
#define MT__ERRNO_ENUM(name, value, text) MT_##name = (value),
  MT_ERRNO_MAP(MT__ERRNO_ENUM)
#undef MT__ERRNO_ENUM
} mt_status;

#define MT_ERROR_LEN 512

/* Marks a function that mpitensor._C exports for its ctypes bindings (loaded by
 * mpitensor._clib): the libraries are compiled with hidden visibility, so the
 * extension's dynamic symbols are PyInit__C and exactly the functions marked. */
#if defined(__GNUC__)
#define MT_EXPORT __attribute__((visibility("default")))
#else
#define MT_EXPORT
#endif

/* Filled in by a failing call: the status it returned and a sentence for the user.
 * Callers may pass NULL where they do not want the message. */
typedef struct mt_error {
  int code;
  char msg[MT_ERROR_LEN];
} mt_error;

/* Local. A short description of a status code ("invalid argument"). */
MT_EXPORT const char *mt_strerror(int code);

/* Local. The symbolic name of a status code ("MT_EINVAL"). */
MT_EXPORT const char *mt_status_name(int code);

/* Local. Records `code` and a printf-style message in `err` (which may be NULL)
 * and returns `code`, so that a failure path is one line. How every library built
 * on the core (comm, io, kernels, the extension) reports an error:
 *
 *   if (n < 0) return mt_error_set(err, MT_EINVAL, "n is %d; it must be >= 0", n);
 */
int mt_error_set(mt_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
