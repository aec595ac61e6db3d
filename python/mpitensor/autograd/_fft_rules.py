"""Backward rules of np.fft's transforms, as torch's (conjugate Wirtinger calculus:
a complex input's gradient is dL/dRe + i dL/dIm, a real input's its real part).

Each transform is linear, so its backward is its adjoint, again a transform of
the same family: the adjoint of a complex transform is the inverse one with the
opposite ``norm`` ("backward" <-> "forward", "ortho" stays); a real-to-complex
transform's adjoint pads the half spectrum with zeros and takes the real part of
the inverse; a complex-to-real transform's is the real-to-complex transform of
the gradient with the frequencies that stand for two (all but the first and,
for an even length, the last) counted twice. A length ``n``/``s`` that cut the
input gives back zeros past the cut; one that padded it drops the padding. The
transforms run as DTensor operations, so their layouts are the forward's
engine's (the pencil method where a transformed axis is sharded).
"""

from __future__ import annotations

import operator

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from ._engine import register_backward
from ._rules import _zeros_like_along


__all__: list = []

_OPPOSITE = {None: "forward", "backward": "forward", "forward": "backward",
             "ortho": "ortho"}


def _resize(g, d, n):
    """``g`` cut or padded with zeros at the end of dim ``d`` to length ``n``."""
    have = g.shape[d]
    if have == n:
        return g
    if have > n:
        return g[(slice(None),) * d + (slice(0, n),)]
    return np.concatenate([g, _zeros_like_along(g, d, n - have)], axis=d)


def _resized(g, axes, lengths):
    for d, n in zip(axes, lengths):
        g = _resize(g, d, n)
    return g


def _doubled(g, d, count):
    """``g`` with ``count`` entries from index 1 along dim ``d`` times two: the
    frequencies a half spectrum holds for two."""
    if count <= 0:
        return g
    head = g[(slice(None),) * d + (slice(0, 1),)]
    mid = g[(slice(None),) * d + (slice(1, 1 + count),)] * 2
    parts = [head, mid]
    if 1 + count < g.shape[d]:
        parts.append(g[(slice(None),) * d + (slice(1 + count, None),)])
    return np.concatenate(parts, axis=d)


def _as_input(gx, x):
    """The gradient in ``x``'s kind: its real part for a real ``x``, ``x``'s dtype."""
    if x.dtype.kind != "c" and gx.dtype.kind == "c":
        gx = np.real(gx)
    return gx if gx.dtype == x.dtype else gx.astype(x.dtype)


# -- the adjoints over given axes ------------------------------------------------------

def _c2c(g, axes, norm, inverse):
    """The adjoint of fftn (ifftn with ``inverse``) over ``axes``."""
    adj = np.fft.fftn if inverse else np.fft.ifftn
    return adj(g, axes=axes, norm=_OPPOSITE[norm])


def _r2c(g, axes, full, norm):
    """The adjoint of rfftn over ``axes`` whose last has length ``full`` before the
    transform: the half spectrum padded with zeros, then ifftn (complex)."""
    g = _resize(g, axes[-1], full)
    return np.fft.ifftn(g, axes=axes, norm=_OPPOSITE[norm])


def _c2r(g, axes, norm):
    """The adjoint of irfftn over ``axes`` (``g`` real, its last axis the output's
    length): rfftn of ``g`` with the doubled frequencies counted twice."""
    n = g.shape[axes[-1]]
    r = np.fft.rfftn(g, axes=axes, norm=_OPPOSITE[norm])
    return _doubled(r, axes[-1], n - (n // 2 + 1))


# -- one axis --------------------------------------------------------------------------

_ONE_ARGS = ("a", "n", "axis", "norm", "out")


def _one(kind):
    def backward(g, node, out):
        b = dict(zip(_ONE_ARGS, node.saved))
        b.update(node.aux or {})
        a, norm = b["a"], b.get("norm")
        ax = normalize_axis_index(operator.index(b.get("axis", -1)), a.ndim)
        length = a.shape[ax]
        n = b.get("n")
        if kind in ("fft", "ifft"):
            gx = _c2c(g, (ax,), norm, kind == "ifft")
            gx = _resize(gx, ax, length)
        elif kind == "rfft":
            n = length if n is None else operator.index(n)
            gx = _resize(_r2c(g, (ax,), n, norm), ax, length)
        elif kind == "irfft":
            gx = _resize(_c2r(g, (ax,), norm), ax, length)
        elif kind == "hfft":  # irfft(conj(a)) with the opposite norm
            gx = np.conj(_resize(_c2r(g, (ax,), _OPPOSITE[norm]), ax, length))
        else:  # ihfft: conj(rfft(a)) with the opposite norm
            n = length if n is None else operator.index(n)
            gx = _resize(_r2c(np.conj(g), (ax,), n, _OPPOSITE[norm]), ax, length)
        return (_as_input(gx, a),)
    return backward


# -- several axes -----------------------------------------------------------------------

_MANY_ARGS = ("a", "s", "axes", "norm", "out")


def _many(kind, default_axes):
    def backward(g, node, out):
        b = dict(zip(_MANY_ARGS, node.saved))
        b.update(node.aux or {})
        a, norm, s = b["a"], b.get("norm"), b.get("s")
        axes = b.get("axes", default_axes)
        if axes is None:
            axes = tuple(range(a.ndim)) if s is None else tuple(range(-len(s), 0))
        axes = normalize_axis_tuple(axes, a.ndim)
        lengths = tuple(a.shape[d] for d in axes)
        if kind in ("fftn", "ifftn"):
            gx = _c2c(g, axes, norm, kind == "ifftn")
        elif kind == "rfftn":
            full = lengths[-1] if s is None else operator.index(tuple(s)[-1])
            gx = _r2c(g, axes, full, norm)
        else:  # irfftn
            gx = _c2r(g, axes, norm)
        return (_as_input(_resized(gx, axes, lengths), a),)
    return backward


def _many_supported(default_axes):
    def supported(args, kwargs) -> bool:
        b = dict(zip(_MANY_ARGS, args))
        b.update(kwargs)
        axes = b.get("axes", default_axes)
        if axes is None:
            return True
        axes = tuple(axes)
        return len(set(operator.index(x) % args[0].ndim for x in axes)) == len(axes)
    return supported


_FUNCTIONS = {}
for _k in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft"):
    _FUNCTIONS[getattr(np.fft, _k)] = (_k, _one(_k))
for _k in ("fftn", "ifftn", "rfftn", "irfftn"):
    _FUNCTIONS[getattr(np.fft, _k)] = (_k, _many(_k, None), _many_supported(None))
    _two = _k[:-1] + "2"
    _FUNCTIONS[getattr(np.fft, _two)] = (_two, _many(_k, (-2, -1)),
                                        _many_supported((-2, -1)))
del _k, _two

for _func, _entry in _FUNCTIONS.items():
    register_backward(_func, *_entry)
del _func, _entry
