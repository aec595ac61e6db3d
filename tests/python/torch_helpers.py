"""torch.distributed on gloo beside the MPI job, for the optional comparison tests
(they import torch with pytest.importorskip first)."""

from __future__ import annotations

from mpitensor.testing import init_torch_gloo


def init_gloo():
    """torch.distributed over gloo with one process per MPI rank, initialised once."""
    return init_torch_gloo()
