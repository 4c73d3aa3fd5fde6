"""Prompt logprobs and pooling read in the prefill, against transformers on the same weights,
whatever the chunking, batching, slicing of the logits buffer or preemption."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from metrale_server import LLM, SamplingParams
from metrale_server.pooling import PoolingParams
from metrale_server.pooling.score_prompt import score_prompt

transformers = pytest.importorskip("transformers")


def random_prompts(seed: int, count: int, lengths: tuple[int, int] = (1, 40)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 49152) for _ in range(rng.randint(*lengths))] for _ in range(count)]


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir: Path) -> object:
    return transformers.LlamaForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32)


def reference_logprobs(hf_model: object, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt])).logits[0]  # type: ignore[operator]
    return torch.log_softmax(logits.float(), dim=-1)


def reference_states(hf_model: object, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = hf_model.model(torch.tensor([prompt]))  # type: ignore[attr-defined]
    return out.last_hidden_state[0].float()


@pytest.mark.parametrize(
    ("max_batch_size", "max_batch_tokens", "num_kv_blocks"),
    [(16, 4096, None), (2, 7, None), (8, 64, 14)],
    ids=["whole", "chunked-small-buffer", "preempted"],
)
def test_prompt_logprobs_equal_transformers(
    tiny_model_dir: Path,
    hf_model: object,
    max_batch_size: int,
    max_batch_tokens: int,
    num_kv_blocks: int | None,
) -> None:
    llm = LLM(
        str(tiny_model_dir),
        dtype="float32",
        max_batch_size=max_batch_size,
        max_batch_tokens=max_batch_tokens,
        num_kv_blocks=num_kv_blocks,
        block_size=4,
    )
    prompts = random_prompts(0, 8)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, prompt_logprobs=3)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    if num_kv_blocks is not None:
        assert llm.engine.scheduler.num_preemptions > 0
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = reference_logprobs(hf_model, prompt)
        entries = output.prompt_logprobs
        assert entries is not None
        assert len(entries) == len(prompt)
        assert entries[0] is None
        for position, entry in enumerate(entries[1:]):
            assert entry is not None
            row = expected[position]
            assert entry.token_id == prompt[position + 1]
            assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=1e-4)
            chosen = row[entry.token_id]  # the rank, up to tokens within rounding of it
            assert entry.rank is not None
            assert (
                int((row > chosen + 1e-4).sum())
                < entry.rank
                <= int((row > chosen - 1e-4).sum()) + 1
            )
            top_values, top_ids = row.topk(3)
            assert [t for t, _ in entry.top] == top_ids.tolist()
            assert [v for _, v in entry.top] == pytest.approx(top_values.tolist(), abs=1e-4)


def test_prompt_logprobs_take_no_prefix_cache_hit(tiny_model_dir: Path, hf_model: object) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", block_size=4)
    prompt = random_prompts(1, 1, (30, 30))[0]
    plain = SamplingParams(temperature=0.0, max_tokens=2)
    llm.generate([{"prompt_token_ids": prompt}], plain)
    cached = llm.generate([{"prompt_token_ids": prompt}], plain)[0]
    assert cached.num_cached_tokens > 0
    asked = llm.generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=0),
    )[0]
    assert asked.num_cached_tokens == 0
    assert asked.prompt_logprobs is not None
    expected = reference_logprobs(hf_model, prompt)
    got = [entry.logprob for entry in asked.prompt_logprobs[1:] if entry is not None]
    want = [float(expected[i, prompt[i + 1]]) for i in range(len(prompt) - 1)]
    assert got == pytest.approx(want, abs=1e-4)
    assert all(entry is None or entry.top == () for entry in asked.prompt_logprobs)


@pytest.mark.parametrize("method", ["last", "mean", "cls"])
def test_pooled_states_equal_transformers(
    tiny_model_dir: Path, hf_model: object, method: str
) -> None:
    # Chunks of 9 tokens: a prompt's states are pooled across steps and across batches.
    llm = LLM(str(tiny_model_dir), dtype="float32", max_batch_tokens=9, block_size=4)
    prompts = random_prompts(2, 6, (1, 30))
    pooling = PoolingParams(method=method, normalize=method != "cls")  # type: ignore[arg-type]
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=1, pooling=pooling)
    )
    alone = [
        llm.generate([{"prompt_token_ids": p}], SamplingParams(max_tokens=1, pooling=pooling))[0]
        for p in prompts[:2]
    ]
    for prompt, output in zip(prompts, outputs, strict=True):
        states = reference_states(hf_model, prompt)
        pooled = {"last": states[-1], "mean": states.mean(dim=0), "cls": states[0]}[method]
        if pooling.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=0)
        assert output.pooled is not None
        assert torch.allclose(torch.tensor(output.pooled), pooled, atol=1e-5)
        assert output.outputs[0].token_ids == ()
        assert output.outputs[0].finish_reason == "stop"
    for one, batched in zip(alone, outputs, strict=False):
        assert one.pooled == batched.pooled
    assert llm.engine.block_manager.num_free_blocks == llm.engine.num_kv_blocks


def test_dimensions_truncate_before_normalizing(tiny_model_dir: Path, hf_model: object) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32")
    prompt = random_prompts(3, 1)[0]
    pooling = PoolingParams(dimensions=16)
    output = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(pooling=pooling))[0]
    expected = torch.nn.functional.normalize(reference_states(hf_model, prompt)[-1, :16], dim=0)
    assert output.pooled is not None
    assert len(output.pooled) == 16
    assert torch.allclose(torch.tensor(output.pooled), expected, atol=1e-5)


def test_pair_score_is_the_softmax_over_the_pair(tiny_model_dir: Path, hf_model: object) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", max_batch_tokens=8)
    prompts = random_prompts(4, 5)
    no_id, yes_id = 1000, 2000
    pooling = PoolingParams(score_token_ids=(no_id, yes_id))
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(pooling=pooling)
    )
    for prompt, output in zip(prompts, outputs, strict=True):
        logits = reference_logprobs(hf_model, prompt)[-1]  # log-softmax: same difference
        expected = torch.sigmoid(logits[yes_id] - logits[no_id])
        assert output.pooled == pytest.approx((float(expected),), abs=1e-5)
    assert llm.engine.stats.num_generated_tokens == 0


def test_pooling_takes_blocks_for_its_prompt_only(tiny_model_dir: Path, hf_model: object) -> None:
    """A prompt as long as the context pools (no room for output is needed), holding the
    blocks of its prompt and no more."""
    llm = LLM(str(tiny_model_dir), dtype="float32", max_seq_len=32, block_size=4)
    runner = llm.engine.core.runner
    execute = runner.execute
    used: list[int] = []

    def recording(step):  # type: ignore[no-untyped-def]
        used.append(llm.engine.block_manager.num_used_blocks)
        return execute(step)

    runner.execute = recording  # type: ignore[method-assign]
    prompt = random_prompts(5, 1, (32, 32))[0]
    output = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(pooling=PoolingParams()))
    assert used == [8]
    expected = torch.nn.functional.normalize(reference_states(hf_model, prompt)[-1], dim=0)
    assert output[0].pooled is not None
    assert torch.allclose(torch.tensor(output[0].pooled), expected, atol=1e-5)
    assert llm.engine.block_manager.num_free_blocks == llm.engine.num_kv_blocks


def test_llm_embed_and_score(tiny_model_dir: Path, hf_model: object) -> None:
    """The offline API, vLLM's ``LLM.embed`` and ``LLM.score``: a causal LM served as an
    embedding model (loaded without its head) and as a yes/no reranker."""
    texts = ["The capital of France", "is Paris."]
    with LLM(str(tiny_model_dir), dtype="float32", task="embed") as embedder:
        assert embedder.engine.loaded.config.tie_word_embeddings  # no head of its own
        vectors = embedder.embed(texts)
        short = embedder.embed(texts[0], dimensions=8)
        with pytest.raises(ValueError, match="task 'embed'"):
            embedder.score("q", ["d"])
        tokenizer = embedder.engine.loaded.tokenizer
    for text, vector in zip(texts, vectors, strict=True):
        states = reference_states(hf_model, tokenizer.encode(text, add_special_tokens=True))
        expected = torch.nn.functional.normalize(states[-1], dim=0)
        assert torch.allclose(torch.tensor(vector), expected, atol=1e-5)
    assert len(short[0]) == 8
    with LLM(str(tiny_model_dir), dtype="float32", task="score") as reranker:
        scores = reranker.score("Where is Paris?", ["Paris is in France.", "Bananas."])
        no_id, yes_id = reranker.engine.task.pooling.score_token_ids  # type: ignore[union-attr,misc]
        with pytest.raises(ValueError, match="task 'score'"):
            reranker.embed("x")
    for document, score in zip(["Paris is in France.", "Bananas."], scores, strict=True):
        prompt = score_prompt("Where is Paris?", document)
        logits = reference_logprobs(hf_model, tokenizer.encode(prompt, add_special_tokens=False))
        assert score == pytest.approx(
            float(torch.sigmoid(logits[-1, yes_id] - logits[-1, no_id])), abs=1e-5
        )
