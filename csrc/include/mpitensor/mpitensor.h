/* The MPI-free part of the mpitensor core. Include mpitensor/mesh.h for meshes. */
#ifndef MPITENSOR_H
#define MPITENSOR_H

#include "mpitensor/dtype.h"
#include "mpitensor/kernels.h"
#include "mpitensor/layout.h"
#include "mpitensor/pack.h"
#include "mpitensor/plan.h"
#include "mpitensor/pool.h"
#include "mpitensor/prop.h"
#include "mpitensor/rng.h"
#include "mpitensor/status.h"

#endif
