"""DeepSeek-V2 / V3 / V3.2 (``deepseek_v2``, ``deepseek_v3``, ``deepseek_v32``): MLA attention
over a paged latent cache (:mod:`.attention`; V3.2 attends where its lightning indexer selects,
:mod:`.sparse_attention`), a dense SwiGLU MLP on the layers before ``first_k_dense_replace`` (and
off ``moe_layer_freq``), DeepSeek's MoE elsewhere: V2's softmax routing (:mod:`.moe`), V3's
sigmoid scores with a correction bias, group-limited
(:class:`~metrale_model_arch.families.glm5_next.mlp.GlmMoeBlock`).

A V3 checkpoint's multi-token-prediction layers (``model.layers.{num_hidden_layers + k}``) are
loaded into ``model.mtp_layers`` (:mod:`.mtp`), owned by ``weights.mtp`` in the memory plan;
MTP speculation runs the first (``forward_mtp``). Eager only, a
:class:`~metrale_model_arch.families.decoder_stack.DecoderStack`: no layer here is a llama layer.
"""

from __future__ import annotations

from torch import nn

from metrale_config import ModelConfig
from metrale_kernels import KernelBackend
from metrale_model_arch.counts.moe import SPARSE, require_moe
from metrale_model_arch.families.decoder_stack import DecoderStack
from metrale_model_arch.families.deepseek.decoder_layer import (
    DEEPSEEK_V2,
    DEEPSEEK_V32,
    DeepseekDecoderLayer,
)
from metrale_model_arch.families.deepseek.mtp import DeepseekMtpLayer
from metrale_model_arch.families.llama import UNSUPPORTED_FEATURES, RMSNorm, check_supported
from metrale_model_arch.families.mtp_causal_lm import MtpCausalLM, log_mtp_layers
from metrale_model_arch.families.rotary import rope_or_yarn_cos_sin_table


class DeepseekModel(DecoderStack):
    def __init__(self, config: ModelConfig, max_seq_len: int, backend: KernelBackend) -> None:
        # cos_sin_cache: (max_seq_len, qk_rope_head_dim), YaRN's with DeepSeek's mscale.
        super().__init__(
            config,
            (
                DeepseekDecoderLayer(config, kind == SPARSE, backend)
                for kind in require_moe(config).mlp_layer_types
            ),
            RMSNorm(config.hidden_size, config.rms_norm_eps, backend),
            rope_or_yarn_cos_sin_table(config, max_seq_len),
        )
        mtp_kinds = config.mtp.mlp_layer_types if config.mtp is not None else ()
        self.mtp_layers = nn.ModuleList(
            DeepseekMtpLayer(config, kind == SPARSE, backend) for kind in mtp_kinds
        )


class DeepseekForCausalLM(MtpCausalLM):
    """Model types ``deepseek_v2``, ``deepseek_v3`` and ``deepseek_v32`` (see
    :class:`CausalLM` and this module's docstring)."""

    model: DeepseekModel

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        check_deepseek_config(config)

    def build_model(self) -> DeepseekModel:
        model = DeepseekModel(self.config, self.max_seq_len, self.backend)
        log_mtp_layers(self.config.model_type, len(model.mtp_layers))
        return model


def check_deepseek_config(config: ModelConfig) -> None:
    """Raise ``ValueError`` naming what this family cannot run in ``config``."""
    moe = require_moe(config)
    if config.mla is None:
        raise ValueError(f"{config.source}: a {config.model_type} config needs its MLA fields")
    supported = ("moe", "mla", "dsa") if config.model_type == DEEPSEEK_V32 else ("moe", "mla")
    check_supported(config, tuple(f for f in UNSUPPORTED_FEATURES if f not in supported))
    if config.mlp_bias:
        raise ValueError(f"{config.source}: {config.model_type} with mlp_bias is not supported")
    if config.model_type == DEEPSEEK_V2 and moe.norm_topk_prob:
        # transformers' DeepseekV2 ignores it; no published V2 config sets it.
        raise ValueError(f"{config.source}: deepseek_v2 with norm_topk_prob is not supported")
    mtp = config.mtp
    if mtp is not None and len(mtp.mlp_layer_types) != mtp.num_layers:
        raise ValueError(
            f"{config.source}: {mtp.num_layers} MTP layers but {len(mtp.mlp_layer_types)} "
            "MTP MLP kinds"
        )
