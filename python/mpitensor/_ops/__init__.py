"""NumPy operations on DTensors. Importing this package registers them: each
ufunc's and reduction's signature with the C dispatch (_elementwise.py,
_reductions.py), and each operation's DTensor version in mpitensor._registry,
where DTensor's entry points and the C dispatch's Python entries find them.

These modules are the entries: each normalises a call's arguments and either hands
the executor a dim map or calls an algorithm of mpitensor._algorithms, the floor
below, which registers nothing."""

from . import (_along_axis, _apply, _assemble, _bits, _composed, _counts, _cov, _delete, _diag,  # noqa: F401
               _diagonal, _elementwise, _fallback, _flip, _halo, _indexing, _inplace, _insert, _join, _kron, _like, _linalg,
               _lookup, _metadata, _meshgrid, _nan, _nonzero, _pad, _pointwise, _poly, _print, _put, _repeat,
               _reductions, _scalapack, _scatter, _searchsorted, _select, _setops, _shape, _split,
               _stats, _strided, _take, _tsqr, _unique)

__all__: list = []
