"""mpitensor's version: the installed distribution's, whose one source is the
``project(mpitensor VERSION ...)`` line of CMakeLists.txt (pyproject.toml reads it)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mpitensor")
except PackageNotFoundError:  # the source tree on sys.path, not installed
    __version__ = "unknown"
