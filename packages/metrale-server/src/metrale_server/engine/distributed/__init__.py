"""Tensor parallelism over ``torch.distributed``: rank 0 runs the scheduler (and HTTP) and
sends each step's inputs to the workers, which run the same forward on their shard.

Only rank 0 samples: every rank gathers the whole vocabulary's logits, the workers drop them.

On one host, ``met serve MODEL --tensor-parallel-size 2`` (or ``LLM(tensor_parallel_size=2)``)
starts the workers itself (torch.multiprocessing spawn, rendezvous on 127.0.0.1 at a free
port). Across hosts every host runs the same command under ``torchrun``, rank 0's host serving
HTTP::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \
        -m metrale_server serve MODEL --host 0.0.0.0

(``--tensor-parallel-size`` defaults to ``WORLD_SIZE`` there). gloo on the CPU, NCCL on CUDA
(rank ``r`` on ``cuda:LOCAL_RANK``).
"""

from metrale_server.engine.distributed.channel import WorkerLostError
from metrale_server.engine.distributed.rendezvous import Rendezvous
from metrale_server.engine.distributed.tensor_parallel import TensorParallelGroup

__all__ = ["Rendezvous", "TensorParallelGroup", "WorkerLostError"]
