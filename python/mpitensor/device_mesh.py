"""DeviceMesh: an n-dimensional array of MPI ranks and its communicators.

Mirrors ``torch.distributed.device_mesh``. The communicators (one duplicate of the
user's communicator split into one communicator per mesh dim) are created once
per mesh in the C core and freed with it.
"""

from __future__ import annotations

import math
import os
import warnings
import weakref
from typing import Iterable, Sequence

import numpy as np

from . import _C, _departure, _mpi_library, _timemodel, _comm
from ._fingerprint import fingerprint
from ._mesh_layout import (cosets, flattened, positions, root_offsets, same_offsets,
                           unflattened)

__all__ = ["DeviceMesh", "init_device_mesh", "ranks_per_node", "set_cache_limits"]

_mesh_stack: list["DeviceMesh"] = []
# Bounds of each mesh's caches (set_cache_limits): decisions of operations, the
# layouts they are keyed by, and redistribution plans (of DTensor.redistribute,
# of operations' decisions, and of indexing, each).
_limits = {"decisions": 4096, "layouts": 4096, "plans": 256}
# Meshes alive in this process, so that an unpickled DTensor finds its mesh without
# creating one (a collective) inside pickle.load, and set_cache_limits reaches every
# mesh's caches. Keyed by identity: equal meshes (the same ranks of the same
# communicator) are distinct objects with caches of their own.
_live_meshes: "weakref.WeakValueDictionary[int, DeviceMesh]" = weakref.WeakValueDictionary()


def _current_mesh() -> "DeviceMesh":
    """The innermost mesh entered with ``with mesh:``; RuntimeError if none."""
    if not _mesh_stack:
        raise RuntimeError(
            "No device mesh is currently active! Pass device_mesh= or enter one "
            "with `with mesh:`."
        )
    return _mesh_stack[-1]


def find_live_mesh(device_type, ranks: np.ndarray, names) -> "DeviceMesh | None":
    """A mesh alive on this rank with these ranks and names (the innermost
    ``with mesh:`` first), for unpickling without the collective of creating one;
    None when there is none. Local.

    Example: ``find_live_mesh("cpu", np.arange(4), None)`` after
    ``init_device_mesh("cpu", (4,))``.
    """
    def fits(m):
        return (m.device_type == device_type and m.mesh_dim_names == names
                and m.mesh.shape == ranks.shape and np.array_equal(m.mesh, ranks))

    for m in [*reversed(_mesh_stack), *list(_live_meshes.values())]:
        if fits(m) and m is not _local_mesh:
            return m
    return None


def _world():
    from mpi4py import MPI  # imported here so that `import mpitensor` does not start MPI

    return MPI.COMM_WORLD


# This process alone, as a 1-D mesh of one rank over MPI_COMM_SELF (local_mesh()).
_local_mesh: "DeviceMesh | None" = None


def local_mesh() -> "DeviceMesh":
    """This process alone as a mesh of one rank over ``MPI_COMM_SELF``: where a local
    array lives as a DTensor, so that autograd follows it (``DTensor.to_local`` of a
    tensor that requires grad). Made once; Local (its communicators hold this rank
    only). Never the mesh an unpickled DTensor lands on.

    Example: ``local_mesh().shape == (1,)`` on every rank.
    """
    global _local_mesh
    if _local_mesh is None:
        from mpi4py import MPI  # imported here so that `import mpitensor` does not start MPI

        _local_mesh = DeviceMesh("cpu", [0], comm=MPI.COMM_SELF)
        _local_mesh._local = True  # ndarrays mix with its DTensors as Replicate
    return _local_mesh


_watchdog_started = False


def _start_watchdog() -> None:
    """Sets the collective watchdog's timeout from ``MPITENSOR_TIMEOUT`` (seconds;
    default torch's 30 minutes; 0 turns it off) the first time a mesh is made, once
    MPI runs. Local; ValueError for a value that is not a number >= 0."""
    global _watchdog_started
    if _watchdog_started:
        return
    text = os.environ.get("MPITENSOR_TIMEOUT", "").strip()
    try:
        seconds = float(text) if text else None
    except ValueError:
        seconds = -1.0
    if seconds is not None and not 0.0 <= seconds < float("inf"):
        raise ValueError(f"MPITENSOR_TIMEOUT must be a number of seconds >= 0 (0 turns "
                         f"the collective watchdog off), got {text!r}")
    _comm.set_collective_timeout(seconds)
    _watchdog_started = True


def is_local_mesh(mesh) -> bool:
    """Whether ``mesh`` is :func:`local_mesh`'s: where a local array that records
    for autograd lives. Local.

    Example: ``is_local_mesh(local_mesh()) and not is_local_mesh(init_device_mesh("cpu", (1,)))``.
    """
    return mesh is not None and mesh is _local_mesh


def _check_device_type(device_type) -> None:
    if device_type != "cpu":
        raise ValueError(
            f"mpitensor meshes are made of CPU processes: device_type must be 'cpu', "
            f"got {device_type!r}"
        )


def _check_names(names, ndim: int):
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"mesh_dim_names must be a tuple of str, got {names!r}")
    names = tuple(names)
    if len(set(names)) != len(names):
        raise RuntimeError(
            f"Each mesh_dim_name must be unique. Found repeated mesh_dim_name in "
            f"mesh_dim_names {names}"
        )
    if len(names) != ndim:
        raise RuntimeError(
            f"mesh_dim_names {names} has {len(names)} names for a {ndim}-D mesh; "
            f"mesh shape and mesh_dim_names should have the same length"
        )
    return names


def _as_rank_array(mesh) -> np.ndarray:
    arr = np.array(mesh)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.size == 0:
        raise ValueError("a DeviceMesh needs at least one rank")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"mesh must hold integer ranks, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    arr.setflags(write=False)
    return arr


def _check_launcher(comm) -> None:
    """RuntimeError when the launcher started several processes but each one's
    world holds only itself (a launcher of another MPI library). Local: every
    process so started finds the same."""
    if comm.Get_size() == 1 and comm == _world():
        problem = _mpi_library.launcher_mismatch(1)
        if problem is not None:
            raise RuntimeError(problem)


def _check_ranks(arr: np.ndarray, comm_size: int, world: bool = False) -> None:
    if arr.size > comm_size:
        raise RuntimeError(
            f"Mesh should not be bigger than the communicator size {comm_size}, "
            f"but found {arr.size} ranks!"
            + (_mpi_library.slurm_hint(comm_size) if world else "")
        )
    if arr.min() < 0 or arr.max() >= comm_size:
        raise ValueError(
            f"mesh ranks must lie in [0, {comm_size}), got {arr.min()}..{arr.max()}"
        )
    if np.unique(arr).size != arr.size:
        raise ValueError(f"mesh ranks must be distinct, got {arr.tolist()}")


class DeviceMesh(_C.MeshBase):
    """An n-D array of ranks of an MPI communicator, with one communicator per dim.

    Collective on ``comm`` (default ``MPI.COMM_WORLD``): every rank of ``comm``
    constructs it with the same arguments, members or not (checked: otherwise every
    rank raises the same ValueError). A rank that is not in ``mesh`` gets a mesh
    whose :meth:`get_coordinate` is None.

    Example (run with ``mpiexec -n 4``)::

        >>> mesh = DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
        >>> mesh["tp"].size()
        2
    """

    def __init__(self, device_type: str, mesh, *, mesh_dim_names=None, comm=None):
        self._create(device_type, lambda: mesh, mesh_dim_names, comm)

    def _create(self, device_type, ranks, mesh_dim_names, comm) -> None:
        """Checks (``ranks()`` gives the rank array, checking its own arguments),
        agrees and builds. Collective on ``comm``."""
        comm = _world() if comm is None else comm
        _mpi_library.check_mpi_library()  # before _C sees an mpi4py communicator
        # A rank given other arguments than the rest would leave them waiting, or
        # make a mesh that pairs other ranks: every rank's checks and arguments
        # are agreed on in the creation's first all-reduce (mt_mesh_create_agreed),
        # so every rank raises the first failing rank's error.
        try:
            _check_device_type(device_type)
            _check_launcher(comm)
            arr = _as_rank_array(ranks())
            names = _check_names(mesh_dim_names, arr.ndim)
            _check_ranks(arr, comm.Get_size(), comm == _world())
            _start_watchdog()
            failure = None
        except (TypeError, ValueError, RuntimeError) as e:
            arr, names, failure = np.zeros(1, np.int64), None, e
        try:
            _comm.create(self, comm, arr.shape, arr.ravel().astype(np.intc),
                         fingerprint((device_type, names)), failure)
        except (TypeError, ValueError, RuntimeError) as e:
            if failure is not None and str(e) == str(failure):
                raise failure from None
            raise
        _timemodel.model_for(comm, self)
        _departure.listen(self)  # the first mesh over the world: collective
        self._init(device_type, arr, names, comm)

    def _init(self, device_type, arr, names, comm) -> None:
        """The Python side of a mesh whose communicators the C base owns."""
        self.device_type = device_type
        self._mesh = arr
        self._names = names
        self._comm = comm
        coord = _comm.coordinate(self)
        self._coordinate = None if coord is None else list(coord)
        self._rank = comm.Get_rank()
        # A slice knows the mesh it was cut from, and whether this rank's slice is
        # the first of its kind (coordinate 0 on every dim cut away), so that a
        # state_dict's replicated slices are saved once.
        self._root: "DeviceMesh | None" = None
        self._first_slice = True
        # Each dim's offsets among the root's row-major positions (_mesh_layout);
        # a slice or a derived mesh sets its own.
        self._offsets = root_offsets(arr.shape)
        # A root's flattened dims by name (torch's _flatten_mapping), and the meshes
        # made over its communicator whose dims derived meshes slice (carriers).
        self._flatten_mapping: dict[str, DeviceMesh] = {}
        self._carriers: list[DeviceMesh] = []
        # Parsed basic-indexing keys, and the reshapes of each rank's block in
        # place (FIFO, bounded); every decision and plan of operations and
        # redistributes lives in the C base's memo.
        self._index_keys: dict = {}
        self._block_reshapes: dict = {}
        # Operands on equal meshes mix in the executor, which compares these keys.
        self._equal_key = (fingerprint(self._key()) & 0xFFFFFFFFFFFFFFFF) or 1
        # A Replicate DTensor mixes into operations on meshes of the same ranks.
        self._ranks_key = (fingerprint((self._comm.handle, sorted(arr.ravel().tolist())))
                           & 0xFFFFFFFFFFFFFFFF) or 1
        _live_meshes[id(self)] = self

    # -- the executor's caches ---------------------------------------------------
    def _dispatch_stats(self) -> dict:
        """{hits, misses, decisions, plans, layouts, and their limits} of this
        mesh's decision memo and layout table. Local."""
        return _comm.dispatch_stats(self._tables)

    def _dispatch_clear(self) -> None:
        """Forgets this mesh's decisions and layouts (ids are not reused). Local."""
        st = self._dispatch_stats()
        self._set_cache_limits(st["decision_limit"], st["plan_limit"], st["layout_limit"])

    # -- structure ---------------------------------------------------------------
    @property
    def mesh(self) -> np.ndarray:
        """The (read-only) array of ranks of ``comm`` that make up this mesh. Local.

        Example: ``init_device_mesh("cpu", (2, 2)).mesh.tolist() == [[0, 1], [2, 3]]``.
        """
        return self._mesh

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None:
        """Names of the mesh dims, or None. Local.

        Example: ``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        .mesh_dim_names == ("dp", "tp")``.
        """
        return self._names

    @property
    def ndim(self) -> int:
        """Number of mesh dims. Local.

        Example: ``init_device_mesh("cpu", (2, 2)).ndim == 2``.
        """
        return self._mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        """Size of each mesh dim. Local.

        Example: ``init_device_mesh("cpu", (2, 2)).shape == (2, 2)``.
        """
        return tuple(self._mesh.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        """Number of ranks in the mesh, or along ``mesh_dim``. Local.

        Example::

            >>> init_device_mesh("cpu", (2, 2)).size(1)
            2
        """
        if mesh_dim is None:
            return int(self._mesh.size)
        return int(self._mesh.shape[self._dim_index(mesh_dim)])

    def _dim_index(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if self._names is None or mesh_dim not in self._names:
                raise KeyError(
                    f"Mesh dimension '{mesh_dim}' does not exist. Available mesh "
                    f"dimensions are: mesh_dim_names={self._names}"
                )
            return self._names.index(mesh_dim)
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, (int, np.integer)):
            raise TypeError(f"mesh_dim must be an int or a name, got {mesh_dim!r}")
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim {mesh_dim} is out of range for a {self.ndim}-D mesh")
        return int(mesh_dim) % self.ndim

    def _only_dim(self, mesh_dim, what: str) -> int:
        if mesh_dim is None:
            if self.ndim > 1:
                raise RuntimeError(
                    f"Found the DeviceMesh have {self.ndim} dimensions. Optional kwarg "
                    f"`mesh_dim` needs to be specified when device_mesh.ndim > 1 "
                    f"({what})."
                )
            return 0
        return self._dim_index(mesh_dim)

    # -- this rank -----------------------------------------------------------------
    def get_rank(self) -> int:
        """This process's rank in the mesh's communicator. Local.

        Example: ``init_device_mesh("cpu", (4,)).get_rank() == MPI.COMM_WORLD.Get_rank()``.
        """
        return self._rank

    def get_coordinate(self) -> list[int] | None:
        """This rank's coordinate on the mesh, or None when it is not a member. Local.

        Example::

            >>> init_device_mesh("cpu", (2, 2)).get_coordinate()  # on rank 3
            [1, 1]
        """
        return None if self._coordinate is None else list(self._coordinate)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's coordinate along ``mesh_dim`` (required on an N-D mesh). Local.

        Example: on rank 2 of a ``(2, 2)`` mesh named ``("dp", "tp")``,
        ``mesh.get_local_rank("dp") == 1`` and ``mesh.get_local_rank("tp") == 0``.
        """
        flat = self._flattened_dim(mesh_dim)
        if flat is not None:
            return flat.get_local_rank()
        d = self._only_dim(mesh_dim, "get_local_rank")
        if self._coordinate is None:
            raise RuntimeError(f"rank {self._rank} is not a member of {self!r}")
        return self._coordinate[d]

    def get_group(self, mesh_dim: int | str | None = None):
        """The mpi4py communicator of ``mesh_dim`` (required on an N-D mesh). Local.

        The communicator belongs to the mesh: use it, do not ``Free()`` it. A
        non-member gets ``MPI.COMM_NULL``. The name of a dim flattened from the
        mesh's root (:meth:`_flatten`) gives that dim's communicator, as torch's.

        Example::

            >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            >>> mesh.get_group("tp").Get_size()
            2
        """
        flat = self._flattened_dim(mesh_dim)
        if flat is not None:
            return flat.get_group()
        return self.get_all_groups()[self._only_dim(mesh_dim, "get_group")]

    def _flattened_dim(self, mesh_dim) -> "DeviceMesh | None":
        """The flattened mesh that ``mesh_dim`` names on this mesh's root (torch's
        get_group and get_local_rank take such names on any mesh of the root),
        or None."""
        if not isinstance(mesh_dim, str) or (self._names and mesh_dim in self._names):
            return None
        return self._get_root_mesh()._flatten_mapping.get(mesh_dim)

    def get_all_groups(self) -> list:
        """The mpi4py communicators of every mesh dim, in order. Local.

        Example: ``[g.Get_size() for g in init_device_mesh("cpu", (2, 2)).get_all_groups()]``
        is ``[2, 2]``.
        """
        from mpi4py import MPI

        return [MPI.Intracomm(c) if c != MPI.COMM_NULL else MPI.COMM_NULL
                for c in _comm.dim_groups(self)]

    # -- nodes ---------------------------------------------------------------------
    def _node_layout(self) -> dict:
        """What this mesh learnt of its nodes when it was made, as its plans price
        them. Local. ``nodes``: ``"one"`` (the whole mesh on one node),
        ``"blocks"`` (its ranks, in mesh order, fill nodes of equal size, one rank
        each included), ``"unequal"`` (consecutive ranks, nodes of ``smallest`` to
        ``largest``) or ``"interleaved"`` (a node's ranks are not consecutive), with
        the ``count`` of nodes; ``ranks_per_node``: 0 on one node, the block size,
        or 1 for unequal and interleaved nodes, which plans price as one rank per
        node; ``inside`` and ``across``: the dims (names, or indices on an unnamed
        mesh) whose groups stay inside a node, and those whose groups span nodes.

        Example: on 2 nodes of 2 ranks, ``init_device_mesh("cpu", (2, 2),
        mesh_dim_names=("dp", "tp"))._node_layout()`` is ``{"nodes": "blocks",
        "count": 2, "smallest": 2, "largest": 2, "ranks_per_node": 2, "inside":
        ["tp"], "across": ["dp"]}``.
        """
        kind, count, smallest, largest = _comm.nodes(self)
        k = int(_comm.mesh_time_model(self)[7])
        numel, stride = self.size(), 1
        strides = []
        for n in reversed(self.shape):
            strides.insert(0, stride)
            stride *= n
        inside, across = [], []
        for d, (n, s) in enumerate(zip(self.shape, strides)):
            # As the C time model's link of a group (mt_time_link): `n` members
            # `s` apart span n * s positions, within a node when such spans tile them.
            local = n <= 1 or k == 0 or k >= numel or (n * s <= k and k % (n * s) == 0)
            (inside if local else across).append(self._names[d] if self._names else d)
        return {"nodes": kind, "count": count, "smallest": smallest, "largest": largest,
                "ranks_per_node": k, "inside": inside, "across": across}

    # -- slicing -------------------------------------------------------------------
    def __getitem__(self, names: str | Sequence[str]) -> "DeviceMesh":
        """The sub-mesh over the named dims that holds this rank. Local.

        On a root mesh, the names of its flattened dims (:meth:`_flatten`) slice
        too, alone or with the root's other dims, as torch's do (with torch's
        warning that such slicing is to be deprecated).

        Example::

            >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            >>> mesh["tp"].mesh  # on rank 2
            array([2, 3])
        """
        if self._names is None:
            raise RuntimeError("Cannot slice a DeviceMesh without mesh_dim_names!")
        names = (names,) if isinstance(names, str) else tuple(names)
        flat = self._flatten_mapping if self._root is None else {}
        for n in names:
            if n not in self._names and n not in flat:
                raise KeyError(
                    f"Invalid mesh_dim_name {n!r} specified. Valid mesh_dim_names "
                    f"are {[*self._names, *flat]}."
                )
        if any(n not in self._names for n in names):
            return self._slice_flattened(names)
        dims = [self._names.index(n) for n in names]
        if dims != sorted(set(dims)):
            raise KeyError(
                f"Invalid mesh_dim_names {names} specified. Mesh dim indices should be "
                f"distinct and in the order of {self._names}."
            )
        if names == self._names:
            return self
        return self._slice(dims)

    def _slice_flattened(self, names: tuple) -> "DeviceMesh":
        """A root's slice that names flattened dims: a slice of the mesh that
        flattening made, never a new one (Local)."""
        warnings.warn("Slicing a flattened dim from root mesh will be deprecated in PT "
                      "2.11. Users need to bookkeep the flattened mesh directly. ",
                      stacklevel=3)
        if len(names) == 1:
            return self._flatten_mapping[names[0]]
        offsets = [self._offsets[self._names.index(n)] if n in self._names
                   else self._flatten_mapping[n]._offsets[0] for n in names]
        spans = [int(o.max()) for o in offsets if len(o) > 1]
        if spans != sorted(set(spans), reverse=True):
            raise KeyError(f"Invalid mesh_dim_names {names} specified. Mesh dim indices "
                           f"should be in ascending order.")
        if cosets(offsets, self.size()) is None:
            raise RuntimeError(f"Slicing overlapping dim_names {names} is not allowed.")
        found = _derived(self, offsets, names)
        if found is None:
            raise NotImplementedError(
                f"mesh[{names}]: these dims share no mesh of communicators; make one "
                f"with DeviceMesh._concatenate([mesh[...], mesh[...]]) (collective), "
                f"or flatten them together")
        return found

    def _slice(self, dims: list[int], names=None) -> "DeviceMesh":
        coord = self._coordinate or [0] * self.ndim
        index = tuple(slice(None) if d in dims else coord[d] for d in range(self.ndim))
        sub = DeviceMesh.__new__(DeviceMesh)
        if names is None and self._names is not None:
            names = tuple(self._names[d] for d in dims)
        _comm.slice_into(sub, self, dims)
        sub._init(self.device_type, self._mesh[index], names, self._comm)
        sub._root = self._get_root_mesh()
        sub._offsets = tuple(self._offsets[d] for d in dims)
        sub._first_slice = self._first_slice and all(
            coord[d] == 0 for d in range(self.ndim) if d not in dims)
        return sub

    def _dim_mesh(self, mesh_dim: int) -> "DeviceMesh":
        """The 1-D mesh of dim ``mesh_dim`` through this rank, made once per mesh
        (its decisions and plans stay cached with it): what a functional
        collective on ``(mesh, dim)`` runs on. Local."""
        d = self._dim_index(mesh_dim)
        if self.ndim == 1:
            return self
        cache = self.__dict__.setdefault("_dim_meshes", {})
        if d not in cache:
            cache[d] = self._slice([d])
        return cache[d]

    def _get_root_mesh(self) -> "DeviceMesh":
        """The mesh this one was sliced from (itself when not a slice), as torch's."""
        return self._root if self._root is not None else self

    # -- flatten, unflatten, concatenate --------------------------------------------
    def _flatten(self, mesh_dim_name: str | None = None,
                 backend_override=None) -> "DeviceMesh":
        """A 1-D mesh through this mesh's dims (row-major: the first dim slowest),
        named ``mesh_dim_name`` (default: the names joined by ``_``), as torch's.
        The root mesh keeps it: ``root[name]``, ``root.get_group(name)`` and a later
        ``_flatten`` of the same dims and name give it back; the same name for
        other dims, or a name of the root's own dims, is a ValueError. A 1-D mesh
        flattened to its own name is itself.

        Collective on the root mesh's communicator (every rank calls it with the
        same arguments; a rank's bad argument raises on every rank): the first
        flattening of a name makes its communicators.

        Example (``mpiexec -n 4``)::

            >>> mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp", "cp", "tp"))
            >>> mesh["dp", "cp"]._flatten("dp_cp").mesh   # on rank 1
            array([1, 3])
            >>> mesh["dp_cp"].size()
            2
        """
        root = self._get_root_mesh()
        name, merged, failure = mesh_dim_name, None, None
        try:
            _no_backend(backend_override)
            if not self._names:
                raise RuntimeError("Cannot flatten a DeviceMesh without mesh_dim_names!")
            if not name:
                name = "_".join(self._names)
            if not isinstance(name, str):
                raise TypeError(f"mesh_dim_name must be a str, got {name!r}")
            if not (self.ndim == 1 and name in self._names):
                if root._names and name in root._names:
                    raise ValueError(
                        f"{name} already exists for submesh of the {root}. The "
                        f"mesh_dim_names of submesh and flattened mesh are "
                        f"{root._names}. Please specify another valid mesh_dim_name.")
                merged = flattened(self._offsets)
                old = root._flatten_mapping.get(name)
                if old is not None and not same_offsets(old._offsets[0], merged):
                    raise ValueError(
                        f"Flatten mesh with mesh_dim_name {name} has been created "
                        f"before, Please specify another valid mesh_dim_name.")
        except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
            failure = e
        _agree_on(root, failure, ("flatten", name, self.shape,
                                  [o.tolist() for o in self._offsets]))
        if merged is None:
            return self
        if name in root._flatten_mapping:
            return root._flatten_mapping[name]
        flat = _derived(root, [merged], (name,))
        if flat is None:
            # The carrier keeps the root's other dims beside the flattened one, so
            # that root[other, name] slices it too.
            dims = [next((d for d, r in enumerate(root._offsets) if same_offsets(r, o)),
                         None) for o in self._offsets]
            dims = [] if None in dims else dims
            carrier = [merged] if not dims else \
                [merged if d == dims[0] else root._offsets[d]
                 for d in range(root.ndim) if d == dims[0] or d not in dims]
            _carrier(root, carrier)
            flat = _derived(root, [merged], (name,))
        root._flatten_mapping[name] = flat
        return flat

    def _unflatten(self, dim: int | str, mesh_sizes, mesh_dim_names,
                   backend_override=None) -> "DeviceMesh":
        """This mesh with dim ``dim`` split into dims of ``mesh_sizes`` named
        ``mesh_dim_names`` (row-major: the first new dim slowest), as torch's.
        The new dims are reached through the mesh returned, not through the root.

        Collective on the root mesh's communicator (every rank calls it with the
        same arguments; a rank's bad argument raises on every rank): new
        communicators are made unless a mesh made before has these dims.

        Example (``mpiexec -n 4``)::

            >>> world = init_device_mesh("cpu", (4,), mesh_dim_names=("world",))
            >>> mesh = world._unflatten(0, (2, 2), ("dp", "tp"))
            >>> mesh["tp"].mesh    # on rank 2
            array([2, 3])
        """
        root = self._get_root_mesh()
        offsets = names = failure = None
        try:
            _no_backend(backend_override)
            if isinstance(dim, int) and not isinstance(dim, bool) and dim >= self.ndim:
                raise ValueError(f"dim {dim} specified in `_unflatten` is out of range "
                                 f"{self.ndim}")
            if isinstance(dim, str) and dim not in (self._names or ()):
                raise ValueError(f"dim {dim} specified in `_unflatten` is not in "
                                 f"{self._names}")
            sizes, new_names = tuple(mesh_sizes), tuple(mesh_dim_names)
            if len(sizes) != len(new_names):
                raise RuntimeError("mesh_dim_names must have same length as mesh_sizes "
                                   "in _unflatten!")
            if self._names is None:
                raise RuntimeError("Cannot unflatten a DeviceMesh without mesh_dim_names!")
            d = self._dim_index(dim)
            if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool)
                       and n >= 1 for n in sizes):
                raise ValueError(f"mesh_sizes must be positive ints, got {sizes}")
            if math.prod(sizes) != self.shape[d]:
                raise ValueError(
                    f"The product of mesh_sizes={sizes} is {math.prod(sizes)}, but the "
                    f"original dimension at dim={d} has size {self.shape[d]}. These "
                    f"must be equal for unflatten to work correctly.")
            parts = unflattened(self._offsets[d], [int(n) for n in sizes])
            if parts is None:
                raise ValueError(f"mesh_sizes={sizes} cut across the dims that dim {d} "
                                 f"was flattened from")
            names = list(self._names)
            names[d:d + 1] = new_names
            names = _check_names(names, len(names))
            offsets = [*self._offsets[:d], *parts, *self._offsets[d + 1:]]
        except (TypeError, ValueError, RuntimeError, IndexError, KeyError,
                NotImplementedError) as e:
            failure = RuntimeError(str(e)) if isinstance(e, KeyError) else e
        _agree_on(root, failure, ("unflatten", names,
                                  None if offsets is None else [o.tolist() for o in offsets]))
        return _derived_or_made(root, offsets, names)

    @staticmethod
    def _concatenate(device_mesh_list: list["DeviceMesh"]) -> "DeviceMesh":
        """One mesh with the dims of every mesh of ``device_mesh_list`` in order (all
        from the same root mesh, none overlapping another), as torch's.

        Collective on the root mesh's communicator (every rank calls it with the
        same arguments; a bad one raises on every rank): new communicators are made
        unless a mesh made before has these dims (the root's own, in order, need
        none).

        Example (``mpiexec -n 4``)::

            >>> mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp", "cp", "tp"))
            >>> DeviceMesh._concatenate([mesh["dp"], mesh["tp"]]).mesh_dim_names
            ('dp', 'tp')
        """
        meshes = list(device_mesh_list)
        if not meshes or not all(isinstance(m, DeviceMesh) for m in meshes):
            raise TypeError("_concatenate takes a non-empty list of DeviceMesh")
        root = meshes[0]._get_root_mesh()
        offsets = names = failure = None
        try:
            if any(m._get_root_mesh() != root for m in meshes):
                raise RuntimeError("Cannot concatenate DeviceMeshes derived from different "
                                   "device meshs")
            if any(m._names is None for m in meshes):
                raise RuntimeError("Cannot concatenate a DeviceMesh without mesh_dim_names")
            offsets = [o for m in meshes for o in m._offsets]
            if cosets(offsets, root.size()) is None:
                raise RuntimeError(f"Cannot concatenate overlapping meshes: {meshes}")
            names = _check_names([n for m in meshes for n in m._names], len(offsets))
        except (TypeError, ValueError, RuntimeError) as e:
            failure = e
        _agree_on(root, failure, ("concatenate", names,
                                  None if offsets is None else [o.tolist() for o in offsets]))
        return _derived_or_made(root, offsets, names)

    @staticmethod
    def from_group(group, device_type: str, mesh=None, *,
                   mesh_dim_names=None) -> "DeviceMesh":
        """A mesh over an mpi4py communicator (torch's ProcessGroup), or over a list
        of them, one per mesh dim, as torch's ``DeviceMesh.from_group``.

        One communicator: a 1-D mesh of its ranks, numbered as the communicator
        numbers them (torch numbers them in its default group; the two agree for
        ``MPI.COMM_WORLD``); ``mesh``, if given, must be those ranks
        (ValueError). Collective on ``group``.

        A list: ``mesh`` (ranks of ``MPI.COMM_WORLD``, as torch's global ranks)
        and ``mesh_dim_names`` are required, ``mesh`` has one dim per
        communicator, and communicator ``d`` must hold, in order, the ranks of this
        rank's line along mesh dim ``d`` (ValueError on every rank otherwise). The
        mesh makes its own communicators over those lines: collective on
        ``MPI.COMM_WORLD``.

        Example (``mpiexec -n 4``)::

            >>> tp = MPI.COMM_WORLD.Split(MPI.COMM_WORLD.Get_rank() // 2)
            >>> DeviceMesh.from_group(tp, "cpu", mesh_dim_names=("tp",)).shape
            (2,)
        """
        from mpi4py import MPI  # imported here so that `import mpitensor` does not start MPI

        if isinstance(group, MPI.Comm):
            if not isinstance(group, MPI.Intracomm) or group == MPI.COMM_NULL:
                raise TypeError(f"from_group needs an intracommunicator, got {group!r}")

            def ranks():
                own = list(range(group.Get_size()))
                given = None if mesh is None else np.asarray(mesh).tolist()
                if given is not None and given != own:
                    raise ValueError(f"Invalid mesh {given} for ProcessGroup with ranks "
                                     f"{own}")
                return np.asarray(own)

            out = DeviceMesh.__new__(DeviceMesh)
            out._create(device_type, ranks, mesh_dim_names, group)
            return out
        if isinstance(group, (str, bytes)) or not isinstance(group, (list, tuple)):
            raise TypeError(f"from_group takes an mpi4py communicator or a list of them, "
                            f"got {type(group).__name__}")
        groups = list(group)

        def ranks():
            if not groups:
                raise ValueError("Expects at least one ProcessGroup to be passed")
            if mesh is None:
                raise ValueError("Must pass mesh if passing multiple ProcessGroups")
            if mesh_dim_names is None:
                raise ValueError("Must pass mesh_dim_names if passing multiple "
                                 "ProcessGroups")
            arr = _as_rank_array(mesh)
            if arr.ndim != len(groups):
                raise ValueError(f"Expects mesh with ndim equal to number of "
                                 f"ProcessGroups but got mesh {arr.tolist()} and "
                                 f"{len(groups)} ProcessGroups")
            _check_lines(arr, groups, _world())
            return arr

        out = DeviceMesh.__new__(DeviceMesh)
        out._create(device_type, ranks, mesh_dim_names, None)
        return out

    # -- default mesh --------------------------------------------------------------
    def __enter__(self) -> "DeviceMesh":
        _mesh_stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _mesh_stack.pop()

    # -- identity ------------------------------------------------------------------
    def _key(self):
        # The same ranks of two different communicators are different processes,
        # so the communicator is part of a mesh's identity.
        return (self._comm.handle, self._mesh.shape, self._mesh.tobytes(), self._names)

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        return isinstance(other, DeviceMesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        names = "" if self._names is None else f", mesh_dim_names={self._names}"
        return f"DeviceMesh('{self.device_type}', {self._mesh.tolist()}{names})"


# 1-D meshes made over communicators passed to functional collectives, by handle,
# with the communicator object they were made for (a freed one is forgotten).
_group_meshes: dict[int, tuple] = {}


def mesh_of_group(comm) -> DeviceMesh:
    """The 1-D mesh whose communicator is ``comm`` (an mpi4py intracommunicator,
    torch's ProcessGroup): the dim of a live mesh whose group it is (Local), else a
    mesh made over it once (:meth:`DeviceMesh.from_group`, collective on ``comm``)
    and kept while ``comm`` is not freed.

    Example: ``mesh_of_group(mesh.get_group("tp")).size() == mesh.size("tp")``.
    """
    from mpi4py import MPI  # imported here so that `import mpitensor` does not start MPI

    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise ValueError(f"Unsupported group type: {type(comm)}, {comm}")
    handle = MPI._handleof(comm)
    for mesh in [*_mesh_stack, *list(_live_meshes.values())]:
        if (mesh._coordinate is None or getattr(mesh, "_local", False)
                or not _usable_here(mesh)):
            continue
        for d, group in enumerate(_comm.dim_groups(mesh)):
            if group != MPI.COMM_NULL and MPI._handleof(group) == handle:
                return mesh._dim_mesh(d)
    for key, (held, _) in list(_group_meshes.items()):
        if held == MPI.COMM_NULL:
            del _group_meshes[key]
    if handle not in _group_meshes:
        _group_meshes[handle] = (comm, DeviceMesh.from_group(comm, "cpu"))
    return _group_meshes[handle][1]


def _usable_here(mesh) -> bool:
    """Whether this thread may run ``mesh``'s collectives (the thread that made it,
    and the mesh not freed): a live mesh another thread made, over the same
    communicator, is not this thread's group. Local."""
    try:
        _comm.checked(mesh)
    except RuntimeError:
        return False
    return True


def _no_backend(backend_override) -> None:
    """MPI is the one backend: torch's backend_override has nothing to choose."""
    if backend_override is not None:
        raise NotImplementedError("mpitensor meshes communicate through MPI: "
                                  "backend_override has no backend to choose")


def _agree_on(root: DeviceMesh, failure, what) -> None:
    """Every member of ``root`` raises the first failing member's error, or a
    ValueError when the members passed different arguments (``what``); the
    arguments of a mesh derivation are agreed before any communicator is made.
    Collective on ``root``'s members."""
    state = (what, sorted(root._flatten_mapping), len(root._carriers))
    try:
        _comm.agree(root, failure is None, fingerprint(repr(state)),
                    str(failure) if failure is not None else
                    f"the ranks of {root} passed different arguments to {what[0]} (or "
                    f"derived other meshes before): every rank must make the same calls",
                    type(failure) if failure is not None else ValueError)
    except Exception as e:
        if failure is not None and str(e) == str(failure):
            raise failure from None
        raise


def _derived(root: DeviceMesh, offsets, names) -> "DeviceMesh | None":
    """A slice, named ``names``, of the first mesh over ``root``'s ranks (the root
    or a carrier) that has dims of these offsets in this order, or None. Local."""
    for carrier in (root, *root._carriers):
        dims: list[int] = []
        for o in offsets:
            # Dims of one rank all have the offsets [0]: each takes the next one.
            hit = [d for d, co in enumerate(carrier._offsets)
                   if same_offsets(co, o) and (not dims or d > dims[-1])]
            if not hit:
                break
            dims.append(hit[0])
        if len(dims) == len(offsets):
            out = carrier._slice(dims, None if names is None else tuple(names))
            out._root = root
            return out
    return None


def _carrier(root: DeviceMesh, offsets) -> DeviceMesh:
    """A new mesh over ``root``'s communicator with dims of ``offsets`` (and, when
    they cut the root into several groups, a first dim across the groups), kept by
    the root for the meshes derived from it. Collective on the root's
    communicator."""
    starts = cosets(offsets, root.size())
    table = positions(offsets)
    ranks = root.mesh.ravel()
    if starts.size > 1:
        arr = ranks[starts.reshape((-1,) + (1,) * table.ndim) + table]
        dims = (starts, *offsets)
    else:
        arr, dims = ranks[table], tuple(offsets)
    carrier = DeviceMesh.__new__(DeviceMesh)
    carrier._create(root.device_type, lambda: arr, None, root._comm)
    carrier._root = root
    carrier._offsets = tuple(np.asarray(o, np.int64) for o in dims)
    root._carriers.append(carrier)
    return carrier


def _derived_or_made(root: DeviceMesh, offsets, names) -> DeviceMesh:
    """:func:`_derived`, making a carrier of exactly these dims when no mesh has
    them. Collective on the root's communicator when it makes one."""
    found = _derived(root, offsets, names)
    if found is None:
        _carrier(root, offsets)
        found = _derived(root, offsets, names)
    return found


def _check_lines(arr: np.ndarray, groups, world) -> None:
    """Each communicator of ``groups`` must hold, in order, the world ranks of this
    rank's line of ``arr`` along its dim (from_group of several groups)."""
    from mpi4py import MPI  # imported here so that `import mpitensor` does not start MPI

    me = world.Get_rank()
    at = np.argwhere(arr == me)
    for d, g in enumerate(groups):
        if not isinstance(g, MPI.Intracomm) or g == MPI.COMM_NULL:
            raise TypeError(f"from_group: group {d} is not an mpi4py intracommunicator: "
                            f"{g!r}")
        if not len(at):
            continue
        index = tuple(slice(None) if k == d else c for k, c in enumerate(at[0]))
        line = arr[index].tolist()
        mine, whole = g.Get_group(), world.Get_group()
        try:
            held = mine.Translate_ranks(list(range(g.Get_size())), whole)
        finally:
            mine.Free()
            whole.Free()
        if list(held) != line:
            raise ValueError(f"from_group: group {d} holds the world ranks {list(held)} "
                             f"but the mesh's dim {d} through rank {me} holds {line}")


def init_device_mesh(device_type: str, mesh_shape: Iterable[int], *,
                     mesh_dim_names=None, comm=None) -> DeviceMesh:
    """A mesh of shape ``mesh_shape`` over ranks ``0..prod(mesh_shape)-1`` of ``comm``.

    Collective on ``comm`` (default ``MPI.COMM_WORLD``). Every rank must pass the
    same arguments: they are checked on every rank (one small all-reduce), and a
    rank that passed another shape or other names makes every rank raise the same
    ValueError, as a bad argument on one rank raises its error on every rank.

    One size may be ``-1``, as in ``numpy.reshape``: the communicator's ranks divided
    by the other sizes (ValueError on every rank when they do not divide them). On a
    cluster, ``(-1, ranks_per_node())`` makes the first dim span the nodes and the
    second stay inside one (see :func:`ranks_per_node`).

    Example (``mpiexec -n 4``)::

        >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        >>> mesh.shape
        (2, 2)
        >>> init_device_mesh("cpu", (-1, 2)).shape
        (2, 2)
    """
    def ranks():
        shape = tuple(mesh_shape) if not isinstance(mesh_shape, int) else (mesh_shape,)
        shape = _infer_size(shape, (_world() if comm is None else comm).Get_size())
        if mesh_dim_names is not None:
            _check_names(mesh_dim_names, len(shape))
        return np.arange(math.prod(shape)).reshape(shape)

    mesh = DeviceMesh.__new__(DeviceMesh)
    mesh._create(device_type, ranks, mesh_dim_names, comm)
    return mesh


def _infer_size(shape: tuple, size: int) -> tuple[int, ...]:
    """``shape`` with its -1 (if any) replaced by what makes it hold ``size`` ranks;
    ValueError for sizes that are not positive ints, or that cannot fit."""
    def is_int(s):
        return not isinstance(s, bool) and isinstance(s, (int, np.integer))

    if not all(is_int(s) and (s >= 1 or s == -1) for s in shape) or \
            sum(s == -1 for s in shape) > 1:
        zero = " (a size of 0: was it ranks // per_node with fewer ranks than per_node?)" \
            if any(is_int(s) and s == 0 for s in shape) else ""
        raise ValueError(f"mesh_shape must hold positive ints and at most one -1, got "
                         f"{shape}{zero}")
    if -1 not in shape:
        return tuple(int(s) for s in shape)
    rest = math.prod(int(s) for s in shape if s != -1)
    if size % rest:
        raise ValueError(
            f"mesh_shape {shape}: the other sizes (product {rest}) do not divide the "
            f"{size} ranks of the communicator, so no size for -1 fits; start a "
            f"multiple of {rest} ranks, or choose sizes that divide {size}")
    return tuple(size // rest if s == -1 else int(s) for s in shape)


def _node_table(comm) -> list[tuple[int, str]]:
    """(the lowest rank on its node, the node's name) of every rank of ``comm``, by
    rank: the ranks that share memory (``MPI_COMM_TYPE_SHARED``, what the C mesh
    calls a node). Collective on ``comm``."""
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        leader = node.allreduce(comm.Get_rank(), op=MPI.MIN)
    finally:
        node.Free()
    return comm.allgather((leader, MPI.Get_processor_name()))


def _node_layout_problem(table: list[tuple[int, str]]) -> str | None:
    """Why ranks laid out as ``table`` (:func:`_node_table`) fill no (nodes, ranks
    per node) mesh, or None when they do. Local: every rank that has the same table
    gives the same answer."""
    nodes: dict[int, list[int]] = {}
    for r, (leader, _) in enumerate(table):
        nodes.setdefault(leader, []).append(r)

    def named(leader):
        return f"{table[leader][1]} (ranks {_ranges(nodes[leader])})"

    counts = {len(members) for members in nodes.values()}
    if len(counts) > 1:
        return ("the nodes hold different numbers of ranks: "
                + ", ".join(named(n) for n in nodes)
                + ". A (nodes, ranks per node) mesh needs as many on each: start the same "
                  "number on every node (Open MPI: equal slots in the hostfile or "
                  "--map-by ppr:N:node; MPICH: -ppn N; SLURM: --ntasks-per-node=N), or "
                  "build the mesh from explicit ranks with DeviceMesh")
    if any(members != list(range(members[0], members[0] + len(members)))
           for members in nodes.values()):
        return ("the ranks of a node are not consecutive: "
                + ", ".join(named(n) for n in nodes)
                + ". A mesh's last dim stays inside a node only when each node holds "
                  "consecutive ranks: place them in blocks (Open MPI: its default or "
                  "--map-by slot, not --map-by node; MPICH: -ppn N or host:N in the "
                  "hostfile; SLURM: --distribution=block), or build the mesh from "
                  "explicit ranks with DeviceMesh")
    return None


def _ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def ranks_per_node(comm=None) -> int:
    """How many ranks of ``comm`` (default ``MPI.COMM_WORLD``) run on each node: the
    size of a mesh dim that stays inside a node, as torch users take it from
    ``LOCAL_WORLD_SIZE``. A node is what MPI finds shares memory
    (``MPI_COMM_TYPE_SHARED``); one machine is one node.

    Collective on ``comm``. The nodes must hold the same number of ranks each, in
    consecutive blocks (ranks 0 to k-1 on the first node, and so on, as Open MPI's
    ``mpiexec`` and ``srun`` place them by default); otherwise every rank raises
    the same RuntimeError, naming each node and its ranks, and how to launch so
    that they fit.

    Example (``mpiexec -n 8`` over 2 nodes of 4 ranks; data parallel across the
    nodes, tensor parallel inside each)::

        >>> ranks_per_node()
        4
        >>> mesh = init_device_mesh("cpu", (-1, ranks_per_node()),
        ...                         mesh_dim_names=("dp", "tp"))
        >>> mesh.shape
        (2, 4)
    """
    comm = _world() if comm is None else comm
    _mpi_library.check_mpi_library()
    table = _node_table(comm)
    problem = _node_layout_problem(table)
    if problem is not None:
        raise RuntimeError(f"ranks_per_node: {problem}")
    return sum(leader == 0 for leader, _ in table)


# The C base's memo and layout table take their bounds from here.
_C.set_cache_limits(_limits["decisions"], _limits["plans"], _limits["layouts"])


def set_cache_limits(*, decisions: int | None = None, layouts: int | None = None,
                     plans: int | None = None) -> dict:
    """Bounds of each mesh's caches, for every mesh, live or future; returns the
    bounds now in force. Local (each rank bounds its own memory). Defaults:
    4096 decisions of operations and redistributes, 4096 layouts, 256 plans held
    by those decisions (a mesh also keeps at most 256 parsed indexing keys).
    Changing a bound empties the caches of the live meshes; past a bound the
    least recently used decisions go (CLOCK), to be made again when needed.

    Example::

        >>> mpitensor.set_cache_limits(decisions=1024, plans=64)
        {'decisions': 1024, 'layouts': 4096, 'plans': 64}
    """
    for name, value in (("decisions", decisions), ("layouts", layouts), ("plans", plans)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"set_cache_limits: {name} must be a positive int, got {value!r}")
        _limits[name] = int(value)
    _C.set_cache_limits(_limits["decisions"], _limits["plans"], _limits["layouts"])
    for mesh in list(_live_meshes.values()):
        mesh._set_cache_limits(_limits["decisions"], _limits["plans"], _limits["layouts"])
        mesh._index_keys.clear()
        mesh._block_reshapes.clear()
    return dict(_limits)
