"""mpitensor.show_config() prints every field, and the check before the first mesh
that mpi4py and mpitensor._C use one MPI library (mpitensor._mpi_library): the
comparison on made-up version strings, and a mesh refused on every rank, naming
both libraries, when the extension reports another MPI."""

from __future__ import annotations

import contextlib
import io

import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import _mpi_library, _show_config
from mpi_helpers import Problems, raised

OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
MPICH = "MPICH Version:      4.2.0\nMPICH Release date: Fri Feb  9 12:29:21 CST 2024\n"


def test_comparison_of_library_versions():
    assert _mpi_library.same_mpi_library(OPEN_MPI, OPEN_MPI + "\0")  # Open MPI's counted NUL
    assert _mpi_library.same_mpi_library(MPICH, MPICH.rstrip())
    assert not _mpi_library.same_mpi_library(OPEN_MPI, MPICH)
    assert not _mpi_library.same_mpi_library(OPEN_MPI, OPEN_MPI.replace("4.1.4", "5.0.3"))
    message = _mpi_library.mismatch_message(OPEN_MPI, MPICH)
    assert "mpi4py:       MPICH Version:      4.2.0\n" in message
    assert f"mpitensor._C: {OPEN_MPI}\n" in message
    assert "--no-binary=mpi4py" in message and "show_config()" in message


def test_the_libraries_of_this_build_agree():
    _mpi_library.check_mpi_library()
    assert _show_config.config()["MPI of mpitensor._C"]["same as mpi4py's"] is True


def test_a_mesh_over_another_mpi_is_refused(monkeypatch):
    monkeypatch.setattr(_mpi_library, "_checked", False)
    monkeypatch.setattr(_mpi_library._C, "mpi_library_version", lambda: MPICH)
    p = Problems()
    p.expect(raised(lambda: mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),)),
                    RuntimeError, "mpitensor._C: MPICH Version"), "mesh on another MPI")
    monkeypatch.undo()
    p.expect(mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),)).size()
             == MPI.COMM_WORLD.Get_size(), "a mesh once the libraries agree")
    assert p == []


def test_show_config_prints_every_field(monkeypatch):
    monkeypatch.setenv("MPITENSOR_POOL_BYTES", "12345")
    monkeypatch.setenv("MPITENSOR_MISSPELT", "1")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert mt.show_config() is None
    text = out.getvalue()
    sections = _show_config.config()
    for title, fields in sections.items():
        assert f"{title}:\n" in text
        for name in fields:
            assert f"\n  {name}:" in text, name
    assert f"  version: {mt.__version__}\n" in text
    assert "  MPITENSOR_POOL_BYTES: 12345\n" in text and "  MPITENSOR_MISSPELT: 1\n" in text
    assert f"  MPI library: {MPI.Get_library_version().rstrip(chr(0)).splitlines()[0]}" in text
    assert f"  nn kernels: {mt.nn._kernels.blas_provider()}\n" in text
    assert "libmpi.so" in text
    with pytest.raises(ValueError, match="mode must be"):
        mt.show_config("html")
