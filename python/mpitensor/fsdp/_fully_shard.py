"""fully_shard: torch's FSDP2 on DTensors.

A fully_sharded module owns one group: its parameters that no fully_sharded
descendant owns. Each parameter is stored sharded on dim 0 (or the dim
``shard_placement_fn`` names) over the data-parallel mesh (of what tensor
parallelism leaves on the rank, for a parameter already on a ``tp`` mesh). Every
rank's shards of the group are packed into one flat
buffer, each padded to the same number of rows on every rank, so that the group's
unshard is one even all-gather and its gradient one reduce-scatter, as torch's
FSDP2 (``FSDPParamGroup``).

The unsharded parameters are DTensors on the mesh without ``dp``: the ``dp`` mesh
itself, Replicate, for a module of plain arrays on a 1-D mesh (so an input sharded
over ``dp`` is a global batch, and the loss is global); beside tensor parallelism
(``dp`` sliced from a 2-D mesh) the ``tp`` mesh with their own placement for a
parallelized parameter, and the local mesh for a plain array (the ndarray outside
grad mode), where torch has plain tensors: each data-parallel replica runs its own
batch, as torch's. Each forward in grad mode gets its own
DTensors on the gathered arrays (the graph holds them); freeing the group swaps
their local arrays for a placeholder that holds no memory, and gathering it again
puts the new arrays into every one a backward may still need.

Autograd: each of a forward's unsharded parameters is the output of a node whose
input is that forward's token, and the token's node has the group's sharded
parameters as inputs. The engine runs a tensor's node only after every node
computed from it, so the token's node runs once, after the last gradient of the
group arrived: there the gradients are reduce-scattered, in one collective, into
the sharded parameters. A node on the module's outputs runs before anything inside
the module in backward: there the group is all-gathered again if it was freed.

HSDP (a 2-D ``(replicate, shard)`` mesh, as torch's ``HSDPMeshInfo``): the
parameters are ``(Replicate(), Shard(0))``, sharded within each replica group
(the mesh's dim 1) and replicated across them (dim 0); the flat buffer is
gathered over the shard dim alone; the gradients are reduce-scattered over it
and the result all-reduced over the replicate dim, one collective each per
group. The unsharded parameters are Replicate over both dims, so a batch sharded
over both is the global batch and the loss global, as on a 1-D mesh.

Mixed precision (``mp_policy``): the sharded parameters keep their dtype; the
flat buffer is filled in ``param_dtype`` (the cast happens on the shards, before
the all-gather), so the unsharded parameters are ``param_dtype`` values, and the
gradients are summed into a buffer of ``reduce_dtype``, reduce-scattered in it
and cast to the sharded parameters' dtype, as torch's ``FSDPParam``.

Prefetching (torch's ``unshard(async_op=True)``, ``set_modules_to_forward_prefetch``,
``set_modules_to_backward_prefetch``): a group's all-gather can be started as a
nonblocking MPI collective (an asynchronous redistribute, a ``_comm.Request``) and
completed only where the group's parameters are needed: in its pre-forward or
pre-backward. A module's forward prefetches start after its own group is gathered,
before its compute; its pre-backward starts those of its backward list, by default
the group whose forward came just before its own (the next in backward), as torch's
``FSDPParamGroup._backward_prefetch``. Every rank starts them in the same order:
the hooks run in the same order everywhere and the lists are agreed on when set. A
started all-gather that nothing used is waited on (and dropped) at the root's
post-forward, at the end of the backward, at the group's next reshard or unshard
and at exit, so no request outlives the step. Each hook also tests the requests
in flight, which lets an MPI library without a progress thread move them.
"""

from __future__ import annotations

import atexit
import weakref

import numpy as np

from .. import _comm, _modes
from .._args import resolve_mesh
from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
from .._fingerprint import fingerprint
from ..autograd import no_grad
from ..autograd._engine import queue_callback, record
from ..device_mesh import DeviceMesh, local_mesh
from ..nn.module import Module, Parameter
from ..placement_types import Partial, Replicate, Shard
from ._mesh_dims import DataParallelMeshDims, data_mesh, validate
from ._mixed_precision import MixedPrecisionPolicy, cast_floats, group_problem, policy_problem
from ._offload import OffloadPolicy

__all__ = ["fully_shard", "FSDPModule", "UnshardHandle"]

# Root meshes with their tp dim moved ahead of the shard dim, made once per mesh
# (see _Param).
_tp_ahead_meshes: dict = {}
# The post-forward meshes of reshard_after_forward=N, made once per (mesh, N).
_post_meshes: dict = {}
# Counts the root modules' forwards: a group still gathered from an earlier one
# (kept for a backward that never came) is gathered again, since the optimizer
# may have changed the shards since.
_generation = [0]
# Group forwards under way: an all-gather started outside any forward and backward
# (an explicit unshard between steps) is for the next root forward.
_forwarding = [0]
# The groups with an all-gather in flight, to wait on at exit (before MPI finalises).
_in_flight: "weakref.WeakSet" = weakref.WeakSet()
# fully_shard calls per mesh: a group's number on its mesh names it alike on every
# rank of the mesh (each took part in every call), for the prefetch agreement.
_serials: dict = {}
# Off only to compare a step without prefetching (tests): the default backward
# prefetch of the group whose forward came before.
_implicit_backward_prefetch = True


@atexit.register
def _settle_all() -> None:
    """Waits on every all-gather still in flight, so none reaches MPI_Finalize."""
    for state in list(_in_flight):
        state.settle()


class UnshardHandle:
    """What ``unshard(async_op=True)`` returns, as torch's: :meth:`wait` completes
    the started all-gather and puts the gathered parameters in place.

    Example::

        >>> handle = model.layers[1].unshard(async_op=True)
        >>> ...  # work that overlaps the all-gather
        >>> handle.wait()
    """

    def __init__(self, state) -> None:
        self._state = state

    def wait(self) -> None:
        """Completes the all-gather (nothing when the module's pre-forward already
        did); later calls do nothing. Collective on the data-parallel mesh (an MPI
        wait: it returns once every rank has started it).

        Example: ``model.unshard(async_op=True).wait()``.
        """
        state, self._state = self._state, None
        if state is not None:
            state.finish_unshard()


class _Context:
    """What the groups of one root share: the group whose forward ended last in
    the current root forward (the default backward prefetch of the next)."""

    __slots__ = ("last", "__weakref__")

    def __init__(self) -> None:
        # (state, its _Forward), held strongly: whether a prefetch starts must not
        # depend on when each rank's garbage collector frees a dropped graph
        self.last = None

    def settle(self) -> None:
        """Waits on and drops the all-gathers in flight of this root's groups."""
        for state in list(_in_flight):
            if state.ctx is self:
                state.settle()


def _progress() -> None:
    """Lets MPI move the all-gathers in flight (an MPI_Test each): a library without
    a progress thread moves a nonblocking collective only inside MPI calls, so the
    hooks poke it at every module boundary, between pieces of compute. Local."""
    for state in list(_in_flight):
        local = state.pending._local_tensor if state.pending is not None else None
        if type(local) is _comm.Request:
            local.test()


def _target_generation() -> int:
    """The root forward an all-gather started now is for: the one under way inside
    a forward or backward, the next one between steps (an explicit unshard)."""
    if _forwarding[0] or _modes.state.backward:
        return _generation[0]
    return _generation[0] + 1


class FSDPModule:
    """What :func:`fully_shard` mixes into a module's class (as torch's
    ``FSDPModule``): ``unshard()`` and ``reshard()`` move the module's own
    parameter group by hand, ``unshard(async_op=True)`` and the prefetch lists
    start its all-gather early (see the module docstring). Collective on the
    data-parallel mesh.

    Example::

        >>> fully_shard(model)
        >>> isinstance(model, FSDPModule)
        True
        >>> model.unshard(); model.reshard()
    """

    def __call__(self, *args, **kwargs):
        state = self.__dict__["_fsdp_state"]
        depth, forwarding = len(state.calls), _forwarding[0]
        try:
            return super().__call__(*args, **kwargs)
        except BaseException:
            state.forward_failed(depth, forwarding)
            raise

    def unshard(self, async_op: bool = False) -> "UnshardHandle | None":
        """All-gather this module's parameter group (one collective; nothing when
        it is unsharded already), as torch's. With ``async_op=True`` the
        all-gather is only started (a nonblocking MPI collective) and an
        :class:`UnshardHandle` is returned: its ``wait()``, or else the module's
        next pre-forward (or pre-backward), completes it. Without, it completes
        here and None is returned. Gathered outside a forward, the parameters
        are those of the next forward: change no parameter in between.
        Collective on the data-parallel mesh.

        Example::

            >>> handle = model.unshard(async_op=True)
            >>> batch = next(loader)   # overlaps the all-gather
            >>> loss = model(batch)    # waits on it first
        """
        state = self.__dict__["_fsdp_state"]
        state.start_unshard(again=state.generation != _target_generation())
        handle = UnshardHandle(state)
        if async_op:
            return handle
        handle.wait()
        return None

    def set_modules_to_forward_prefetch(self, modules) -> None:
        """The FSDP modules whose all-gathers this module starts in its forward,
        as torch's: after its own group is gathered, before its compute, so they
        overlap it; each is waited on in that module's pre-forward. Passing
        the next block gives one all-gather in flight during each block's
        forward; more use more memory. Raises ValueError (on every rank) for a
        module that is not an FSDPModule or when the ranks' lists differ.
        Collective on this module's mesh (one small agreement).

        Example::

            >>> for i, block in enumerate(model.layers[:-1]):
            ...     block.set_modules_to_forward_prefetch([model.layers[i + 1]])
        """
        self.__dict__["_fsdp_state"].set_prefetch("forward", modules)

    def set_modules_to_backward_prefetch(self, modules) -> None:
        """The FSDP modules whose all-gathers this module starts in its
        pre-backward, instead of the default (the module whose forward came just
        before this one's: the next in backward), as torch's; each is waited on
        in that module's pre-backward. An empty list restores the default.
        Raises ValueError (on every rank) for a module that is not an FSDPModule
        or when the ranks' lists differ. Collective on this module's mesh (one
        small agreement).

        Example::

            >>> for i, block in enumerate(model.layers[1:], 1):
            ...     block.set_modules_to_backward_prefetch([model.layers[i - 1]])
        """
        self.__dict__["_fsdp_state"].set_prefetch("backward", modules)

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *,
                                   recurse: bool = True) -> None:
        """Whether this module's backward reduce-scatters its gradients (and, with
        HSDP, all-reduces them), as torch's: with False each rank adds its
        unsharded gradients into a buffer of its own, with no communication, and
        the next backward with True reduces that sum with its own gradients in
        one reduce-scatter, so gradient accumulation over micro-batches costs one
        reduction. ``recurse`` sets it on every FSDP module inside too. Local, but
        every rank must set the same.

        Example::

            >>> for i, batch in enumerate(micro_batches):
            ...     model.set_requires_gradient_sync(i == len(micro_batches) - 1)
            ...     loss_fn(model(batch)).backward()
            >>> opt.step()
        """
        modules = self.modules() if recurse else [self]
        for m in modules:
            state = m.__dict__.get("_fsdp_state")
            if state is not None:
                state.sync = bool(requires_gradient_sync)

    def reshard(self) -> None:
        """Free this module's unsharded parameters (no communication; an
        all-gather still in flight is waited on and dropped). Local.

        Example: ``model.reshard()`` after an evaluation forward.
        """
        self.__dict__["_fsdp_state"].reshard()


_fsdp_classes: dict = {}


def _fsdp_class(cls):
    if issubclass(cls, FSDPModule):
        return cls
    if cls not in _fsdp_classes:
        _fsdp_classes[cls] = type(f"FSDP{cls.__name__}", (FSDPModule, cls), {})
    return _fsdp_classes[cls]


def fully_shard(module, *, mesh: DeviceMesh | None = None,
                reshard_after_forward: bool | int | None = True,
                shard_placement_fn=None,
                mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(),
                offload_policy: OffloadPolicy = OffloadPolicy(),
                ignored_params=None, dp_mesh_dims: DataParallelMeshDims | None = None):
    """Shard ``module``'s parameters over the data-parallel mesh, as torch's FSDP2
    ``fully_shard``: call it on submodules (such as each transformer block) first,
    then on the root. Returns the module, whose class now also derives from
    :class:`FSDPModule`.

    Every parameter the module owns (not owned by a fully_sharded descendant)
    becomes a ``Shard(0)`` DTensor over ``dp``; one of a module parallelized over
    the ``tp`` dim of a 2-D ``(dp, tp)`` mesh keeps its ``tp`` placement beside it
    (on the 2-D mesh; on that mesh with its dims swapped, ``(tp, dp)``, when TP
    shards dim 0 too, so that ``dp`` shards the rank's TP shard as torch's strided
    sharding does). Before the module's forward its group is all-gathered in one
    collective; after it the gathered parameters are freed when
    ``reshard_after_forward`` (the root module, first to run backward, keeps them,
    as torch's default None, which is taken as True); an int N keeps each group
    of N consecutive dp ranks holding the gathered parameters between them
    (torch's post-forward mesh, dp viewed as (dp // N, N)), so the backward's all-gather runs over N ranks; the
    parameters are gathered again before the module's backward, and the gradients
    are reduce-scattered in one collective into the sharded parameters' ``.grad``:
    summed when they are Partial over ``dp`` (a batch sharded over ``dp``),
    averaged over the replicas otherwise (each replica's own batch).

    ``shard_placement_fn``: called with each parameter, returns ``Shard(d)`` to
    shard it on dim ``d`` instead of 0, or None for 0, as torch's; a dim other
    than 0 must split evenly over the shard dim (NotImplementedError, as torch's),
    a result that is no Shard is a ValueError. The group still moves in one
    all-gather and one reduce-scatter. ``ignored_params``: parameters (any
    iterable, matched by identity) left as they are: not sharded, gathered or
    reduced by FSDP; a DTensor among them that requires grad keeps its gradient
    where backward made it, as every DTensor leaf does (a Replicate one on
    ``dp``: a Partial gradient, the global loss's, reduced by the optimizer's
    step).

    ``mp_policy`` (:class:`MixedPrecisionPolicy`): the dtype the group is gathered
    and computed in (``param_dtype``), the dtype its gradients are reduce-scattered
    in (``reduce_dtype``), the casts of the forward's inputs and outputs; the
    sharded parameters and their gradients keep their own dtype.

    ``offload_policy``: :class:`OffloadPolicy` or :class:`CPUOffloadPolicy`, as
    torch's; every array already lives in host memory, so either runs alike
    (TypeError for anything else).

    ``mesh``: the 1-D data-parallel mesh (FSDP), or a 2-D mesh, whatever its dim
    names, read as torch reads it: ``(replicate, shard)`` (HSDP). Each parameter
    is then ``(Replicate(), Shard(0))``: the group is all-gathered over the shard
    dim, and its gradients reduce-scattered over it and all-reduced over the
    replicate dim; ``reshard_after_forward`` as an int divides the shard dim's size,
    also on a mesh sliced beside ``tp``.
    A 2-D mesh sliced from a 3-D ``(replicate, shard, tp)`` one takes a module
    parallelized over its ``tp`` dim (HSDP beside tensor parallelism): each
    parallelized parameter lives on the 3-D mesh, ``(Replicate(), Shard(0),
    tp placement)``, and each data-parallel rank runs its own batch, as beside a
    1-D ``dp`` mesh; gradients are averaged over both data-parallel dims.
    Default the current mesh.

    ``dp_mesh_dims`` (:class:`DataParallelMeshDims`, torch 2.13's): ``mesh`` is
    the whole SPMD mesh (data-parallel and, say, ``tp`` dims) and every parameter
    a DTensor on it, Replicate over the dims ``dp_mesh_dims`` names
    (``distribute_module``, ``parallelize_module`` over the whole mesh). Each
    parameter is sharded over the ``shard`` dim, on that mesh, keeping its other
    placements (HSDP with a ``replicate`` dim ahead of it); the unsharded
    parameters are DTensors on the whole mesh with the parameter's placements,
    so an input sharded over the data-parallel dims is the global batch. As
    torch's, the gradients' sum over the data-parallel ranks is divided by their
    number, whatever their placement there. Raises as torch's: ValueError for a
    name the mesh lacks, a mesh without dim names, a parameter that is no
    DTensor on ``mesh`` or not Replicate over a data-parallel dim;
    NotImplementedError for an int ``reshard_after_forward``. Several shard or
    replicate names (torch flattens them) and replicate dims alone are
    NotImplementedError here.

    Raises as torch's: ValueError for a mesh of more than 2 dims, AssertionError for a 2-D mesh without dim names. Raises ValueError
    (on every rank: the ranks' checks, parameters' names, shapes and dtypes and
    policies are agreed on) when the module is fully_sharded already, a parameter
    is owned by a fully_sharded ancestor (call it on children first) or lives on a
    mesh that is not the other dim of ``dp``'s 2-D mesh (any DTensor, with HSDP),
    is a scalar or Partial, or the group mixes dtypes, or an int
    ``reshard_after_forward`` does not divide the dp (shard) size (1 means False,
    the size True, as torch's), or the ranks' parameters differ; and when the policy names a dtype other than
    float16, bfloat16, float32 and float64, casts complex parameters, or differs
    between ranks. Collective on the mesh (one small agreement; local shards are
    cut; the swapped mesh, when needed, communicates).

    Example (``mpiexec -n 2``)::

        >>> mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
        >>> for block in model.layers:
        ...     fully_shard(block, mesh=mesh)
        >>> fully_shard(model, mesh=mesh)
        >>> model.layers[0].w1.weight.placements
        (Shard(dim=0),)

    HSDP (``mpiexec -n 4``: two replicas, each sharded over two ranks)::

        >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        >>> fully_shard(model, mesh=mesh)
        >>> model.w1.weight.placements
        (Replicate(), Shard(dim=0))
        >>> x = distribute_tensor(batch, mesh, [Shard(0), Shard(0)])  # the global batch

    Weights sharded on their input dim, a frozen embedding left alone::

        >>> fully_shard(model, mesh=mesh, ignored_params={model.embed.weight},
        ...             shard_placement_fn=lambda p: Shard(1) if p.ndim == 2 else None)
    """
    if not isinstance(module, Module):
        raise TypeError(f"fully_shard takes an mpitensor.nn.Module, got "
                        f"{type(module).__name__}")
    if "_fsdp_state" in module.__dict__:
        raise ValueError(f"fully_shard: {type(module).__name__} is fully_sharded already")
    spmd = None
    if dp_mesh_dims is not None:
        spmd = _spmd_mesh(mesh, dp_mesh_dims, reshard_after_forward)
        mesh = data_mesh(spmd, dp_mesh_dims)
    else:
        mesh = _data_mesh(mesh)
    state = _State(module, mesh, reshard_after_forward, mp_policy, offload_policy,
                   shard_placement_fn, ignored_params, spmd)
    for m in module.modules():
        s = m.__dict__.get("_fsdp_state")
        if s is not None and m is not module:
            s.is_root = False
            s.ctx = state.ctx
    module.__dict__["_fsdp_state"] = state
    module.__class__ = _fsdp_class(type(module))
    # First, as torch's: a user's pre-hook registered earlier sees the gathered
    # parameters and the cast inputs.
    module.register_forward_pre_hook(state.pre_forward, prepend=True, with_kwargs=True)
    module.register_forward_hook(state.post_forward)
    return module


def _data_mesh(mesh) -> DeviceMesh:
    """The mesh fully_shard works on, checked as torch's ``_validate_mesh``."""
    if mesh is None:
        mesh = resolve_mesh(None)
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard: mesh must be a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim not in (1, 2):
        raise ValueError(f"fully_shard expects a 1D or 2D DeviceMesh but got {mesh!r}")
    if mesh.ndim == 2 and mesh.mesh_dim_names is None:
        raise AssertionError("Please init the 2D mesh for HSDP with mesh_dim_names specified")
    return mesh


def _spmd_mesh(mesh, dims, reshard_after_forward) -> DeviceMesh:
    """The whole mesh ``dp_mesh_dims`` names dims of, checked as torch's."""
    if mesh is None:
        mesh = resolve_mesh(None)
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard: mesh must be a DeviceMesh, got {type(mesh).__name__}")
    validate(mesh, dims)
    if len(dims.shard_names) > 1 or len(dims.replicate_names) > 1:
        raise NotImplementedError(
            f"fully_shard: dp_mesh_dims names several shard or replicate dims "
            f"({dims.shard_names}, {dims.replicate_names}); flatten them into one dim "
            f"of the mesh first (mesh[names]._flatten(name))")
    if not isinstance(reshard_after_forward, (bool, np.bool_, type(None))) and \
            isinstance(reshard_after_forward, (int, np.integer)):
        raise NotImplementedError("reshard_after_forward as int is not yet supported with "
                                  "SPMD mesh (dp_mesh_dims)")
    return mesh


def _shard_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The 1-D mesh the parameters are sharded over: a 2-D mesh's dim 1 (HSDP)."""
    return mesh if mesh.ndim == 1 else mesh._slice([1])


def _post_forward_size(value, mesh: DeviceMesh):
    """``reshard_after_forward`` as torch normalises it: True, False, or the size N
    of the groups the parameters stay gathered in after forward (1 < N < the
    shard dim's size)."""
    if value is None:  # torch's default: the root keeps its parameters, as here
        return True
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if not isinstance(value, (int, np.integer)):
        raise ValueError(f"reshard_after_forward should be a bool or an int representing "
                         f"the group size to reshard to, not {value}")
    n, dp = int(value), _shard_mesh(mesh).size()
    if n < 1 or dp % n:
        where = "" if mesh.ndim == 1 else " of the shard dim"
        raise ValueError(f"If passing reshard_after_forward as an int, it should be a "
                         f"factor of {dp}, not {n} (fully_shard: it must divide the "
                         f"data-parallel size {dp}{where})")
    if n == 1 or n == dp:  # in torch's order: at dp 1, 1 is False
        return n != 1
    return n


def _post_mesh(mesh: DeviceMesh, n: int) -> DeviceMesh:
    """The 1-D mesh of this rank's group of ``n`` consecutive ranks of ``mesh``
    flattened, as torch's ``mesh.view(-1, n)``: ``n`` divides the shard dim's
    size, so a group lies within one replica. Collective on ``mesh``'s root mesh
    the first time.

    A mesh sliced from a larger one (dp beside tp) holds other ranks on each of
    its peers, and a mesh's creation needs one rank array everywhere: the array
    is the root's, with ``mesh``'s dims moved last, so that each row of groups is
    some rank's ``mesh.view(-1, n)``."""
    if (mesh, n) not in _post_meshes:
        root = mesh._get_root_mesh()
        dims = [root.mesh_dim_names.index(name) for name in mesh.mesh_dim_names] \
            if root is not mesh else list(range(mesh.ndim))
        ranks = np.moveaxis(root.mesh, dims, range(root.ndim - len(dims), root.ndim))
        grid = DeviceMesh(mesh.device_type, ranks.reshape(-1, n),
                          mesh_dim_names=("post_replicate", "post_shard"), comm=root._comm)
        _post_meshes[(mesh, n)] = grid["post_shard"]
    return _post_meshes[(mesh, n)]


def _tp_ahead(root: DeviceMesh, tp: str, shard_name: str) -> DeviceMesh:
    """``root`` ((dp, tp) or (replicate, shard, tp)) with its dim ``tp`` just ahead
    of its dim ``shard_name``. Collective on ``root``'s ranks the first time."""
    names = list(root.mesh_dim_names)
    order = [n for n in names if n != tp]
    order.insert(order.index(shard_name), tp)
    if order == names:
        return root
    if root not in _tp_ahead_meshes:
        perm = [names.index(n) for n in order]
        _tp_ahead_meshes[root] = DeviceMesh(root.device_type, root.mesh.transpose(perm),
                                            mesh_dim_names=tuple(order), comm=root._comm)
    return _tp_ahead_meshes[root]


class _Param:
    """One parameter of a group: its sharded and unsharded DTensors, where it
    is registered, and its slot in the group's flat buffer.

    ``dim`` is the dim the data-parallel ranks shard (0 unless a
    ``shard_placement_fn`` says otherwise). Each rank's slot holds its chunk of
    that dim padded to ``cshape``, the first rank's, so that the group's buffer
    is the same size on every rank; a dim other than 0 must split evenly, as
    torch's, so only dim 0 pads."""

    def __init__(self, where, value, mesh: DeviceMesh, dp_mesh: DeviceMesh, what: str,
                 placement=None, spmd: DeviceMesh | None = None):
        self.where, self.name = where, what  # [(module, name)], its qualified name
        # To find a registration of the same parameter outside the group: a weak
        # reference where the type has them (ndarray), else the id (DTensor; an id
        # only matches while the object lives, i.e. is still registered elsewhere)
        self.origin_id = id(value)
        try:
            self.origin = weakref.ref(value)
        except TypeError:
            self.origin = None
        self.dp = dp = dp_mesh.size()
        rank = dp_mesh.get_local_rank()
        root = dp_mesh._get_root_mesh()
        tp_pl = None
        self.spmd_dp = ()  # with dp_mesh_dims: the data-parallel dims of the whole mesh
        if spmd is not None:
            local, self.spmd_dp = self._spmd_parts(value, spmd, mesh, what)
            self.umesh, self.upl = spmd, tuple(value.placements)
            shape = value.shape
        elif isinstance(value, DTensor) and (mesh.ndim == 1 or root.ndim == 3):
            tp_mesh, tp_pl, local = self._tp_parts(value, mesh, what)
            self.umesh, self.upl = tp_mesh, (tp_pl,)
            shape = value.shape
        elif mesh.ndim == 2 and root.ndim == 2:  # HSDP: Replicate over both dims
            if isinstance(value, DTensor):
                self._hsdp_refuses(value, mesh, what)
            local = np.asarray(value)
            self.umesh, self.upl = mesh, (Replicate(), Replicate())
            shape = local.shape
        else:
            local = np.asarray(value)
            # Beside tensor parallelism the forward's activations are this rank's
            # (local arrays, or local DTensors under grad), as torch's plain tensors;
            # on a mesh of data-parallel dims alone the parameter is Replicate there.
            beside_tp = root.ndim > mesh.ndim
            self.umesh = local_mesh() if beside_tp else mesh
            self.upl = (Replicate(),) * (1 if beside_tp else mesh.ndim)
            shape = local.shape
        if local.ndim == 0 or len(shape) == 0:
            raise ValueError(f"fully_shard: parameter {what} is a scalar; FSDP shards dim 0")
        if not np.issubdtype(local.dtype, np.inexact):
            raise ValueError(f"fully_shard: parameter {what} has dtype {local.dtype}; "
                             f"parameters must be floating point or complex")
        self.dim = d = self._shard_dim(placement, local.shape, dp, what)
        self.shape, self.dtype, self.lshape = tuple(shape), local.dtype, local.shape
        chunk = -(-local.shape[d] // dp)  # torch.chunk's: the first rank's, padded to
        start = min(rank * chunk, local.shape[d])
        n = min(local.shape[d] - start, chunk)
        self.cshape = local.shape[:d] + (chunk,) + local.shape[d + 1:]
        self.sshape = local.shape[:d] + (n,) + local.shape[d + 1:]  # this rank's
        self.csize = int(np.prod(self.cshape, dtype=np.int64))
        self.ssize = int(np.prod(self.sshape, dtype=np.int64))
        cut = (slice(None),) * d + (slice(start, start + n),)
        shard = np.ascontiguousarray(local[cut]).copy()
        stride = contiguous_strides(self.shape)
        fsdp_pl = Shard(d)
        if spmd is not None:
            smesh, spl = self._spmd_sharded(spmd, self.upl, self.spmd_dp[-1], d, what)
        elif mesh.ndim == 2 and tp_pl is None:
            smesh, spl = mesh, (Replicate(), fsdp_pl)
        elif tp_pl is None:
            smesh, spl = mesh, (fsdp_pl,)
        else:
            names = dict(zip(mesh.mesh_dim_names, (Replicate(), fsdp_pl)[-mesh.ndim:]))
            shard_name = mesh.mesh_dim_names[-1]
            # TP shards the same dim: dp shards the rank's TP shard (torch's strided
            # sharding), which a mesh with the tp dim ahead of dp's describes
            tp_name = self.umesh.mesh_dim_names[0]
            smesh = _tp_ahead(root, tp_name, shard_name) if tp_pl.is_shard(d) else root
            spl = tuple(names.get(n, tp_pl) for n in smesh.mesh_dim_names)
        self.sharded = DTensor.from_local(shard, smesh, spl, shape=self.shape, stride=stride)
        self.sharded.requires_grad_(True)
        self.compute_in(self.dtype)

    @staticmethod
    def _spmd_parts(value, spmd: DeviceMesh, dp_mesh: DeviceMesh, what: str):
        """(the local array, the indices of the data-parallel dims of ``spmd``,
        the shard dim last) of a parameter under ``dp_mesh_dims``, checked as
        torch's ``_init_sharding_spec_spmd``."""
        if not isinstance(value, DTensor):
            raise ValueError(
                f"When dp_mesh_dims is provided, all parameters must be DTensors on the "
                f"full SPMD mesh (e.g. via distribute_module). Got plain tensor for "
                f"parameter '{what}'.")
        if value.device_mesh is not spmd:
            raise ValueError("Expected param's DTensor mesh to be the same mesh passed to "
                             "fully_shard, but got different mesh objects")
        names = list(spmd.mesh_dim_names)
        dims = [names.index(n) for n in (dp_mesh.mesh_dim_names or ())]
        for i in dims:
            if not value.placements[i].is_replicate():
                raise ValueError(f"Expected Replicate() on DP dim '{names[i]}' (index {i}) "
                                 f"but got {value.placements[i]}")
        return value.detach()._data(), tuple(dims)

    @staticmethod
    def _spmd_sharded(spmd: DeviceMesh, placements: tuple, i: int, d: int, what: str):
        """The mesh and placements of a sharded parameter under ``dp_mesh_dims``: its
        own, with ``Shard(d)`` on the shard dim ``i``. A dim after ``i`` that shards
        ``d`` too is moved ahead of it (the rank's shard of that dim is what the
        data-parallel ranks split, torch's strided sharding)."""
        names = list(spmd.mesh_dim_names)
        later = [j for j in range(i + 1, spmd.ndim) if placements[j].is_shard(d)]
        pls = dict(zip(names, placements))
        pls[names[i]] = Shard(d)
        if not later:
            return spmd, tuple(pls[n] for n in names)
        if len(later) > 1 or spmd._get_root_mesh() is not spmd:
            raise NotImplementedError(
                f"fully_shard: parameter {what} is sharded on dim {d} by several mesh "
                f"dims after the data-parallel shard dim")
        smesh = _tp_ahead(spmd, names[later[0]], names[i])
        return smesh, tuple(pls[n] for n in smesh.mesh_dim_names)

    @staticmethod
    def _shard_dim(placement, lshape: tuple, dp: int, what: str) -> int:
        """The dim ``shard_placement_fn`` chose (0 without), checked as torch's."""
        if placement is None:
            return 0
        if not isinstance(placement, Shard):
            raise ValueError(f"Invalid shard_placement_fn result: {placement}")
        d = placement.dim + len(lshape) if placement.dim < 0 else placement.dim
        if not 0 <= d < len(lshape):
            raise ValueError(f"fully_shard: Shard dim {placement.dim} is invalid for "
                             f"{len(lshape)}D parameter {what}: {tuple(lshape)}")
        if d > 0 and lshape[d] % dp:
            raise NotImplementedError(
                f"FSDP does not support uneven sharding on dim {d}: {tuple(lshape)} "
                f"(world size: {dp}) (parameter {what})")
        return d

    def gathered(self, block: np.ndarray) -> np.ndarray:
        """The unsharded local array from the ranks' slots, ``block`` (dp, csize)."""
        chunks = block.reshape((block.shape[0],) + self.cshape)
        if self.dim == 0:
            return chunks.reshape((-1,) + self.cshape[1:])[:self.lshape[0]]
        return np.moveaxis(chunks, 0, self.dim).reshape(self.lshape)

    def slots(self, local: np.ndarray, dtype) -> np.ndarray:
        """The unsharded gradient ``local`` cut into the ranks' slots: (dp, csize),
        zeros where dim 0 pads."""
        dp = self.dp
        if self.dim == 0:
            padded = np.zeros((dp * self.cshape[0],) + self.cshape[1:], dtype)
            padded[:self.lshape[0]] = local
            return padded.reshape(dp, -1)
        d, c = self.dim, self.cshape[self.dim]
        split = local.reshape(self.lshape[:d] + (dp, c) + self.lshape[d + 1:])
        return np.moveaxis(split, d, 0).astype(dtype, copy=True).reshape(dp, -1)

    def compute_in(self, dtype: np.dtype) -> None:
        """Makes the unsharded parameter (freed: a placeholder that holds no
        memory) of ``dtype``, the dtype the group is gathered in."""
        self.free = np.broadcast_to(np.array(np.nan, dtype), self.lshape)
        self.unsharded = DTensor.from_local(self.free, self.umesh, self.upl, shape=self.shape,
                                            stride=contiguous_strides(self.shape))

    @staticmethod
    def _hsdp_refuses(value: DTensor, mesh: DeviceMesh, what: str):
        if value.device_mesh == mesh:
            raise ValueError(
                f"fully_shard: parameter {what} is on {mesh!r} already, with placements "
                f"{value.placements}: it is fully_sharded by an ancestor (call "
                f"fully_shard on submodules before their parents)")
        raise ValueError(
            f"fully_shard: parameter {what} is a DTensor on {value.device_mesh!r}; "
            f"fully_shard on a 2-D (replicate, shard) mesh (HSDP) takes arrays, or "
            f"DTensors on the third dim of the 3-D mesh it was sliced from (HSDP beside "
            f"tensor parallelism)")

    @staticmethod
    def _tp_parts(value: DTensor, dmesh: DeviceMesh, what: str):
        """The TP mesh, placement and local array of a parameter parallelized over
        the dim of the root mesh that the data-parallel mesh ``dmesh`` leaves."""
        mesh = value.device_mesh
        root = dmesh._get_root_mesh()
        dp_names = dmesh.mesh_dim_names or ()
        ok = (mesh.ndim == 1 and root.ndim == dmesh.ndim + 1 and mesh is not dmesh
              and mesh._get_root_mesh() is root and len(dp_names) == dmesh.ndim
              and mesh.mesh_dim_names is not None
              and mesh.mesh_dim_names[0] not in dp_names)
        if not ok:
            if mesh == dmesh or mesh.ndim > 1 and mesh._get_root_mesh() is root or \
                    mesh in _tp_ahead_meshes.values():
                raise ValueError(
                    f"fully_shard: parameter {what} is on {mesh!r} already, with "
                    f"placements {value.placements}: it is fully_sharded by an ancestor "
                    f"(call fully_shard on submodules before their parents) or was "
                    f"parallelized over the whole mesh (parallelize over mesh['tp'])")
            raise ValueError(
                f"fully_shard: parameter {what} is a DTensor on {mesh!r}; fully_shard over "
                f"{dmesh!r} takes arrays, or DTensors on the other dim of the mesh the "
                f"data-parallel mesh was sliced from (parallelize_module over "
                f"mesh['tp'] first)")
        pl = value.placements[0]
        if pl.is_partial():
            raise ValueError(f"fully_shard: parameter {what} is Partial over "
                             f"{mesh.mesh_dim_names[0]}")
        return mesh, pl, value.detach()._data()


class _State:
    """A fully_sharded module's group and the hooks that move it."""

    def __init__(self, module: Module, mesh: DeviceMesh, reshard_after_forward,
                 mp_policy: MixedPrecisionPolicy, offload_policy: OffloadPolicy,
                 shard_placement_fn=None, ignored_params=None, spmd=None):
        # The mesh passed (1-D, or 2-D for HSDP), the one the group is gathered and
        # reduce-scattered over, and with HSDP the one its gradients are all-reduced
        # over.
        self.module, self.mesh = module, mesh
        self.spmd = spmd  # with dp_mesh_dims: the whole mesh the parameters live on
        self.dp_mesh = _shard_mesh(mesh)
        self.replicate_mesh = mesh._slice([0]) if mesh.ndim == 2 else None
        self.dp = self.dp_mesh.size()
        self.full = None  # the group's gathered (dp, size) buffer while unsharded
        self.post = None  # this rank's rows of it, kept after forward for post_mesh
        self.is_root = True
        self.unsharded = False
        # set_requires_gradient_sync: without, backward adds into `accum` (the
        # (dp, size) buffer of unreduced gradients) and `accum_got` (their divisors)
        self.sync, self.accum, self.accum_got = True, None, {}
        self.generation = -1  # the root forward the gathered arrays were made in
        self.live = weakref.WeakSet()  # the recorded forwards whose graphs live
        self.calls: list = []  # the forwards under way (a _Forward, or None)
        self.ctx = _Context()  # shared with the groups of the root's tree
        # The all-gather in flight: a DTensor whose local is a _comm.Request, whether it
        # gathers the rows kept after forward, and the root forward it is for.
        self.pending, self.pending_post, self.pending_generation = None, False, -1
        self.forward_prefetch: list = []  # the _States set_modules_to_*_prefetch named
        self.backward_prefetch: list = []
        problem, after, error = None, True, ValueError
        try:
            after = _post_forward_size(reshard_after_forward, mesh)
            self.params = self._collect(module, shard_placement_fn, ignored_params)
            dtypes = {p.dtype for p in self.params}
            if len(dtypes) > 1:
                raise ValueError(
                    f"fully_shard: {type(module).__name__}'s parameters mix dtypes "
                    f"{sorted(str(d) for d in dtypes)}; a group is one buffer of one "
                    f"dtype: fully_shard the submodules of each dtype apart")
        except (ValueError, TypeError, NotImplementedError) as e:
            # torch's classes: a Shard dim that does not split evenly is
            # NotImplementedError, a result that is no Shard ValueError
            self.params, problem, error = [], str(e), type(e)
        if not isinstance(offload_policy, OffloadPolicy):
            problem, error = (f"fully_shard: offload_policy must be an OffloadPolicy or "
                              f"CPUOffloadPolicy, got {type(offload_policy).__name__}",
                              TypeError)
        self.dtype = self.params[0].dtype if self.params else np.dtype(np.float64)
        self._agree(mp_policy, after, problem, error)
        _serials[mesh] = self.serial = _serials.get(mesh, 0) + 1
        self.reshard_after_forward = bool(after)
        # made after the agreement: its creation is collective
        post = after is not True and after is not False
        self.post_mesh = _post_mesh(mesh, after) if post else None
        self._mixed_precision(mp_policy)
        self.offsets, size = [], 0
        for p in self.params:
            self.offsets.append(size)
            size += p.csize
        self.size = size
        for p in self.params:
            for m, name in p.where:
                m._parameters[name] = p.sharded

    def _agree(self, mp, reshard_after_forward, problem: str | None,
               error: type = ValueError) -> None:
        """One small all-reduce over the mesh: every rank raises when one failed a
        check, or when the ranks' policies, ``reshard_after_forward`` or
        parameters (names, shapes, dtypes) differ, since the group's collectives
        would then wait for each other or pair other rows."""
        name = type(self.module).__name__
        problem = policy_problem(mp) or problem or group_problem(mp, self.dtype, name)
        layout = [(p.name, p.shape, p.dtype.str, p.dim) for p in self.params]
        _comm.agree(self.mesh, problem is None,
                 fingerprint((mp, reshard_after_forward, layout)),
                 problem or f"fully_shard: the ranks passed different mp_policy, "
                            f"reshard_after_forward or parameters (names, shapes, dtypes, "
                            f"shard dims) of {name}",
                 TypeError if not isinstance(mp, MixedPrecisionPolicy) else error)

    def _mixed_precision(self, mp: MixedPrecisionPolicy) -> None:
        """The dtypes the group is gathered (and computed) and reduced in, as torch's
        ``FSDPParam.init_dtype_attrs``."""
        self.param_dtype = self.dtype if mp.param_dtype is None else mp.param_dtype
        self.reduce_dtype = self.param_dtype if mp.reduce_dtype is None else mp.reduce_dtype
        self.output_dtype = mp.output_dtype
        self.cast_inputs = mp.cast_forward_inputs and mp.param_dtype is not None
        if self.param_dtype != self.dtype:
            for p in self.params:
                p.compute_in(self.param_dtype)

    def _collect(self, module: Module, shard_placement_fn=None, ignored_params=None) -> list:
        """The group's parameters: those of ``module`` and of its submodules that no
        fully_shard call owns, but ``ignored_params`` (matched by identity: an
        ndarray has no hash), each sharded on the dim ``shard_placement_fn``
        gives."""
        found: dict = {}
        order: list = []
        ignored = {id(p.data if isinstance(p, Parameter) else p)
                   for p in (ignored_params or ())}

        def walk(m, prefix):
            for name, value in m._parameters.items():
                if value is None or id(value) in ignored:
                    continue
                key = id(value)
                if key not in found:
                    found[key] = ([], value, f"{prefix}{name}")
                    order.append(key)
                found[key][0].append((m, name))
            for cname, child in m.named_children():
                if "_fsdp_state" not in child.__dict__:
                    walk(child, f"{prefix}{cname}.")

        walk(module, "")
        for m in module.modules():
            child = m.__dict__.get("_fsdp_state")
            for p in child.params if child is not None else ():
                key = p.origin_id if p.origin is None else id(p.origin())
                if key in found:
                    raise ValueError(
                        f"fully_shard: parameter {found[key][2]} of "
                        f"{type(module).__name__} is also a parameter of a fully_sharded "
                        f"submodule ({type(m).__name__}); a shared (tied) parameter must "
                        f"be in one group: fully_shard a module that holds every use")
        place = shard_placement_fn if callable(shard_placement_fn) else (lambda value: None)
        return [_Param(found[k][0], found[k][1], self.mesh, self.dp_mesh, found[k][2],
                       place(found[k][1]), self.spmd)
                for k in order]

    # -- moving the group --------------------------------------------------------------
    def unshard(self, again: bool = False) -> None:
        """The group's one all-gather over dp, unpacked into the unsharded DTensors
        (nothing when gathered already, unless ``again``; only the wait when it
        was started already)."""
        self.start_unshard(again)
        self.finish_unshard()

    def start_unshard(self, again: bool = False) -> None:
        """Starts the group's all-gather as a nonblocking collective (nothing when
        gathered already, unless ``again``, or started already for this root
        forward). Collective on the dp (or post-forward) mesh."""
        if self.pending is not None:
            if not again or self.pending_generation == _target_generation():
                return
            self.settle()  # started for an earlier forward: the shards may have changed
        if (self.unsharded and not again) or not self.params:
            return
        self.pending_post = self.post is not None and not again
        if self.pending_post:  # kept rows: gathered over post_mesh
            local, mesh = self.post.reshape(-1), self.post_mesh
            # for this backward only: a forward that finds it still in flight
            # gathers from the shards
            self.pending_generation = -1
        else:
            self.pending_generation = _target_generation()
            local = np.zeros(self.size, self.param_dtype)  # the cast to param_dtype is here
            for p, off in zip(self.params, self.offsets):
                local[off:off + p.ssize] = p.sharded._data().reshape(-1)
            mesh = self.dp_mesh
        # the all-gather reads its source at the call
        self.post = None
        with no_grad():
            flat = DTensor.from_local(local, mesh, [Shard(0)],
                                      shape=(mesh.size() * local.size,), stride=(1,))
            self.pending = flat.redistribute(mesh, [Replicate()], async_op=True)
        _in_flight.add(self)

    def finish_unshard(self) -> None:
        """Waits on the started all-gather and puts the gathered arrays into the
        unsharded DTensors. Local but for the MPI wait."""
        if self.pending is None:
            if not self.params:
                self.unsharded = True
            return
        full = self._take_pending()
        if not self.pending_post:
            self.generation = self.pending_generation
        full = full.reshape(self.dp, self.size)
        # kept only for the rows reshard(to_post=True) keeps: the parameters' arrays
        # are copies out of it
        self.full = full if self.post_mesh is not None else None
        arrays = []
        for p, off in zip(self.params, self.offsets):
            arrays.append(p.gathered(full[:, off:off + p.csize]))
        self._set_locals(arrays)
        self.unsharded = True

    def _take_pending(self) -> np.ndarray:
        pending, self.pending = self.pending, None
        _in_flight.discard(self)
        return pending._data()

    def settle(self) -> None:
        """Waits on an all-gather in flight and drops its result: nothing used it
        (a prefetch whose group did not run), and it must not outlive the step.
        The group stays as it was."""
        if self.pending is not None:
            self._take_pending()

    def set_prefetch(self, kind: str, modules) -> None:
        """``set_modules_to_{kind}_prefetch``: checked and agreed on over this
        group's mesh, so that every rank starts the same all-gathers in the same
        order (or every rank raises)."""
        modules = list(modules)
        problem = None
        for m in modules:
            if not isinstance(m, FSDPModule) or "_fsdp_state" not in m.__dict__:
                problem = f"Expects FSDPModule but got {type(m)}: {m}"
                break
        states = [] if problem else [m.__dict__["_fsdp_state"] for m in modules]
        _comm.agree(self.mesh, problem is None,
                    fingerprint((kind, self._ident(), [s._ident() for s in states])),
                    problem or f"set_modules_to_{kind}_prefetch: the ranks passed "
                               f"different modules to {type(self.module).__name__} "
                               f"(every rank must prefetch the same modules in the "
                               f"same order)")
        setattr(self, f"{kind}_prefetch", states)

    def _ident(self) -> tuple:
        """This group, named alike on every rank of its mesh."""
        return type(self.module).__name__, self.serial, self.mesh.shape

    def reshard(self, to_post: bool = False) -> None:
        """Frees the unsharded parameters (their arrays become placeholders); with
        ``to_post`` this rank keeps its rows of the gathered buffer, the part it
        contributes to the post-forward mesh's all-gather."""
        self.settle()
        self.post = None
        if to_post and self.full is not None:
            k = self.dp // self.post_mesh.size()
            j = self.post_mesh.get_local_rank()
            self.post = np.array(self.full[j * k:(j + 1) * k])
        self.full = None
        self._set_locals([p.free for p in self.params])
        self.unsharded = False

    def _set_locals(self, arrays) -> None:
        """The local arrays of the unsharded parameters, and of every recorded
        forward's that a backward may still need."""
        for i, (p, a) in enumerate(zip(self.params, arrays)):
            p.unsharded._local_tensor = a
            for fwd in self.live:
                if fwd.views:
                    fwd.views[i]._local_tensor = a

    def _register(self, tensors) -> None:
        for p, t in zip(self.params, tensors):
            for m, name in p.where:
                m._parameters[name] = t

    # -- hooks -------------------------------------------------------------------------
    def pre_forward(self, module, args, kwargs):
        if self.is_root:
            _generation[0] += 1
            self.ctx.last = None  # a new forward order
        _forwarding[0] += 1
        _progress()
        self.unshard(again=self.generation != _generation[0])
        outermost = not self.calls
        if _modes.state.grad_enabled and self.params:
            fwd = self._record()
            self._register(fwd.views)
        else:
            fwd = None
            # as to_local() outside grad mode: a local-mesh parameter is the ndarray
            self._register([p.unsharded._data() if p.umesh is local_mesh() else p.unsharded
                            for p in self.params])
        self.calls.append(fwd)
        # Started after this group is gathered, before its compute, which they
        # overlap; not when the forward recomputes inside a backward, as torch's.
        if outermost and not _modes.state.backward:
            for target in self.forward_prefetch:
                target.start_unshard(again=target.generation != _generation[0])
        if self.cast_inputs:
            return cast_floats(args, self.param_dtype), cast_floats(kwargs, self.param_dtype)
        return None

    def forward_failed(self, depth: int, forwarding: int) -> None:
        """The forward that ``pre_forward`` began raised, so ``post_forward`` will
        not run: its record goes, so that the next forward is the outermost again
        (and prefetches), and the root waits for the all-gathers it started."""
        del self.calls[depth:]
        _forwarding[0] = forwarding
        if self.is_root:
            self.ctx.settle()

    def post_forward(self, module, args, output):
        _forwarding[0] -= 1
        _progress()
        self._register([p.sharded for p in self.params])
        fwd = self.calls.pop()
        if fwd is None:
            self.reshard()
        else:
            count = [0]
            output = _alias_outputs(output, lambda: self.pre_backward(fwd), count)
            # the group whose forward ended before: the next in backward
            fwd.prev, self.ctx.last = self.ctx.last, (self, fwd)
            # Without an output to hook, nothing would gather the group again before
            # its backward: it stays gathered.
            if self.reshard_after_forward and not self.is_root and count[0]:
                self.reshard(to_post=self.post_mesh is not None)
        if self.is_root:
            self.ctx.settle()  # forward prefetches of groups that did not run
        if self.output_dtype is not None:
            return cast_floats(output, self.output_dtype)
        return None if fwd is None else output

    def pre_backward(self, fwd: "_Forward") -> None:
        fwd.active = True
        _progress()
        self.unshard()
        if fwd.prefetched:  # another output of the same forward
            return
        fwd.prefetched = True
        targets = self.backward_prefetch or self._default_backward_prefetch(fwd)
        for target in targets:
            target.start_unshard()
        if targets:
            queue_callback(self.ctx.settle)  # a target whose backward never ran

    @staticmethod
    def _default_backward_prefetch(fwd: "_Forward") -> list:
        """The group whose forward ended just before ``fwd``'s, as torch's, while
        that forward still awaits its backward (else the all-gather would be
        wasted: it ran already, or is running)."""
        if not _implicit_backward_prefetch or fwd.prev is None:
            return []
        state, prev = fwd.prev
        if not prev.views or prev.active:
            return []
        return [state]

    # -- autograd ----------------------------------------------------------------------
    def _record(self) -> "_Forward":
        """This forward's unsharded parameters (on the gathered arrays), each the
        output of a node whose input is this forward's token."""
        fwd = _Forward()
        fwd.views = [DTensor(p.unsharded._data(), p.unsharded._spec) for p in self.params]
        everywhere = [Replicate()] * self.mesh.ndim
        token = DTensor.from_local(np.zeros((), self.dtype), self.mesh, everywhere)
        # a parameter frozen with requires_grad_(False) gets no gradient, as torch's
        # (record gives the node only the inputs that require grad)
        need = [p.sharded._requires_grad for p in self.params]
        record("FSDPPostBackward", token, [p.sharded for p in self.params],
               lambda g, node, out: self.post_backward(fwd))
        zero = DTensor.from_local(np.zeros((), self.dtype), self.mesh, everywhere)
        for i, v in enumerate(fwd.views):
            if need[i]:
                record("FSDPUnshard", v, (token,), self._collector(fwd, i, zero))
        self.live.add(fwd)
        return fwd

    def _collector(self, fwd: "_Forward", i: int, zero: DTensor):
        def backward_fn(g, node, out):
            self._add_grad(fwd, i, g)
            return (zero,)
        return backward_fn

    def _add_grad(self, fwd: "_Forward", i: int, g: DTensor) -> None:
        """Adds unsharded parameter i's gradient, as this rank's term of the sum the
        reduce-scatter (and with HSDP the all-reduce) makes, into the forward's
        buffer, divided by the part of its divisor torch divides by before the
        sum; ``fwd.got[i]`` keeps the part left for after it."""
        p = self.params[i]
        g, divisor = self._as_terms(p, g)
        pre, post = _divide_factors(divisor, self.reduce_dtype)
        local = g._data()
        if fwd.grad is None:
            fwd.grad = np.zeros((self.dp, self.size), self.reduce_dtype)
        off = self.offsets[i]
        slots = p.slots(local, self.reduce_dtype)
        if pre != 1:
            slots /= pre
        fwd.grad[:, off:off + p.csize] += slots
        fwd.got[i] = post

    def _as_terms(self, p: _Param, g: DTensor):
        """``g`` as terms of a sum over the data-parallel ranks, and what that sum
        is to be divided by. Over a mesh dim where ``g`` is Partial("sum") (a batch
        sharded over it, a global loss) the terms add up to the gradient; over any
        other each rank holds a replica's whole gradient (Replicate, or made so),
        and the replicas are averaged, as torch's; Partial("avg") is such an
        average already. Beside TP each replica runs its own batch: averaged.
        Under ``dp_mesh_dims`` the other dims are moved to the parameter's
        placements, and the sum over the data-parallel ranks is divided by their
        number, as torch's (its reduce-scatter averages whatever they hold)."""
        if p.spmd_dp:
            target = [pl if i not in p.spmd_dp else
                      g.placements[i] if g.placements[i].is_partial("sum") else Replicate()
                      for i, pl in enumerate(p.upl)]
            if tuple(target) != tuple(g.placements):
                g = g.redistribute(p.umesh, target)
            return g, self.mesh.size()
        if p.umesh is not self.mesh:
            if tuple(g.placements) != p.upl:
                g = g.redistribute(p.umesh, p.upl)
            return g, self.mesh.size()  # every replica's, HSDP's too
        target, divisor = [], 1
        for d, pl in enumerate(g.placements):
            target.append(pl if pl.is_partial("sum") or pl.is_partial("avg") else Replicate())
            if not pl.is_partial("sum"):
                divisor *= self.mesh.size(d)
        if tuple(target) != tuple(g.placements):
            g = g.redistribute(self.mesh, target)
        return g, divisor

    def post_backward(self, fwd: "_Forward"):
        """The forward's one reduce-scatter over the shard dim (then, with HSDP, one
        all-reduce of its result over the replicate dim) and the division left for
        after them; the sharded gradients for the engine to accumulate into
        ``.grad``. Frees the unsharded parameters unless another
        forward's backward is under way (the same module called twice)."""
        buf, got = fwd.grad, fwd.got
        fwd.grad, fwd.views, fwd.active, fwd.prev = None, [], False, None
        self.live.discard(fwd)
        if not any(f.active for f in self.live):
            self.reshard()
        if not self.sync:  # accumulation: this rank's terms wait for the next sync
            if buf is not None:
                self.accum = buf if self.accum is None else self.accum + buf
                self.accum_got.update(got)
            return (None,) * len(self.params)
        if self.accum is not None:
            buf = self.accum if buf is None else buf + self.accum
            got = {**self.accum_got, **got}
            self.accum, self.accum_got = None, {}
        if buf is None:
            return (None,) * len(self.params)
        flat = DTensor.from_local(buf.reshape(-1), self.dp_mesh, [Partial("sum")],
                                  shape=(self.dp * self.size,), stride=(1,))
        local = flat.redistribute(self.dp_mesh, [Shard(0)])._data()
        if self.replicate_mesh is not None:
            local = DTensor.from_local(local, self.replicate_mesh, [Partial("sum")],
                                       shape=local.shape, stride=(1,))
            local = local.redistribute(self.replicate_mesh, [Replicate()])._data()
        if any(post != 1 for post in got.values()):
            if not local.flags.writeable:
                local = np.array(local)
            for i, post in got.items():
                p, off = self.params[i], self.offsets[i]
                if post != 1:
                    local[off:off + p.ssize] /= post
        # The parts of this one new buffer are the engine's to keep as .grad without
        # a copy when they tile it; with padding between them (uneven dims) a kept
        # part would keep the padding alive, so the engine copies them.
        cast = local.dtype != self.dtype  # each part then is its own new array
        tiles = cast or (len(got) == len(self.params)
                         and sum(p.ssize for p in self.params) == local.size)
        out = []
        for i, (p, off) in enumerate(zip(self.params, self.offsets)):
            if i not in got:
                out.append(None)
                continue
            shard = local[off:off + p.ssize].reshape(p.sshape)
            if cast:
                shard = shard.astype(self.dtype)
            s = p.sharded._spec
            part = DTensor.from_local(shard, s.mesh, s.placements, shape=s.shape,
                                      stride=s.stride)
            part._fresh = tiles
            out.append(part)
        return tuple(out)


def _divide_factors(divisor: int, reduce_dtype: np.dtype) -> tuple:
    """``divisor`` split into what divides the gradients before their sum and
    what divides the sum, as torch's ``_get_gradient_divide_factors``: in float32
    and bfloat16 all after (torch's ReduceOp.AVG); in other dtypes, which torch
    deems at risk of overflow, a power of two near its square root before and the
    rest after."""
    if divisor == 1:
        return 1, 1
    if np.dtype(reduce_dtype).name in ("float32", "bfloat16"):
        return 1, divisor
    pre = 1
    while divisor % pre == 0 and divisor / pre > pre:
        pre *= 2
    return pre, divisor / pre


class _Forward:
    """One recorded forward of a group: its unsharded parameters (held by the graph,
    whose nodes hold this record: it lives as long as the graph), its gradients
    and whether its backward is under way."""

    __slots__ = ("views", "grad", "got", "active", "prev", "prefetched", "__weakref__")

    def __init__(self) -> None:
        # got: the parameters whose gradient came, each with its divisor left
        self.views, self.grad, self.got, self.active = [], None, {}, False
        # prev: (state, _Forward) of the forward that ended before
        # this one in the root forward; prefetched: the pre-backward started its
        # prefetches
        self.prev, self.prefetched = None, False


def _alias_outputs(output, pre_backward, count: list):
    """``output`` with each DTensor that requires grad (in tuples, lists and dicts)
    replaced by an alias whose backward runs ``pre_backward`` first (before
    anything the module computed); ``count[0]`` counts them."""
    if type(output) is DTensor:
        if not output._requires_grad:
            return output
        def backward_fn(g, node, out):
            pre_backward()
            return (g,)
        count[0] += 1
        return record("FSDPPreBackward", DTensor(output._data(), output._spec), (output,),
                      backward_fn)
    if isinstance(output, (tuple, list)):
        items = [_alias_outputs(o, pre_backward, count) for o in output]
        if hasattr(output, "_fields"):  # a namedtuple
            return type(output)(*items)
        return type(output)(items)
    if isinstance(output, dict):
        return type(output)((k, _alias_outputs(v, pre_backward, count))
                            for k, v in output.items())
    return output
