"""The parity checks a model family runs against transformers on tiny random checkpoints
(float32): a ragged prefill's logits, batched greedy decoding against ``generate`` and alone,
chunked prefill against one shot, every tensor made on the model's device, a step padded to a
bucket, the bfloat16 error against transformers' own, and no fused llama executor taking the
model.

A family's test module makes a module-scoped ``checkpoint`` fixture (a :class:`FamilyCheckpoint`,
parametrized over its cases) and collects the checks as a class::

    class TestParity(Bfloat16ParityChecks):  # or FamilyParityChecks, without bfloat16's
        family = DeepseekForCausalLM

``paged_runner`` is the model-arch tests' fixture (their ``conftest.PagedRunner``). Not imported
by the plugin: torch and the metrale packages are imported here at the top.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import attrs
import torch

from metrale_config import ModelConfig, model_config_from_hf_file
from metrale_model_arch import LoadOptions
from metrale_model_arch.counts.base import ParamCounts
from metrale_model_arch.families import CausalLM
from metrale_model_arch.families.compiled_steps import can_compile
from metrale_model_arch.families.native_steps import native_executor
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.weights import weight_bytes
from metrale_testing.device_scan import assert_tensors_made_on_the_models_device
from metrale_testing.greedy import paged_greedy, transformers_greedy
from metrale_testing.padded_step import assert_padding_rows_change_nothing

Family = TypeVar("Family", bound=CausalLM)
PagedRunnerFactory = Callable[..., Any]


@attrs.frozen(kw_only=True)
class FamilyCheckpoint:
    """A tiny checkpoint saved by transformers: its case ``name``, directory, parsed config, the
    transformers model it was saved from, ``{seq_id: prompt}`` and the ``max_seq_len`` to serve
    it at (``None``: the config's)."""

    name: str
    path: Path
    config: ModelConfig
    hf_model: Any
    prompts: dict[int, list[int]]
    max_seq_len: int | None = None

    @classmethod
    def saved(
        cls,
        name: str,
        path: Path,
        hf_model: Any,
        prompt_lens: Sequence[int],
        max_seq_len: int | None = None,
    ) -> FamilyCheckpoint:
        """The checkpoint at ``path``, with random prompts of ``prompt_lens`` tokens (seed 1)."""
        config = model_config_from_hf_file(path)
        return cls(
            name=name,
            path=path,
            config=config,
            hf_model=hf_model,
            prompts=random_prompts(config.vocab_size, prompt_lens),
            max_seq_len=max_seq_len,
        )

    @property
    def longest_id(self) -> int:
        return max(self.prompts, key=lambda seq_id: len(self.prompts[seq_id]))


def random_prompts(vocab_size: int, lengths: Sequence[int], seed: int = 1) -> dict[int, list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return {
        seq_id: torch.randint(vocab_size, (length,), generator=generator).tolist()
        for seq_id, length in enumerate(lengths)
    }


def load_checkpoint(
    checkpoint: FamilyCheckpoint,
    family: type[Family],
    dtype: torch.dtype = torch.float32,
    kernel_backend: str = "auto",
) -> Family:
    """``checkpoint`` loaded on the CPU at ``dtype`` as ``family``."""
    options = LoadOptions(
        dtype=dtype,
        device="cpu",
        max_seq_len=checkpoint.max_seq_len,
        kernel_backend=kernel_backend,
    )
    model = load_safetensors_model(checkpoint.path, checkpoint.config, options)
    assert isinstance(model, family)
    return model


def hf_logits(hf_model: Any, prompt: list[int]) -> torch.Tensor:
    """transformers' logits ``(len(prompt), vocab)`` over one prompt."""
    with torch.inference_mode():
        logits: torch.Tensor = hf_model(torch.tensor([prompt])).logits[0]
    return logits


def assert_counts_equal_transformers(
    checkpoint: FamilyCheckpoint, counts: ParamCounts, family: type[CausalLM]
) -> None:
    """``counts`` (a stack without MTP layers) add up to transformers' parameters and buffers
    (correction biases; not its RoPE tables), the loaded model holds as many, its float32 ones
    (routers, correction biases) stay float32 at any serve dtype, and the plan prices them so."""
    hf_model = checkpoint.hf_model
    hf_params = sum(p.numel() for p in hf_model.parameters())
    hf_buffers = sum(b.numel() for n, b in hf_model.named_buffers() if "rotary" not in n)
    ours = counts.embeddings + counts.layers + counts.final_norm + counts.lm_head
    assert ours + counts.layers_fp32 == hf_params + hf_buffers
    model = load_checkpoint(checkpoint, family)
    assert sum(p.numel() for p in model.parameters()) == ours + counts.layers_fp32
    bf16 = load_checkpoint(checkpoint, family, torch.bfloat16)
    kept = sum(p.numel() for p in bf16.parameters() if p.dtype == torch.float32)
    assert kept == counts.layers_fp32
    assert weight_bytes(checkpoint.config, 2).total() == 2 * ours + 4 * counts.layers_fp32


class FamilyParityChecks:
    """Ragged prefill, batched greedy, chunked prefill and executor checks of ``family``."""

    family: ClassVar[type[CausalLM]]
    block_size: ClassVar[int] = 4
    num_greedy_tokens: ClassVar[int] = 32
    # Logits within this of transformers' (float32).
    logits_atol: ClassVar[float] = 1e-4
    # A prefill in chunks within this of one prefill (float32).
    chunked_atol: ClassVar[float] = 1e-4

    def load(self, checkpoint: FamilyCheckpoint, dtype: torch.dtype = torch.float32) -> CausalLM:
        return load_checkpoint(checkpoint, self.family, dtype)

    def test_ragged_prefill_matches_transformers(
        self, checkpoint: FamilyCheckpoint, paged_runner: PagedRunnerFactory
    ) -> None:
        runner = paged_runner(self.load(checkpoint), num_blocks=64, block_size=self.block_size)
        logits = runner.step(checkpoint.prompts)
        vocab_size = checkpoint.config.vocab_size
        for seq_id, prompt in checkpoint.prompts.items():
            expected = hf_logits(checkpoint.hf_model, prompt)
            assert logits[seq_id].shape == (len(prompt), vocab_size)
            torch.testing.assert_close(logits[seq_id], expected, atol=self.logits_atol, rtol=0)

    def greedy(
        self,
        model: CausalLM,
        prompts: dict[int, list[int]],
        paged_runner: PagedRunnerFactory,
        seed: int,
    ) -> dict[int, list[int]]:
        runner = paged_runner(model, num_blocks=128, block_size=self.block_size, seed=seed)
        return paged_greedy(runner, prompts, self.num_greedy_tokens)

    def test_batched_greedy_decode_matches_transformers_generate_and_alone(
        self, checkpoint: FamilyCheckpoint, paged_runner: PagedRunnerFactory
    ) -> None:
        expected = {
            seq_id: transformers_greedy(checkpoint.hf_model, prompt, self.num_greedy_tokens)
            for seq_id, prompt in checkpoint.prompts.items()
        }
        model = self.load(checkpoint)
        assert self.greedy(model, checkpoint.prompts, paged_runner, seed=3) == expected
        longest = checkpoint.longest_id
        alone = self.greedy(model, {longest: checkpoint.prompts[longest]}, paged_runner, seed=7)
        assert alone[longest] == expected[longest]

    def test_chunked_prefill_matches_one_shot(
        self, checkpoint: FamilyCheckpoint, paged_runner: PagedRunnerFactory
    ) -> None:
        model = self.load(checkpoint)
        prompt, other = checkpoint.prompts[checkpoint.longest_id], checkpoint.prompts[2]
        first_cut, second_cut = 9, 19
        block_size = self.block_size
        one_shot = paged_runner(model, num_blocks=32, block_size=block_size).step({0: prompt})[0]
        chunked = paged_runner(model, num_blocks=32, block_size=block_size, seed=5)
        first = chunked.step({0: prompt[:first_cut]})[0]
        # The second chunk shares its step with another sequence's whole prefill.
        second = chunked.step({1: other, 0: prompt[first_cut:second_cut]})
        third = chunked.step({0: prompt[second_cut:]})[0]
        torch.testing.assert_close(
            torch.cat([first, second[0], third]), one_shot, atol=self.chunked_atol, rtol=0
        )
        expected = hf_logits(checkpoint.hf_model, other)
        torch.testing.assert_close(second[1], expected, atol=1e-4, rtol=0)

    def test_every_tensor_is_made_on_the_models_device(
        self, checkpoint: FamilyCheckpoint, paged_runner: PagedRunnerFactory
    ) -> None:
        """With the reference ops a GPU's torch backend runs."""
        model = load_checkpoint(checkpoint, self.family, kernel_backend="torch")
        assert_tensors_made_on_the_models_device(
            model, paged_runner, checkpoint.prompts, num_blocks=128, block_size=self.block_size
        )

    def test_a_step_padded_to_a_bucket_gives_the_same_logits(
        self, checkpoint: FamilyCheckpoint, paged_runner: PagedRunnerFactory
    ) -> None:
        """The property CUDA graphs' padded batches rely on (``metrale_testing.padded_step``)."""
        assert_padding_rows_change_nothing(
            self.load(checkpoint),
            paged_runner,
            checkpoint.prompts,
            bucket=8,
            num_blocks=128,
            block_size=self.block_size,
            num_slots=8,
        )

    def test_no_fused_llama_executor_takes_it(self, checkpoint: FamilyCheckpoint) -> None:
        model = self.load(checkpoint)
        assert not can_compile(model)
        assert native_executor(model) is None
        assert model.executor_name == "eager"


class Bfloat16ParityChecks(FamilyParityChecks):
    """:class:`FamilyParityChecks`, and the bfloat16 model's mean logit error against float32
    transformers at most 1.25x transformers' own in bfloat16 (+1e-3), averaged over
    ``bfloat16_prompts``."""

    def bfloat16_prompts(self, checkpoint: FamilyCheckpoint) -> list[list[int]]:
        """The longest prompt, unless a family needs more to average over."""
        return [checkpoint.prompts[checkpoint.longest_id]]

    def test_bfloat16_model_is_as_close_to_float32_as_transformers_bfloat16(
        self, checkpoint: FamilyCheckpoint, paged_runner: PagedRunnerFactory
    ) -> None:
        prompts = self.bfloat16_prompts(checkpoint)
        model = self.load(checkpoint, torch.bfloat16)
        hf_bf16 = copy.deepcopy(checkpoint.hf_model).to(torch.bfloat16)
        our_errors, their_errors = [], []
        for prompt in prompts:
            runner = paged_runner(model, num_blocks=16, block_size=self.block_size)
            ours = runner.step({0: prompt})[0]
            assert ours.dtype == torch.bfloat16
            theirs = hf_logits(hf_bf16, prompt)
            exact = hf_logits(checkpoint.hf_model, prompt)
            our_errors.append((ours.float() - exact).abs().mean())
            their_errors.append((theirs.float() - exact).abs().mean())
        our_error = sum(our_errors) / len(prompts)
        their_error = sum(their_errors) / len(prompts)
        assert our_error <= 1.25 * their_error + 1e-3, (our_error, their_error)
