"""The ctypes bindings of the C library, one module per folder of ``csrc``:

- :mod:`.core` (``csrc/core``): layout math, strided layouts, dim maps, plans as
  data, time models, the kernels along an axis, random fills;
- :mod:`.comm` (``csrc/comm``): meshes, their collectives, plan runs, agreement,
  rings, pending requests, the watchdog, the block pool;
- :mod:`.io` (``csrc/io``): checkpoint files;
- :mod:`.linalg` (``csrc/linalg``): TSQR on NumPy's LAPACK, ScaLAPACK;
- :mod:`.kernels` (``csrc/kernels``): the nn kernels.

Each exported C function is bound once, here, at import (:func:`mpitensor._clib.fn`,
the one loader), under its C name without ``mt_``; the struct types its prototype
names come from the extension's table (:func:`mpitensor._clib.struct`). The
modules above import what they call and hold the Python around it. Nothing here
holds state or calls a function. A new C function is bound in the module of its
folder.
"""
