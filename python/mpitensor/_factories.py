"""DTensor factories: each rank allocates only its own shard, with no communication.

``requires_grad=True`` makes the new tensor a leaf that autograd records (a
floating-point dtype only), as torch's factories.

The ranges (``arange``, ``linspace``, ``logspace``) and the matrices (``eye``,
``identity``, ``tri``) give each rank NumPy's own values of its part: each element
is computed from its global index by the expression NumPy evaluates for it, so the
global tensor is bit-identical to NumPy's on any mesh and placements."""

from __future__ import annotations

import math
import operator

import numpy as np

from . import _args, _dtypes, _strided, random as _random
from ._dtensor import DTensor
from ._dtensor_spec import DTensorSpec, contiguous_strides
from ._layout import compute_local_shape_and_global_offset
from .placement_types import Replicate

try:  # what NumPy 2's linspace converts start and stop with
    from numpy._core._multiarray_umath import _array_converter
except ImportError:
    _array_converter = None

__all__ = ["zeros", "ones", "empty", "full", "rand", "randn", "arange", "linspace",
           "logspace", "eye", "identity", "tri", "zeros_like", "ones_like",
           "empty_like", "full_like", "rand_like", "randn_like"]


def _spec_and_box(size, dtype, device_mesh, placements, what):
    shape = _args.parse_size(size)
    dt = _args.check_dtype(np.float64 if dtype is None else dtype)
    _args.check_extent(shape, None, dt)
    mesh = _args.resolve_mesh(device_mesh)
    pl = _args.normalize_placements(placements, mesh, len(shape))
    _args.reject_partial(pl, what)
    local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, pl)
    return DTensorSpec(mesh, pl, shape, dt, contiguous_strides(shape)), local_shape, offset


def _filled(size, dtype, device_mesh, placements, what, make):
    spec, local_shape, _ = _spec_and_box(size, dtype, device_mesh, placements, what)
    return DTensor(make(local_shape, spec.dtype), spec)


def _numpy_dtype_argument(size, dtype):
    """``zeros((2, 3), np.int32)``, NumPy's positional dtype, told apart from torch's
    varargs sizes by not being an int."""
    if len(size) == 2 and not isinstance(size[1], (int, np.integer, tuple, list)):
        if dtype is not None:
            raise TypeError("got multiple values for argument 'dtype'")
        return size[:1], size[1]
    return size, dtype


def _held(spec):
    """The global indices this rank holds along each dim (strided shards included),
    or None on a rank outside the mesh."""
    coord = spec.mesh.get_coordinate()
    if coord is None:
        return None
    return _strided.held_indices(spec.shape, spec.placements, spec.mesh.shape, coord)


def _built(shape, dtype, device_mesh, placements, what, make, requires_grad) -> DTensor:
    """A DTensor whose part is ``make(held indices, dtype)``, the values NumPy's
    whole array has at those indices."""
    spec, local_shape, _ = _spec_and_box((shape,), dtype, device_mesh, placements, what)
    held = _held(spec)
    if held is None:
        local = np.empty(local_shape, spec.dtype)
    else:
        local = np.ascontiguousarray(make(held, spec.dtype), dtype=spec.dtype)
    return DTensor(local, spec).requires_grad_(requires_grad)


def _part(value, shape, held):
    """The elements of ``value``, broadcast to ``shape``, at the held indices. A
    0-d value stays as it is, so a Python scalar keeps NumPy's weak promotion."""
    if np.ndim(value) == 0:
        return value
    return np.broadcast_to(value, shape)[np.ix_(*held)]


def zeros(*size, dtype=None, device_mesh=None, placements=None,
          requires_grad: bool = False) -> DTensor:
    """A DTensor of zeros; each rank allocates only its shard. Local.

    Sizes as torch takes them (``zeros(8, 4)``, ``zeros((8, 4))``), or NumPy's
    ``zeros((8, 4), np.float32)`` with the dtype after them; likewise ``ones``
    and ``empty``.

    Example::

        >>> zeros(8, 4, device_mesh=mesh, placements=[Shard(0)]).shape
        (8, 4)
    """
    size, dtype = _numpy_dtype_argument(size, dtype)
    return _filled(size, dtype, device_mesh, placements, "zeros", np.zeros
                   ).requires_grad_(requires_grad)


def ones(*size, dtype=None, device_mesh=None, placements=None,
         requires_grad: bool = False) -> DTensor:
    """A DTensor of ones; each rank allocates only its shard. Local.

    Example::

        >>> ones((8, 4), device_mesh=mesh).to_local().sum()
        32.0
    """
    size, dtype = _numpy_dtype_argument(size, dtype)
    return _filled(size, dtype, device_mesh, placements, "ones", np.ones
                   ).requires_grad_(requires_grad)


def empty(*size, dtype=None, device_mesh=None, placements=None,
          requires_grad: bool = False) -> DTensor:
    """A DTensor whose values are uninitialized. Local.

    Example::

        >>> empty(3, device_mesh=mesh, dtype=np.int32).dtype
        dtype('int32')
    """
    size, dtype = _numpy_dtype_argument(size, dtype)
    return _filled(size, dtype, device_mesh, placements, "empty", np.empty
                   ).requires_grad_(requires_grad)


def full(size, fill_value, dtype=None, *, device_mesh=None, placements=None,
         requires_grad: bool = False) -> DTensor:
    """A DTensor filled with ``fill_value``; dtype inferred from it as NumPy does. An
    array ``fill_value`` broadcasts to ``size`` as in ``np.full``, each rank taking
    its part. Local.

    Example::

        >>> full((2, 2), 7, device_mesh=mesh).dtype
        dtype('int64')
        >>> full((4, 3), [1, 2, 3], device_mesh=mesh, placements=[Shard(1)])
    """
    size = tuple(size) if isinstance(size, (tuple, list)) else (size,)
    if isinstance(fill_value, DTensor):
        raise TypeError("full takes a scalar or an array-like fill_value, not a DTensor")
    if dtype is None:
        fill_value = np.asarray(fill_value)
        dtype = fill_value.dtype
    if np.ndim(fill_value) == 0:
        return _filled(size, dtype, device_mesh, placements, "full",
                       lambda shape, dt: np.full(shape, fill_value, dt)
                       ).requires_grad_(requires_grad)
    shape = _args.parse_size(size)
    fill_value = np.asarray(fill_value)
    if np.broadcast_shapes(fill_value.shape, shape) != shape:
        raise ValueError(f"could not broadcast input array from shape "
                         f"{fill_value.shape} into shape {shape}")
    return _built(shape, dtype, device_mesh, placements, "full",
                  lambda held, dt: _part(fill_value, shape, held), requires_grad)


def _random_tensor(size, dtype, device_mesh, placements, what, dist) -> DTensor:
    spec, local_shape, offset = _spec_and_box(size, dtype, device_mesh, placements, what)
    if spec.dtype not in _random._DTYPES:
        kinds = ", ".join(map(str, _random._DTYPES))
        raise TypeError(f"{what} makes {kinds} tensors, not {spec.dtype}")
    stream = _random._next_stream()  # every rank advances, members or not
    local = np.empty(local_shape, spec.dtype)
    if spec.mesh.get_coordinate() is not None:  # a 0-d member also has offset ()
        shape = spec.shape
        if _strided.has_strided(spec.placements):
            # A strided part is one box of the expansion, whose elements have the
            # same C-order indices as the tensor's: the same values as a plain one.
            shape, pl, _ = _strided.expand(shape, spec.placements, spec.mesh.shape)
            box, offset = compute_local_shape_and_global_offset(shape, spec.mesh, pl)
            local = local.reshape(box)
        local = _random.fill(local, shape, offset, dist, stream).reshape(local_shape)
    return DTensor(local, spec)


def rand(*size, dtype=None, device_mesh=None, placements=None,
         requires_grad: bool = False) -> DTensor:
    """Uniform [0, 1) values that depend only on the seed and the global index. Local.

    The global tensor is bit-identical on any mesh and placements.

    Example::

        >>> manual_seed(0); a = rand(6, device_mesh=mesh, placements=[Shard(0)])
    """
    return _random_tensor(size, dtype, device_mesh, placements, "rand", _random._UNIFORM
                          ).requires_grad_(requires_grad)


def randn(*size, dtype=None, device_mesh=None, placements=None,
          requires_grad: bool = False) -> DTensor:
    """Standard normal values that depend only on the seed and the global index. Local.

    Example::

        >>> manual_seed(0); a = randn(6, 6, device_mesh=mesh, placements=[Shard(1)])
    """
    return _random_tensor(size, dtype, device_mesh, placements, "randn", _random._NORMAL
                          ).requires_grad_(requires_grad)


# -- ranges -------------------------------------------------------------------------

_MISSING = object()
_INTP_MAX = np.iinfo(np.intp).max


def _arange_ceil(value: float) -> int:
    """NumPy's ``_arange_safe_ceil_to_intp``: OverflowError past intp, and the one
    value that passes its check but not the cast, 2**63, wraps to a negative length
    (an empty range) as NumPy's cast does on x86."""
    if math.isnan(value):
        raise ValueError("arange: cannot compute length")
    if not -2.0**63 <= value <= 2.0**63:
        raise OverflowError
    n = math.ceil(value)
    return n if n <= _INTP_MAX else -1


def _arange_length(start, stop, step, dtype: np.dtype) -> int:
    """NumPy's ``_calc_length``, the same Python operations on the same objects, so
    the errors are NumPy's too (ZeroDivisionError for a zero step)."""
    diff = stop - start
    nonzero = bool(diff != 0)
    val = diff / step
    val_is_zero = bool(val == 0)
    if dtype.kind == "c" and isinstance(val, complex):
        return min(_arange_ceil(val.real), _arange_ceil(val.imag))
    value = float(val)
    if val_is_zero and nonzero:  # the quotient underflowed, or the step is infinite
        return 0 if math.copysign(1.0, value) < 0 else 1
    return _arange_ceil(value)


def _arange_dtype(start, stop, step) -> np.dtype:
    """NumPy's default: the dtypes of the three promoted, at least intp."""
    dt = np.dtype(np.intp)
    for x in (start, stop, step):
        dt = np.promote_types(dt, np.asarray(x).dtype)
    return dt


def _arange_values(idx: np.ndarray, dtype: np.dtype, head: np.ndarray) -> np.ndarray:
    """Element ``idx`` of NumPy's arange whose first two elements are ``head``: NumPy
    stores those two, then fills element i with ``head[0] + i * (head[1] - head[0])``
    evaluated in the dtype's C type (float16 in float, integers in intp or uint64,
    wrapping)."""
    if dtype.kind in "iu":
        wide = np.dtype(np.uint64 if dtype == np.uint64 else np.int64)
        start = head[:1].astype(wide)
        delta = (head[1:] - head[:1]).astype(wide)
        out = (start + idx.astype(wide) * delta).astype(dtype)
    elif _dtypes.is_narrow_float(dtype):  # float16 and bfloat16
        start = head[:1].astype(np.float32)
        out = (start + idx.astype(np.float32) * (head[1:].astype(np.float32) - start)
               ).astype(dtype)
    elif dtype.kind == "f":
        out = head[:1] + idx.astype(dtype) * (head[1:] - head[:1])
    elif dtype.kind == "c":
        i = idx.astype(head.real.dtype)
        delta = head[1:] - head[:1]
        out = np.empty(idx.shape, dtype)
        out.real = head[:1].real + i * delta.real
        out.imag = head[:1].imag + i * delta.imag
    else:  # bool, whose ranges are at most two long
        out = np.empty(idx.shape, dtype)
    first = idx < 2
    out[first] = head[idx[first]]
    return out


def arange(start=_MISSING, stop=None, step=None, dtype=None, *, device_mesh=None,
           placements=None, requires_grad: bool = False) -> DTensor:
    """``np.arange([start,] stop[, step], dtype=None)`` as a 1-D DTensor: each rank
    computes only its part, bit-identical to NumPy's array there. NumPy's errors
    (ZeroDivisionError for a zero step, TypeError for a bool range longer than 2).
    Local.

    Example::

        >>> arange(10, device_mesh=mesh, placements=[Shard(0)]).to_local()  # rank 1 of 4
        array([3, 4, 5])
    """
    if start is _MISSING:
        if stop is None:
            raise TypeError("arange() requires stop to be specified.")
        start, stop = stop, None
    if step is None:
        step = 1
    if stop is None:
        start, stop = 0, start
    dt = _arange_dtype(start, stop, step) if dtype is None else _dtypes.as_dtype(dtype)
    try:
        n = max(_arange_length(start, stop, step, dt), 0)
        following = start + step if n > 0 else None
    except OverflowError:
        raise ValueError("Maximum allowed size exceeded") from None
    if dt.kind == "b" and n > 2:
        raise TypeError("arange() is only supported for booleans when the result has "
                        "at most length 2.")
    dt = _args.check_dtype(dt)
    head = np.zeros(2, dt)
    if n > 0:
        head[0] = start  # the conversions NumPy makes (OverflowError out of range)
    if n > 1:
        head[1] = following
    return _built((n,), dt, device_mesh, placements, "arange",
                  lambda held, _: _arange_values(held[0], dt, head), requires_grad)


class _Spaced:
    """NumPy's linspace up to its first use of the sample indices: the converted
    start and stop, the dtype it computes in, delta and step. ``values`` then runs
    the rest of NumPy's code on the held indices only."""

    def __init__(self, start, stop, num, endpoint, dtype, axis):
        num = operator.index(num)
        if num < 0:
            raise ValueError(f"Number of samples, {num}, must be non-negative.")
        self.num, self.endpoint = num, bool(endpoint)
        self.div = (num - 1) if endpoint else num
        if _array_converter is not None:
            conv = _array_converter(start, stop)
            start, stop = conv.as_arrays()
            dt = conv.result_type(ensure_inexact=True)
            delta = np.subtract(stop, start, dtype=type(dt))
        else:  # NumPy 1.26
            start, stop = np.asanyarray(start) * 1.0, np.asanyarray(stop) * 1.0
            dt = np.result_type(start, stop, float(num))
            delta = stop - start
        self.start, self.stop, self.dt, self.delta = start, stop, dt, delta
        self.integer = dtype is not None and np.issubdtype(dtype, np.integer)
        self.dtype = dt if dtype is None else dtype
        if self.div > 0:
            self.step = delta / self.div
            self.any_step_zero = bool(np.asanyarray(self.step == 0).any())
        else:
            self.step = np.nan
        rest = np.shape(delta)
        self.axis = _axis(axis, len(rest) + 1)
        self.shape = rest[:self.axis] + (num,) + rest[self.axis:]

    def values(self, held, shape):
        """The part at ``held`` (indices of the output's dims) of the samples, with
        start and stop broadcast to ``shape`` (the output's shape)."""
        idx = held[self.axis]
        rest = held[:self.axis] + held[self.axis + 1:]
        rest_shape = shape[:self.axis] + shape[self.axis + 1:]

        def part(v):
            return _part(v, rest_shape, rest)

        head = np.array([0, 1], self.dt)
        y = _arange_values(idx, self.dt, head).reshape((-1,) + (1,) * len(rest))
        delta = part(self.delta)
        if self.div > 0:
            if self.any_step_zero:  # a subnormal step: NumPy divides first
                y /= self.div
                y = y * delta
            else:
                y = y * part(self.step)
        else:
            y = y * delta
        y += part(self.start)
        if self.endpoint and self.num > 1:
            y[idx == self.num - 1, ...] = part(self.stop)
        y = np.moveaxis(y, 0, self.axis)
        if self.integer:
            np.floor(y, out=y)
        return y


def _axis(axis, ndim: int) -> int:
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise np.exceptions.AxisError(axis, ndim)
    return axis % ndim


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0, *,
             device_mesh=None, placements=None, requires_grad: bool = False):
    """``np.linspace`` as a DTensor: each rank computes only its samples, with
    NumPy's expressions, so every element is bit-identical to NumPy's (the endpoint
    too). ``start`` and ``stop`` may be arrays, as in NumPy (the samples then run
    along ``axis``). ``retstep=True`` returns ``(dtensor, step)``. Local.

    Example::

        >>> linspace(0, 1, 5, device_mesh=mesh, placements=[Shard(0)]).full_tensor()
        array([0.  , 0.25, 0.5 , 0.75, 1.  ])
    """
    spaced = _Spaced(start, stop, num, endpoint, dtype, axis)
    out = _built(spaced.shape, spaced.dtype, device_mesh, placements, "linspace",
                 lambda held, _: spaced.values(held, spaced.shape), requires_grad)
    return (out, spaced.step) if retstep else out


def logspace(start, stop, num=50, endpoint=True, base=10.0, dtype=None, axis=0, *,
             device_mesh=None, placements=None, requires_grad: bool = False) -> DTensor:
    """``np.logspace``: ``base ** linspace(start, stop, ...)`` as a DTensor, each
    rank computing only its part, bit-identical to NumPy's. Local.

    Example::

        >>> logspace(0, 3, 4, device_mesh=mesh, placements=[Shard(0)]).full_tensor()
        array([   1.,   10.,  100., 1000.])
    """
    if _array_converter is None or (not isinstance(base, (float, int))
                                    and np.ndim(base)):
        # NumPy broadcasts an array base with start and stop first, since its
        # shape may decide which dim ``axis`` names.
        ndmax = np.broadcast(start, stop, base).ndim
        start, stop, base = (np.array(a, subok=True, ndmin=ndmax)
                             for a in (start, stop, base))
        spaced = _Spaced(start, stop, num, endpoint, None, axis)
        base = np.expand_dims(base, axis=spaced.axis)
        shape = np.broadcast_shapes(base.shape, spaced.shape)
    else:
        spaced = _Spaced(start, stop, num, endpoint, None, axis)
        shape = spaced.shape
    sample = base if np.ndim(base) == 0 else np.ones(1, np.asarray(base).dtype)
    out_dtype = np.power(sample, np.ones(1, spaced.dt)).dtype if dtype is None else dtype

    def values(held, _):
        return np.power(_part(base, shape, held), spaced.values(held, shape))

    return _built(shape, out_dtype, device_mesh, placements, "logspace", values,
                  requires_grad)


# -- matrices -------------------------------------------------------------------------

def eye(N, M=None, k=0, dtype=float, *, device_mesh=None, placements=None,
        requires_grad: bool = False) -> DTensor:
    """``np.eye``: ones on the ``k``-th diagonal of an ``N`` x ``M`` DTensor, zeros
    elsewhere; each rank fills only its block. Local.

    Example::

        >>> eye(4, device_mesh=mesh, placements=[Shard(0)]).full_tensor()[1]
        array([0., 1., 0., 0.])
    """
    if M is None:
        M = N
    shape = _args.parse_size((N, M))
    if not k >= M:
        k = operator.index(k)
    # Offsets past either side leave the diagonal outside the matrix alike;
    # clamping them keeps the index arithmetic in int64.
    k = min(max(k, -shape[0]), shape[1])

    def block(held, dt):
        rows, cols = held
        out = np.zeros((len(rows), len(cols)), dt)
        out[np.equal.outer(rows + k, cols)] = 1
        return out

    return _built(shape, None if dtype is None else dtype, device_mesh, placements,
                  "eye", block, requires_grad)


def identity(n, dtype=None, *, device_mesh=None, placements=None,
             requires_grad: bool = False) -> DTensor:
    """``np.identity``: the ``n`` x ``n`` identity DTensor, each rank filling only
    its block. Local.

    Example::

        >>> identity(3, device_mesh=mesh, placements=[Shard(1)]).shape
        (3, 3)
    """
    return eye(n, dtype=dtype, device_mesh=device_mesh, placements=placements,
               requires_grad=requires_grad)


def tri(N, M=None, k=0, dtype=float, *, device_mesh=None, placements=None,
        requires_grad: bool = False) -> DTensor:
    """``np.tri``: ones at and below the ``k``-th diagonal of an ``N`` x ``M``
    DTensor (``j <= i + k``), zeros above; each rank fills only its block. A
    negative size gives an empty dim, as in NumPy. Local.

    Example::

        >>> tri(3, device_mesh=mesh, placements=[Shard(0)]).full_tensor()[1]
        array([1., 1., 0.])
    """
    N = operator.index(N)
    M = N if M is None else operator.index(M)
    N, M, k = max(N, 0), max(M, 0), operator.index(k)
    # NumPy stores the first two column numbers, -k and 1 - k, as int64.
    if any(not -2**63 <= c < 2**63 for c in (-k, 1 - k)[:M]):
        raise OverflowError("Python int too large to convert to C long")
    # Offsets past either side fill or empty the whole matrix; clamping them keeps
    # the index arithmetic in int64.
    k = min(max(k, -N), M)

    def block(held, dt):
        rows, cols = held
        return np.greater_equal.outer(rows, cols - k).astype(dt)

    return _built((N, M), None if dtype is None else dtype, device_mesh, placements,
                  "tri", block, requires_grad)


# -- like another tensor ----------------------------------------------------------------

def _like_spec(a, dtype, shape, device_mesh, placements):
    """(shape, dtype, mesh, placements) of a new tensor like ``a``: a DTensor's own
    unless overridden, a Partial taken as Replicate (its values are new, not parts of
    a sum, as torch's ``*_like``); its placements are kept only on its mesh with as
    many dims. Any other array-like gives its shape and dtype."""
    if isinstance(a, DTensor):
        a_shape, a_dtype, a_mesh = a.shape, a.dtype, a.device_mesh
        a_placements = tuple(Replicate() if p.is_partial() else p
                             for p in a.placements)
    else:
        a = np.asarray(a)
        a_shape, a_dtype, a_mesh, a_placements = a.shape, a.dtype, None, None
    shape = a_shape if shape is None else tuple(np.atleast_1d(shape).tolist())
    mesh = a_mesh if device_mesh is None else device_mesh
    if placements is None and mesh is a_mesh and mesh is not None \
            and len(shape) == len(a_shape):
        placements = a_placements
    return shape, a_dtype if dtype is None else dtype, mesh, placements


def zeros_like(a, dtype=None, *, shape=None, device_mesh=None, placements=None,
               requires_grad: bool = False) -> DTensor:
    """``np.zeros_like``: zeros with ``a``'s shape, dtype, mesh and placements (a
    Partial becomes Replicate); each can be overridden. ``a`` may also be an ndarray
    (then Replicate on ``device_mesh`` unless placed). Local.

    Example::

        >>> zeros_like(dt).placements == dt.placements  # dt sharded
        True
    """
    shape, dtype, mesh, placements = _like_spec(a, dtype, shape, device_mesh, placements)
    return zeros(shape, dtype=dtype, device_mesh=mesh, placements=placements,
                 requires_grad=requires_grad)


def ones_like(a, dtype=None, *, shape=None, device_mesh=None, placements=None,
              requires_grad: bool = False) -> DTensor:
    """``np.ones_like``: ones laid out like ``a``, as :func:`zeros_like`. Local.

    Example::

        >>> ones_like(dt, dtype=np.int32).dtype
        dtype('int32')
    """
    shape, dtype, mesh, placements = _like_spec(a, dtype, shape, device_mesh, placements)
    return ones(shape, dtype=dtype, device_mesh=mesh, placements=placements,
                requires_grad=requires_grad)


def empty_like(a, dtype=None, *, shape=None, device_mesh=None, placements=None,
               requires_grad: bool = False) -> DTensor:
    """``np.empty_like``: uninitialized values laid out like ``a``, as
    :func:`zeros_like`. Local.

    Example::

        >>> empty_like(dt, placements=[Replicate()]).placements
        (Replicate(),)
    """
    shape, dtype, mesh, placements = _like_spec(a, dtype, shape, device_mesh, placements)
    return empty(shape, dtype=dtype, device_mesh=mesh, placements=placements,
                 requires_grad=requires_grad)


def full_like(a, fill_value, dtype=None, *, shape=None, device_mesh=None,
              placements=None, requires_grad: bool = False) -> DTensor:
    """``np.full_like``: ``fill_value`` (cast to ``a``'s dtype unless ``dtype=``, as
    NumPy does) laid out like ``a``, as :func:`zeros_like`. Local.

    Example::

        >>> full_like(dt, 7).full_tensor()  # all sevens
    """
    shape, dtype, mesh, placements = _like_spec(a, dtype, shape, device_mesh, placements)
    return full(shape, fill_value, dtype, device_mesh=mesh, placements=placements,
                requires_grad=requires_grad)


def rand_like(a, dtype=None, *, shape=None, device_mesh=None, placements=None,
              requires_grad: bool = False) -> DTensor:
    """torch's ``rand_like``: :func:`rand` values laid out like ``a``, as
    :func:`zeros_like` (a floating dtype only). Local.

    Example::

        >>> manual_seed(0); r = rand_like(dt)
    """
    shape, dtype, mesh, placements = _like_spec(a, dtype, shape, device_mesh, placements)
    return rand(shape, dtype=dtype, device_mesh=mesh, placements=placements,
                requires_grad=requires_grad)


def randn_like(a, dtype=None, *, shape=None, device_mesh=None, placements=None,
               requires_grad: bool = False) -> DTensor:
    """torch's ``randn_like``: :func:`randn` values laid out like ``a``, as
    :func:`zeros_like` (a floating dtype only). Local.

    Example::

        >>> manual_seed(0); r = randn_like(dt, placements=[Replicate()])
    """
    shape, dtype, mesh, placements = _like_spec(a, dtype, shape, device_mesh, placements)
    return randn(shape, dtype=dtype, device_mesh=mesh, placements=placements,
                 requires_grad=requires_grad)
