/* The executor's "ran" event (ext_trace.c), for the debugging tools that trace
 * what each operation ran (mpitensor.debug.DebugMode). */
#ifndef MPITENSOR_EXT_TRACE_H
#define MPITENSOR_EXT_TRACE_H

#include "ext.h"

/* Local. While a debugging tool listens (modes->listeners) and the "ran" hook is
 * installed (mpitensor._trace.record_runs: while a DebugMode is entered), calls
 * it with the op's key, the call's operands (DTensors, scalars), each DTensor
 * operand's placements as the local function got it (`dec`: its plan's target,
 * Partial(sum) where it is partitioned), the local function's positional
 * arguments (`locals`: the operands' local arrays as moved, then the op's
 * positional extra arguments) and the result `out`. 0, or -1 with an exception. */
int mt_ext_ran_event(mt_ext_dispatch *d, const mt_ext_op *op, const mt_ext_call *c,
                     const mt_decision *dec, PyObject *const *ops, PyObject *const *locals,
                     PyObject *out);

#endif
