"""The tiny-chat builder: deterministic, and a real Llama with its tokenizer
and chat template (what vLLM and transformers load)."""

from __future__ import annotations

import json
from pathlib import Path

from inferd.catalog.tiny_chat import build_tiny_chat


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_two_builds_are_byte_identical_and_load_as_llama(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tiny_chat(tmp_path / "a")
    build_tiny_chat(tmp_path / "b")
    files = _files(tmp_path / "a")
    assert files == _files(tmp_path / "b")

    config = json.loads(files["config.json"])
    assert config["architectures"] == ["LlamaForCausalLM"]
    # vLLM's CPU attention needs a head size of at least 32.
    assert config["hidden_size"] // config["num_attention_heads"] >= 32
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a"))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "a"))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True, tokenize=False
    )
    assert "Hello" in prompt
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert model(ids).logits.shape == (1, ids.shape[1], config["vocab_size"])
