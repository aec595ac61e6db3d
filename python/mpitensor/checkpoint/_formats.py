"""Which format a path is saved in or loaded from: ``format=`` when given, else its
suffix; a load of any other name looks at what is there (a directory with an
``index.json`` is a state_dict, one with a ``zarr.json`` a Zarr store, a file
that starts with HDF5's signature an HDF5 file, anything else a .npy file).
Every function here is Local.
"""

from __future__ import annotations

import os

FORMATS = ("npy", "hdf5", "zarr")
_SUFFIXES = {".npy": "npy", ".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5",
             ".he5": "hdf5", ".nc": "hdf5", ".nc4": "hdf5", ".zarr": "zarr"}
# HDF5 files start with it at byte 0 (or after a user block, which this reader
# does not look past: name such a file .h5 or pass format="hdf5").
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def named(path: str, format=None):
    """The format ``format=`` or the suffix of ``path`` names (a netCDF-4 file,
    .nc, is HDF5), else None. ValueError for a ``format`` not in FORMATS.

    Example::

        >>> named("run/x.h5"), named("x.bin"), named("x.bin", "zarr")
        ('hdf5', None, 'zarr')
    """
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format= takes one of {', '.join(map(repr, FORMATS))}, "
                             f"got {format!r}")
        return format
    return _SUFFIXES.get(os.path.splitext(os.fspath(path))[1].lower())


def found(path: str, prefix: bytes) -> str:
    """The format of what stands at ``path`` (a directory, or a file whose first
    bytes are ``prefix``): "dict" for a state_dict directory, else as FORMATS."""
    if os.path.isdir(path):
        store = os.path.exists(os.path.join(path, "zarr.json"))
        return "zarr" if store and not os.path.exists(os.path.join(path, "index.json")) \
            else "dict"
    return "hdf5" if prefix.startswith(HDF5_SIGNATURE) else "npy"
