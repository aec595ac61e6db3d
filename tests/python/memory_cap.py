"""A process whose next allocations fail: its address space capped just above what
it uses. For tests of what every rank does when one rank runs out of memory.

malloc's free chunks are held (untouched) while capped: an allocation the cap
refuses a fresh mapping falls back to malloc (the block pool does), and malloc
serves it from a free chunk of its heap when one is large enough, so a chunk left
by earlier work would let through the allocation that was meant to fail. The
heap's free top is handed back first (malloc_trim): malloc would otherwise grow it
into the headroom and serve the request from the two together.

Example::

    with capped(64 * 2**20):
        np.empty(2**24)      # 128 MiB: MemoryError
"""

import contextlib
import ctypes
import gc
import resource


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


_LIBC = ctypes.CDLL(None)
_LIBC.malloc.restype = ctypes.c_void_p
_LIBC.malloc.argtypes = [ctypes.c_size_t]
_LIBC.free.argtypes = [ctypes.c_void_p]
_LIBC.mallinfo2.restype = _Mallinfo2
_LIBC.malloc_trim.argtypes = [ctypes.c_size_t]


def free_in_heap() -> int:
    """Bytes of malloc's free chunks, its heap's top included."""
    return _LIBC.mallinfo2().fordblks


def vm_size() -> int:
    """This process's address space in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


@contextlib.contextmanager
def heap_held():
    """malloc's free chunks of 64 KiB and more, taken and held for the while."""
    held, size = [], free_in_heap()
    while size >= 2**16 and len(held) < 10_000:
        before = free_in_heap()
        p = _LIBC.malloc(size)
        if p and free_in_heap() <= before - size // 2:  # mostly a free chunk
            held.append(p)
            continue
        if p:
            _LIBC.free(p)
        size //= 2
    try:
        yield
    finally:
        for p in held:
            _LIBC.free(p)


@contextlib.contextmanager
def capped(headroom: int):
    """This process's address space capped at what it uses plus `headroom` bytes,
    malloc's free chunks held, for the while."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    # A collection inside the capped region would free memory mapped before the cap,
    # room the cap does not count; collected first, the headroom is what it says.
    gc.collect()
    _LIBC.malloc_trim(0)
    with heap_held():
        resource.setrlimit(resource.RLIMIT_AS, (vm_size() + headroom, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
