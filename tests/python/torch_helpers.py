"""torch.distributed on gloo beside the MPI job, for the optional comparison tests
(they import torch with pytest.importorskip first)."""

from __future__ import annotations

import os
import socket

from mpi4py import MPI


def init_gloo():
    """torch.distributed over gloo with one process per MPI rank (initialised once
    per process: rank 0 picks a free port and the ranks agree on it through MPI)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        comm = MPI.COMM_WORLD
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
