/* The pure core of mpitensor (the mpitensor_core library: no MPI, no threads, no
 * files), whose headers are mpitensor/core/. Each other library has its own
 * folder: mpitensor/kernels/ (mpitensor_kernels), mpitensor/comm/
 * (mpitensor_comm: meshes, redistribution, distribute, counters, agreement, ring
 * exchanges, the block pool, direct copies, the watchdog) and mpitensor/io/
 * (mpitensor_io). */
#ifndef MPITENSOR_H
#define MPITENSOR_H

#include "mpitensor/core/dtype.h"
#include "mpitensor/core/lanes.h"
#include "mpitensor/core/layout.h"
#include "mpitensor/core/names.h"
#include "mpitensor/core/pack.h"
#include "mpitensor/core/plan.h"
#include "mpitensor/core/prop.h"
#include "mpitensor/core/reshape.h"
#include "mpitensor/core/rng.h"
#include "mpitensor/core/status.h"
#include "mpitensor/core/strided.h"

#endif
