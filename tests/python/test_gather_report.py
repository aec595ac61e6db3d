"""Every gather an operation needs (the user guide's table of gathers) is reported:
an INFO line under MPITENSOR_LOGS=dtensor and, with
``mpitensor.set_gather_warning(True)``, a UserWarning on every rank; operations that
merge records or sort in pieces report nothing."""

from __future__ import annotations

import logging
import re
import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Replicate, Shard, _logging
from ops_helpers import W, make, mesh_of

pytestmark = pytest.mark.skipif(W == 1, reason="one rank gathers nothing")
R, S0 = Replicate(), Shard(0)


def gathers():
    """(name, call) of operations that gather in the table's cases."""
    mesh = mesh_of((W,))
    col = make(np.arange(4.0 * W).reshape(4 * W, 1), mesh, [S0])
    vec = make(np.arange(4.0 * W), mesh, [S0])
    return [
        (r"numpy.partition gathers dim 0 .*\[S\(0\)\] -> \[R\]",
         lambda: np.partition(col, 1, axis=0)),
        (r"DTensor.__getitem__ gathers dim 0", lambda: vec[1:3]),
        (r"DTensor.tolist gathers dim 0", lambda: vec.tolist()),
    ]


def no_gathers():
    mesh = mesh_of((W,))
    vec = make(np.arange(4.0 * W)[::-1].copy(), mesh, [S0])
    mat = make(np.arange(8.0 * W).reshape(4 * W, 2), mesh, [S0])
    square = make(np.ones((2 * W, 2 * W)), mesh, [S0])
    col = make(np.arange(4.0 * W).reshape(4 * W, 1), mesh, [S0])
    wide = make(np.arange(8.0 * W).reshape(2, 4 * W), mesh, [Shard(1)])
    return [lambda: np.sort(vec), lambda: np.median(vec), lambda: np.var(mat, axis=0),
            lambda: np.sort(col, axis=0),
            lambda: np.argmax(mat, axis=0), lambda: np.fft.fft2(square),
            lambda: np.fft.fft(make(np.ones(W * W * 2), mesh, [S0])),
            lambda: vec[vec > 3], lambda: np.cumsum(mat, axis=0), lambda: np.cumsum(col),
            # re-chunked or reversed in one exchange of rows
            lambda: np.concatenate([vec, vec]), lambda: np.flip(vec),
            # the flattened array reached by exchanges (_flatten), not a gather
            lambda: np.cumsum(wide), lambda: np.roll(wide, 1), lambda: np.flip(wide),
            lambda: np.concatenate([wide, mat], axis=None)]


def test_each_gather_warns_on_every_rank_when_asked():
    assert mpitensor.set_gather_warning(True) is False
    try:
        for words, call in gathers():
            with pytest.warns(UserWarning, match=words):
                call()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for call in no_gathers():
                call()
    finally:
        assert mpitensor.set_gather_warning(False) is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _, call in gathers():
            call()


def test_each_gather_is_logged_at_info(capsys):
    _logging.set_level(logging.INFO)
    try:
        for words, call in gathers():
            capsys.readouterr()
            call()
            err = capsys.readouterr().err
            assert "INFO:mpitensor:" in err
            assert any(re.search(words, line) for line in err.splitlines())
        for call in no_gathers():
            call()
        assert "gathers" not in capsys.readouterr().err
    finally:
        _logging.set_level(None)
