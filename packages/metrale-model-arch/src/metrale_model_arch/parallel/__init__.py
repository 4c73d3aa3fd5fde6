"""Tensor and expert parallelism over ``torch.distributed``, applied from outside the families.

A rank's model is its family built from :func:`shard_config` (every split size divided by the
world size), with the layers that need a collective swapped in (:func:`apply_tensor_parallel`)
and each checkpoint tensor narrowed to the rank's shard (:func:`shard_checkpoint`).
"""

from metrale_model_arch.parallel.apply import apply_tensor_parallel, apply_tensor_parallel_quantized
from metrale_model_arch.parallel.checkpoint_shard import shard_checkpoint
from metrale_model_arch.parallel.layers import (
    ExpertParallelMoeBlock,
    RowParallelLinear,
    VocabParallelEmbedding,
    gather_vocab_logits,
)
from metrale_model_arch.parallel.shard import (
    TENSOR_PARALLEL_MODEL_TYPES,
    TensorParallelError,
    TensorShard,
    check_runs_split,
    shard_config,
)

__all__ = [
    "TENSOR_PARALLEL_MODEL_TYPES",
    "ExpertParallelMoeBlock",
    "RowParallelLinear",
    "TensorParallelError",
    "TensorShard",
    "VocabParallelEmbedding",
    "apply_tensor_parallel",
    "apply_tensor_parallel_quantized",
    "check_runs_split",
    "gather_vocab_logits",
    "shard_checkpoint",
    "shard_config",
]
