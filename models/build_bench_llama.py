"""Build `bench-llama-25m`: a randomly initialised ~25M-parameter Llama with
tiny-chat's tokenizer and chat template, and print its directory.

    python models/build_bench_llama.py [--out DIR]

tiny-chat (2 layers, hidden 128) prefills so cheaply on a CPU that a KV
cache hit saves nothing measurable; routing benchmarks need prefill to cost
what it costs on real models, relatively: this one (8 layers, hidden 512)
prefills about 1-2k tokens/s on one core. Deterministic: same code, same
weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

ARCH = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
}
DEFAULT_OUT = Path(__file__).resolve().parent.parent / ".inferd" / "bench-models"


def build(out_dir: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from inferd.catalog.tiny_chat import build_tokenizer

    target = out_dir / "bench-llama-25m"
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(target)
    tokenizer.model_max_length = ARCH["max_position_embeddings"]  # type: ignore[attr-defined]
    tokenizer.save_pretrained(str(target))  # type: ignore[attr-defined]
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
        **ARCH,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(target))
    (target / ".complete").write_text("ok\n")
    return target


def parameters(path: Path) -> int:
    from transformers import AutoConfig, LlamaForCausalLM

    with __import__("torch").device("meta"):
        model = LlamaForCausalLM(AutoConfig.from_pretrained(str(path)))
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    path = build(parser.parse_args().out)
    print(f"{path} ({parameters(path) / 1e6:.1f}M parameters)")
