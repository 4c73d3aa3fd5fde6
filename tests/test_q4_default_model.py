"""The served default format, q4, against float32 on the bundled default model (the same Q4_1
GGUF, dequantized): the same weights, every quantized op within the error its format allows,
and a perplexity within 1% of float32's.

q4 (:mod:`metrale_model_arch.weight_format`) keeps the projections' Q4_1 blocks, so its weights
are float32's exactly; what differs is that each projection's input is written as two int8
digits (:func:`metrale_kernels.reference.int8_matmul.two_digit_rows`: off by at most ``s / 508`` per
element, ``s = max|x| / 127`` of its row), and that the embeddings and the (tied) head are
int8 per row (off by at most half a step ``sw / 2`` per weight). The bounds here follow from
that alone, plus float32 rounding bounded as for any dot product of length ``K`` in any order
(Higham's ``K u sum |x| |w|``, ``u = 2**-24``; the reference's sums are plain float32 dot
products, the q4 and int8 kernels' are exact integer sums with a few float32 operations on
top, so ``2 K u`` covers both sides). No tolerance is read off the measured errors.

Through 30 layers the format's errors compound nonlinearly (norms, softmax attention, SiLU), so
no bound on the end-to-end logits follows from the format alone: each quantized op is checked
on the float32 model's own activations (the head's output being the logits), and the end to
end effect by perplexity on ``benches/data/perplexity_text.txt`` (as
``benches/format_quality.py`` computes its "all tokens" figure, over the text's first two
512-token chunks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from metrale_testing.greedy import prefill_hidden
from torch import nn

from metrale_kernels import dequantize_q4
from metrale_kernels.reference.int8_matmul import (
    DIGIT_BASE,
    INT8_MAX,
    error_bound,
    quantize_per_row,
)
from metrale_kernels.reference.q4_matmul import Q4_BLOCK, Q4_LEVELS, block_scales
from metrale_model_arch import (
    LlamaForCausalLM,
    LoadedModel,
    LoadOptions,
    load_model,
)
from metrale_model_arch.families.int8_layers import Int8Embedding, Int8Linear
from metrale_model_arch.families.q4_layers import Q4Linear

pytestmark = pytest.mark.slow

TEXT_PATH = Path(__file__).parents[1] / "benches" / "data" / "perplexity_text.txt"
BLOCK_SIZE = 16
CTX = 512  # perplexity chunk length, as format_quality's default
# The text's first two 512-token chunks (of ~5.6): the whole text through both models takes
# minutes on a 2-core machine. Measured on a 2-core AMD EPYC (AVX2): float32 19.42, q4 19.50
# (+0.42%); on the whole text 22.14 and 22.22 (+0.35%), no chunk above +0.7%.
NUM_CHUNKS = 2
NUM_OP_TOKENS = 64  # tokens whose activations check each op
UNIT_ROUNDOFF = 2.0**-24  # float32
# The head's int8 matmul on at most 4 rows (8 rows of digits) takes the native kernel's
# few-rows path, as every decode step of up to 4 sequences does; integer sums being exact, it
# is bit-identical to oneDNN's GEMM, which on a CPU without int8 dot products (AVX2 only) runs
# at ~0.5 GMAC/s: all positions' logits at once would take minutes.
HEAD_ROWS = 4


@pytest.fixture(scope="module")
def float32_model() -> LoadedModel:
    return load_model(None, LoadOptions(dtype=torch.float32, quantization="none"))


@pytest.fixture(scope="module")
def q4_model() -> LoadedModel:
    return load_model(None, LoadOptions(dtype=torch.float32, quantization="q4"))


@pytest.fixture(scope="module")
def text_tokens(float32_model: LoadedModel) -> list[int]:
    tokens = float32_model.tokenizer.encode(TEXT_PATH.read_text("utf-8"), add_special_tokens=True)
    assert len(tokens) >= NUM_CHUNKS * CTX
    return tokens


def llama(loaded: LoadedModel) -> LlamaForCausalLM:
    assert isinstance(loaded.model, LlamaForCausalLM)
    return loaded.model


def float_weight(loaded: LoadedModel, name: str) -> torch.Tensor:
    """The float32 matrix of projection ``name`` (a float model's)."""
    module = loaded.model.get_submodule(name)
    assert isinstance(module, nn.Linear), (name, module)
    return module.weight


def quantized_modules(loaded: LoadedModel) -> dict[str, nn.Module]:
    return {
        name: module
        for name, module in loaded.model.named_modules()
        if isinstance(module, Q4Linear | Int8Linear | Int8Embedding)
    }


def prefill(loaded: LoadedModel, tokens: Sequence[int]) -> torch.Tensor:
    """The final normed hidden state ``(tokens, hidden)`` of one fresh sequence's prefill."""
    hidden: torch.Tensor = prefill_hidden(loaded, tokens, BLOCK_SIZE)
    return hidden


def logits(loaded: LoadedModel, hidden: torch.Tensor) -> torch.Tensor:
    """The head's logits, ``HEAD_ROWS`` rows a call for an int8 head, all at once else."""
    rows = HEAD_ROWS if isinstance(llama(loaded).lm_head, Int8Linear) else hidden.shape[0]
    with torch.inference_mode():
        return torch.cat(
            [
                loaded.model.compute_logits(hidden[start : start + rows])
                for start in range(0, hidden.shape[0], rows)
            ]
        )


def digit_error(x: torch.Tensor) -> torch.Tensor:
    """``(rows, 1)``: the most an element of each row is off once written as two digits."""
    return x.abs().amax(dim=-1, keepdim=True) / INT8_MAX / (2 * DIGIT_BASE)


def q4_bound(x: torch.Tensor, weight: torch.Tensor, module: Q4Linear) -> torch.Tensor:
    """``|q4(x) - x @ weight.T|`` at most, ``weight`` being the module's blocks dequantized."""
    step, minimum = block_scales(module.scales)
    # |w| <= |m| + 15 d in each block: the rounding term's weights.
    magnitude = (Q4_LEVELS * step + minimum.abs()).repeat_interleave(Q4_BLOCK, dim=1)
    digits = digit_error(x)
    rounding = 2 * x.shape[1] * UNIT_ROUNDOFF * ((x.abs() + digits) @ magnitude.t())
    return digits * weight.abs().sum(dim=-1) + rounding


def int8_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``|int8_linear(x, *quantize_per_row(weight)) - x @ weight.T|`` at most."""
    _, weight_step = quantize_per_row(weight)
    magnitude = weight.abs() + weight_step[:, None] / 2
    rounding = 2 * x.shape[1] * UNIT_ROUNDOFF * ((x.abs() + digit_error(x)) @ magnitude.t())
    return error_bound(x, weight) + rounding


def test_q4_projections_hold_the_float32_weights_bit_for_bit(
    float32_model: LoadedModel, q4_model: LoadedModel
) -> None:
    modules = quantized_modules(q4_model)
    config = q4_model.config
    projections = {name: m for name, m in modules.items() if isinstance(m, Q4Linear)}
    # qkv, o, gate_up and down in every layer; the embeddings, and the head reading them.
    assert len(projections) == 4 * config.num_hidden_layers
    assert config.tie_word_embeddings
    assert isinstance(llama(q4_model).model.embed_tokens, Int8Embedding)
    assert isinstance(llama(q4_model).lm_head, Int8Linear)
    assert len(modules) == len(projections) + 2
    for name, module in projections.items():
        weight = float_weight(float32_model, name)
        assert torch.equal(dequantize_q4(module.packed, module.scales), weight), name


def test_every_quantized_op_is_within_its_format_bound(
    float32_model: LoadedModel, q4_model: LoadedModel, text_tokens: list[int]
) -> None:
    """Each q4 projection, the int8 embeddings and the int8 head (the logits) on the float32
    model's activations for the text's first tokens, against float32's op on the same input."""
    tokens = text_tokens[:NUM_OP_TOKENS]
    reference = llama(float32_model)
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
            del module
            inputs[name], outputs[name] = args[0].clone(), out.clone()

        return hook

    projections = {
        name: module
        for name, module in quantized_modules(q4_model).items()
        if isinstance(module, Q4Linear)
    }
    handles = [
        reference.get_submodule(name).register_forward_hook(keep(name)) for name in projections
    ]
    try:
        hidden = prefill(float32_model, tokens)
    finally:
        for handle in handles:
            handle.remove()

    largest = 0.0  # the largest error of a projection
    for name, module in projections.items():
        x = inputs[name]
        with torch.inference_mode():
            got = module(x)
        error = (got - outputs[name]).abs()
        bound = q4_bound(x, float_weight(float32_model, name), module)
        largest = max(largest, float(error.max()))
        assert bool((error <= bound).all()), (name, float((error / bound).max()))

    # The head: the logits of the float32 model's final hidden state.
    table = reference.model.embed_tokens.weight
    assert isinstance(reference.lm_head, nn.Linear)
    assert reference.lm_head.weight is table  # tied
    error = (logits(q4_model, hidden) - logits(float32_model, hidden)).abs()
    bound = int8_bound(hidden, table)
    assert bool((error <= bound).all()), float((error / bound).max())
    assert float(error.max()) > 0  # the int8 head is at work, not a float one

    # The embeddings, every row: off by at most half a step, then one float32 product.
    embedding = llama(q4_model).model.embed_tokens
    assert isinstance(embedding, Int8Embedding)
    with torch.inference_mode():
        rows = embedding(torch.arange(table.shape[0]))
    _, step = quantize_per_row(table)
    bound = step[:, None] / 2 + 2 * UNIT_ROUNDOFF * (table.abs() + step[:, None] / 2)
    assert bool(((rows - table).abs() <= bound).all())
    assert largest > 0  # the two-digit inputs are at work in the projections


def chunk_nll(loaded: LoadedModel, chunk: Sequence[int]) -> torch.Tensor:
    """``(len(chunk) - 1,)`` float64: NLL of token ``i + 1`` given tokens ``0..i``."""
    hidden = prefill(loaded, chunk)[:-1]
    log_probs = torch.log_softmax(logits(loaded, hidden).double(), dim=-1)
    targets = torch.tensor(chunk[1:])[:, None]
    return -log_probs.gather(1, targets).squeeze(1)


def perplexity(loaded: LoadedModel, tokens: Sequence[int]) -> tuple[float, torch.Tensor]:
    """Over ``NUM_CHUNKS`` fresh ``CTX``-token sequences, every token after each one's first
    scored; and those tokens' NLL."""
    chunks = [list(tokens[i * CTX : (i + 1) * CTX]) for i in range(NUM_CHUNKS)]
    nll = torch.cat([chunk_nll(loaded, chunk) for chunk in chunks])
    return math.exp(float(nll.mean())), nll


def test_q4_perplexity_is_within_one_percent_of_float32(
    float32_model: LoadedModel, q4_model: LoadedModel, text_tokens: list[int]
) -> None:
    float32_ppl, float32_nll = perplexity(float32_model, text_tokens)
    q4_ppl, q4_nll = perplexity(q4_model, text_tokens)
    assert q4_ppl <= 1.01 * float32_ppl, (q4_ppl, float32_ppl)
    assert not torch.equal(q4_nll, float32_nll)  # two formats, not one model twice
