"""mpi4py and mpitensor._C use one and the same MPI library."""

import os
import re
import shutil
import subprocess

import pytest
from mpi4py import MPI

import mpitensor
from mpitensor import _C, _comm

# Which libmpi each extension links: the same at every rank count.
pytestmark = pytest.mark.np(1)

LIBMPI = re.compile(r"/libmpi\.so(\.\d+)*$")


def test_same_library_version_string():
    ours = _comm.mpi_library_version()
    # Open MPI counts the terminating NUL in the length it reports, and mpi4py
    # passes it on; the extension returns the C string without it.
    theirs = MPI.Get_library_version().rstrip("\0")
    assert ours and "\0" not in ours
    assert ours == theirs


def mapped_libmpi_files():
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/" in line}
    return {os.path.realpath(p) for p in paths if LIBMPI.search(p)}


def test_one_libmpi_is_mapped():
    # Both are loaded in this process: mpi4py by the conftest, the extension here.
    assert mpitensor._C is _C and MPI.Is_initialized()
    files = mapped_libmpi_files()
    assert len(files) == 1, files


def linked_libmpi(shared_object):
    out = subprocess.run(["ldd", shared_object], capture_output=True, text=True,
                         timeout=60).stdout
    found = re.findall(r"(libmpi\.so[.\d]*) => (\S+)", out)
    return {os.path.realpath(path) for _, path in found}


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_both_extensions_link_the_mapped_libmpi():
    ours = linked_libmpi(_C.__file__)
    theirs = linked_libmpi(MPI.__file__)
    assert len(ours) == 1 and ours == theirs == mapped_libmpi_files()
