"""The cpu kernel backend: :class:`~metrale_kernels.cpu.backend.CpuBackend` and its native
C++ ops (the sources here, built by :mod:`~metrale_kernels.cpu.build`, loaded by
:mod:`~metrale_kernels.cpu.native`)."""
