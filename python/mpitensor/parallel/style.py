"""Parallel styles: how parallelize_module shards one module, as in
torch.distributed.tensor.parallel.style.

Every style is applied through :func:`mpitensor.distribute_module` or forward
hooks: parameters become DTensors once, and at each call the inputs are
annotated with their layout (``input_layouts``: what the caller's arrays are)
and redistributed to what the computation needs; outputs are redistributed to
``output_layouts`` and, with ``use_local_output``, handed back as local arrays.

The 2023 API (PairwiseParallel, PairwiseSequenceParallel and the make_input_* /
make_output_* helpers, from _legacy_style) is re-exported here, where code written
for torch 2.0 looks for it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from .. import _comm
from .._bind import core
from .._args import normalize_placements
from .._dtensor import DTensor
from .._distribute import distribute_tensor
from .._distribute_module import distribute_module
from .._dtensor_spec import contiguous_strides
from .._fingerprint import fingerprint
from ..nn.embedding import Embedding
from ..nn.linear import Linear
from ..placement_types import Placement, Replicate, Shard
from ._legacy_style import (
    PairwiseParallel, PairwiseSequenceParallel, make_input_replicate_1d,
    make_input_reshard_replicate, make_input_shard_1d, make_input_shard_1d_last_dim,
    make_output_replicate_1d, make_output_reshard_tensor, make_output_shard_1d,
    make_output_tensor, make_sharded_output_tensor)
from ._parallel_style import ParallelStyle
from ._utils import annotate, check_placement, is_local, is_local_array, layouts

__all__ = [
    "ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
    "PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput",
    "PairwiseParallel", "PairwiseSequenceParallel",
    "make_input_replicate_1d", "make_input_reshard_replicate", "make_input_shard_1d",
    "make_input_shard_1d_last_dim", "make_output_replicate_1d",
    "make_output_reshard_tensor", "make_output_shard_1d", "make_output_tensor",
    "make_sharded_output_tensor",
]


def _local_to_dtensor(local, mesh, placements, mod=None):
    """An input array annotated with ``placements``. A local array sharded on its
    last dim that feeds a Linear gets its global width from ``in_features``; other
    sharded inputs are even shards, as in torch (see annotate)."""
    if not is_local_array(local):
        raise TypeError(f"expecting the input of {type(mod).__name__} to be an ndarray or "
                        f"a DTensor, got {type(local).__name__}")
    (p,) = placements
    if (isinstance(mod, Linear) and local.ndim > 0 and p.is_shard()
            and p.dim in (-1, local.ndim - 1)):
        shape = local.shape[:-1] + (mod.in_features,)
        _agree_linear_input(local, mesh, mod.in_features)
        return DTensor.from_local(local, mesh, placements, shape=shape,
                                  stride=contiguous_strides(shape))
    return annotate(local, mesh, placements, f"input of {type(mod).__name__}")


def _agree_linear_input(local, mesh, features: int) -> None:
    """The ranks agree that each local input is its shard of ``in_features`` wide and
    that all have the same leading dims and dtype: one agreement (an all-reduce of
    three integers), before the matmul. Collective on the mesh when it has several
    ranks.

    Without it a rank of another width fails in its own matmul while the others
    wait in the output's reduction (Partial to Replicate or Shard), and other
    leading dims or dtype on one rank make that reduction's counts or types differ
    between ranks. The reduction is the forward's only collective and comes after
    the matmul, with a count set by the leading dims, so the verdict cannot ride in
    it. Torch runs no check here.
    """
    coord = mesh.get_coordinate()
    if coord is None or mesh.size(0) == 1:
        return
    want = core.chunk_sizes(features, mesh.size(0))[coord[0]]
    width = local.shape[-1]
    lead = tuple(local.shape[:-1])
    _comm.agree(mesh, width == want, fingerprint((np.dtype(local.dtype).str, lead)),
             f"the input of Linear has {width} features on rank {mesh.get_rank()}, where "
             f"its shard of in_features={features} over {mesh.size(0)} ranks has {want}"
             if width != want else
             f"the local inputs of Linear differ in their leading dims or dtype across the "
             f"ranks of the mesh ({lead}, {np.dtype(local.dtype)} on rank "
             f"{mesh.get_rank()}): the output's reduction needs the same on every rank",
             ValueError)


def _prepare_linear_like_input(input_layouts, desired_input_layouts, mod, inputs, mesh):
    if not inputs:
        raise ValueError(f"{type(mod).__name__} was called without inputs")
    x = inputs[0]
    if not isinstance(x, DTensor) or is_local(x):
        x = _local_to_dtensor(x, mesh, input_layouts, mod)
    if input_layouts != desired_input_layouts:
        x = x.redistribute(placements=desired_input_layouts)
    return (x,) + tuple(inputs[1:])


def _prepare_linear_like_output(output_layouts, use_local_output, mod, outputs, mesh):
    # Compared with the shard dims counted from the front, as the output's own are:
    # ColwiseParallel's default Shard(-1) is where its output already is, and an
    # explicit redistribute there would still agree over the mesh (a collective
    # that torch's no-op redistribute does not make).
    wanted = normalize_placements(output_layouts, outputs.device_mesh, outputs.ndim)
    if outputs.placements != wanted:
        outputs = outputs.redistribute(placements=output_layouts)
    return outputs.to_local() if use_local_output else outputs


def _layouts_repr(style) -> str:
    return (f"{type(style).__name__}(input_layouts={style.input_layouts}, "
            f"output_layouts={style.output_layouts}, "
            f"use_local_output={style.use_local_output})")


def _distribute_params(module, mesh, placement_of, src_data_rank):
    for name, param in list(module.named_parameters(recurse=False)):
        module.register_parameter(name, distribute_tensor(
            param, mesh, [placement_of(name)], src_data_rank=src_data_rank))


class ColwiseParallel(ParallelStyle):
    """Shard a Linear or Embedding column-wise, as torch's ColwiseParallel.

    Linear: weight and bias ``Shard(0)`` (output features); Embedding: weight
    ``Shard(1)``. The input is annotated with ``input_layouts`` (default
    Replicate) and made Replicate; the output, sharded on its last dim, is
    redistributed to ``output_layouts`` (default ``Shard(-1)``) and returned as a
    local array when ``use_local_output`` (default True). With the defaults the
    forward needs no communication.

    Example (``mpiexec -n 2``)::

        >>> parallelize_module(mlp, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    """

    def __init__(self, *, input_layouts: Placement | None = None,
                 output_layouts: Placement | None = None, use_local_output: bool = True):
        super().__init__()
        self.input_layouts = (check_placement(input_layouts, "input_layouts") or Replicate(),)
        self.output_layouts = (check_placement(output_layouts, "output_layouts") or Shard(-1),)
        self.desired_input_layouts = (Replicate(),)
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        if isinstance(module, Linear):
            dim = 0
        elif isinstance(module, Embedding):
            dim = 1
        else:
            raise NotImplementedError("ColwiseParallel currently only support nn.Linear and "
                                      f"nn.Embedding! (got {type(module).__name__})")

        return _apply_linear_like(self, module, device_mesh, lambda _: Shard(dim))

    def __repr__(self) -> str:
        return _layouts_repr(self)


def _apply_linear_like(style, module, device_mesh, placement_of):
    """Colwise/Rowwise: ``module``'s parameters placed by ``placement_of(name)``, the
    input and output hooks of the style's layouts. Collective on the mesh."""
    def partition(name, mod, mesh):
        if mod is module:
            _distribute_params(mod, mesh, placement_of, style.src_data_rank)

    return distribute_module(
        module, device_mesh, partition,
        partial(_prepare_linear_like_input, style.input_layouts,
                style.desired_input_layouts),
        partial(_prepare_linear_like_output, style.output_layouts, style.use_local_output))


class RowwiseParallel(ParallelStyle):
    """Shard a Linear or Embedding row-wise, as torch's RowwiseParallel.

    Linear: weight ``Shard(1)`` (input features), bias Replicate; the input is
    annotated with ``input_layouts`` (default ``Shard(-1)``) and must end sharded
    on its last dim. Embedding: weight ``Shard(0)`` (the vocabulary), input made
    Replicate; each rank looks up the indices in its rows and zeroes the others.
    Either way the output is Partial(sum) and is redistributed to
    ``output_layouts``: Replicate (default) is one all-reduce, a Shard one
    reduce-scatter.

    Constructing a style is local; :func:`parallelize_module` applying it is
    collective on the mesh, and so is the forward where it redistributes.

    Example (``mpiexec -n 2``)::

        >>> parallelize_module(model, mesh, {"tok_embeddings": RowwiseParallel(
        ...     input_layouts=Replicate(), output_layouts=Shard(1))})
    """

    def __init__(self, *, input_layouts: Placement | None = None,
                 output_layouts: Placement | None = None, use_local_output: bool = True):
        super().__init__()
        self.input_layouts = (check_placement(input_layouts, "input_layouts") or Shard(-1),)
        self.output_layouts = (check_placement(output_layouts, "output_layouts")
                               or Replicate(),)
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        if isinstance(module, Linear):
            self.desired_input_layouts = (Shard(-1),)

            def placement_of(name):
                return Shard(1) if name == "weight" else Replicate()
        elif isinstance(module, Embedding):
            self.desired_input_layouts = (Replicate(),)

            def placement_of(name):
                return Shard(0)
        else:
            raise NotImplementedError("RowwiseParallel currently only support nn.Linear and "
                                      f"nn.Embedding! (got {type(module).__name__})")

        return _apply_linear_like(self, module, device_mesh, placement_of)

    def __repr__(self) -> str:
        return _layouts_repr(self)


class SequenceParallel(ParallelStyle):
    """Replicate a module's parameters and run it on inputs sharded on the sequence
    dim (LayerNorm, RMSNorm, Dropout and other per-token modules), as torch's
    SequenceParallel (Korthikanti et al., 2022).

    A local input is taken as an even shard on ``sequence_dim`` (default 1), as in
    torch, with no communication (``MPITENSOR_CHECK=1`` checks the sizes agree); pass
    a DTensor for uneven sequence shards. A DTensor input with other placements is
    redistributed to ``Shard(sequence_dim)``.
    The output stays a DTensor unless ``use_local_output``. Parameters are wrapped
    as Replicate without communication: like torch, this assumes every rank holds
    the same values (the ones/zeros a norm starts with).

    Example::

        >>> parallelize_module(block, mesh, {"attention_norm": SequenceParallel()})
    """

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False):
        super().__init__()
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = use_local_output

    @staticmethod
    def _replicate_module_fn(name, module, mesh):
        for p_name, param in list(module.named_parameters(recurse=False)):
            if not isinstance(param, DTensor):
                module.register_parameter(
                    p_name, DTensor.from_local(param, mesh, [Replicate()], run_check=False))

    @staticmethod
    def _prepare_input_fn(sequence_sharding, mod, inputs, mesh):
        x = inputs[0] if inputs else None
        if isinstance(x, DTensor) and not is_local(x):
            if x.placements != sequence_sharding:
                x = x.redistribute(placements=sequence_sharding)
        elif is_local_array(x):
            x = annotate(x, mesh, sequence_sharding, f"input of {type(mod).__name__}")
        else:
            raise ValueError(f"expecting input of {type(mod).__name__} to be an ndarray or "
                             f"DTensor, but got {type(x).__name__}")
        return (x,) + tuple(inputs[1:])

    @staticmethod
    def _prepare_output_fn(use_local_output, mod, outputs, mesh):
        return outputs.to_local() if use_local_output else outputs

    def _apply(self, module, device_mesh):
        return distribute_module(
            module, device_mesh, self._replicate_module_fn,
            partial(self._prepare_input_fn, self.sequence_sharding),
            partial(self._prepare_output_fn, self.use_local_output))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(sequence_dim={self.sequence_sharding[0].dim}, "
                f"use_local_output={self.use_local_output})")


class PrepareModuleInput(ParallelStyle):
    """Annotate a module's inputs with ``input_layouts`` and redistribute them to
    ``desired_input_layouts`` at each call (a forward pre-hook), as torch's
    PrepareModuleInput. ``None`` entries leave an input untouched; keyword inputs
    use ``input_kwarg_layouts`` / ``desired_input_kwarg_layouts``. Inputs stay
    DTensors unless ``use_local_output``. Parameters are not touched.

    Constructing a style is local; :func:`parallelize_module` applying it is
    collective on the mesh, and so is the forward where it redistributes.

    Example::

        >>> parallelize_module(block, mesh, {"attention": PrepareModuleInput(
        ...     input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))})
    """

    def __init__(self, *, input_layouts=None, desired_input_layouts=None,
                 input_kwarg_layouts: dict | None = None,
                 desired_input_kwarg_layouts: dict | None = None,
                 use_local_output: bool = False):
        self.input_layouts = layouts(input_layouts, "input_layouts")
        self.desired_input_layouts = layouts(desired_input_layouts, "desired_input_layouts")
        self.use_local_output = use_local_output
        if self.input_layouts is not None:
            if self.desired_input_layouts is None:
                raise ValueError("desired module inputs should not be None!")
            if len(self.input_layouts) != len(self.desired_input_layouts):
                raise ValueError("input_layouts and desired_input_layouts should have same "
                                 "length!")
        self.with_kwargs = input_kwarg_layouts is not None
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        if self.with_kwargs and len(self.input_kwarg_layouts) != len(
                self.desired_input_kwarg_layouts):
            raise ValueError("input_kwarg_layouts and desired_input_kwarg_layouts should "
                             "have same length!")
        for table in (self.input_kwarg_layouts, self.desired_input_kwarg_layouts):
            for key, value in table.items():
                check_placement(value, f"the layout of keyword input {key!r}")

    def _prepare_input_arg(self, value: Any, mesh, input_layout, desired_layout):
        if input_layout is None:
            return value
        if isinstance(value, DTensor) and not is_local(value):
            dt = value
        elif is_local_array(value):
            dt = annotate(value, mesh, (input_layout,))
        else:
            raise TypeError(f"expecting an input with layout {input_layout} to be an "
                            f"ndarray or a DTensor, got {type(value).__name__}")
        if desired_layout is not None and input_layout != desired_layout:
            dt = dt.redistribute(placements=(desired_layout,))
        return dt.to_local() if self.use_local_output else dt

    def _prepare_input_fn(self, inputs, mesh):
        if self.input_layouts is None:
            return inputs
        if not isinstance(inputs, tuple):
            inputs = (inputs,)
        if len(inputs) != len(self.input_layouts):
            raise ValueError(f"module inputs and input_layouts should have same length! "
                             f"({len(inputs)} inputs, {len(self.input_layouts)} layouts)")
        return tuple(self._prepare_input_arg(x, mesh, lay, want) for x, lay, want in
                     zip(inputs, self.input_layouts, self.desired_input_layouts))

    def _prepare_input_kwarg_fn(self, inputs, kwargs, mesh):
        args = self._prepare_input_fn(inputs, mesh)
        out = {key: self._prepare_input_arg(value, mesh, self.input_kwarg_layouts.get(key),
                                            self.desired_input_kwarg_layouts.get(key))
               for key, value in kwargs.items()}
        return args, out

    def _apply(self, module, device_mesh):
        if self.with_kwargs:
            module.register_forward_pre_hook(
                lambda _, inputs, kwargs: self._prepare_input_kwarg_fn(inputs, kwargs,
                                                                       device_mesh),
                with_kwargs=True)
        else:
            module.register_forward_pre_hook(
                lambda _, inputs: self._prepare_input_fn(inputs, device_mesh))
        return module

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, "
                f"desired_input_layouts={self.desired_input_layouts}, "
                f"input_kwarg_layouts={self.input_kwarg_layouts}, "
                f"desired_input_kwarg_layouts={self.desired_input_kwarg_layouts}, "
                f"use_local_output={self.use_local_output})")


class PrepareModuleOutput(ParallelStyle):
    """Annotate a module's outputs with ``output_layouts`` and redistribute them to
    ``desired_output_layouts`` after each call (a forward hook), as torch's
    PrepareModuleOutput; local arrays are returned when ``use_local_output``
    (default True). ``None`` entries leave an output untouched.

    Example::

        >>> parallelize_module(block, mesh, PrepareModuleOutput(
        ...     output_layouts=Replicate(), desired_output_layouts=Shard(0)))
    """

    def __init__(self, *, output_layouts, desired_output_layouts,
                 use_local_output: bool = True):
        self.output_layouts = layouts(output_layouts, "output_layouts")
        self.desired_output_layouts = layouts(desired_output_layouts,
                                              "desired_output_layouts")
        self.use_local_output = use_local_output
        if self.output_layouts is None or self.desired_output_layouts is None:
            raise ValueError("output_layouts and desired_output_layouts must be given")
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise ValueError("output_layouts and desired_output_layouts should have same "
                             "length!")

    def _prepare_out_fn(self, outputs, mesh):
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        if len(outputs) != len(self.output_layouts):
            raise ValueError("module outputs and output_layouts should have same length!")
        prepared = []
        for out, layout, want in zip(outputs, self.output_layouts,
                                     self.desired_output_layouts):
            if layout is None:
                prepared.append(out)
                continue
            dt = out if isinstance(out, DTensor) and not is_local(out) else annotate(
                out, mesh, (layout,), "output")
            if want is not None and layout != want:
                dt = dt.redistribute(placements=(want,))
            prepared.append(dt.to_local() if self.use_local_output else dt)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    def _apply(self, module, device_mesh):
        module.register_forward_hook(
            lambda _, inputs, outputs: self._prepare_out_fn(outputs, device_mesh))
        return module

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_layouts={self.output_layouts}, "
                f"desired_output_layouts={self.desired_output_layouts}, "
                f"use_local_output={self.use_local_output})")


class PrepareModuleInputOutput(ParallelStyle):
    """:class:`PrepareModuleInput` and :class:`PrepareModuleOutput` on one module, as
    torch's PrepareModuleInputOutput (``use_local_input`` is the input side's
    ``use_local_output``).

    Constructing a style is local; :func:`parallelize_module` applying it is
    collective on the mesh, and so is the forward where it redistributes.

    Example::

        >>> parallelize_module(block, mesh, {"attention": PrepareModuleInputOutput(
        ...     input_layouts=Shard(1), desired_input_layouts=Replicate(),
        ...     output_layouts=Replicate(), desired_output_layouts=Shard(1))})
    """

    def __init__(self, *, input_layouts=None, desired_input_layouts=None,
                 input_kwarg_layouts=None, desired_input_kwarg_layouts=None,
                 use_local_input: bool = False, output_layouts, desired_output_layouts,
                 use_local_output: bool = True):
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input)
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output)

    def _apply(self, module, device_mesh):
        self.prepare_module_input._apply(module, device_mesh)
        self.prepare_module_output._apply(module, device_mesh)
        return module

    def __repr__(self) -> str:
        i, o = self.prepare_module_input, self.prepare_module_output
        return (f"{type(self).__name__}(input_layouts={i.input_layouts}, "
                f"desired_input_layouts={i.desired_input_layouts}, "
                f"input_kwarg_layouts={i.input_kwarg_layouts}, "
                f"desired_input_kwarg_layouts={i.desired_input_kwarg_layouts}, "
                f"use_local_input={i.use_local_output}, "
                f"output_layouts={o.output_layouts}, "
                f"desired_output_layouts={o.desired_output_layouts}, "
                f"use_local_output={o.use_local_output})")
