"""Tensor parallelism over ``torch.distributed``: rank 0 runs the scheduler (and HTTP) and
sends each step's inputs to the workers, which run the same forward on their shard.

Only rank 0 samples: every rank gathers the whole vocabulary's logits, the workers drop them.
"""

from metrale_server.engine.distributed.channel import WorkerLostError
from metrale_server.engine.distributed.rendezvous import Rendezvous
from metrale_server.engine.distributed.tensor_parallel import TensorParallelGroup

__all__ = ["Rendezvous", "TensorParallelGroup", "WorkerLostError"]
