"""Seconds per image of a full-size SDXL on a CUDA GPU: inferd's diffusers
engine at its default settings and with `optimize=True`, against the bare
pipeline measured in the same run (the reference). The 2.54 s/image that
diffusers' guide reports for a tuned SDXL on an A100 is printed for context,
never judged against: it was measured on another machine.

    .venv/bin/python benchmarks/gpu_images.py [--steps 30] [--size 1024] [--runs 3]
        [--device-index 0] [--variants bare default optimize]
    .venv/bin/python benchmarks/gpu_images.py --smoke     # any machine, CPU

The real run needs a CUDA GPU (it stops at once, with a message, where torch
sees none). Nothing is downloaded: the pipeline is SDXL base 1.0's
architecture (the UNet, VAE and both CLIP text encoders built from the
configuration values of `stabilityai/stable-diffusion-xl-base-1.0`, written
out below; parameter counts equal the catalog's `sdxl-base-1.0`) with random
weights, in half precision, and a hand-made tokenizer (the tiny-sdxl one:
token ids differ from CLIP's, which costs nothing). Random weights cost the
same arithmetic as trained ones; the images are noise.

Variants, each on a freshly built pipeline (same seed), one after another:
- bare: `StableDiffusionXLPipeline(...)` called directly (`pipe(prompt,
  num_inference_steps=30)`, PIL output), SDPA attention by default.
- default: `DiffusersImageEngine` with default options (the replica's
  `--device cuda`), `generate()` returning PNG bytes; PNG encoding included.
- optimize: the same with `optimize=True` (the replica's `--optimize`): fused
  QKV, channels-last, `torch.compile` of the UNet and VAE decoder (the
  engine's compile mode, `default`; `--compile-mode` picks another).
  Compilation happens in the warm-up call, reported apart.

Each variant: one warm-up call at the measured size (not timed in the rate;
its time is shown), then `--runs` timed images, median reported. Goal: the
engine's fastest settings at or under the bare pipeline's median (the engine
also encodes a PNG). Context: diffusers' "Accelerate inference of
text-to-image diffusion models" tutorial
(https://huggingface.co/docs/diffusers/tutorials/fast_diffusion): 2.54 s
per 1024x1024 image, 30 steps, SDXL on an 80 GB 400 W A100 with bf16, SDPA
and torch.compile.

`--smoke` exercises the same code path on the CPU at toy scale (a random
tiny SDXL-shaped configuration, 64x64, 2 steps, fp32) and builds the
full-size components on the `meta` device to check their parameter counts
against the catalog. Its timings mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import load_average, print_table, write_report

GUIDE_S_PER_IMAGE = 2.54
GUIDE = "diffusers fast_diffusion tutorial: SDXL, A100 80GB, 1024x1024, 30 steps"
PROMPT = "Astronaut in a jungle, cold color palette, muted colors, detailed, 8k"
REPO_ROOT = Path(__file__).resolve().parent.parent

# --- SDXL base 1.0's component configurations (stabilityai/stable-diffusion-xl-base-1.0)

SDXL_UNET: dict[str, Any] = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "center_input_sample": False,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    "only_cross_attention": False,
    "block_out_channels": (320, 640, 1280),
    "layers_per_block": 2,
    "downsample_padding": 1,
    "mid_block_scale_factor": 1,
    "act_fn": "silu",
    "norm_num_groups": 32,
    "norm_eps": 1e-5,
    "cross_attention_dim": 2048,
    "transformer_layers_per_block": (1, 2, 10),
    "attention_head_dim": (5, 10, 20),
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
}
SDXL_VAE: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "act_fn": "silu",
    "latent_channels": 4,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": 0.13025,
    "force_upcast": True,
}
# CLIP ViT-L/14's text tower, and OpenCLIP ViT-bigG/14's (with projection).
SDXL_TEXT_ENCODER: dict[str, Any] = {
    "vocab_size": 49408,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "projection_dim": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}
SDXL_TEXT_ENCODER_2: dict[str, Any] = {
    **SDXL_TEXT_ENCODER,
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "projection_dim": 1280,
    "num_hidden_layers": 32,
    "num_attention_heads": 20,
    "hidden_act": "gelu",
}
SDXL_SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "prediction_type": "epsilon",
    "timestep_spacing": "leading",
    "steps_offset": 1,
    "interpolation_type": "linear",
    "use_karras_sigmas": False,
}

# --- a toy configuration of the same shape, for --smoke on a CPU

TINY_UNET: dict[str, Any] = {
    **SDXL_UNET,
    "sample_size": 8,
    "block_out_channels": (8, 16, 32),
    "layers_per_block": 1,
    "transformer_layers_per_block": (1, 1, 1),
    "attention_head_dim": (2, 4, 8),
    "norm_num_groups": 8,
    "cross_attention_dim": 32,
    "addition_time_embed_dim": 8,
    "projection_class_embeddings_input_dim": 6 * 8 + 16,
}
TINY_VAE: dict[str, Any] = {
    **SDXL_VAE,
    "block_out_channels": (4, 4, 4, 4),
    "layers_per_block": 1,
    "norm_num_groups": 2,
    "sample_size": 64,
}
TINY_TEXT_ENCODER: dict[str, Any] = {
    **SDXL_TEXT_ENCODER,
    "hidden_size": 16,
    "intermediate_size": 32,
    "projection_dim": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
}
TINY_TEXT_ENCODER_2 = TINY_TEXT_ENCODER


@dataclass(frozen=True)
class Configs:
    unet: dict[str, Any]
    vae: dict[str, Any]
    text_encoder: dict[str, Any]
    text_encoder_2: dict[str, Any]


FULL = Configs(SDXL_UNET, SDXL_VAE, SDXL_TEXT_ENCODER, SDXL_TEXT_ENCODER_2)
TINY = Configs(TINY_UNET, TINY_VAE, TINY_TEXT_ENCODER, TINY_TEXT_ENCODER_2)


def build_components(configs: Configs, device: Any, token_ids: dict[str, int]) -> dict[str, Any]:
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(0)
    with torch.device(device):
        return {
            "unet": UNet2DConditionModel(**configs.unet),
            "vae": AutoencoderKL(**configs.vae),
            "text_encoder": CLIPTextModel(CLIPTextConfig(**configs.text_encoder, **token_ids)),
            "text_encoder_2": CLIPTextModelWithProjection(
                CLIPTextConfig(**configs.text_encoder_2, **token_ids)
            ),
        }


def write_tokenizer(out_dir: Path) -> dict[str, int]:
    """The tiny-sdxl tokenizer (made here, no hub); returns its special ids."""
    from inferd.catalog.tiny_sdxl import _CORPUS, BOS, EOS, NUM_MERGES, build_tokenizer, learn_bpe

    vocab, merges = learn_bpe(_CORPUS, NUM_MERGES)
    build_tokenizer(out_dir, vocab, merges)
    return {"bos_token_id": vocab[BOS], "eos_token_id": vocab[EOS], "pad_token_id": vocab[EOS]}


def build_pipeline(configs: Configs, tokenizer_dir: Path, device: str, dtype: Any) -> Any:
    """A random-weight SDXL pipeline, made on `device` directly (initialising
    2.6 B parameters on a GPU takes a moment, on a CPU minutes)."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    token_ids = write_tokenizer(tokenizer_dir)
    parts = build_components(configs, device, token_ids)
    for module in parts.values():
        module.to(dtype=dtype).eval()
    tokenizer = CLIPTokenizer.from_pretrained(str(tokenizer_dir))
    pipeline = StableDiffusionXLPipeline(
        **parts,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        scheduler=EulerDiscreteScheduler(**SDXL_SCHEDULER),
        add_watermarker=False,
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


# --- measuring ---------------------------------------------------------------------


@dataclass
class VariantResult:
    variant: str
    build_s: float
    warmup_s: float
    seconds: list[float]

    def row(self) -> dict[str, Any]:
        median = statistics.median(self.seconds)
        return {
            "variant": self.variant,
            "build_s": round(self.build_s, 2),
            "warmup_s": round(self.warmup_s, 2),
            "runs": len(self.seconds),
            "s_per_image": round(median, 3),
            "min_s": round(min(self.seconds), 3),
            "max_s": round(max(self.seconds), 3),
        }


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def run_bare(
    configs: Configs, device: str, dtype: Any, size: int, steps: int, runs: int, tmp: Path
) -> VariantResult:
    started = time.perf_counter()
    pipeline = build_pipeline(configs, tmp / "tokenizer-bare", device, dtype)
    sync(device)
    build_s = time.perf_counter() - started

    def one() -> float:
        start = time.perf_counter()
        pipeline(PROMPT, num_inference_steps=steps, width=size, height=size).images[0]
        sync(device)
        return time.perf_counter() - start

    warmup_s = one()
    seconds = [one() for _ in range(runs)]
    return VariantResult("bare pipeline", build_s, warmup_s, seconds)


def run_engine(
    configs: Configs,
    device: str,
    device_index: int | None,
    size: int,
    steps: int,
    runs: int,
    optimize: bool,
    tmp: Path,
    compile_mode: str | None = None,
) -> VariantResult:
    from inferd.engines.base import EngineOptions, ImageRequest, ServingDefaults
    from inferd.engines.diffusers import DiffusersImageEngine

    options = EngineOptions(
        engine="diffusers",
        device="cuda" if device.startswith("cuda") else "cpu",
        gpu_ids=() if device_index is None else (device_index,),
        optimize=optimize,
        serving=ServingDefaults(
            default_steps=steps,
            default_size=(size, size),
            min_side=min(256, size),
            max_side=max(2048, size),
        ),
        extra={"compile_mode": compile_mode} if compile_mode else {},
    )
    built: list[float] = []
    tokenizer_dir = tmp / f"tokenizer-{'optimize' if optimize else 'default'}"

    def loader(model_path: Path, engine_device: str, dtype: Any) -> Any:
        start = time.perf_counter()
        pipeline = build_pipeline(configs, tokenizer_dir, engine_device, dtype)
        built.append(time.perf_counter() - start)
        return pipeline

    engine = DiffusersImageEngine("sdxl-random", tmp, options, loader=loader)

    async def measure() -> tuple[float, list[float]]:
        await engine.start()

        async def one(index: int) -> float:
            start = time.perf_counter()
            request = ImageRequest(
                request_id=f"bench-{index}",
                prompt=PROMPT,
                width=size,
                height=size,
                num_inference_steps=steps,
            )
            (png,) = await engine.generate(request)
            assert png.startswith(b"\x89PNG")
            return time.perf_counter() - start

        try:
            warmup = await one(-1)
            return warmup, [await one(i) for i in range(runs)]
        finally:
            await engine.shutdown()

    warmup_s, seconds = asyncio.run(measure())
    label = "engine optimize=True" if optimize else "engine default"
    return VariantResult(label, built[0] if built else 0.0, warmup_s, seconds)


def meta_parameter_check() -> list[dict[str, Any]]:
    """Full-size components on the meta device (no memory), their parameter
    counts against the catalog's sdxl-base-1.0 entry."""
    import yaml

    entry = yaml.safe_load((REPO_ROOT / "models/catalog/sdxl-base-1.0.yaml").read_text())
    expected = entry["architecture"]["components"]
    parts = build_components(FULL, "meta", {})
    names = {"unet": "unet", "vae": "vae", "text_encoder": "textEncoder"}
    names["text_encoder_2"] = "textEncoder2"
    rows = []
    for part, module in parts.items():
        count = sum(p.numel() for p in module.parameters())
        rows.append(
            {
                "component": part,
                "parameters": count,
                "catalog": expected[names[part]],
                "equal": count == expected[names[part]],
            }
        )
    return rows


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--size", type=int, default=1024, help="square side in pixels")
    parser.add_argument("--runs", type=int, default=3, help="timed images per variant")
    parser.add_argument("--device-index", type=int, default=0, help="CUDA device to use")
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=("bare", "default", "optimize"),
        default=["bare", "default", "optimize"],
    )
    parser.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile mode for the optimize variant (default: the engine's, 'default')",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="toy scale on the CPU: checks the code path only"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    if args.smoke:
        configs, device, dtype = TINY, "cpu", torch.float32
        device_index: int | None = None
        size, steps = 64, 2
    else:
        if not torch.cuda.is_available():
            print(
                "gpu_images needs a CUDA GPU, and torch sees none "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
                "Run it on a GPU machine, or pass --smoke for a CPU check of the code path.",
                file=sys.stderr,
            )
            return 2
        if args.device_index >= torch.cuda.device_count():
            print(f"no CUDA device {args.device_index}", file=sys.stderr)
            return 2
        configs, dtype = FULL, torch.float16
        device_index = args.device_index
        device = f"cuda:{device_index}"
        torch.cuda.set_device(device_index)
        size, steps = args.size, args.steps

    gpu = torch.cuda.get_device_name(device_index) if device_index is not None else "none (CPU)"
    print(f"device {device} ({gpu}), {size}x{size}, {steps} steps; {load_average()}")
    report: dict[str, Any] = {
        "config": {**vars(args), "out": str(args.out), "size": size, "steps": steps},
        "device": gpu,
        "reference": "the bare pipeline, measured in this run",
        "context": {"s_per_image": GUIDE_S_PER_IMAGE, "source": GUIDE},
    }
    if args.smoke:
        check = meta_parameter_check()
        print_table("full-size SDXL components on the meta device", check, list(check[0]))
        report["meta_parameter_check"] = check

    results: list[VariantResult] = []
    with tempfile.TemporaryDirectory(prefix="gpu-images-") as tmp_name:
        tmp = Path(tmp_name)
        for variant in args.variants:
            if variant == "bare":
                result = run_bare(configs, device, dtype, size, steps, args.runs, tmp)
            else:
                result = run_engine(
                    configs, device, device_index, size, steps, args.runs,
                    variant == "optimize", tmp, args.compile_mode,
                )  # fmt: skip
            results.append(result)
            print(f"{result.variant}: {result.row()}")
            free(device)
    rows = [r.row() for r in results]
    bare = next((r["s_per_image"] for r in rows if r["variant"].startswith("bare")), None)
    for row in rows:
        row["vs bare"] = round(row["s_per_image"] / bare, 3) if bare else None
    if device.startswith("cuda"):
        report["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print_table(
        f"SDXL-architecture pipeline, random fp16 weights, {size}x{size}, {steps} steps, on "
        f"{gpu}; reference: the bare pipeline, this run (context, not judged: "
        f"{GUIDE_S_PER_IMAGE} s/image, {GUIDE}); {load_average()}",
        rows,
        list(rows[0]),
    )
    engine_rows = [r for r in rows if r["variant"].startswith("engine")]
    best = min(engine_rows, key=lambda r: r["s_per_image"]) if engine_rows else None
    if args.smoke:
        print("\n--smoke: code path checked at toy scale on the CPU; no goal is judged.")
        report["goal_met"] = None
    elif best is not None and bare is not None:
        met = best["s_per_image"] <= bare
        print(
            f"\ngoal: the engine's fastest settings at or under the bare pipeline's "
            f"{bare} s/image, same run: {'met' if met else 'NOT met'} "
            f"({best['variant']}: {best['s_per_image']} s)"
        )
        report["goal_met"] = met
    else:
        print("\nno goal judged: it needs the bare variant and an engine variant in one run")
        report["goal_met"] = None
    report["results"] = rows
    write_report("gpu_images_smoke" if args.smoke else "gpu_images", report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
