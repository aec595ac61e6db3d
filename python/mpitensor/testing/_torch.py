"""torch.distributed on gloo beside the MPI job, for programs that compare their
DTensors with torch's side by side (torch is imported only here, when called)."""

from __future__ import annotations

import os
import socket

__all__ = ["init_torch_gloo"]


def init_torch_gloo(comm=None):
    """Initialise ``torch.distributed`` (gloo, ``env://``) with one process per MPI
    rank of ``comm`` (default: ``MPI.COMM_WORLD``) and return ``torch.distributed``.
    Collective on ``comm`` the first time; later calls return at once. Rank 0
    picks a free loopback port and the ranks agree on it through MPI, so nothing
    needs to be set in the environment. torch runs one thread per rank, as NumPy
    does with ``OPENBLAS_NUM_THREADS=1``.

    Example (``mpiexec -n 2``, torch installed)::

        >>> from mpitensor.testing import init_torch_gloo
        >>> dist = init_torch_gloo()
        >>> dist.get_world_size()
        2
    """
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    if dist.is_initialized():
        return dist
    comm = MPI.COMM_WORLD if comm is None else comm
    port = None
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(comm.rank), WORLD_SIZE=str(comm.size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    return dist
