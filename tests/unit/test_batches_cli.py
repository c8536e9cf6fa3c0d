"""`inferd batches`: the progress line, `--wait` drawing it until the end,
and `create --capacity`."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pytest

from inferd.cli import build_parser
from inferd.client.batches_cli import BatchClient, progress_line, watch


def batch(status: str, total: int, done: int, failed: int = 0, eta: int | None = None) -> Any:
    return {
        "id": "batch_1",
        "status": status,
        "request_counts": {"total": total, "completed": done, "failed": failed},
        "estimated_completion_at": eta,
    }


@pytest.mark.parametrize(
    ("b", "line"),
    [
        (batch("validating", 10, 0), "[..........]  0/10 done (0 failed), validating"),
        (batch("in_progress", 10, 4, 1, eta=1030), "[#####.....]  5/10 done (1 failed), "
                                                    "in_progress, ~30 s left"),
        (batch("completed", 10, 9, 1, eta=990), "[##########] 10/10 done (1 failed), completed"),
        (batch("cancelled", 0, 0), "[..........] 0/0 done (0 failed), cancelled"),
    ],
)  # fmt: skip
def test_progress_line(b: Any, line: str) -> None:
    assert progress_line(b, now=1000, width=10) == line


class Client:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers

    def get(self, batch_id: str) -> Any:
        return self.answers.pop(0)


def test_watch_draws_each_change_until_the_batch_ends() -> None:
    out = io.StringIO()
    states = [batch("in_progress", 4, 1), batch("in_progress", 4, 1), batch("in_progress", 4, 3),
              batch("completed", 4, 4)]  # fmt: skip
    ended = watch(Client(states), "batch_1", out, clock=lambda: 0.0, sleep=lambda s: None)  # type: ignore[arg-type]
    assert ended["status"] == "completed"
    assert [line.split("]")[1].strip() for line in out.getvalue().splitlines()] == [
        "1/4 done (0 failed), in_progress",
        "3/4 done (0 failed), in_progress",
        "4/4 done (0 failed), completed",
    ]


def test_the_cli_has_the_batch_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["batches", "create", "in.jsonl", "--wait", "--metadata", "a=b"])
    assert args.wait and args.metadata == ["a=b"] and str(args.file) == "in.jsonl"
    for action in (["list"], ["get", "b", "--watch"], ["cancel", "b"], ["results", "b"]):
        assert callable(parser.parse_args(["batches", *action]).func)


def test_create_takes_the_capacity_setting_and_sends_it_only_when_given() -> None:
    parser = build_parser()
    assert parser.parse_args(["batches", "create", "in.jsonl"]).capacity is None
    args = parser.parse_args(["batches", "create", "in.jsonl", "--capacity", "running"])
    assert args.capacity == "running"
    with pytest.raises(SystemExit):
        parser.parse_args(["batches", "create", "in.jsonl", "--capacity", "sometimes"])
    sent: list[dict[str, Any]] = []

    def server(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"id": "batch_1", "capacity": "running"})

    client = BatchClient("http://ep", "t")
    client._http = httpx.Client(base_url=client.base, transport=httpx.MockTransport(server))
    client.create("file-1", "/v1/chat/completions", {}, "running")
    client.create("file-1", "/v1/chat/completions", {})
    client.close()
    assert [body.get("capacity") for body in sent] == ["running", None]
