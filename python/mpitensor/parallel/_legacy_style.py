"""The 2023 tensor-parallel API (torch 2.0/2.1), for code written against it:
PairwiseParallel, PairwiseSequenceParallel and the make_input_* / make_output_*
helpers, which are re-exported by :mod:`mpitensor.parallel.style`.

An input helper takes an ndarray (annotated, no communication) or a DTensor
(redistributed); given a tuple of module inputs it uses the first. An output
helper takes a DTensor. ``device_mesh`` defaults to the DTensor's mesh and must
be 1-D.
"""

from __future__ import annotations

import functools

import numpy as np

from .._dtensor import DTensor
from .._distribute import distribute_tensor
from .._distribute_module import distribute_module
from ..nn.attention import MultiheadAttention
from ..nn.linear import Linear
from ..placement_types import Replicate, Shard
from ._parallel_style import ParallelStyle
from ._utils import annotate, validate_tp_mesh_dim
from .multihead_attention_tp import TensorParallelMultiheadAttention


def _input_mesh(x, device_mesh, what):
    if device_mesh is None:
        if not isinstance(x, DTensor):
            raise ValueError(f"{what}: device_mesh is not passed nor can be inferred from "
                             f"an ndarray input")
        device_mesh = x.device_mesh
    validate_tp_mesh_dim(device_mesh)
    return device_mesh


def _prepare_input_validate(func):
    @functools.wraps(func)
    def wrapper(input, device_mesh=None, *args, **kwargs):
        if isinstance(input, (tuple, list)):
            if not input:
                raise ValueError(f"{func.__name__}: no input to prepare")
            input = input[0]
        mesh = _input_mesh(input, device_mesh, func.__name__)
        if not isinstance(input, (DTensor, np.ndarray)):
            raise TypeError(f"{func.__name__}: expecting an ndarray or a DTensor, got "
                            f"{type(input).__name__}")
        return func(input, mesh, *args, **kwargs)
    return wrapper


def _prepare_output_validate(func):
    @functools.wraps(func)
    def wrapper(output, device_mesh=None, *args, **kwargs):
        if not isinstance(output, DTensor):
            raise TypeError(f"{func.__name__}: expecting the output to be a DTensor, got "
                            f"{type(output).__name__}")
        mesh = _input_mesh(output, device_mesh, func.__name__)
        return func(output, mesh, *args, **kwargs)
    return wrapper


def _to_placement(x, mesh, placement):
    if isinstance(x, DTensor):
        return x.redistribute(mesh, [placement])
    return annotate(x, mesh, [placement])


@_prepare_input_validate
def make_input_shard_1d(input, device_mesh=None, dim: int = 0) -> DTensor:
    """The input as a DTensor sharded on ``dim`` of a 1-D mesh: an ndarray is taken
    as this rank's shard (local), a DTensor is redistributed (collective).

    Example::

        >>> make_input_shard_1d(np.ones((2, 4)), mesh, dim=0).shape   # np=2: (4, 4)
    """
    return _to_placement(input, device_mesh, Shard(dim))


@_prepare_input_validate
def make_input_shard_1d_last_dim(input, device_mesh=None) -> DTensor:
    """:func:`make_input_shard_1d` on the input's last dim."""
    return _to_placement(input, device_mesh, Shard(input.ndim - 1))


@_prepare_input_validate
def make_input_replicate_1d(input, device_mesh=None) -> DTensor:
    """The input as a Replicate DTensor: an ndarray is taken as the whole value
    (local), a DTensor is gathered or reduced (collective).

    Example::

        >>> make_input_replicate_1d(np.ones(3), mesh).placements
        (Replicate(),)
    """
    return _to_placement(input, device_mesh, Replicate())


@_prepare_input_validate
def make_input_reshard_replicate(input, device_mesh=None) -> DTensor:
    """An ndarray taken as this rank's shard on dim 0, then made Replicate (one
    all-gather): the input side of sequence parallelism."""
    return make_input_replicate_1d(make_input_shard_1d(input, device_mesh, 0), device_mesh)


@_prepare_output_validate
def make_output_shard_1d(output, device_mesh=None, dim: int = 0) -> DTensor:
    """The output DTensor redistributed to ``Shard(dim)`` (a Partial output: one
    reduce-scatter)."""
    return output.redistribute(device_mesh, [Shard(dim)])


@_prepare_output_validate
def make_output_replicate_1d(output, device_mesh=None) -> DTensor:
    """The output DTensor made Replicate (a Partial output: one all-reduce)."""
    return output.redistribute(device_mesh, [Replicate()])


@_prepare_output_validate
def make_output_tensor(output, device_mesh=None) -> np.ndarray:
    """The output made Replicate, as a plain ndarray (the whole value on every rank)."""
    return make_output_replicate_1d(output, device_mesh).to_local()


@_prepare_output_validate
def make_sharded_output_tensor(output, device_mesh=None) -> np.ndarray:
    """This rank's local array of the output DTensor, as it is (no communication)."""
    return output.to_local()


@_prepare_output_validate
def make_output_reshard_tensor(output, device_mesh=None) -> np.ndarray:
    """The output redistributed to ``Shard(0)``, as this rank's local ndarray (one
    reduce-scatter for a Partial output): the output side of sequence parallelism."""
    return make_output_shard_1d(output, device_mesh, 0).to_local()


def _as_hook(helper):
    """A make_* helper as distribute_module's three-argument input_fn/output_fn."""
    return lambda module, values, mesh: helper(values, mesh)


def _colwise_partition(src_data_rank):
    def partition(name, module, mesh):
        if isinstance(module, Linear):
            for pname, p in list(module.named_parameters(recurse=False)):
                module.register_parameter(pname, distribute_tensor(
                    p, mesh, [Shard(0)], src_data_rank=src_data_rank))
    return partition


def _rowwise_partition(src_data_rank):
    def partition(name, module, mesh):
        if isinstance(module, Linear):
            for pname, p in list(module.named_parameters(recurse=False)):
                pl = Shard(1) if pname == "weight" else Replicate()
                module.register_parameter(pname, distribute_tensor(
                    p, mesh, [pl], src_data_rank=src_data_rank))
    return partition


class PairwiseParallel(ParallelStyle):
    """Megatron's column-then-row pairing, the 2023 style (torch 2.0).

    On a module whose Linear children come in an even number (an MLP), the 1st,
    3rd, ... are sharded column-wise and the 2nd, 4th, ... row-wise; on a
    :class:`~mpitensor.nn.MultiheadAttention` (replaced by a
    :class:`~mpitensor.parallel.TensorParallelMultiheadAttention`) the q/k/v
    projections are column-wise and the output projection row-wise; on anything
    else it applies to each child. The first sharded module's input goes through
    ``_prepare_input`` (default :func:`make_input_replicate_1d`) and the last one's
    output through ``_prepare_output`` (default :func:`make_output_tensor`): one
    all-reduce per pair.

    Constructing a style is local; :func:`parallelize_module` applying it is
    collective on the mesh, and so is the forward where it redistributes.

    Example::

        >>> mlp = parallelize_module(mlp, mesh, PairwiseParallel())
    """

    def __init__(self, _prepare_input=None, _prepare_output=None):
        self._prepare_input = _prepare_input or make_input_replicate_1d
        self._prepare_output = _prepare_output or make_output_tensor

    def _apply(self, module, device_mesh):
        if isinstance(module, MultiheadAttention):
            if not isinstance(module, TensorParallelMultiheadAttention):
                module = TensorParallelMultiheadAttention.from_module(module)
            return self._parallelize_attention(module, device_mesh)
        linears = [m for m in module.children() if isinstance(m, Linear)]
        if linears and len(linears) % 2 == 0:
            return self._parallelize_mlp(module, linears, device_mesh)
        for name, child in list(module.named_children()):
            module.register_module(name, self._apply(child, device_mesh))
        return module

    def _parallelize_mlp(self, module, linears, mesh):
        col, row = _colwise_partition(self.src_data_rank), _rowwise_partition(
            self.src_data_rank)
        for i, lin in enumerate(linears):
            if i % 2 == 0:
                distribute_module(lin, mesh, col,
                                  input_fn=_as_hook(self._prepare_input) if i == 0 else None)
            else:
                last = i == len(linears) - 1
                distribute_module(lin, mesh, row,
                                  output_fn=_as_hook(self._prepare_output) if last else None)
        return module

    def _parallelize_attention(self, module, mesh):
        col, row = _colwise_partition(self.src_data_rank), _rowwise_partition(
            self.src_data_rank)
        names = ["qkv_proj"] if module.fused_qkv else ["q_proj", "k_proj", "v_proj"]
        for name in names:
            distribute_module(getattr(module, name), mesh, col)
        distribute_module(module.out_proj, mesh, row)
        module.register_forward_pre_hook(
            lambda mod, inputs: tuple(self._prepare_input(x, mesh)
                                      if isinstance(x, (np.ndarray, DTensor)) else x
                                      for x in inputs))
        module.register_forward_hook(
            lambda mod, inputs, output: self._prepare_output(output, mesh))
        return module

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(_prepare_input={self._prepare_input.__name__}, "
                f"_prepare_output={self._prepare_output.__name__})")


class PairwiseSequenceParallel(PairwiseParallel):
    """:class:`PairwiseParallel` with sequence parallelism on its ends (torch 2.0's
    PairwiseSequenceParallel): the input is this rank's shard on dim 0 and is
    all-gathered (:func:`make_input_reshard_replicate`); the output is
    reduce-scattered back to shards on dim 0 (:func:`make_output_reshard_tensor`)
    instead of all-reduced.

    Constructing a style is local; :func:`parallelize_module` applying it is
    collective on the mesh, and so is the forward where it redistributes.

    Example::

        >>> mlp = parallelize_module(mlp, mesh, PairwiseSequenceParallel())
    """

    def __init__(self):
        super().__init__(make_input_reshard_replicate, make_output_reshard_tensor)
