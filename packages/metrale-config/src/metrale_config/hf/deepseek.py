"""``config.json`` → ``ModelConfig`` for DeepSeek-V2 / V2-Lite / V2.5 (``deepseek_v2``) and
DeepSeek-V3 / R1 (``deepseek_v3``): MLA attention, dense MLPs before ``first_k_dense_replace``,
then DeepSeek's MoE.

Defaults follow transformers' ``DeepseekV2Config`` / ``DeepseekV3Config``. ``head_dim`` is the
query/key head dim ``qk_nope_head_dim + qk_rope_head_dim`` (transformers writes
``qk_rope_head_dim`` there: the width its rotary table reads, here ``mla.qk_rope_head_dim``);
``num_key_value_heads`` is ``num_attention_heads`` whatever the file says (every head reads
the one cached latent).
Routing is told by the MoE fields alone: V2's ``greedy`` is one group (``n_group`` and
``topk_group`` 1, whatever the file says), ``group_limited_greedy`` keeps its groups; V3's
``noaux_tc`` (sigmoid scores plus a correction bias) is the only V3 method.
V3's multi-token-prediction layers (``num_nextn_predict_layers``) sit at index
``num_hidden_layers + k`` and take their MLP by the same rule as the stack; V2 has none.
DeepSeek-V3.2 (``deepseek_v32``) is V3 with a DSA lightning indexer (``index_*``) on every
layer, selecting single tokens (``index_kpool`` 1, no tail); it is served without MTP layers.
"""

from __future__ import annotations

import attrs

from metrale_config.fields import FieldReader
from metrale_config.hf.common import parse_mtp
from metrale_config.hf.llama_like import parse_common
from metrale_config.layer_types import LayerType
from metrale_config.model_config import DsaConfig, MlaConfig, ModelConfig, MoeConfig

V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
V3_TOPK_METHOD = "noaux_tc"
SCORING_FUNCS = {"deepseek_v2": "softmax", "deepseek_v3": "sigmoid", "deepseek_v32": "sigmoid"}
DEEPSEEK_V32 = "deepseek_v32"


@attrs.frozen(kw_only=True)
class _Defaults:
    num_experts: int
    moe_intermediate_size: int
    num_shared_experts: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    first_k_dense_replace: int
    n_group: int
    topk_group: int


_DEFAULTS = {
    "deepseek_v2": _Defaults(
        num_experts=64,
        moe_intermediate_size=1407,
        num_shared_experts=2,
        routed_scaling_factor=1.0,
        norm_topk_prob=False,
        first_k_dense_replace=0,
        n_group=1,
        topk_group=1,
    ),
    "deepseek_v3": _Defaults(
        num_experts=256,
        moe_intermediate_size=2048,
        num_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=3,
        n_group=8,
        topk_group=4,
    ),
}
_DEFAULTS[DEEPSEEK_V32] = _DEFAULTS["deepseek_v3"]


def parse_deepseek(reader: FieldReader, model_type: str) -> ModelConfig:
    config = parse_common(reader, model_type)
    mla = _parse_mla(reader, model_type)
    attention_bias = reader.boolean("attention_bias", False)
    num_layers = config.num_hidden_layers
    mtp = parse_mtp(reader) if model_type == "deepseek_v3" else None
    num_mtp = mtp.num_layers if mtp is not None else 0
    moe = _parse_moe(reader, model_type, num_layers + num_mtp)
    kinds = moe.mlp_layer_types
    if mtp is not None:
        mtp = attrs.evolve(mtp, mlp_layer_types=kinds[num_layers:])
    is_v32 = model_type == DEEPSEEK_V32
    return attrs.evolve(
        config,
        layer_types=(LayerType.SPARSE_ATTENTION,) * num_layers if is_v32 else config.layer_types,
        dsa=_parse_v32_indexer(reader, num_layers) if is_v32 else None,
        head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        num_key_value_heads=config.num_attention_heads,
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        mlp_bias=reader.boolean("mlp_bias", False) if model_type == "deepseek_v2" else False,
        mla=mla,
        moe=attrs.evolve(moe, mlp_layer_types=kinds[:num_layers]),
        mtp=mtp,
    )


def _parse_mla(reader: FieldReader, model_type: str) -> MlaConfig:
    q_lora_rank = reader.optional_integer("q_lora_rank", 1536)
    if q_lora_rank is not None:
        q_lora_rank = reader.positive_integer("q_lora_rank", 1536)
    return MlaConfig(
        q_lora_rank=q_lora_rank,
        kv_lora_rank=reader.positive_integer("kv_lora_rank", 512),
        qk_nope_head_dim=reader.positive_integer("qk_nope_head_dim", 128),
        qk_rope_head_dim=_even(reader, "qk_rope_head_dim", 64),
        v_head_dim=reader.positive_integer("v_head_dim", 128),
        rope_interleave=model_type == "deepseek_v2" or reader.boolean("rope_interleave", True),
    )


def _parse_v32_indexer(reader: FieldReader, num_layers: int) -> DsaConfig:
    return DsaConfig(
        index_n_heads=reader.positive_integer("index_n_heads", 64),
        index_head_dim=reader.positive_integer("index_head_dim", 128),
        index_topk=reader.positive_integer("index_topk", 2048),
        index_kpool=1,
        index_kpool_always_select_tail=False,
        indexer_types=("full",) * num_layers,
    )


def _even(reader: FieldReader, name: str, default: int) -> int:
    value = reader.positive_integer(name, default)
    if value % 2:
        raise reader.error(name, f"must be even (rotary turns pairs), got {value}")
    return value


def _parse_moe(reader: FieldReader, model_type: str, num_layers: int) -> MoeConfig:
    defaults = _DEFAULTS[model_type]
    scoring = reader.string("scoring_func", SCORING_FUNCS[model_type])
    if scoring != SCORING_FUNCS[model_type]:
        raise reader.error(
            "scoring_func", f"must be {SCORING_FUNCS[model_type]!r} for {model_type}"
        )
    n_group = reader.optional_integer("n_group") or defaults.n_group
    topk_group = reader.optional_integer("topk_group") or defaults.topk_group
    if model_type == "deepseek_v2":
        method = reader.string("topk_method", "greedy")
        if method not in V2_TOPK_METHODS:
            raise reader.error("topk_method", f"must be one of {', '.join(V2_TOPK_METHODS)}")
        if method == "greedy":
            n_group = topk_group = 1
    elif reader.is_set("topk_method") and reader.string("topk_method") != V3_TOPK_METHOD:
        raise reader.error("topk_method", f"must be {V3_TOPK_METHOD!r} for {model_type}")
    if n_group < 1 or not 0 < topk_group <= n_group:
        raise reader.error("topk_group", f"must be in 1..n_group ({n_group}), got {topk_group}")
    first_dense = reader.optional_integer("first_k_dense_replace")
    first_dense = defaults.first_k_dense_replace if first_dense is None else first_dense
    if first_dense < 0:
        raise reader.error("first_k_dense_replace", f"must not be negative, got {first_dense}")
    layer_freq = reader.positive_integer("moe_layer_freq", 1)
    num_shared = reader.integer("n_shared_experts", defaults.num_shared_experts)
    if num_shared < 0:
        raise reader.error("n_shared_experts", f"must not be negative, got {num_shared}")
    moe_intermediate_size = reader.positive_integer(
        "moe_intermediate_size", defaults.moe_intermediate_size
    )
    return MoeConfig(
        num_experts=reader.positive_integer("n_routed_experts", defaults.num_experts),
        num_experts_per_tok=reader.positive_integer("num_experts_per_tok"),
        moe_intermediate_size=moe_intermediate_size,
        num_shared_experts=num_shared,
        shared_expert_intermediate_size=moe_intermediate_size * num_shared or None,
        norm_topk_prob=reader.boolean("norm_topk_prob", defaults.norm_topk_prob),
        routed_scaling_factor=reader.number(
            "routed_scaling_factor", defaults.routed_scaling_factor
        ),
        n_group=n_group,
        topk_group=topk_group,
        # DeepSeek's rule: sparse from first_k_dense_replace on, every moe_layer_freq-th layer.
        mlp_layer_types=tuple(
            "sparse" if i >= first_dense and i % layer_freq == 0 else "dense"
            for i in range(num_layers)
        ),
    )
