"""One prompt, one paged KV cache, token by token: the path behind ``met generate``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from metrale_kernels import build_attention_metadata
from metrale_model_arch import LoadedModel, allocate_kv_cache

BLOCK_SIZE_TOKENS = 16


def sample_next(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Greedy at temperature 0, otherwise a draw from ``softmax(logits / temperature)``."""
    if temperature == 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def generate_token_ids(
    loaded: LoadedModel,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
    stop_token_ids: frozenset[int] = frozenset(),
) -> Iterator[int]:
    """Yield up to ``max_tokens`` new token ids; a stop token is yielded, then generation ends."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    total_tokens = len(prompt_ids) + max_tokens
    if total_tokens > loaded.max_seq_len:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"max_seq_len ({loaded.max_seq_len})"
        )
    device = loaded.device
    num_blocks = -(-total_tokens // BLOCK_SIZE_TOKENS)
    kv_caches = allocate_kv_cache(
        loaded.config,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE_TOKENS,
        dtype=loaded.dtype,
        device=device,
    )
    block_table = list(range(num_blocks))
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    context_len = 0
    query = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(max_tokens):
            context_len += len(query)
            metadata = build_attention_metadata(
                block_tables=[block_table],
                seq_lens=[context_len],
                query_lens=[len(query)],
                block_size=BLOCK_SIZE_TOKENS,
                device=device,
            )
            positions = torch.arange(context_len - len(query), context_len, device=device)
            input_ids = torch.tensor(query, dtype=torch.int64, device=device)
            hidden = loaded.model(input_ids, positions, kv_caches, metadata)
            logits = loaded.model.compute_logits(hidden[-1:])[0]
            token_id = sample_next(logits, temperature, generator)
            yield token_id
            if token_id in stop_token_ids:
                return
            query = [token_id]
