"""Chat messages -> prompt token ids, with the model's own chat template."""

from __future__ import annotations

import contextlib
import json
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

    def render(
        self,
        messages: Sequence[ChatMessage],
        tools: list[dict[str, Any]] | None = None,
        *,
        continue_final: bool = False,
        generation_prompt: bool = True,
    ) -> list[int]:
        """Prompt token ids; `tools` (OpenAI's shape) are written by the
        template where it supports them. `continue_final`: the prompt ends
        inside the final (assistant) message, so the model goes on writing
        it (vLLM's `continue_final_message`)."""
        if tools is None and not any(m.tool_calls or m.tool_call_id for m in messages):
            conversation = [{"role": m.role, "content": m.content} for m in messages]
        else:
            conversation = template_messages(messages)
        try:
            ids = self.tokenizer.apply_chat_template(
                conversation,
                tools=tools,
                add_generation_prompt=generation_prompt and not continue_final,
                continue_final_message=continue_final,
                tokenize=True,
                return_dict=False,
            )
        except Exception as exc:  # jinja raises its own errors for bad role orders
            raise BadRequest(
                f"The messages cannot be rendered with this model's chat template: {exc}",
                param="messages",
            ) from None
        return [int(i) for i in ids]


def message_dict(message: ChatMessage) -> dict[str, Any]:
    """One message in the OpenAI shape, as chat templates and vLLM read it."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
        if not message.content:
            out["content"] = None
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for the chat template: a call's arguments as an object, as
    Hugging Face templates expect them (vLLM's renderer does the same)."""
    out = []
    for message in messages:
        item = message_dict(message)
        for call in item.get("tool_calls", ()):
            function = call["function"]
            # Text that is not JSON is written as it is.
            with contextlib.suppress(json.JSONDecodeError):
                function["arguments"] = json.loads(function["arguments"] or "{}")
        out.append(item)
    return out
