"""Chat messages -> prompt token ids, with the model's own chat template."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferd.engines.base import ChatMessage
from inferd.errors import BadRequest


class ChatPromptRenderer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the model's tokenizer has no chat template")

    @classmethod
    def from_pretrained(cls, model_path: Path) -> ChatPromptRenderer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_path)))

    def render(self, messages: Sequence[ChatMessage]) -> list[int]:
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        try:
            ids = self.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as exc:  # jinja raises its own errors for bad role orders
            raise BadRequest(
                f"The messages cannot be rendered with this model's chat template: {exc}",
                param="messages",
            ) from None
        return [int(i) for i in ids]
