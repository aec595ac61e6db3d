"""The device of a DTensor, as torch's ``torch.device``: every array mpitensor
holds lives in the memory of a CPU process."""

from __future__ import annotations

__all__ = ["device"]


class device:
    """torch's ``torch.device`` for the one device mpitensor has: ``type`` is
    ``"cpu"``, ``index`` None; ``str()`` gives ``"cpu"`` and ``repr()`` torch's
    ``device(type='cpu')``. Equal to another device of the same type and, unlike
    torch's, to the string ``"cpu"`` (what ``DTensor.device`` was before). Frozen
    and hashable. Local.

    Example::

        >>> dt.device.type
        'cpu'
        >>> dt.device == mpitensor.device("cpu") == "cpu"
        True
    """

    __slots__ = ("_type", "_mesh")

    def __init__(self, type: str = "cpu", index: int | None = None):  # noqa: A002
        if isinstance(type, device):
            type = type.type  # noqa: A001
        if type != "cpu" or index not in (None, 0):
            raise ValueError(f"mpitensor arrays live on the CPU: device must be 'cpu', "
                             f"got {type!r}" + (f" (index {index})" if index else ""))
        object.__setattr__(self, "_type", "cpu")
        object.__setattr__(self, "_mesh", None)

    def __setattr__(self, name, value):
        raise AttributeError("a device is frozen")

    @property
    def type(self) -> str:
        """The device type, ``"cpu"``. Local.

        Example: ``dt.device.type == "cpu"``.
        """
        return self._type

    @property
    def index(self) -> None:
        """The device index: None, as torch's ``torch.device("cpu")``. Local.

        Example: ``dt.device.index is None``.
        """
        return None

    def __str__(self) -> str:
        return self._type

    def __repr__(self) -> str:
        return f"device(type={self._type!r})"

    def __eq__(self, other) -> bool:
        if isinstance(other, device):
            return other._type == self._type
        if isinstance(other, str):
            return other == self._type
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._type)

    def __reduce__(self):
        return (device, (self._type,))


CPU = device("cpu")


def on(mesh) -> device:
    """The device of the arrays on ``mesh``: the CPU, equal to every CPU device,
    which remembers the mesh, so that the array API's creation functions given
    ``device=x.device`` build on ``x``'s mesh (:func:`mesh_of`). Local.

    Example: ``on(mesh) == "cpu"`` and ``mesh_of(on(mesh)) is mesh``.
    """
    d = device("cpu")
    object.__setattr__(d, "_mesh", mesh)
    return d


def mesh_of(d):
    """The mesh a device from :func:`on` remembers, else None. Local.

    Example: ``mesh_of(dt.device) is dt.device_mesh``; ``mesh_of("cpu") is None``.
    """
    return d._mesh if isinstance(d, device) else None
