"""Gemma 3 and Qwen2.5-VL from llama.cpp's two files, the text GGUF and the mmproj GGUF.

A tiny random image checkpoint of each is converted the way llama.cpp's converter writes it
(:mod:`metrale_testing.llama_cpp_mmproj`), at F32 and Q8_0, each pair in its own directory as a
llama.cpp user keeps them (``model-f32.gguf`` beside ``mmproj-model-f32.gguf``). The pair loads
to the safetensors load's config (every field), weights (F32 exactly; Q8_0 what the file
holds) and image-prompt logits; the text GGUF alone loads the text stack. Qwen2.5-VL's tower
uses llama.cpp's fixed 112-pixel window (14-pixel patches), which its mmproj cannot change.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import gguf
import numpy as np
import pytest
import torch
from metrale_testing.gguf_parity import as_the_file_holds, model_fields
from metrale_testing.image_files import random_image
from metrale_testing.llama_cpp_mmproj import convert_image_model, vocabulary, write_mmproj
from metrale_testing.recording_allocator import RecordingAllocator
from metrale_testing.vision_parity import WithPromptInputs

from metrale_config import (
    ConfigError,
    ModelConfig,
    model_config_from_gguf,
    model_config_from_hf_file,
    model_config_with_mmproj,
    read_gguf_header,
)
from metrale_model_arch import (
    LoadOptions,
    ModelNotFoundError,
    image_encoder_for,
    load_model,
    read_model_config,
    resolve_model,
    text_only_config,
)
from metrale_model_arch.families.gemma3.vision import prompt_embeds
from metrale_model_arch.families.gemma3.vision.preprocess import preprocess_images as gemma3_images
from metrale_model_arch.families.gemma3.vision.processor_config import ImageProcessorConfig
from metrale_model_arch.families.mmproj_names import UnknownMmprojTensorError, mmproj_tensor
from metrale_model_arch.families.qwen2_5_vl.vision import prompt_inputs
from metrale_model_arch.families.qwen2_5_vl.vision.preprocess import (
    preprocess_images as qwen_images,
)
from metrale_model_arch.families.qwen2_5_vl.vision.processor_config import (
    Qwen2VLImageProcessorConfig,
)
from metrale_model_arch.families.vision.image_inputs import expand_image_tokens
from metrale_model_arch.families.vision.processor_fields import read_preprocessor_config
from metrale_model_arch.loading.gguf_loader import load_gguf_model
from metrale_model_arch.loading.mmproj_loader import load_gguf_model_with_mmproj
from metrale_model_arch.loading.safetensors_loader import load_safetensors_model
from metrale_model_arch.memory.rope_table import rope_table_bytes
from metrale_model_arch.memory.weights import VISION as VISION_OWNER
from metrale_model_arch.memory.weights import weight_bytes
from metrale_model_arch.owners import ROPE_TABLE

transformers = pytest.importorskip("transformers")
gemma3_pil = pytest.importorskip("transformers.models.gemma3.image_processing_pil_gemma3")
qwen_pil = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")

Q = gguf.GGMLQuantizationType
VOCAB_SIZE = 256
MAX_SEQ_LEN = 256
# Gemma 3: image, begin and end of image; Qwen2.5-VL: image, video, vision start and end.
GEMMA3_TOKENS = {250: "<image_soft_token>", 251: "<start_of_image>", 252: "<end_of_image>"}
QWEN_TOKENS = {250: "<|image_pad|>", 251: "<|video_pad|>", 252: "<|vision_start|>",
               253: "<|vision_end|>"}  # fmt: skip
GEMMA3_TEXT = {"vocab_size": VOCAB_SIZE, "hidden_size": 32, "intermediate_size": 48,
               "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 8, "sliding_window": 6, "sliding_window_pattern": 6,
               "query_pre_attn_scalar": 8, "max_position_embeddings": MAX_SEQ_LEN}  # fmt: skip
GEMMA3_VISION = {"hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
                 "vision_use_head": False}  # fmt: skip
QWEN_TEXT = {"vocab_size": VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": MAX_SEQ_LEN, "bos_token_id": 1, "eos_token_id": 2,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2, 3, 3]}}  # fmt: skip
QWEN_VISION = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 48,
               "out_hidden_size": 64, "patch_size": 14, "window_size": 112,
               "fullatt_block_indexes": [1]}  # fmt: skip
QWEN_PROCESSOR = {"patch_size": 14, "min_pixels": 8 * 28 * 28, "max_pixels": 4096 * 28 * 28}


@attrs.frozen(kw_only=True)
class Converted:
    family: str
    checkpoint_dir: Path
    pairs: dict[Q, tuple[Path, Path]]

    def safetensors_model(self) -> Any:
        config = model_config_from_hf_file(self.checkpoint_dir)
        return load_safetensors_model(self.checkpoint_dir, config, OPTIONS)

    def gguf_model(self, qtype: Q) -> Any:
        text, mmproj = self.pairs[qtype]
        return load_gguf_model_with_mmproj(
            read_gguf_header(text), read_gguf_header(mmproj), OPTIONS
        )


OPTIONS = LoadOptions(dtype=torch.float32, device="cpu", max_seq_len=MAX_SEQ_LEN)


def randomize(model: torch.nn.Module) -> None:
    """Every parameter random: LayerNorm / RMSNorm scales around one (Gemma's ``1 + w`` text
    norms around zero), embeddings small."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            is_gemma_text_norm = "language_model" in name and "norm" in name
            if ("norm" in name or "ln_q" in name) and not is_gemma_text_norm:
                param.copy_(1.0 + 0.2 * noise)
            else:
                param.copy_((0.02 if "embed_tokens" in name else 0.25) * noise)


def save_checkpoint(family: str, path: Path) -> None:
    if family == "gemma3":
        hf_config = transformers.Gemma3Config(
            text_config=GEMMA3_TEXT, vision_config=GEMMA3_VISION, mm_tokens_per_image=4,
            image_token_index=250, boi_token_index=251, eoi_token_index=252,
        )  # fmt: skip
        model = transformers.Gemma3ForConditionalGeneration(hf_config)
        size = {"height": 16, "width": 16}
        processor = gemma3_pil.Gemma3ImageProcessorPil(size=size)
    else:
        hf_config = transformers.Qwen2_5_VLConfig(
            text_config=QWEN_TEXT, vision_config=QWEN_VISION, image_token_id=250,
            video_token_id=251, vision_start_token_id=252, vision_end_token_id=253,
        )  # fmt: skip
        model = transformers.Qwen2_5_VLForConditionalGeneration(hf_config)
        processor = qwen_pil.Qwen2VLImageProcessorPil(**QWEN_PROCESSOR)
    randomize(model)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    if family == "gemma3":
        # What Gemma3Processor adds to the published preprocessor_config.json.
        preprocessor = json.loads((path / "preprocessor_config.json").read_text())
        preprocessor["image_seq_length"] = 4
        (path / "preprocessor_config.json").write_text(json.dumps(preprocessor))


def family_vocabulary(family: str, config: ModelConfig) -> Any:
    named = GEMMA3_TOKENS if family == "gemma3" else QWEN_TOKENS
    eos = config.eos_token_ids[0] if config.eos_token_ids else None
    return vocabulary(
        VOCAB_SIZE,
        named,
        bos_token_id=config.bos_token_id,
        eos_token_id=eos,
        pad_token_id=config.pad_token_id,
    )


@pytest.fixture(scope="module", params=["gemma3", "qwen2_5_vl"])
def converted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Converted:
    family = request.param
    root = tmp_path_factory.mktemp(family)
    checkpoint_dir = root / "hf"
    save_checkpoint(family, checkpoint_dir)
    vocab = family_vocabulary(family, model_config_from_hf_file(checkpoint_dir))
    pairs = {
        qtype: convert_image_model(checkpoint_dir, root / qtype.name.lower(), qtype, vocab)
        for qtype in (Q.F32, Q.Q8_0)
    }
    return Converted(family=family, checkpoint_dir=checkpoint_dir, pairs=pairs)


def test_the_pair_reads_as_the_checkpoints_config(converted: Converted) -> None:
    expected = model_config_from_hf_file(converted.checkpoint_dir)
    for qtype, (text, mmproj) in converted.pairs.items():
        text_header = read_gguf_header(text)
        config = model_config_with_mmproj(
            model_config_from_gguf(text), text_header, read_gguf_header(mmproj)
        )
        assert model_fields(config) == model_fields(expected), qtype.name


def test_the_mmproj_beside_the_model_is_found(converted: Converted) -> None:
    text, mmproj = converted.pairs[Q.F32]
    for name in (text, text.parent):
        source = resolve_model(str(name))
        assert (source.path, source.mmproj) == (text, mmproj)
        expected = model_config_from_hf_file(converted.checkpoint_dir)
        assert model_fields(read_model_config(source)) == model_fields(expected)
        text_only = read_model_config(source, text_only=True)
        assert text_only.vision is None
        assert text_only.siglip_vision is None


def test_load_model_takes_the_mmproj_beside_the_text_gguf(converted: Converted) -> None:
    text, _ = converted.pairs[Q.F32]
    options = attrs.evolve(OPTIONS, max_seq_len=64)
    loaded = load_model(str(text.parent), options)
    assert loaded.config.model_type == converted.family
    assert image_encoder_for(loaded) is not None
    text_only = load_model(str(text), attrs.evolve(options, text_only=True))
    assert text_only.config.vision is None
    assert text_only.config.siglip_vision is None
    assert image_encoder_for(text_only) is None


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_weights_are_the_safetensors_load_as_the_file_holds_it(
    converted: Converted, qtype: Q
) -> None:
    """F32: the checkpoint's values exactly (but for the rounding of the ``w + 1`` the
    converter stores Gemma's norms as, and Gemma 3's input projection, which it always stores
    F16); Q8_0: what the file's blocks hold."""
    expected = as_the_files_hold(converted, qtype)
    loaded = converted.gguf_model(qtype).state_dict()
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        assert torch.equal(tensor, expected[name]), name


def test_the_weight_plan_is_the_ledger_with_the_tower(converted: Converted) -> None:
    """Planned from the pair's config alone, byte for byte what the load allocates."""
    text, mmproj = converted.pairs[Q.Q8_0]
    config = read_model_config(resolve_model(str(text)))
    allocator = RecordingAllocator()
    options = attrs.evolve(OPTIONS, dtype=torch.bfloat16, allocator=allocator)
    load_gguf_model_with_mmproj(read_gguf_header(text), read_gguf_header(mmproj), options)
    plan = {owner: size for owner, size in weight_bytes(config, 2).by_owner().items() if size}
    assert plan[VISION_OWNER] > 0
    assert allocator.bytes_by_owner.pop(ROPE_TABLE) == rope_table_bytes(config, MAX_SEQ_LEN)
    assert dict(allocator.bytes_by_owner) == plan


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
def test_image_prompt_logits_match_the_safetensors_load(
    converted: Converted, qtype: Q, paged_runner: Callable[..., Any]
) -> None:
    """Against the safetensors load holding what the file holds (an F32 pair of Qwen2.5-VL
    holds the checkpoint's values; Gemma 3's F16 input projection alone moves its logits by
    up to 2.9e-4)."""
    reference = converted.safetensors_model()
    reference.load_state_dict(as_the_files_hold(converted, qtype))
    ours = image_prompt_logits(converted, converted.gguf_model(qtype), paged_runner)
    theirs = image_prompt_logits(converted, reference, paged_runner)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_the_text_gguf_alone_is_the_text_only_load(
    converted: Converted, paged_runner: Callable[..., Any]
) -> None:
    text, _ = converted.pairs[Q.F32]
    model = load_gguf_model(text, OPTIONS)
    expected = text_only_config(model_config_from_hf_file(converted.checkpoint_dir))
    fields = model_fields(model.config)
    if converted.family == "gemma3":
        # llama.cpp's gemma3 text file is gemma3_text: the same stack under its own name.
        assert fields.pop("model_type") == "gemma3_text"
        fields["model_type"] = "gemma3"
    assert fields == model_fields(expected)
    reference = load_safetensors_model(
        converted.checkpoint_dir, expected, attrs.evolve(OPTIONS, text_only=True)
    )
    prompt = torch.randint(3, 250, (19,), generator=torch.Generator().manual_seed(3)).tolist()
    ours = paged_runner(model, num_blocks=16, block_size=8).step({0: prompt})[0]
    theirs = paged_runner(reference, num_blocks=16, block_size=8).step({0: prompt})[0]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_the_preprocessing_is_read_from_the_mmproj(converted: Converted) -> None:
    _, mmproj = converted.pairs[Q.F32]
    config = model_config_from_hf_file(converted.checkpoint_dir)
    saved = read_preprocessor_config(converted.checkpoint_dir)
    fields = read_preprocessor_config(mmproj)
    if converted.family == "gemma3":
        assert config.siglip_vision is not None
        expected = ImageProcessorConfig.from_directory(
            converted.checkpoint_dir, config.siglip_vision
        )
        assert ImageProcessorConfig.from_json(fields, config.siglip_vision) == expected
    else:
        assert config.vision is not None
        # clip.cpp's bounds: 8 to 4096 merged 28-pixel patches (the checkpoint's, here).
        expected_qwen = Qwen2VLImageProcessorConfig.from_json(saved, config.vision)
        from_mmproj = Qwen2VLImageProcessorConfig.from_json(fields, config.vision)
        # The mmproj holds the mean and std as float32 (what normalization computes in).
        same_stats = attrs.evolve(
            from_mmproj, image_mean=expected_qwen.image_mean, image_std=expected_qwen.image_std
        )
        assert same_stats == expected_qwen
        assert (expected_qwen.min_pixels, expected_qwen.max_pixels) == (8 * 784, 4096 * 784)
    for stat in ("image_mean", "image_std"):
        held, written = (np.asarray(source[stat], dtype=np.float32) for source in (fields, saved))
        assert np.array_equal(held, written), stat


def test_a_mismatched_projector_type_is_refused(converted: Converted) -> None:
    other = next(f for f in ("gemma3", "qwen2_5_vl") if f != converted.family)
    other_mmproj = _other_family_mmproj(other, converted.checkpoint_dir.parent)
    text, _ = converted.pairs[Q.F32]
    with pytest.raises(ConfigError, match=rf"{other_mmproj}.*'clip.projector_type'"):
        model_config_with_mmproj(model_config_from_gguf(text), read_gguf_header(text),
                                 read_gguf_header(other_mmproj))  # fmt: skip


def test_an_mmproj_of_another_width_is_refused(converted: Converted, tmp_path: Path) -> None:
    """The mmproj of a checkpoint whose text stack is wider projects to the wrong width."""
    wider = tmp_path / "wider"
    shutil.copytree(converted.checkpoint_dir, wider)
    config = json.loads((wider / "config.json").read_text())
    config["text_config"]["hidden_size"] *= 2
    (wider / "config.json").write_text(json.dumps(config))
    mmproj = write_mmproj(wider, tmp_path / "mmproj-wider.gguf", Q.F32)
    text, _ = converted.pairs[Q.F32]
    with pytest.raises(ConfigError, match=rf"{mmproj}.*'clip.vision.projection_dim' is \d+"):
        model_config_with_mmproj(
            model_config_from_gguf(text), read_gguf_header(text), read_gguf_header(mmproj)
        )


def test_a_text_gguf_without_a_vocabulary_is_refused(converted: Converted, tmp_path: Path) -> None:
    text, mmproj = converted.pairs[Q.F32]
    header = read_gguf_header(text)
    bare = attrs.evolve(
        header, fields={k: v for k, v in header.fields.items() if k != "tokenizer.ggml.tokens"}
    )
    with pytest.raises(ConfigError, match=r"'tokenizer.ggml.tokens' is missing"):
        model_config_with_mmproj(model_config_from_gguf(text), bare, read_gguf_header(mmproj))


def test_two_mmproj_files_beside_a_model_are_refused(converted: Converted, tmp_path: Path) -> None:
    text, mmproj = converted.pairs[Q.F32]
    for path in (text, mmproj):
        shutil.copy(path, tmp_path / path.name)
    shutil.copy(mmproj, tmp_path / "mmproj-model-f16.gguf")
    with pytest.raises(ModelNotFoundError, match="several mmproj files"):
        resolve_model(str(tmp_path / text.name))


def test_an_unknown_mmproj_tensor_is_named() -> None:
    with pytest.raises(UnknownMmprojTensorError, match=r"'v\.blk\.0\.attn_sinks\.weight'"):
        mmproj_tensor("qwen2.5vl_merger", "v.blk.0.attn_sinks.weight")
    with pytest.raises(UnknownMmprojTensorError, match="projector type 'llama4'"):
        mmproj_tensor("llama4", "v.patch_embd.weight")


_OTHER_MMPROJ: dict[str, Path] = {}


def _other_family_mmproj(family: str, tmp_root: Path) -> Path:
    """An mmproj of ``family``'s tiny checkpoint (written once)."""
    if family not in _OTHER_MMPROJ:
        checkpoint_dir = tmp_root / f"other-{family}"
        save_checkpoint(family, checkpoint_dir)
        _OTHER_MMPROJ[family] = write_mmproj(
            checkpoint_dir, tmp_root / f"mmproj-other-{family}.gguf", Q.F32
        )
    return _OTHER_MMPROJ[family]


def _is_stored_plus_one(converted: Converted, name: str) -> bool:
    """Gemma's ``1 + w`` norms (the text stack's and the projector's ``soft_emb_norm``)."""
    if converted.family != "gemma3" or not name.endswith("norm.weight"):
        return False
    return "vision_tower" not in name


def as_the_files_hold(converted: Converted, qtype: Q) -> dict[str, torch.Tensor]:
    """The safetensors load's weights as a ``qtype`` pair holds them: Gemma's ``1 + w`` norms
    rounded through float32 ``w + 1``; with Q8_0, matrices in Q8_0 blocks (F16 where their rows
    are not whole blocks), and Gemma 3's input projection F16, norms, biases and the patch and
    position embeddings F32 (the converter's forced types)."""
    held = {}
    for name, tensor in converted.safetensors_model().state_dict().items():
        values = tensor.numpy()
        if _is_stored_plus_one(converted, name):
            values = (values + np.float32(1)) - np.float32(1)
        file_type = _q8_0_file_type(name, values.ndim) if qtype == Q.Q8_0 else Q.F32
        if "input_projection" in name:
            file_type = Q.F16  # the converter's, whatever the outtype (llama.cpp issue 13025)
        rows = as_the_file_holds(values.reshape(-1, values.shape[-1]), file_type)
        held[name] = torch.from_numpy(np.ascontiguousarray(rows).reshape(values.shape))
    return held


def _q8_0_file_type(name: str, ndim: int) -> Q:
    if ndim < 2 or "norm" in name or "patch_embed" in name or "embeddings." in name:
        return Q.F32
    return Q.F16 if "input_projection" in name else Q.Q8_0


def image_prompt_logits(
    converted: Converted, model: Any, paged_runner: Callable[..., Any]
) -> torch.Tensor:
    """Every position's logits of one prompt: text, an image, text (prefilled in one step)."""
    generator = torch.Generator().manual_seed(1)
    before, after = (torch.randint(3, 250, (n,), generator=generator).tolist() for n in (7, 5))
    with torch.inference_mode():
        if converted.family == "gemma3":
            tokens, embeds, positions = _gemma3_inputs(converted, model, before, after)
        else:
            tokens, embeds, positions = _qwen2_5_vl_inputs(converted, model, before, after)
    wrapped = WithPromptInputs(model)
    wrapped.embeds, wrapped.positions = embeds, positions
    run = paged_runner(wrapped, num_blocks=64, block_size=8)
    logits: torch.Tensor = run.step({0: tokens})[0]
    return logits


_Inputs = tuple[list[int], torch.Tensor, torch.Tensor | None]


def _gemma3_inputs(
    converted: Converted, model: Any, before: list[int], after: list[int]
) -> _Inputs:
    processor = ImageProcessorConfig.from_directory(
        converted.checkpoint_dir, model.config.siglip_vision
    )
    images = gemma3_images([random_image(20, 28, 0)], processor)
    tokens = [*before, 251, *[250] * 4, 252, *after]
    return tokens, prompt_embeds(model, torch.tensor(tokens), images), None


def _qwen2_5_vl_inputs(
    converted: Converted, model: Any, before: list[int], after: list[int]
) -> _Inputs:
    processor = Qwen2VLImageProcessorConfig.from_directory(
        converted.checkpoint_dir, model.config.vision
    )
    images = qwen_images([random_image(150, 230, 0)], processor)
    placeholders = [*before, 252, 250, 253, *after]
    tokens = expand_image_tokens(placeholders, 250, images.num_tokens(2))
    inputs = prompt_inputs(model, torch.tensor(tokens), images)
    return tokens, inputs.embeds, inputs.positions.positions
