"""The tiny-sdxl builder: deterministic, loadable, a real SDXL pipeline."""

from __future__ import annotations

import json
from pathlib import Path

from inferd.catalog.tiny_sdxl import BOS, EOS, learn_bpe
from tests.support import needs


def test_bpe_is_clip_shaped_and_deterministic() -> None:
    vocab, merges = learn_bpe("a cat and a dog and a cat", 10)
    assert (vocab, merges) == learn_bpe("a cat and a dog and a cat", 10)
    assert len(vocab) == 512 + len(merges) + 2
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert vocab[BOS] == len(vocab) - 2 and vocab[EOS] == len(vocab) - 1
    assert ("a", "t</w>") in merges or ("c", "a") in merges


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@needs("diffusers")
def test_two_builds_are_byte_identical_and_load_as_sdxl(tmp_path: Path) -> None:
    import torch
    from diffusers import StableDiffusionXLPipeline

    from inferd.catalog.tiny_sdxl import build_tiny_sdxl

    build_tiny_sdxl(tmp_path / "a")
    build_tiny_sdxl(tmp_path / "b")
    files = _files(tmp_path / "a")
    assert files == _files(tmp_path / "b")
    assert {"tokenizer/vocab.json", "tokenizer/merges.txt", "inferd.json"} <= set(files)

    pipeline = StableDiffusionXLPipeline.from_pretrained(str(tmp_path / "a"))
    assert pipeline.unet.config.addition_embed_type == "text_time"
    assert pipeline.unet.config.cross_attention_dim == (
        pipeline.text_encoder.config.hidden_size + pipeline.text_encoder_2.config.hidden_size
    )
    assert pipeline.vae_scale_factor == 8
    assert pipeline.tokenizer.model_max_length == 77
    ids = pipeline.tokenizer("a cat on the moon").input_ids
    assert ids[0] == pipeline.tokenizer.bos_token_id and ids[-1] == pipeline.tokenizer.eos_token_id
    assert pipeline.default_sample_size * pipeline.vae_scale_factor == 1024

    served = json.loads(files["inferd.json"])
    pipeline.set_progress_bar_config(disable=True)
    image = pipeline(
        "a cat",
        width=256,
        height=256,
        num_inference_steps=served["default_steps"],
        generator=torch.Generator().manual_seed(0),
    ).images[0]
    assert image.size == (256, 256)
