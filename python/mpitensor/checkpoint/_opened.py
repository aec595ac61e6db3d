"""One file that every rank of a mesh reads, agreed to be one file.

Each rank that opens a path on its own may open another file than its peers when
another job replaces the path meanwhile (``os.replace``, a save): rows of the old
version on one rank and of the new one on the next. So every rank opens the file
once, the ranks agree that they opened the same one (its inode, size and time of
last change), and every later read, the core's included, goes through the
descriptor this rank holds: ``/proc/self/fd/N`` opens the file that descriptor
names, whatever now stands at the path. The device number is left out of the
comparison: the hosts of a cluster number the same shared file system apart.
"""

from __future__ import annotations

import os
import stat

from .._fingerprint import fingerprint
from . import _paths


class Opened:
    """This rank's descriptor of the file at ``path``, opened on first use.

    Example::

        >>> with Opened(path) as f:
        ...     header = f.file().read(128)   # on the first rank
        ...     mine, error = f.check()       # compared across the ranks
        ...     np.fromfile(f.name, ...)      # reads what was agreed on
    """

    def __init__(self, path: str, directory: bool = False):
        self.path, self.directory, self.fd = path, directory, None

    def open(self) -> int:
        """The descriptor, opened now if it is not yet: OSError when the path is
        not a regular file (a directory for a store), checked on what was opened.
        Local."""
        if self.fd is None:
            if self.directory:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            else:
                with _paths.open_regular(self.path) as f:
                    self.fd = os.dup(f.fileno())
        return self.fd

    def file(self):
        """A binary file object on a copy of the descriptor, from its start. Local."""
        f = os.fdopen(os.dup(self.open()), "rb")
        f.seek(0)
        return f

    @property
    def name(self) -> str:
        """A path that opens this rank's file, whatever stands at ``path`` now."""
        return f"/proc/self/fd/{self.open()}"

    def identity(self) -> tuple:
        st = os.fstat(self.open())
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
        return kind, st.st_ino, st.st_size, st.st_mtime_ns

    def check(self) -> tuple:
        """(the file's fingerprint, None), or (0, the OSError) when this rank
        cannot open it; the ranks compare the fingerprints in the agreement before
        their read (_stored.read_box). Local."""
        try:
            return fingerprint(self.identity()), None
        except OSError as e:
            return 0, e

    def replaced(self) -> str:
        return (f"{self.path!r} was replaced while it was being opened: the ranks "
                f"opened different versions of it; load it again")

    def local(self, message: str) -> str:
        """``message`` with this rank's descriptor path put back as ``path``."""
        return message.replace(self.name, self.path) if self.fd is not None else message

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
