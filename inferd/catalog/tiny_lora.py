"""Tiny random LoRA adapters for a tiny base model, built with PEFT.

`build_tiny_lora(base_dir, out_dir)` writes what a fine-tune saved with
`PeftModel.save_pretrained` looks like (`adapter_config.json`,
`adapter_model.safetensors`), with random, non-zero B matrices so that the
adapter really changes the base model's output. Deterministic per seed.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def build_tiny_lora(
    base_dir: Path,
    out_dir: Path,
    *,
    rank: int = 8,
    seed: int = 0,
    target_modules: Sequence[str] = ATTENTION,
) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=list(target_modules),
        # PEFT's default zeroes B (the adapter starts as a no-op); random
        # weights make each adapter's output differ from the base's.
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    get_peft_model(model, config).save_pretrained(str(out_dir))
    return out_dir


def ensure_tiny_lora(base_dir: Path, *, rank: int = 8, seed: int = 0) -> Path:
    """`build_tiny_lora` into a directory beside the base model's (named by
    the base's own directory, so a rebuilt base gets new adapters), unless
    it is there already. Built aside and renamed into place: concurrent
    callers never see half-written files."""
    target = base_dir.parent / f"{base_dir.name}-lora-r{rank}-s{seed}"
    if (target / ".complete").exists():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=base_dir.parent))
    try:
        build_tiny_lora(base_dir, tmp, rank=rank, seed=seed)
        (tmp / ".complete").write_text("ok\n")
        try:
            tmp.rename(target)
        except OSError:  # another process put it in place first
            if not (target / ".complete").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
