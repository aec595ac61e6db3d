"""torch.distributed on gloo beside the MPI job, for programs that compare their
DTensors with torch's side by side (torch is imported only here, when called)."""

from __future__ import annotations

import os
import socket
import subprocess

__all__ = ["init_torch_gloo"]


def _host_address() -> str:
    """This host's first address other hosts can reach (not a loopback one)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                             timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    for a in out:
        if not a.startswith("127.") and ":" not in a:
            return a
    return socket.gethostbyname(socket.gethostname())


def _interface_of(address: str) -> str | None:
    """The name of the network interface that holds ``address``, or None."""
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[3].split("/")[0] == address:
            return parts[1]
    return None


def init_torch_gloo(comm=None):
    """Initialise ``torch.distributed`` (gloo, ``env://``) with one process per MPI
    rank of ``comm`` (default: ``MPI.COMM_WORLD``) and return ``torch.distributed``.
    Collective on ``comm`` the first time; later calls return at once. Rank 0
    picks a free port and the ranks agree on it through MPI, so nothing needs to
    be set in the environment: on the loopback when every rank runs on rank 0's
    host, else on rank 0's first address that ``hostname -I`` lists (gloo's
    rendezvous then crosses the hosts as MPI's TCP does). torch runs one thread per rank, as NumPy
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
    one_host = len(set(comm.allgather(MPI.Get_processor_name()))) == 1
    addr = port = None
    if comm.rank == 0:
        addr = "127.0.0.1" if one_host else _host_address()
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
    addr, port = comm.bcast((addr, port))
    if not one_host and "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo advertises the address its host name resolves to, often a loopback
        # one: name the interface that other hosts reach instead.
        ifname = _interface_of(_host_address())
        if ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = ifname
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port),
                      RANK=str(comm.rank), WORLD_SIZE=str(comm.size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    return dist
