/* mt_mpi_error (comm-private.h): an MPI return code as a status and a sentence,
 * through which every file of the library reports MPI failures; in a file of its
 * own, below every other one. An MPI call that fails on one rank leaves the others
 * waiting in the collective it belonged to (or in the next one, which this rank
 * will not enter in step), and no exception on this rank can release them: the
 * sentence also goes to mt__mpi_failure_hook, by which a listening process tells
 * the others (departure.c), whose watchdog then aborts the job naming this rank
 * and the call, instead of waiting for the timeout. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "comm-private.h"

/* Process-wide, as the listening it serves: set once by departure.c when this
 * process starts listening, read (atomically) by any thread that reports a
 * failure. */
void (*_Atomic mt__mpi_failure_hook)(const char *reason);

int mt_mpi_error(mt_error *err, int rc, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    strcpy(text, "unknown MPI error");
  }
  char reason[MPI_MAX_ERROR_STRING + 64];
  snprintf(reason, sizeof reason, "%s failed: %s", what, text);
  void (*hook)(const char *) = atomic_load(&mt__mpi_failure_hook);
  if (hook != NULL) hook(reason);
  return mt_error_set(err, MT_EMPI, "%s", reason);
}
