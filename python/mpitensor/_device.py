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

    __slots__ = ("_type",)

    def __init__(self, type: str = "cpu", index: int | None = None):  # noqa: A002
        if isinstance(type, device):
            type = type.type  # noqa: A001
        if type != "cpu" or index not in (None, 0):
            raise ValueError(f"mpitensor arrays live on the CPU: device must be 'cpu', "
                             f"got {type!r}" + (f" (index {index})" if index else ""))
        object.__setattr__(self, "_type", "cpu")

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
