"""Metrale ops: each declared once by its torch reference, served by a backend's kernel or that
reference; and shared helpers."""

from __future__ import annotations

from metrale_kernels.attention_metadata import AttentionMetadata, build_attention_metadata
from metrale_kernels.backend import KernelBackend, TorchBackend
from metrale_kernels.backend_choice import BACKEND_NAMES, BackendUnavailableError, get_backend
from metrale_kernels.column_split import ColumnSplit
from metrale_kernels.compute_dtype import compute_dtype, widened
from metrale_kernels.cpu_features import CpuFeatures, cpu_features
from metrale_kernels.reference.dsa import (
    index_scores,
    pool_index_keys,
    select_positions,
    sparse_latent_attention,
)
from metrale_kernels.reference.int8_matmul import dequantize_rows, int8_linear, quantize_per_row
from metrale_kernels.reference.kda import kda_chunked, kda_decode_step, kda_recurrent, short_conv
from metrale_kernels.reference.moe_experts import fused_moe
from metrale_kernels.reference.moe_routing import grouped_sigmoid_topk_routing, softmax_topk_routing
from metrale_kernels.reference.q4_matmul import (
    Q4_BLOCK,
    Q4_PANEL,
    dequantize_q4,
    q4_linear,
    q4_shape_error,
    quantize_q4,
)
from metrale_kernels.rotary import (
    cos_sin_cache,
    default_inv_freq,
    dynamic_ntk_inv_freq,
    linear_inv_freq,
    llama3_inv_freq,
)

__all__ = [
    "BACKEND_NAMES",
    "Q4_BLOCK",
    "Q4_PANEL",
    "AttentionMetadata",
    "BackendUnavailableError",
    "ColumnSplit",
    "CpuFeatures",
    "KernelBackend",
    "TorchBackend",
    "build_attention_metadata",
    "compute_dtype",
    "cos_sin_cache",
    "cpu_features",
    "default_inv_freq",
    "dequantize_q4",
    "dequantize_rows",
    "dynamic_ntk_inv_freq",
    "fused_moe",
    "get_backend",
    "grouped_sigmoid_topk_routing",
    "index_scores",
    "int8_linear",
    "kda_chunked",
    "kda_decode_step",
    "kda_recurrent",
    "linear_inv_freq",
    "llama3_inv_freq",
    "pool_index_keys",
    "q4_linear",
    "q4_shape_error",
    "quantize_per_row",
    "quantize_q4",
    "select_positions",
    "short_conv",
    "softmax_topk_routing",
    "sparse_latent_attention",
    "widened",
]
