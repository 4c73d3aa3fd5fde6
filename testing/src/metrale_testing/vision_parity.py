"""What the image models' parity tests (GLM-5.3, Qwen2.5-VL, Gemma 3, their GGUF pairs) share:
image prompts laid out over a checkpoint's images, the model a paged runner steps with a
prompt's embeddings (and M-RoPE positions), greedy decoding after an image prefill,
transformers' logits and ``generate`` on the same inputs, and the two checks every family runs
against them (:class:`ImagePromptChecks`). Not imported by the plugin (torch at the top)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch
from PIL import Image

from metrale_testing.vision_checkpoint import VisionCheckpoint


def random_text(seed: int, low: int, high: int) -> Callable[[int], list[int]]:
    """Draws of random token ids in ``[low, high)``, ``length`` at a time, from one seed."""
    generator = torch.Generator().manual_seed(seed)

    def text(length: int) -> list[int]:
        tokens: list[int] = torch.randint(low, high, (length,), generator=generator).tolist()
        return tokens

    return text


@attrs.frozen(kw_only=True)
class ImagePrompt:
    """Token ids with each image's tokens in place, and the family's ``ImageInputs``."""

    token_ids: list[int]
    images: Any


def laid_out_prompts(
    images: Sequence[Image.Image],
    layouts: Mapping[int, tuple[list[int], list[int]]],
    preprocess: Callable[[list[Image.Image]], Any],
    expand: Callable[[list[int], Any], list[int]] | None = None,
) -> dict[int, ImagePrompt]:
    """Each sequence's prompt from its layout: which of ``images`` it holds and its tokens,
    with each image's tokens in place or (``expand``) one placeholder an image."""
    prompts = {}
    for seq_id, (which, tokens) in layouts.items():
        inputs = preprocess([images[i] for i in which])
        token_ids = tokens if expand is None else expand(tokens, inputs)
        prompts[seq_id] = ImagePrompt(token_ids=token_ids, images=inputs)
    return prompts


class WithPromptInputs(torch.nn.Module):
    """The model for :class:`PagedRunner`: the next step takes ``embeds``, and ``positions``
    when set (the runner's own positions are sequence indices)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config
        self.embeds: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, *rest: Any) -> Any:
        embeds, self.embeds = self.embeds, None
        given, self.positions = self.positions, None
        given = positions if given is None else given
        return self.inner(input_ids, given, *rest, inputs_embeds=embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.inner.compute_logits(hidden)
        return logits


PromptEmbeds = Callable[[Any, torch.Tensor, Any], torch.Tensor]
DecodeHook = Callable[[Mapping[int, list[int]]], None]


@attrs.frozen(kw_only=True, eq=False)
class Prefill:
    """A paged runner after the prompts' one prefill step, their logits, and what a decode
    step needs set first (M-RoPE positions), if anything."""

    run: Any
    logits: dict[int, torch.Tensor]
    before_decode_step: DecodeHook | None = None


def prefill_embeds(
    model: Any,
    paged_runner: Callable[..., Any],
    prompts: Mapping[int, ImagePrompt],
    prompt_embeds: PromptEmbeds,
    block_size: int,
) -> Prefill:
    """All prompts in one paged step, their embeddings from the family's ``prompt_embeds``."""
    wrapped = WithPromptInputs(model)
    run = paged_runner(wrapped, num_blocks=64, block_size=block_size)
    with torch.inference_mode():
        wrapped.embeds = torch.cat(
            [prompt_embeds(model, torch.tensor(p.token_ids), p.images) for p in prompts.values()]
        )
    logits = run.step({seq_id: p.token_ids for seq_id, p in prompts.items()})
    return Prefill(run=run, logits=logits)


def decode_greedily(
    run: Any,
    prefill_logits: Mapping[int, torch.Tensor],
    num_tokens: int,
    before_step: DecodeHook | None = None,
) -> dict[int, list[int]]:
    """Each sequence's ``num_tokens`` greedy tokens, the first from its prefill's logits, the
    rest decoded together; ``before_step`` sees the tokens so far before each decode step."""
    tokens = {seq_id: [int(out[-1].argmax())] for seq_id, out in prefill_logits.items()}
    for _ in range(num_tokens - 1):
        if before_step is not None:
            before_step(tokens)
        logits = run.step({seq_id: out[-1:] for seq_id, out in tokens.items()})
        for seq_id, out in tokens.items():
            out.append(int(logits[seq_id][-1].argmax()))
    return tokens


def transformers_logits(hf_model: Any, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        logits: torch.Tensor = hf_model(**inputs).logits[0]
    return logits


def transformers_generated(
    hf_model: Any, inputs: Mapping[str, torch.Tensor], num_tokens: int
) -> list[int]:
    """The ``num_tokens`` tokens ``generate`` picks greedily after ``inputs``' prompt."""
    with torch.inference_mode():
        generated = hf_model.generate(
            **inputs,
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    tokens: list[int] = generated[0, inputs["input_ids"].shape[1] :].tolist()
    return tokens


@attrs.frozen
class ImagePromptFamily:
    """A family's test functions the shared checks call, and its greedy run's length."""

    load: Callable[[VisionCheckpoint], Any]
    image_prompts: Callable[[VisionCheckpoint], dict[int, ImagePrompt]]
    prefill: Callable[[Any, Callable[..., Any], Mapping[int, ImagePrompt]], Prefill]
    hf_inputs: Callable[[ImagePrompt], dict[str, torch.Tensor]]
    num_greedy_tokens: int
    # Where set: the fewest distinct tokens each sequence's greedy run may have.
    min_distinct_greedy_tokens: int | None = None


class ImagePromptChecks:
    """A family's image prompts, prefilled in one paged step, match transformers' logits
    (within 1e-4); decoded greedily, its ``generate``. A test module with a module-scoped
    ``checkpoint`` fixture (a :class:`VisionCheckpoint`) subclasses it, naming its
    ``family``."""

    family: ClassVar[ImagePromptFamily]

    def test_image_prompts_match_transformers_logits(
        self, checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
    ) -> None:
        family = self.family
        prompts = family.image_prompts(checkpoint)
        logits = family.prefill(family.load(checkpoint), paged_runner, prompts).logits
        for seq_id, prompt in prompts.items():
            theirs = transformers_logits(checkpoint.hf_model, family.hf_inputs(prompt))
            torch.testing.assert_close(logits[seq_id], theirs, rtol=0, atol=1e-4)

    def test_greedy_tokens_match_transformers_generate(
        self, checkpoint: VisionCheckpoint, paged_runner: Callable[..., Any]
    ) -> None:
        family, num_tokens = self.family, self.family.num_greedy_tokens
        prompts = family.image_prompts(checkpoint)
        prefill = family.prefill(family.load(checkpoint), paged_runner, prompts)
        before_step = prefill.before_decode_step
        tokens = decode_greedily(prefill.run, prefill.logits, num_tokens, before_step)
        for seq_id, prompt in prompts.items():
            inputs = family.hf_inputs(prompt)
            expected = transformers_generated(checkpoint.hf_model, inputs, num_tokens)
            assert tokens[seq_id] == expected, seq_id
            fewest = family.min_distinct_greedy_tokens
            if fewest is not None:
                assert len(set(tokens[seq_id])) >= fewest, "a degenerate model proves little"
