"""The seam of a stream resumed by token ids, with vLLM's own incremental
detokenizer and the tiny-chat tokenizer (byte-level BPE: a character outside
ASCII is several tokens): for every point where the replica could be lost,
the text the client read, then the replayed ids' unread text
(`resume.unread`), then what the next replica streams after a prompt that
ends with those ids, is the fault-free text; or the replay is refused and
the answer goes on from its text (a stop string could straddle the seam)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inferd.engines import resume
from tests.support import needs

pytestmark = needs("vllm")


def streamed(tokenizer: Any, prompt: list[int], ids: list[int], stop: list[str]) -> list[str]:
    """The text a client reads after each token, as vLLM streams it
    (`RequestOutputKind.DELTA`): its detokenizer fed one token a step, as
    its output processor feeds it; it ends at a stop string."""
    from vllm import SamplingParams
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    params = SamplingParams(max_tokens=len(ids) + 1, stop=stop or None)
    request = SimpleNamespace(
        request_id="r", prompt_token_ids=prompt, prompt_embeds=None, sampling_params=params
    )
    detokenizer = IncrementalDetokenizer.from_new_request(tokenizer, request)
    out = []
    for k, token in enumerate(ids):
        hit = detokenizer.update([token], False)
        out.append(detokenizer.get_next_output_text(hit is not None or k == len(ids) - 1, True))
        if hit is not None:
            break
    return out


SEAMS = [
    # (case, the answer's text, stop strings, cuts where the replay is refused;
    # None: some, not all)
    ("ASCII words", "Once upon a time, the sea was calm and blue.", [], 0),
    ("characters of several tokens each", "Le café 日本語 ✓ vague 🌊 fin", [], 0),
    (
        "a stop string never met: its length less one held back",
        "alpha beta gamma delta",
        ["zzz"],
        0,
    ),
    (
        "a stop string met: cuts just before it could straddle",
        "alpha beta END gamma",
        ["END"],
        None,
    ),
    ("a stop string of several tokens", "one two three <|stop|> four", ["<|stop|>"], None),
]


@pytest.mark.parametrize(
    ("text", "stop", "refused"), [c[1:] for c in SEAMS], ids=[c[0] for c in SEAMS]
)
def test_the_seam_of_a_replay_is_the_fault_free_text(
    tiny_chat_dir: Path, text: str, stop: list[str], refused: int | None
) -> None:
    from transformers import AutoTokenizer

    from inferd.engines.vllm import decoded_text, whole_characters

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_chat_dir))
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Tell me."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    assert len(ids) > 8
    full = streamed(tokenizer, prompt, ids, stop)
    fault_free = "".join(full)
    fallbacks = held = cut_inside = missed = 0
    # Lost after k tokens were streamed (those after a stop never were).
    for k in range(1, len(full)):
        read = "".join(full[:k])
        # As the engine replays them: up to the last whole character.
        kept = whole_characters(tokenizer, ids[:k])
        cut_inside += kept < k
        decoded = decoded_text(tokenizer, prompt, ids[:kept], True)
        unread = resume.unread(decoded, read, stop, parsed=False)
        if unread is None:
            fallbacks += 1
            # Replayed anyway, the stop string across the seam is missed.
            rest = streamed(tokenizer, prompt + ids[:kept], ids[kept:], stop)
            missed += read + decoded[len(read) :] + "".join(rest) != fault_free
            continue
        held += bool(unread)
        rest = streamed(tokenizer, prompt + ids[:kept], ids[kept:], stop)
        assert read + unread + "".join(rest) == fault_free, (k, read, unread, rest)
    if refused is not None:
        assert fallbacks == refused
    else:
        assert 0 < fallbacks < len(full) - 1
        assert missed > 0
    if stop:
        # vLLM held text back at the seam, and the replay gave it first.
        assert held > 0
    # Cut inside a character exactly where the text has one of several tokens.
    assert bool(cut_inside) == any(ord(c) > 127 for c in text)
