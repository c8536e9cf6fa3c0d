"""An input file of the Batch API, checked line by line before it is kept.

Each line is one request in OpenAI's shape:
`{"custom_id": str, "method": "POST", "url": "/v1/chat/completions", "body": {...}}`.
A file is refused whole, with a 400 naming each bad line (up to
`MAX_REPORTED`), so nothing half-valid is stored and no batch fails late on
a typo. What each request's body holds is the replica's to judge, as for
any request; only what would make the batch itself wrong is checked here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from inferd.control.batches.model import BATCH_URLS
from inferd.errors import BadRequest

MAX_REPORTED = 10
MAX_CUSTOM_ID = 512


@dataclass(frozen=True)
class BatchLine:
    custom_id: str
    url: str
    body: bytes  # the request body, as JSON


def parse_batch_file(content: bytes, max_lines: int) -> list[BatchLine]:
    """The requests of a JSONL file, or `BadRequest` naming what is wrong
    with which line (1-based)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"the file is not UTF-8 text (byte {exc.start}).") from None
    raw = text.split("\n")
    if raw and raw[-1] == "":
        raw.pop()  # the newline ending the last line
    if not raw:
        raise _invalid("the file has no lines; each line is one request.")
    if len(raw) > max_lines:
        raise _invalid(f"the file has {len(raw)} lines; a batch takes at most {max_lines}.")
    lines: list[BatchLine] = []
    problems: list[str] = []
    seen: set[str] = set()
    for number, source in enumerate(raw, start=1):
        line, problem = _line(source.rstrip("\r"))
        if problem is None and line is not None:
            if line.custom_id in seen:
                problem = f"custom_id '{line.custom_id}' is used by an earlier line"
            seen.add(line.custom_id)
        if problem is not None:
            problems.append(f"line {number}: {problem}")
            if len(problems) >= MAX_REPORTED:
                break
        elif line is not None:
            lines.append(line)
    if problems:
        more = " (and perhaps more)" if len(problems) >= MAX_REPORTED else ""
        raise _invalid("; ".join(problems) + more + ".")
    urls = {line.url for line in lines}
    if len(urls) > 1:
        raise _invalid(f"every line must have the same url; this file has {sorted(urls)}.")
    return lines


def _line(source: str) -> tuple[BatchLine | None, str | None]:
    if not source.strip():
        return None, "is empty; each line is one request"
    try:
        data: Any = json.loads(source)
    except json.JSONDecodeError as exc:
        return None, f"is not JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(data, dict):
        return None, "is not a JSON object"
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return None, "custom_id must be a non-empty string"
    if len(custom_id) > MAX_CUSTOM_ID:
        return None, f"custom_id is longer than {MAX_CUSTOM_ID} characters"
    if data.get("method") != "POST":
        return None, "method must be 'POST'"
    url = data.get("url")
    if url not in BATCH_URLS:
        return None, f"url must be one of {', '.join(BATCH_URLS)}, not {json.dumps(url)}"
    body = data.get("body")
    if not isinstance(body, dict):
        return None, "body must be a JSON object (the request's body)"
    if body.get("stream"):
        return None, "body.stream must be false or absent: a batch's answers are not streamed"
    unknown = set(data) - {"custom_id", "method", "url", "body"}
    if unknown:
        return None, f"unknown fields {sorted(unknown)}"
    return BatchLine(custom_id, url, json.dumps(body, separators=(",", ":")).encode()), None


def _invalid(message: str) -> BadRequest:
    return BadRequest(f"Invalid batch input file: {message}", param="file", code="invalid_file")
