"""What an answer served, read from the bytes the gateway relays.

The replica's answer says its token counts in its `usage` object (the end of
a JSON answer; the last chunk of a stream that asked for it; OpenAI's
`prompt_tokens`/`completion_tokens`, the Responses and Messages APIs'
`input_tokens`/`output_tokens`). The gateway keeps only the last bytes of
the answer and counts stream events, so reading costs a slice per chunk,
never a parse of the answer. A stream without a usage chunk counts one
completion token per event (vLLM streams a token or a few per event).
"""

from __future__ import annotations

import re

_TAIL_BYTES = 2048
_PROMPT = re.compile(rb'"(?:prompt_tokens|input_tokens)"\s*:\s*(\d+)')
_COMPLETION = re.compile(rb'"(?:completion_tokens|output_tokens)"\s*:\s*(\d+)')
_EVENT = b"data: "


class UsageTail:
    __slots__ = ("events", "tail")

    def __init__(self) -> None:
        self.tail = b""
        self.events = 0

    def seen(self, body: bytes) -> None:
        if not body:
            return
        self.events += body.count(_EVENT)
        if len(body) >= _TAIL_BYTES:
            self.tail = body[-_TAIL_BYTES:]  # no copy of a large body
        else:
            tail = self.tail + body
            self.tail = tail[-_TAIL_BYTES:] if len(tail) > _TAIL_BYTES else tail

    def counts(self) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens as the answer said them; a stream
        without usage: (None, its content events); None where unknown."""
        prompt = _last(_PROMPT, self.tail)
        completion = _last(_COMPLETION, self.tail)
        if completion is None and self.events:
            # Less the closing [DONE] event.
            completion = max(0, self.events - 1)
        return prompt, completion


def _last(pattern: re.Pattern[bytes], data: bytes) -> int | None:
    matches = pattern.findall(data)
    return int(matches[-1]) if matches else None
