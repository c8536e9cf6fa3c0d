"""Builder of `tiny-sdxl`: a randomly initialised Stable Diffusion XL pipeline.

The real SDXL architecture at toy width: a UNet2DConditionModel with
`addition_embed_type="text_time"` (pooled text embedding plus the six
size/crop conditioning numbers), two CLIP text encoders whose hidden sizes
add up to the UNet's cross-attention width (the second one with a
projection, giving the pooled embedding), two CLIP tokenizers, a 4-level
AutoencoderKL (so latents are 1/8 of the image side, as in SDXL) and an Euler
scheduler. `StableDiffusionXLPipeline.from_pretrained(dir)` loads it and
turns out 1024x1024 images on a CPU in well under a second: the channels are
tiny, and the UNet keeps attention off its 128x128 top level, as SDXL does.

The tokenizers are made by hand (byte-level BPE vocabulary and merges learnt
here from a fixed text), so nothing comes from the hub. The weights are
random: the images are coloured noise.

`inferd.json` in the output directory carries the serving defaults the
engine reads (step count, guidance); the catalog entry repeats them.

Everything is deterministic: same code, same bytes out.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

# A few steps: the weights are random, so more steps only cost time.
DEFAULT_STEPS = 2
DEFAULT_GUIDANCE_SCALE = 5.0
DEFAULT_SIZE = 1024
TOKENIZER_MAX_LENGTH = 77
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
NUM_MERGES = 400

# Hidden sizes of the two text encoders; their sum is the UNet's
# cross_attention_dim (SDXL: 768 + 1280 = 2048).
TEXT_ENCODER_HIDDEN = 32
TEXT_ENCODER_2_HIDDEN = 32
TEXT_ENCODER_2_PROJECTION = 32
ADDITION_TIME_EMBED_DIM = 8

# Tokenizer training text: lowercase, as CLIP normalises.
_CORPUS = """
a photograph of an astronaut riding a horse on the moon, highly detailed
a watercolor painting of a lighthouse by the sea at sunset, soft light
a cat sitting on a windowsill in the rain, cinematic, sharp focus
a mountain landscape with a lake and pine trees in the morning fog
portrait of an old man with a beard, oil painting, dramatic lighting
a red sports car driving through a city street at night, neon lights
a bowl of fruit on a wooden table, still life, studio photo
an illustration of a castle in the clouds, fantasy art, vibrant colors
a forest path in autumn with golden leaves, photo, wide angle
a robot reading a book in a library, digital art, warm tones
"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map of bytes to printable characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def learn_bpe(corpus: str, num_merges: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A plain BPE learner in CLIP's layout: bytes, bytes + `</w>`, merges, specials.

    Ties between equally frequent pairs go to the lexicographically smallest,
    so the result depends on nothing but the text.
    """
    byte_chars = _bytes_to_unicode()
    base = [byte_chars[b] for b in range(256)]
    vocab_list = base + [c + "</w>" for c in base]
    words: Counter[tuple[str, ...]] = Counter()
    for text_word in corpus.lower().replace(",", " ").split():
        symbols = [byte_chars[b] for b in text_word.encode("utf-8")]
        symbols[-1] += "</w>"
        words[tuple(symbols)] += 1
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        if best[0] + best[1] not in vocab_list:
            vocab_list.append(best[0] + best[1])
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    vocab_list += [BOS, EOS]
    return {token: i for i, token in enumerate(vocab_list)}, merges


def build_tokenizer(out_dir: Path, vocab: dict[str, int], merges: list[tuple[str, str]]) -> Any:
    from transformers import CLIPTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n")
    (out_dir / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    )
    tokenizer = CLIPTokenizer(
        vocab=vocab,
        merges=list(merges),
        model_max_length=TOKENIZER_MAX_LENGTH,
    )
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def build_tiny_sdxl(out_dir: Path) -> None:
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab, merges = learn_bpe(_CORPUS, NUM_MERGES)
    tokenizer = build_tokenizer(out_dir / "tokenizer", vocab, merges)
    tokenizer_2 = build_tokenizer(out_dir / "tokenizer_2", vocab, merges)

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        sample_size=DEFAULT_SIZE // 8,
        in_channels=4,
        out_channels=4,
        # SDXL keeps attention off its top (128x128) level; here one level
        # more is plain convolution, so that self-attention runs over 32x32
        # and 16x16 tokens only: 1024x1024 stays cheap on a CPU.
        down_block_types=(
            "DownBlock2D",
            "DownBlock2D",
            "CrossAttnDownBlock2D",
            "CrossAttnDownBlock2D",
        ),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
        block_out_channels=(16, 32, 32, 64),
        layers_per_block=1,
        transformer_layers_per_block=(1, 1, 1, 1),
        attention_head_dim=(2, 4, 4, 8),
        norm_num_groups=8,
        use_linear_projection=True,
        cross_attention_dim=TEXT_ENCODER_HIDDEN + TEXT_ENCODER_2_HIDDEN,
        addition_embed_type="text_time",
        addition_time_embed_dim=ADDITION_TIME_EMBED_DIM,
        projection_class_embeddings_input_dim=6 * ADDITION_TIME_EMBED_DIM
        + TEXT_ENCODER_2_PROJECTION,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        # Four levels: a downsampling factor of 8, as in SDXL. Four channels
        # and no attention in the middle block (SDXL has one over 128x128
        # tokens) keep decoding a 1024x1024 image cheap.
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(4, 4, 4, 4),
        layers_per_block=1,
        norm_num_groups=2,
        mid_block_add_attention=False,
        latent_channels=4,
        sample_size=DEFAULT_SIZE,
        scaling_factor=0.13025,
        force_upcast=True,
    )
    common = {
        "bos_token_id": vocab[BOS],
        "eos_token_id": vocab[EOS],
        "pad_token_id": vocab[EOS],
        "vocab_size": len(vocab),
        "max_position_embeddings": TOKENIZER_MAX_LENGTH,
        "num_hidden_layers": 2,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
    }
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=TEXT_ENCODER_HIDDEN,
            intermediate_size=64,
            num_attention_heads=4,
            projection_dim=TEXT_ENCODER_HIDDEN,
            **common,
        )
    )
    text_encoder_2 = CLIPTextModelWithProjection(
        CLIPTextConfig(
            hidden_size=TEXT_ENCODER_2_HIDDEN,
            intermediate_size=64,
            num_attention_heads=4,
            projection_dim=TEXT_ENCODER_2_PROJECTION,
            **common,
        )
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        prediction_type="epsilon",
        # Few-step SDXL variants use "trailing" spacing: the first step
        # starts from pure noise.
        timestep_spacing="trailing",
        steps_offset=1,
    )
    pipeline = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=scheduler,
        add_watermarker=False,
    )
    pipeline.save_pretrained(str(out_dir))
    (out_dir / "inferd.json").write_text(
        json.dumps(
            {
                "default_size": [DEFAULT_SIZE, DEFAULT_SIZE],
                "default_steps": DEFAULT_STEPS,
                "default_guidance_scale": DEFAULT_GUIDANCE_SCALE,
            },
            indent=2,
        )
        + "\n"
    )
