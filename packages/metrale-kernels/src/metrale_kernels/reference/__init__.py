"""The torch references of the ops: each op's declaration (signature and contract) is its
reference function here, and every backend falls back to it (see
:class:`~metrale_kernels.backend.KernelBackend`)."""
