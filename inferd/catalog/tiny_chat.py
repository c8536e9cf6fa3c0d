"""Builder of `tiny-chat`: a randomly initialised Llama-architecture chat model.

Real architecture (LlamaForCausalLM, grouped-query attention, RoPE), real
tokenizer (byte-level BPE, trained here on a fixed text) and a Llama-3-style
chat template, so that every engine path (vLLM, transformers) runs for real on
a CPU with no network. The weights are random: the text it writes is noise.

Everything is deterministic: same code, same bytes out.
"""

from __future__ import annotations

from pathlib import Path

# head_dim must be >= 32 for vLLM's CPU attention kernels (16 fails).
TINY_CHAT_ARCH = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 2048,
}
VOCAB_SIZE = 1024
SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
# Markup of tool calls (Hermes style, as Qwen2.5 writes them) and of
# reasoning (DeepSeek-R1 style): whole tokens, never split by the BPE, and
# not special, so they stay in the decoded text that vLLM's tool and
# reasoning parsers read (`deepseek_r1` also looks their ids up).
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<think>", "</think>")
# A Llama-3-style template with tool support in the Hermes format that
# vLLM's `hermes` tool parser reads: the tools are listed in a system turn,
# an assistant's calls are written as <tool_call>{json}</tool_call>, and
# tool results come back as `tool` turns.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    "You may call one or more functions. Their signatures:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'For each call write <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>'
    "<|eot_id|>{% endif %}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}"
    "<tool_call>{\"name\": {{ call['function']['name'] | tojson }}, \"arguments\": "
    "{% if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
    "{% else %}{{ call['function']['arguments'] | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# Training text for the tokenizer: enough English for word-like merges.
_CORPUS = """
The quick brown fox jumps over the lazy dog. A model serving runtime loads a
model onto its accelerators and answers requests from many clients at once.
Each request carries a conversation: a system message that sets the tone and a
user message that asks a question. The assistant answers with a short reply.
Inference endpoints scale between a minimum and a maximum number of replicas,
and scale down to zero when nobody has called them for a while. The next
request wakes them up again without being lost. Images are generated from a
text prompt by a diffusion pipeline: a text encoder, a denoising network and
a decoder that turns latents into pixels. Tokens are produced one at a time;
the time to the first token and the number of tokens per second are what
users feel. Hello, how are you today? I am fine, thank you. What is the
weather like in Paris, Berlin, Tokyo, London, New York and San Francisco?
It is sunny and warm, with a light wind from the west and clouds later on.
Please write a short poem about the sea, the mountains and the stars at night.
One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.
"""


def build_tokenizer(out_dir: Path) -> object:
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the lines so that the merges' counts are well separated.
    tokenizer.train_from_iterator(_CORPUS.strip().splitlines() * 4, trainer=trainer)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.add_tokens(list(MARKUP_TOKENS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        model_max_length=TINY_CHAT_ARCH["max_position_embeddings"],
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_chat(out_dir: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
        **TINY_CHAT_ARCH,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
    )
    model.save_pretrained(str(out_dir))
