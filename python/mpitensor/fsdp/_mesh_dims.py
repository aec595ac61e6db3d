"""``DataParallelMeshDims``: which dims of a whole SPMD mesh are data parallel, as
torch 2.13's ``fully_shard(..., dp_mesh_dims=)`` names them, and the data-parallel
mesh fully_shard works on that they give."""

from __future__ import annotations

from dataclasses import dataclass

from ..device_mesh import DeviceMesh

__all__ = ["DataParallelMeshDims"]


@dataclass(frozen=True)
class DataParallelMeshDims:
    """The dims of a :class:`DeviceMesh` that ``fully_shard`` treats as data
    parallel when the parameters are DTensors on that whole mesh (torch 2.13's
    ``DataParallelMeshDims``): ``shard`` names the dim (or dims, flattened into
    one) the parameters are sharded over, ``replicate`` the dim (or dims) they
    are replicated over (HSDP). At least one must be set (ValueError, as
    torch's). Local.

    Example (``mpiexec -n 4``)::

        >>> mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        >>> fully_shard(model, mesh=mesh, dp_mesh_dims=DataParallelMeshDims(shard="dp"))
    """

    shard: str | tuple | None = None
    replicate: str | tuple | None = None

    def __post_init__(self) -> None:
        if self.shard is None and self.replicate is None:
            raise ValueError("At least one of shard or replicate must be set in "
                             "DataParallelMeshDims")

    @property
    def shard_names(self) -> tuple:
        """The shard dims' names, as a tuple.

        Example: ``DataParallelMeshDims(shard="dp").shard_names == ("dp",)``.
        """
        return _names(self.shard)

    @property
    def replicate_names(self) -> tuple:
        """The replicate dims' names, as a tuple.

        Example: ``DataParallelMeshDims(shard="dp", replicate="r").replicate_names``.
        """
        return _names(self.replicate)


def _names(value) -> tuple:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def validate(mesh: DeviceMesh, dims: DataParallelMeshDims) -> None:
    """torch's ``_validate_mesh`` for ``dp_mesh_dims``: the same exceptions and
    words. Local (names are the same on every rank)."""
    if not isinstance(dims, DataParallelMeshDims):
        raise TypeError(f"fully_shard: dp_mesh_dims must be a DataParallelMeshDims, got "
                        f"{type(dims).__name__}")
    if dims.shard is None and dims.replicate is None:
        raise ValueError("At least one of shard or replicate must be set in dp_mesh_dims")
    if mesh.mesh_dim_names is None:
        raise ValueError("mesh must have mesh_dim_names when dp_mesh_dims is provided")
    for name in dims.shard_names + dims.replicate_names:
        if name not in mesh.mesh_dim_names:
            raise ValueError(f"Mesh dim name '{name}' not found in mesh.mesh_dim_names "
                             f"{mesh.mesh_dim_names}")
    if not dims.shard_names:
        raise NotImplementedError("fully_shard: dp_mesh_dims with replicate dims only "
                                  "(data parallelism without sharding) is not supported; "
                                  "name a shard dim")


def _submesh(mesh: DeviceMesh, names: tuple) -> DeviceMesh:
    """The dims ``names`` of ``mesh`` as one dim: the dim itself, or several
    flattened (torch's ``mesh[names]._flatten``). Collective on ``mesh`` when
    flattening creates a mesh."""
    if len(names) == 1:
        return mesh[names[0]]
    return mesh[names]._flatten("_".join(names))


def data_mesh(mesh: DeviceMesh, dims: DataParallelMeshDims) -> DeviceMesh:
    """The data-parallel mesh ``dims`` name in ``mesh``: 1-D (the shard dims) or,
    with replicate dims, 2-D ``(replicate, shard)`` (HSDP), as torch's
    ``_get_mesh_info_from_named_dims``. Collective on ``mesh`` when dims are
    flattened."""
    shard = _submesh(mesh, dims.shard_names)
    if not dims.replicate_names:
        return shard
    names = dims.replicate_names + dims.shard_names
    if len(names) == 2 and list(mesh.mesh_dim_names).index(names[0]) < \
            list(mesh.mesh_dim_names).index(names[1]):
        return mesh[names]
    raise NotImplementedError(
        f"fully_shard: dp_mesh_dims with replicate dims {dims.replicate_names} and shard "
        f"dims {dims.shard_names}: HSDP takes one replicate dim ahead of one shard dim")
