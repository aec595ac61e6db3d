"""pytest plugin of mpitensor: a ``mesh`` fixture and the ``mpi`` marker.

Registered through the ``pytest11`` entry point under the name ``mpitensor``, so it
is active once mpitensor is installed; ``pytest -p no:mpitensor`` turns it off.

``@pytest.mark.mpi(ranks=4)`` says that a test runs on 4 MPI ranks:

- under plain ``pytest`` (not launched by ``mpiexec``) the test runs in a child job,
  ``mpiexec -n 4 python -m mpi4py -m pytest <the test>``, and is reported as an
  ordinary test: it fails when it fails on any rank (the message shows each failing
  rank's report), it is skipped when every rank skipped it, and a test that runs
  past its timeout ends its job and fails naming the test, with each waiting rank's
  stack;
- when pytest itself runs under ``mpiexec -n N`` (a whole suite run on N ranks),
  no nested ``mpiexec`` is started: the test runs in place when ``ranks == N`` and
  is skipped on every rank otherwise.

pytest-isolate-mpi and pytest-mpi define an ``mpi`` marker of their own. When one of
them is active this plugin leaves the marker to it, with a warning that says how to
choose (``-p no:pytest_isolate_mpi``, ``-p no:pytest_mpi``); the ``mesh`` fixture
works either way.

The marker takes ``ranks`` (required), ``timeout`` (seconds, default
``--mpi-timeout``, 300) and, for the ``mesh`` fixture, ``mesh_shape`` and
``mesh_dim_names``. MPI is imported only by the tests that need it (and the
``mesh`` fixture): the plugin itself never initializes MPI in the pytest process.

Example::

    import numpy as np
    import pytest
    import mpitensor as mt
    from mpitensor.testing import assert_equal

    @pytest.mark.mpi(ranks=4, mesh_shape=(2, 2))
    def test_transpose(mesh):
        x = mt.distribute_tensor(np.eye(4), mesh, [mt.Shard(0), mt.Shard(1)])
        assert_equal(x.T, np.eye(4))
"""

from __future__ import annotations

import os

import pytest

from . import _launch, _worker

_MARKER_HELP = (
    "mpi(ranks, timeout=None, mesh_shape=None, mesh_dim_names=None): run the test on "
    "`ranks` MPI ranks; plain pytest starts it under mpiexec, a pytest already under "
    "mpiexec -n N runs it when ranks == N and skips it otherwise")


def pytest_addoption(parser):
    group = parser.getgroup("mpitensor", "MPI tests (mpitensor)")
    group.addoption("--mpi-timeout", type=float, default=300.0,
                    help="seconds an mpi-marked test may run under mpiexec, start-up of its "
                         "job not counted (default 300)")
    group.addoption("--mpiexec", default=os.environ.get("MPITENSOR_MPIEXEC", "mpiexec"),
                    help="the launcher for mpi-marked tests (default mpiexec, or "
                         "$MPITENSOR_MPIEXEC)")
    group.addoption("--mpiexec-args", default=os.environ.get("MPITENSOR_MPIEXEC_ARGS", ""),
                    help="extra launcher arguments, one string (or $MPITENSOR_MPIEXEC_ARGS)")
    group.addoption(_worker.OPTION, default=None, help=_worker.OPTION_HELP)


OTHER_MPI_PLUGINS = _launch.OTHER_MPI_PLUGINS
_OWNS_MARKER = pytest.StashKey[bool]()


def other_mpi_plugins(config) -> list[str]:
    """The distributions of the active plugins that define their own ``mpi`` marker."""
    return [dist for name, dist in OTHER_MPI_PLUGINS.items()
            if config.pluginmanager.has_plugin(name)]


# Before the terminal plugin makes its writer from the colour option.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # pytest colours its report when stdout is a terminal, and under Open MPI every
    # rank's stdout is one, even when mpiexec writes to a log file: under a launcher
    # the colour follows the launcher's output instead, unless the user chose
    # (--color, PY_COLORS, NO_COLOR, FORCE_COLOR).
    if (getattr(config.option, "color", None) == "auto"
            and not any(v in os.environ for v in ("PY_COLORS", "NO_COLOR", "FORCE_COLOR"))
            and _launch.launched_world_size() is not None and not _launch.output_is_terminal()):
        config.option.color = "no"
    others = other_mpi_plugins(config)
    config.stash[_OWNS_MARKER] = not others
    if others:
        # Leave the marker to the other plugin, so that installing mpitensor never
        # changes what an existing suite's @pytest.mark.mpi means.
        names = " and ".join(others)
        config.issue_config_time_warning(pytest.PytestConfigWarning(
            f"mpitensor's pytest plugin leaves the `mpi` marker to {names}, which "
            f"define(s) one of its own: @pytest.mark.mpi tests run as {names} says. "
            f"For mpitensor's mpi(ranks=N) (each test in its own mpiexec job), run "
            f"pytest with " + " ".join(f"-p no:{n}" for n, d in OTHER_MPI_PLUGINS.items()
                                       if d in others)
            + "; to silence this, -p no:mpitensor. The mesh fixture works either way."),
            stacklevel=2)
        return
    config.addinivalue_line("markers", _MARKER_HELP)
    if config.getoption(_worker.OPTION.lstrip("-").replace("-", "_")):
        config.pluginmanager.register(_worker.Worker(config), "mpitensor-worker")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    # Under a launcher every rank runs the tests in place; otherwise marked tests
    # become items that start their own job.
    if _launch.launched_world_size() is not None or not config.stash[_OWNS_MARKER]:
        return
    for i, item in enumerate(items):
        marker = item.get_closest_marker("mpi")
        if marker is not None and isinstance(item, pytest.Function):
            items[i] = _launch.MPIItem.from_parent(item.parent, name=item.name,
                                                   function=item, marker=marker)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    marker = item.get_closest_marker("mpi")
    size = _launch.launched_world_size()
    if marker is None or size is None or not item.config.stash[_OWNS_MARKER]:
        return
    ranks = _launch.marker_ranks(marker)
    if ranks != size:
        raise pytest.skip.Exception(f"needs {ranks} MPI ranks; this pytest runs on {size}",
                                    _use_item_location=True)


# One mesh per test, not per module: a test starts with fresh communicators (a test
# that failed on some ranks inside a collective leaves no message behind for the
# next one) and empty plan caches and decision memo (a test that counts plans or
# cache misses does not depend on which tests ran before it).
@pytest.fixture
def mesh(request):
    """A 1-D DeviceMesh over every rank of MPI.COMM_WORLD, or the mesh of the
    ``mpi`` marker's ``mesh_shape`` and ``mesh_dim_names``. Collective.

    Example::

        @pytest.mark.mpi(ranks=2)
        def test_shards(mesh):
            assert mesh.size() == 2
    """
    import mpitensor
    from mpi4py import MPI

    marker = request.node.get_closest_marker("mpi")
    kwargs = marker.kwargs if marker is not None else {}
    shape = kwargs.get("mesh_shape") or (MPI.COMM_WORLD.Get_size(),)
    return mpitensor.init_device_mesh("cpu", shape, mesh_dim_names=kwargs.get("mesh_dim_names"))
