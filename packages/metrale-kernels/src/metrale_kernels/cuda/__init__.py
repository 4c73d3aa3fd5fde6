"""The CUDA backend: CUDA C kernel sources compiled with NVRTC through CuPy, and the checks
that compile them without a GPU. CuPy is imported only when a kernel is launched."""
