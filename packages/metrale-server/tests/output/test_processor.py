"""The output processor: core token ids in, text out; stop strings reported back to the core."""

from __future__ import annotations

from metrale_model_arch import Tokenizer
from metrale_server.output.core_output import EngineCoreOutput, SequenceDelta
from metrale_server.output.processor import OutputProcessor, RequestOutputKind
from metrale_server.sampling.params import SamplingParams


def step(request_id: str, *tokens: tuple[int, int], finish: str | None = None) -> EngineCoreOutput:
    """One core output: (output index, token id) pairs, one token each."""
    return EngineCoreOutput(
        request_id=request_id,
        deltas=tuple(
            SequenceDelta(index=index, new_token_ids=(token,), finish_reason=finish)
            for index, token in tokens
        ),
        finished=finish is not None,
    )


def ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_delta_outputs_carry_only_what_is_new_and_the_last_is_cumulative(
    default_tokenizer: Tokenizer,
) -> None:
    processor = OutputProcessor(default_tokenizer, default_tokenizer.eos_token_ids)
    tokens = ids(default_tokenizer, "The capital of France is Paris")
    processor.add_request("r", None, [1], SamplingParams(), RequestOutputKind.DELTA)
    pieces = []
    for position, token in enumerate(tokens):
        last = position == len(tokens) - 1
        (output,) = processor.process(
            [step("r", (0, token), finish="length" if last else None)]
        ).outputs
        completion = output.outputs[0]
        pieces.append(completion.delta_text)
        assert completion.delta_token_ids == (token,)
        assert completion.num_tokens == position + 1
        if not last:
            assert (completion.text, completion.token_ids, completion.is_cumulative) == (
                "",
                (),
                False,
            )
    assert output.finished
    assert completion.is_cumulative
    assert completion.text == "".join(pieces) == "The capital of France is Paris"
    assert completion.token_ids == tuple(tokens)
    assert "r" not in processor


def test_a_stop_string_across_tokens_finishes_one_output_and_is_reported_to_the_core(
    default_tokenizer: Tokenizer,
) -> None:
    processor = OutputProcessor(default_tokenizer, default_tokenizer.eos_token_ids)
    params = SamplingParams(n=2, stop=["France is"])
    processor.add_request("r", None, [1], params, RequestOutputKind.CUMULATIVE)
    stopping = ids(default_tokenizer, "The capital of France is Paris")
    going = ids(default_tokenizer, "one two three four five six seven")
    stopped: list[tuple[str, tuple[int, ...]]] = []
    for first, second in zip(stopping, going, strict=False):
        processed = processor.process([step("r", (0, first), (1, second))])
        stopped += processed.stopped
    assert stopped == [("r", (0,))]  # once, when "France is" completed
    (output,) = processed.outputs
    assert output.outputs[0].text == "The capital of "
    assert (output.outputs[0].finish_reason, output.outputs[0].stop_reason) == ("stop", "France is")
    assert output.outputs[1].finish_reason is None
    assert not output.finished

    # The core ends the other output; a late token for the stopped one is ignored.
    processed = processor.process([step("r", (0, 5), (1, going[-1]), finish="length")])
    (output,) = processed.outputs
    assert output.finished
    assert processed.stopped == []
    assert output.outputs[0].text == "The capital of "
    assert output.outputs[1].finish_reason == "length"


def test_final_only_reports_once_and_a_stop_ending_the_request_aborts_it_in_the_core(
    default_tokenizer: Tokenizer,
) -> None:
    processor = OutputProcessor(default_tokenizer, default_tokenizer.eos_token_ids)
    processor.add_request(
        "r", "prompt", [1], SamplingParams(stop=[" big"]), RequestOutputKind.FINAL_ONLY
    )
    outputs = []
    stopped = []
    for token in ids(default_tokenizer, "Paris is big and old"):
        processed = processor.process([step("r", (0, token))])
        outputs += processed.outputs
        stopped += processed.stopped
    (final,) = outputs
    assert final.finished
    assert final.prompt == "prompt"
    assert final.outputs[0].text == "Paris is"
    assert stopped == [("r", (0,))]
    assert processor.process([step("r", (0, 7))]).outputs == []  # finished here already


def test_abort_and_failure_end_the_request(default_tokenizer: Tokenizer) -> None:
    processor = OutputProcessor(default_tokenizer, default_tokenizer.eos_token_ids)
    processor.add_request("a", None, [1], SamplingParams(), RequestOutputKind.DELTA)
    processor.add_request("b", None, [1], SamplingParams(), RequestOutputKind.DELTA)
    aborted = processor.abort("a")
    assert aborted is not None
    assert aborted.outputs[0].finish_reason == "abort"
    assert processor.abort("a") is None
    failed = processor.process(
        [EngineCoreOutput(request_id="b", deltas=(), finished=True, error="boom")]
    ).outputs
    assert [(o.request_id, o.error, o.finished) for o in failed] == [("b", "boom", True)]
