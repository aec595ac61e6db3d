/* MPI types and operations for reductions over mpitensor element types. */
#ifndef MPITENSOR_MPI_TYPES_PRIVATE_H
#define MPITENSOR_MPI_TYPES_PRIVATE_H

#include <mpi.h>

#include "mpitensor/status.h"

/* Local. Whether `op` (mt_reduce_op) can reduce `dtype` (mt_dtype): MT_ETYPE for
 * complex max/min and bool avg, so callers can refuse before communicating. */
int mt__reduce_check(int dtype, int op, mt_error *err);

/* Local. The MPI datatype and operation that reduce `dtype` with `op`. float16 and
 * float max/min use user-defined operations (created on first use, freed by
 * MPI_Finalize) so results match NumPy, NaNs included. */
int mt__reduce_type(int dtype, int op, MPI_Datatype *type, MPI_Op *mop, mt_error *err);

#endif
