"""What a checkpoint path may be, checked on the mesh's first rank before any byte
moves: the target of a save is absent or a regular file (a symlink stands for its
target, as numpy.save writes through it), a file to load is a regular file that
opens without blocking, a file named by an index lies inside its checkpoint
directory, and what a killed save left behind is removed by the next save of the
same target.

Every function here is Local: the callers run it on the first rank through
_agree.first_rank, so every rank raises what it raises.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import time

# The temporary name the core gives a save of NAME (csrc/io/io.c, temp_name):
# NAME cut to 200 bytes, then ".<pid>-<clock>.tmp" in hex. Earlier versions wrote
# NAME.mpitensor-<pid>-<clock>.tmp in decimal.
_TEMP_NAME_KEEP = 200
_TEMP_SUFFIX = re.compile(rb"\.[0-9a-f]+-[0-9a-f]+\.tmp\Z")
_OLD_TEMP_SUFFIX = re.compile(rb"\.mpitensor-[0-9]+-[0-9]+\.tmp\Z")

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def temp_name(path: str) -> str:
    """A temporary name beside ``path`` of the core's form, for the small files
    written from Python (index.json), so that remove_leftovers finds them too."""
    folder, name = os.path.split(path)
    cut = os.fsdecode(os.fsencode(name)[:_TEMP_NAME_KEEP])
    return os.path.join(folder, f"{cut}.{os.getpid():x}-{time.time_ns():x}.tmp")


def remove_leftovers(folder: str, names) -> None:
    """Removes the temporary files (and Zarr stores) that killed saves of the
    files ``names`` left in ``folder`` (one listing of the directory for all of
    them). A temporary file of a save still running elsewhere would make that
    save fail (its first rank created the file, the others open it without
    creating it, and the rename finds nothing): never a file holding some
    ranks' bytes only."""
    full = {os.fsencode(n) for n in names}
    cut = {n[:_TEMP_NAME_KEEP] for n in full}
    try:
        entries = os.listdir(os.fsencode(folder))
    except OSError:
        return
    for entry in entries:
        new, old = _TEMP_SUFFIX.search(entry), _OLD_TEMP_SUFFIX.search(entry)
        if (new and entry[:new.start()] in cut) or (old and entry[:old.start()] in full):
            found = os.path.join(os.fsencode(folder), entry)
            try:
                if os.path.isdir(found) and not os.path.islink(found):
                    shutil.rmtree(found)  # a Zarr store's
                else:
                    os.unlink(found)
            except OSError:
                pass  # gone already, or not ours to remove: the save goes on


def sync_file(path: str) -> None:
    """fsyncs the file ``path``: its bytes, its metadata and the device's cache."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        raise OSError(e.errno, f"fsync of {path!r} failed: {e.strerror}") from None
    finally:
        os.close(fd)


def sync_dir(folder: str) -> None:
    """Syncs a directory, so that the names renamed into it survive a power cut."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:  # a file system that cannot sync directories
            raise
    finally:
        os.close(fd)


def replace_synced(path: str, data: bytes, durable: bool = True) -> None:
    """Writes ``path`` whole or not at all: a temporary file, synced, renamed over
    it, and the directory synced (no syncs unless ``durable``)."""
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        sync_dir(os.path.dirname(path))


def _check_kind(path: str) -> None:
    """Nothing but a regular file at ``path``, if anything."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"cannot save to {path!r}: it is a directory")
    if not stat.S_ISREG(mode):
        raise OSError(f"cannot save to {path!r}: it is {_kind(mode)}; a save replaces "
                      f"regular files only")


def check_target(path: str) -> bytes:
    """Before a save to ``path`` (symlinks resolved): its directory exists and
    nothing but a regular file is there; removes what killed saves left."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot save to {path!r}: the directory {parent!r} "
                                f"does not exist")
    check_targets(parent, [os.path.basename(path)])
    return b""


def check_targets(folder: str, names) -> None:
    """Before a save of the files ``names`` into the existing directory ``folder``:
    nothing but regular files are there; removes what killed saves left."""
    for name in names:
        _check_kind(os.path.join(folder, name))
    remove_leftovers(folder, names)


def open_regular(path: str):
    """``path`` opened for reading in binary mode, or OSError when it is not a
    regular file: a FIFO would block the opening rank, and every other rank with it."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise OSError(f"cannot load {path!r}: it is {_kind(mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    # Checked again on what was opened, in case the path changed in between.
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"cannot load {path!r}: it is not a regular file")
    return os.fdopen(fd, "rb")


def inside(folder: str, name) -> str:
    """The path of the file ``name`` that an index of the checkpoint ``folder``
    lists; ValueError unless it resolves inside ``folder`` (no ``..``, no absolute
    path, no symlink out), FileNotFoundError when it is missing, OSError when it is
    not a regular file."""
    root = os.path.realpath(folder)
    if not isinstance(name, str) or not name:
        raise ValueError(f"the checkpoint {folder!r} lists the file {name!r}, which is "
                         f"not a file name")
    real = os.path.realpath(os.path.join(root, name))
    if real == root or os.path.commonpath([root, real]) != root:
        raise ValueError(f"the checkpoint {folder!r} lists the file {name!r}, which lies "
                         f"outside its directory")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"the checkpoint {folder!r} lists the file {name!r}, "
                                f"which does not exist") from None
    if not stat.S_ISREG(mode):
        raise OSError(f"the checkpoint {folder!r} lists the file {name!r}, which is "
                      f"{_kind(mode)}, not a regular file")
    return real
