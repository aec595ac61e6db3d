/* mt_mpi_error (comm-private.h): an MPI return code as a status and a sentence,
 * through which every file of the library reports MPI failures. An MPI call that
 * fails on one rank leaves the others waiting in the collective it belonged to (or
 * in the next one, which this rank will not enter in step), and no exception on
 * this rank can release them: so the failure is also told to every other process
 * (departure.c), whose watchdog then aborts the job, naming this rank and the
 * call, instead of waiting for the timeout. */
#include <stdio.h>
#include <string.h>

#include "comm-private.h"

int mt_mpi_error(mt_error *err, int rc, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    strcpy(text, "unknown MPI error");
  }
  char reason[MPI_MAX_ERROR_STRING + 64];
  snprintf(reason, sizeof reason, "%s failed: %s", what, text);
  mt__departure_tell_failure(reason);
  return mt_error_set(err, MT_EMPI, "%s", reason);
}
