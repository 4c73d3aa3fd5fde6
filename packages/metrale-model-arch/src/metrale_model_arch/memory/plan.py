"""The preflight memory plan: every byte of the budget given an owner, from config + serve args.

``plan_memory`` runs before any weight is loaded. The budget is ``total_bytes x
gpu_memory_utilization``; from it come the weights, the reserve terms (per-sequence state for
``max_batch_size`` slots, the linear-attention state pool, the buffer arena, runtime headroom,
and a speculative draft model's weights when one is planned) and what is left is the KV pool,
in whole blocks (each also buying a draft block, when a draft model or the model's own MTP
layer drafts: the draft pool), clamped to
what ``max_batch_size`` full-length sequences can ever use and to ``kv_cache_max_bytes`` when
set. A plan that cannot hold the weights, or the reserve plus one ``max_seq_len`` sequence of
KV, raises :class:`MemoryPlanError` naming the term and the flags.
"""

from __future__ import annotations

import attrs

from metrale_config import ModelConfig
from metrale_model_arch.kv_cache_dtype import KvCacheDtype
from metrale_model_arch.memory.arena import buffer_arena_bytes
from metrale_model_arch.memory.draft import (
    DraftInputs,
    draft_kv_bytes_per_token,
    draft_model_bytes,
    draft_state_bytes,
    mtp_kv_bytes_per_token,
)
from metrale_model_arch.memory.encoder import (
    EncoderInputs,
    encoder_activation_bytes,
    encoder_cache_bytes,
)
from metrale_model_arch.memory.headroom import runtime_headroom_bytes
from metrale_model_arch.memory.kv_price import kv_bytes_per_token
from metrale_model_arch.memory.linear_state import linear_state_pool_bytes
from metrale_model_arch.memory.rope_table import rope_table_bytes
from metrale_model_arch.memory.seq_state_reserve import PerSequenceState, per_sequence_state_bytes
from metrale_model_arch.memory.sliding_window_kv import sliding_window_kv_bytes
from metrale_model_arch.memory.spec_rollback import spec_checkpoint_reserve_bytes
from metrale_model_arch.memory.weights import WeightBytes, weight_bytes
from metrale_model_arch.owners import (
    BUFFER_ARENA,
    DRAFT_KV_POOL,
    DRAFT_MODEL,
    ENCODER_ACTIVATIONS,
    ENCODER_CACHE,
    KV_POOL,
    LINEAR_STATE_POOL,
    PER_SEQUENCE_STATE,
    PROPOSER_STATE,
    ROPE_TABLE,
    RUNTIME_HEADROOM,
    SLIDING_WINDOW_KV,
    SPEC_STATE_SNAPSHOT,
)
from metrale_model_arch.registry import cache_specs
from metrale_model_arch.sliding_window_ring import RingLayout, SlidingWindowCache, ring_specs_of
from metrale_model_arch.weight_format import Quantization

__all__ = [
    "BUFFER_ARENA",
    "DRAFT_KV_POOL",
    "DRAFT_MODEL",
    "ENCODER_ACTIVATIONS",
    "ENCODER_CACHE",
    "KV_POOL",
    "LINEAR_STATE_POOL",
    "PER_SEQUENCE_STATE",
    "ROPE_TABLE",
    "RUNTIME_HEADROOM",
    "SLIDING_WINDOW_KV",
    "MemoryPlan",
    "MemoryPlanError",
    "PlanInputs",
    "plan_memory",
]

MAX_AUTO_BATCH_SIZE = 128
TRANSIENT_OWNERS = (RUNTIME_HEADROOM, ENCODER_ACTIVATIONS)
GIB = 2**30


class MemoryPlanError(ValueError):
    """The plan does not fit the budget. ``term`` names what did not fit."""

    def __init__(self, message: str, *, term: str) -> None:
        super().__init__(message)
        self.term = term


@attrs.frozen(kw_only=True)
class PlanInputs:
    """The serve arguments the plan reads. ``max_batch_size=None`` is ``auto``."""

    device_kind: str
    total_bytes: int
    gpu_memory_utilization: float
    dtype_bytes: int
    max_seq_len: int
    block_size: int = 16
    max_batch_size: int | None = 8
    max_batch_tokens: int = 2048
    num_kv_blocks: int | None = None
    # At most this many bytes of KV pool and sliding-window rings (``None``: whatever the
    # budget leaves), yet always room for one ``max_seq_len`` sequence.
    kv_cache_max_bytes: int | None = None
    spec_on: bool = False
    indexer_paged: bool = True
    quantization: Quantization = Quantization.NONE
    # How K/V attention layers store their cache (the draft model's pool keeps the serve dtype).
    kv_cache_dtype: KvCacheDtype = KvCacheDtype.AUTO
    # A speculative draft model to reserve for (its weights, and its own KV pool of as many
    # blocks as the target's).
    draft: DraftInputs | None = None
    # Speculation by the model's own first MTP layer (its weights are the target's): its K/V
    # in the draft pool, one draft block for each of the target's blocks.
    mtp: bool = False
    # Images served through the model's vision tower: its output cache and batch activations.
    encoder: EncoderInputs | None = None
    # Sliding-window layers in a ring per sequence (``ring``) or in the KV pool (``full``).
    sliding_window_cache: SlidingWindowCache = SlidingWindowCache.RING

    @property
    def budget_bytes(self) -> int:
        return int(self.total_bytes * self.gpu_memory_utilization)

    @property
    def ring(self) -> RingLayout | None:
        """How sliding-window rings would be sized (``None``: the lever keeps them in the
        pool); the plan decides whether they pay (``MemoryPlan.ring``)."""
        if self.sliding_window_cache is SlidingWindowCache.FULL:
            return None
        return RingLayout(
            block_size=self.block_size,
            max_batch_tokens=self.max_batch_tokens,
            max_seq_len=self.max_seq_len,
        )

    @property
    def blocks_per_sequence(self) -> int:
        return -(-self.max_seq_len // self.block_size)


@attrs.frozen(kw_only=True)
class MemoryPlan:
    """A plan that fits. ``by_owner`` adds up to ``used_bytes`` <= ``budget_bytes``."""

    inputs: PlanInputs
    max_batch_size: int
    weights: WeightBytes
    rope_table_bytes: int
    kv_bytes_per_token: int
    kv_blocks: int
    per_sequence: PerSequenceState
    per_sequence_reserve_bytes: int
    linear_state_pool_bytes: int
    buffer_arena_bytes: int
    runtime_headroom_bytes: int
    draft_model_bytes: int = 0
    draft_kv_bytes_per_token: int = 0
    encoder_cache_bytes: int = 0
    encoder_activation_bytes: int = 0
    # Speculation over per-sequence state: each slot's checkpoint (``spec_state_snapshot``).
    spec_snapshot_bytes: int = 0
    # The sliding-window layers' K/V rings, every slot's (``sliding_window_kv``), and how
    # they are sized; ``None`` with the layers in the KV pool.
    sliding_window_kv_bytes: int = 0
    ring: RingLayout | None = None

    @property
    def budget_bytes(self) -> int:
        return self.inputs.budget_bytes

    @property
    def kv_block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.inputs.block_size

    @property
    def kv_pool_bytes(self) -> int:
        return self.kv_blocks * self.kv_block_bytes

    @property
    def draft_kv_block_bytes(self) -> int:
        return self.draft_kv_bytes_per_token * self.inputs.block_size

    @property
    def draft_kv_pool_bytes(self) -> int:
        """The draft model's paged pool: one draft block for each of the target's blocks."""
        return self.kv_blocks * self.draft_kv_block_bytes

    @property
    def block_bytes(self) -> int:
        """What one more KV block costs: the target's block and the draft's, if any."""
        return self.kv_block_bytes + self.draft_kv_block_bytes

    @property
    def max_kv_tokens(self) -> int:
        return self.kv_blocks * self.inputs.block_size

    @property
    def reserve_bytes(self) -> int:
        return sum(_reserve_terms(self).values())

    @property
    def pre_kv_bytes(self) -> int:
        """Weights and the tables built with them: what is resident before the KV pool."""
        return self.weights.total() + self.rope_table_bytes

    @property
    def used_bytes(self) -> int:
        return self.pre_kv_bytes + self.reserve_bytes + self.kv_blocks * self.block_bytes

    @property
    def admitted_sequences(self) -> int:
        """Full-length sequences that can run at once: slots, bounded by the KV pool."""
        return min(self.max_batch_size, self.kv_blocks // self.inputs.blocks_per_sequence)

    def by_owner(self) -> dict[str, int]:
        """Every owner's bytes, including terms that are reserved but never allocated."""
        return {
            **self.weights.by_owner(),
            ROPE_TABLE: self.rope_table_bytes,
            KV_POOL: self.kv_pool_bytes,
            **({DRAFT_KV_POOL: self.draft_kv_pool_bytes} if self.draft_kv_bytes_per_token else {}),
            **_reserve_terms(self),
        }

    def allocated_by_owner(self) -> dict[str, int]:
        """The owners the allocation ledger must show, with the bytes it must show for each.

        Runtime headroom and the encoder's activations are transient, never a standing
        allocation; the per-sequence and linear-state terms are planned for the families that
        own such state.
        """
        return {
            owner: size
            for owner, size in self.by_owner().items()
            if owner not in TRANSIENT_OWNERS and size > 0
        }


def _reserve_terms(plan: MemoryPlan) -> dict[str, int]:
    batch = max(plan.max_batch_size, 1)
    terms = {
        PER_SEQUENCE_STATE: plan.per_sequence.target_layers * batch,
        LINEAR_STATE_POOL: plan.linear_state_pool_bytes,
        BUFFER_ARENA: plan.buffer_arena_bytes,
        RUNTIME_HEADROOM: plan.runtime_headroom_bytes,
    }
    if plan.per_sequence.proposer:
        terms[PROPOSER_STATE] = plan.per_sequence.proposer * batch
    if plan.spec_snapshot_bytes:
        terms[SPEC_STATE_SNAPSHOT] = plan.spec_snapshot_bytes
    if plan.sliding_window_kv_bytes:
        terms[SLIDING_WINDOW_KV] = plan.sliding_window_kv_bytes
    if plan.inputs.draft is not None:
        terms[DRAFT_MODEL] = plan.draft_model_bytes
    if plan.inputs.encoder is not None:
        terms[ENCODER_CACHE] = plan.encoder_cache_bytes
        terms[ENCODER_ACTIVATIONS] = plan.encoder_activation_bytes
    return terms


def plan_memory(config: ModelConfig, inputs: PlanInputs) -> MemoryPlan:
    """The plan for ``config`` under ``inputs``; ``max_batch_size=None`` picks the slot count
    in 1..128 that admits the most full-length sequences (ties to the smaller)."""
    if inputs.max_batch_size is not None:
        return _plan_at(config, inputs, inputs.max_batch_size)
    best: MemoryPlan | None = None
    first_error: MemoryPlanError | None = None
    for slots in range(1, MAX_AUTO_BATCH_SIZE + 1):
        try:
            plan = _plan_at(config, inputs, slots)
        except MemoryPlanError as error:
            first_error = first_error or error
            break  # every term grows with the slot count: more slots cannot fit either
        if best is None or plan.admitted_sequences > best.admitted_sequences:
            best = plan
    if best is None:
        assert first_error is not None
        raise first_error
    return best


def _plan_at(config: ModelConfig, inputs: PlanInputs, max_batch_size: int) -> MemoryPlan:
    """The plan at ``max_batch_size`` slots, with sliding-window rings where they pay: where
    the KV pool then holds more tokens than with every layer in it (or as many, in less
    memory). Rings cost every slot its window whatever its length, so at many slots of short
    sequences the pool is the better home."""
    ring = inputs.ring
    if ring is None or not ring_specs_of(
        cache_specs(config, indexer_paged=inputs.indexer_paged, ring=ring)
    ):
        return _plan_with(config, inputs, max_batch_size, None)
    try:
        pooled = _plan_with(config, inputs, max_batch_size, None)
    except MemoryPlanError:
        return _plan_with(config, inputs, max_batch_size, ring)
    try:
        ringed = _plan_with(config, inputs, max_batch_size, ring)
    except MemoryPlanError:
        return pooled
    rings_pay = ringed.max_kv_tokens > pooled.max_kv_tokens or (
        ringed.max_kv_tokens == pooled.max_kv_tokens and ringed.used_bytes < pooled.used_bytes
    )
    return ringed if rings_pay else pooled


def _plan_with(
    config: ModelConfig, inputs: PlanInputs, max_batch_size: int, ring: RingLayout | None
) -> MemoryPlan:
    budget = inputs.budget_bytes
    weights = weight_bytes(config, inputs.dtype_bytes, inputs.quantization)
    rope = rope_table_bytes(config, inputs.max_seq_len)
    # Only the MTP proposer owns per-sequence state: n-gram and draft-model speculation none.
    per_sequence = per_sequence_state_bytes(
        config,
        inputs.max_seq_len,
        inputs.mtp,
        indexer_paged=inputs.indexer_paged,
        dtype_bytes=inputs.dtype_bytes,
    )
    per_token = kv_bytes_per_token(
        config,
        inputs.dtype_bytes,
        indexer_paged=inputs.indexer_paged,
        kv_cache_dtype=inputs.kv_cache_dtype,
        ring=ring,
    )
    plan = MemoryPlan(
        inputs=inputs,
        max_batch_size=max_batch_size,
        weights=weights,
        rope_table_bytes=rope,
        kv_bytes_per_token=per_token,
        kv_blocks=0,
        per_sequence=per_sequence,
        per_sequence_reserve_bytes=per_sequence.for_batch(max_batch_size),
        spec_snapshot_bytes=spec_checkpoint_reserve_bytes(
            config,
            max_batch_size,
            indexer_paged=inputs.indexer_paged,
            spec_on=inputs.spec_on,
            dtype_bytes=inputs.dtype_bytes,
        ),
        linear_state_pool_bytes=linear_state_pool_bytes(config, max_batch_size, inputs.dtype_bytes),
        sliding_window_kv_bytes=(
            0
            if ring is None
            else sliding_window_kv_bytes(
                config,
                max_batch_size,
                inputs.dtype_bytes,
                ring,
                kv_cache_dtype=inputs.kv_cache_dtype,
            )
        ),
        ring=ring,
        buffer_arena_bytes=buffer_arena_bytes(
            config,
            max_batch_tokens=inputs.max_batch_tokens,
            max_batch_size=max_batch_size,
            dtype_bytes=inputs.dtype_bytes,
            max_seq_len=inputs.max_seq_len,
            block_size=inputs.block_size,
        ),
        runtime_headroom_bytes=runtime_headroom_bytes(
            config,
            device_kind=inputs.device_kind,
            budget_bytes=budget,
            max_batch_tokens=inputs.max_batch_tokens,
            max_seq_len=inputs.max_seq_len,
            dtype_bytes=inputs.dtype_bytes,
        ),
    )
    if inputs.draft is not None:
        plan = attrs.evolve(
            plan,
            draft_model_bytes=draft_model_bytes(
                inputs.draft, inputs.dtype_bytes, inputs.max_seq_len
            )
            + draft_state_bytes(inputs.draft, max_batch_size, inputs.dtype_bytes),
            draft_kv_bytes_per_token=draft_kv_bytes_per_token(inputs.draft, inputs.dtype_bytes),
        )
    if inputs.encoder is not None:
        plan = attrs.evolve(
            plan,
            encoder_cache_bytes=encoder_cache_bytes(config, inputs.encoder, inputs.dtype_bytes),
            encoder_activation_bytes=encoder_activation_bytes(
                config, inputs.encoder, inputs.dtype_bytes
            ),
        )
    if inputs.mtp:
        per_draft_token = mtp_kv_bytes_per_token(config, inputs.dtype_bytes)
        plan = attrs.evolve(plan, draft_kv_bytes_per_token=per_draft_token)
    if plan.pre_kv_bytes > budget:
        raise MemoryPlanError(
            f"the weights need {_gib(plan.pre_kv_bytes)} but the budget is {_budget(inputs)}; "
            "raise --gpu-memory-utilization, choose a smaller --dtype, or serve a smaller model",
            term="weights",
        )
    kv_room = budget - plan.pre_kv_bytes - plan.reserve_bytes
    blocks_per_seq = inputs.blocks_per_sequence
    if plan.block_bytes:
        blocks_fit = max(kv_room, 0) // plan.block_bytes
    elif kv_room >= 0:  # every layer in a ring: blocks cost nothing, as many as can be used
        blocks_fit = max(max_batch_size * blocks_per_seq, inputs.num_kv_blocks or 0)
    else:
        blocks_fit = 0
    if blocks_fit < blocks_per_seq:
        term, size = max(_reserve_terms(plan).items(), key=lambda item: item[1])
        raise MemoryPlanError(
            f"one --max-seq-len={inputs.max_seq_len} sequence needs "
            f"{_gib(blocks_per_seq * plan.block_bytes)} of KV cache, but the budget "
            f"({_budget(inputs)}) less {_gib(plan.pre_kv_bytes)} of weights and "
            f"{_gib(plan.reserve_bytes)} of reserve (largest term: {term}, {_gib(size)}) "
            f"leaves {_gib(max(kv_room, 0))}; lower --max-seq-len, --max-batch-size or "
            "--max-prefill-tokens, or raise --gpu-memory-utilization",
            term="kv_cache",
        )
    if inputs.num_kv_blocks is not None:
        if inputs.num_kv_blocks > blocks_fit:
            raise MemoryPlanError(
                f"--num-kv-blocks={inputs.num_kv_blocks} needs "
                f"{_gib(inputs.num_kv_blocks * plan.block_bytes)} but only {blocks_fit} "
                f"blocks ({_gib(blocks_fit * plan.block_bytes)}) fit in the budget "
                f"({_budget(inputs)}); lower --num-kv-blocks or raise --gpu-memory-utilization",
                term="kv_cache",
            )
        kv_blocks = inputs.num_kv_blocks
    else:
        kv_blocks = min(blocks_fit, max_batch_size * blocks_per_seq)
        if inputs.kv_cache_max_bytes is not None and plan.kv_block_bytes:
            # The sliding-window rings are K/V too: the cap holds them and the pool together.
            pool_cap = max(inputs.kv_cache_max_bytes - plan.sliding_window_kv_bytes, 0)
            cap_blocks = max(pool_cap // plan.kv_block_bytes, blocks_per_seq)
            kv_blocks = min(kv_blocks, cap_blocks)
    return attrs.evolve(plan, kv_blocks=kv_blocks)


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def _budget(inputs: PlanInputs) -> str:
    return (
        f"{_gib(inputs.total_bytes)} total x {inputs.gpu_memory_utilization:g} "
        f"--gpu-memory-utilization = {_gib(inputs.budget_bytes)}"
    )
