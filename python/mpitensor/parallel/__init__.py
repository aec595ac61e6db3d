"""Tensor parallelism over NumPy modules, as torch.distributed.tensor.parallel.

:func:`parallelize_module` applies parallel styles to an :mod:`mpitensor.nn`
model by a plan dict, the same one written for torch::

    >>> mesh = init_device_mesh("cpu", (4,))
    >>> parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})

Styles: ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput,
PrepareModuleOutput, PrepareModuleInputOutput; ``loss_parallel`` for a
vocabulary-parallel cross entropy; and the 2023 API (PairwiseParallel,
PairwiseSequenceParallel, TensorParallelMultiheadAttention, the make_input_* /
make_output_* helpers in :mod:`mpitensor.parallel.style`, and
:func:`mpitensor.parallel.fsdp.enable_2d_with_fsdp`).
"""

from .style import (
    ColwiseParallel, PairwiseParallel, PairwiseSequenceParallel, ParallelStyle,
    PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput, RowwiseParallel,
    SequenceParallel)
from .api import parallelize_module
from .loss import loss_parallel
from .multihead_attention_tp import TensorParallelMultiheadAttention
from . import fsdp, style

__all__ = [
    "parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel",
    "SequenceParallel", "PrepareModuleInput", "PrepareModuleOutput",
    "PrepareModuleInputOutput", "PairwiseParallel", "PairwiseSequenceParallel",
    "TensorParallelMultiheadAttention", "loss_parallel", "style", "fsdp",
]
