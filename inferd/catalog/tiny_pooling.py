"""Builders of the tiny pooling models: embedders and a reranker of real architectures.

- `tiny-embed`: BERT (`BertModel`), the architecture of the BGE embedders
  (BAAI/bge-*-en-v1.5), with a WordPiece tokenizer and the
  sentence-transformers files that tell vLLM to pool the [CLS] token and
  normalise, as BGE's own repository does.
- `tiny-qwen3-embed`: `Qwen3ForCausalLM` served as an embedder (last-token
  pooling, normalised, Matryoshka dimensions), as Qwen/Qwen3-Embedding-*.
- `tiny-rerank`: `XLMRobertaForSequenceClassification` with one label, the
  architecture of BAAI/bge-reranker-*: a cross-encoder scoring text pairs.

Random weights (the numbers mean nothing), real code paths; deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_SIZE = 512
MAX_POSITIONS = 512
# head_dim must be >= 32 for vLLM's CPU attention kernels.
ENCODER_ARCH = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
}
ST = "sentence_transformers.models."
_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _corpus() -> list[str]:
    from inferd.catalog.tiny_chat import _CORPUS

    return _CORPUS.strip().splitlines() * 4


def build_wordpiece_tokenizer(out_dir: Path, *, xlm_roberta: bool = False) -> object:
    """A BERT-style WordPiece tokenizer: `[CLS] a [SEP] b [SEP]` for pairs (the
    cross-encoder's input), lower-cased."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
    from tokenizers.models import WordPiece
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(_SPECIAL), show_progress=False
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(str(out_dir))
    return fast


def _sentence_transformers(out_dir: Path, pooling: str, dimension: int) -> None:
    """The files a sentence-transformers repository carries; vLLM reads the
    pooling and normalisation from them."""
    modules = [("0", "", "Transformer"), ("1", "1_Pooling", "Pooling")]
    modules.append(("2", "2_Normalize", "Normalize"))
    (out_dir / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": i,
                    "name": name,
                    "path": path,
                    "type": f"sentence_transformers.models.{cls}",
                }
                for i, (name, path, cls) in enumerate(modules)
            ]
        )
    )
    (out_dir / "1_Pooling").mkdir(exist_ok=True)
    (out_dir / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": dimension,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_lasttoken": pooling == "last",
            }
        )
    )
    (out_dir / "2_Normalize").mkdir(exist_ok=True)


def build_tiny_embed(out_dir: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_wordpiece_tokenizer(out_dir)
    config = BertConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        **ENCODER_ARCH,
    )
    config.architectures = ["BertModel"]
    torch.manual_seed(0)
    BertModel(config).to(torch.float32).save_pretrained(str(out_dir))
    _sentence_transformers(out_dir, "cls", config.hidden_size)


def build_tiny_rerank(out_dir: Path) -> None:
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_wordpiece_tokenizer(out_dir)
    pad = tokenizer.pad_token_id  # type: ignore[attr-defined]
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        # XLM-R counts positions from pad + 1, as BGE's reranker does.
        max_position_embeddings=MAX_POSITIONS + pad + 1,
        pad_token_id=pad,
        bos_token_id=tokenizer.cls_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.sep_token_id,  # type: ignore[attr-defined]
        type_vocab_size=1,
        num_labels=1,
        **ENCODER_ARCH,
    )
    config.architectures = ["XLMRobertaForSequenceClassification"]
    torch.manual_seed(0)
    XLMRobertaForSequenceClassification(config).to(torch.float32).save_pretrained(str(out_dir))


def build_tiny_qwen3_embed(out_dir: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from inferd.catalog.tiny_chat import build_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = Qwen3Config(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=True,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    # Trained with Matryoshka losses (as Qwen3-Embedding): a prefix of the
    # vector is an embedding too, so requests may ask for fewer `dimensions`.
    config.is_matryoshka = True
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).to(torch.float32).save_pretrained(str(out_dir))
    _sentence_transformers(out_dir, "last", config.hidden_size)
