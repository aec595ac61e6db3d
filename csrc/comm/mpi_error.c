/* mt_mpi_error (comm-private.h): an MPI return code as a status and a sentence. In
 * a file of its own, below every other file of the library, which all report MPI
 * failures through it. */
#include <string.h>

#include "comm-private.h"

int mt_mpi_error(mt_error *err, int rc, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    strcpy(text, "unknown MPI error");
  }
  return mt_error_set(err, MT_EMPI, "%s failed: %s", what, text);
}
