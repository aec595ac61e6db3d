/* MPI types and operations for reductions over mpitensor element types. */
#ifndef MPITENSOR_MPI_TYPES_PRIVATE_H
#define MPITENSOR_MPI_TYPES_PRIVATE_H

#include <mpi.h>
#include <stdint.h>

#include "mpitensor/core/status.h"

/* Local. The MPI datatype and operation that reduce `dtype` with `op` (what
 * mt_partial_check refuses fails here the same way). float16 and
 * float max/min use user-defined operations (created on first use, freed by
 * MPI_Finalize) so results match NumPy, NaNs included. */
int mt__reduce_type(int dtype, int op, MPI_Datatype *type, MPI_Op *mop, mt_error *err);

/* Local. MPI counts are ints: byte counts and displacements (`n` values) beyond
 * INT_MAX travel in units of the largest block dividing all of them, as one
 * committed contiguous datatype. Sets *type (MPI_BYTE when bytes fit; free any
 * other with MPI_Type_free) and *unit (bytes per unit); MT_EOVERFLOW when even
 * that unit leaves a count above INT_MAX. */
int mt__byte_unit(const int64_t *values, int64_t n, MPI_Datatype *type, int64_t *unit,
                  mt_error *err);

#endif
