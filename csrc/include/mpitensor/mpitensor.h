/* The pure core of mpitensor (the mpitensor_core library: no MPI, no threads, no
 * files). The other libraries have their own headers: mpitensor/kernels.h
 * (mpitensor_kernels); mpitensor/mesh.h, comm.h, counters.h, agree.h, ring.h,
 * pool.h (mpitensor_comm); mpitensor/io.h (mpitensor_io). */
#ifndef MPITENSOR_H
#define MPITENSOR_H

#include "mpitensor/dtype.h"
#include "mpitensor/layout.h"
#include "mpitensor/pack.h"
#include "mpitensor/plan.h"
#include "mpitensor/prop.h"
#include "mpitensor/rng.h"
#include "mpitensor/status.h"

#endif
