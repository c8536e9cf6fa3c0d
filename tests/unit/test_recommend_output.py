"""What `inferd recommend` prints of the API's answers: rejections grouped by
reason, the machines' capacity holding the options, what was measured named
as measured, and every kind of answer printable."""

from __future__ import annotations

from typing import Any

import pytest

from inferd.catalog.capacity_fit import within_capacity
from inferd.catalog.cli import format_answer, format_measured, format_rejected
from inferd.cli import main


def option(location: str, gpu_type: str, count: int = 1, **fields: Any) -> dict[str, Any]:
    return {"location": location, "gpuType": gpu_type, "gpuCount": count,
            "reasons": ["estimated"], **fields}  # fmt: skip


def test_identical_rejections_share_one_line_by_location() -> None:
    split = ["2 heads do not split over 4 GPUs"]
    rejected = [
        option("us-east", "H200", 4, reasons=split),
        option("us-east", "L4", 4, reasons=split),
        option("eu-west", "H200", 4, reasons=split),
        option("us-east", "cpu", reasons=["needs 9 GB, 8 GB usable"]),
    ]
    assert format_rejected(rejected) == [
        "",
        "Rejected:",
        "  3 options: 2 heads do not split over 4 GPUs",
        "    us-east 4 x H200, 4 x L4; eu-west 4 x H200",
        "  us-east 1 x cpu: needs 9 GB, 8 GB usable",
    ]
    assert format_rejected([]) == []


def test_options_beyond_the_machines_move_to_rejected() -> None:
    answer = {
        "best": option("local", "cpu", replicas=58, fits=True),
        "options": [
            option("local", "cpu", replicas=58, fits=True),
            option("local", "L4", 2, replicas=2, fits=True),
            option("local", "L4", 1, replicas=3, fits=True),
            option("us-east", "L4", replicas=500, fits=True),  # no machines known there
        ],
        "rejected": [option("local", "H200", 8, fits=False, reasons=["too big"])],
    }
    held = within_capacity(answer, {("local", "cpu"): 4, ("local", "L4"): 3})
    kept = [(o["location"], o["gpuType"], o["gpuCount"]) for o in held["options"]]
    assert kept == [("local", "L4", 1), ("us-east", "L4", 1)]
    assert held["best"] == held["options"][0]
    moved = {(o["gpuType"], o["gpuCount"]): o for o in held["rejected"]}
    assert moved[("cpu", 1)]["reasons"] == [
        "needs 58 CPU replica(s); the machines of local run 4 (cpu_replica_slots)"
    ]
    assert moved[("L4", 2)]["reasons"] == [
        "needs 4 L4 GPU(s) (2 replica(s) x 2); the machines of local have 3"
    ]
    assert not moved[("cpu", 1)]["fits"] and moved[("H200", 8)]["reasons"] == ["too big"]
    # An option sized from a measurement says so where it is rejected.
    measured = option("local", "cpu", replicas=7, fits=True, basis="measured on 1 x cpu, 2026")
    held = within_capacity({"options": [measured], "rejected": []}, {("local", "cpu"): 4})
    assert held["rejected"][0]["reasons"] == [
        "needs 7 CPU replica(s) (measured on 1 x cpu, 2026); the machines of local run 4 "
        "(cpu_replica_slots)"
    ]
    # Nothing beyond the machines: the answer as it was.
    assert within_capacity(answer, {("local", "cpu"): 64, ("local", "L4"): 8}) is answer


def test_a_recommendation_without_a_load_counts_one_replica() -> None:
    answer = {"best": None, "options": [option("local", "L4", 2)], "rejected": []}
    held = within_capacity(answer, {("local", "L4"): 1})
    assert held["options"] == [] and held["best"] is None
    assert "needs 2 L4 GPU(s)" in held["rejected"][0]["reasons"][0]


def test_measured_profiles_are_named_as_measured() -> None:
    profile = {"gpuType": "cpu", "gpuCount": 1, "kind": "chat", "measuredAt": "2026-11-27T10:00Z",
               "points": [{"concurrency": 1, "outputTokensPerS": 20.0},
                          {"concurrency": 4, "outputTokensPerS": 50.25}]}  # fmt: skip
    text = format_measured([profile])
    assert "Measured (inferd bench)" in text
    assert (
        "1 x cpu, 2026-11-27: 20.0 tokens/s at concurrency 1, 50.2 tokens/s at concurrency 4"
        in (text)
    )
    assert format_measured([]) == ""


def test_a_pooling_answer_from_the_server_prints() -> None:
    """`recommend EMBEDDER --server --requests-per-second ...` printed a
    KeyError: the pooling answer went to the chat formatter."""
    answer = {
        "model": "bge", "currency": "USD",
        "workload": {"requestsPerSecond": 200, "tokensPerInput": 256, "inputsPerRequest": 1,
                     "inputTokensPerS": 51200},
        "options": [option("us-east", "L4", inputTokensPerSPerReplica=90000.0, replicas=1,
                           hourlyPrice=0.79, totalHourlyPrice=0.79, costPerMillionTokens=0.0043)],
        "rejected": [option("local", "cpu", reasons=["needs 58 CPU replica(s)"])],
    }  # fmt: skip
    text = format_answer(answer)
    assert "bge for 200 requests/s of 256 tokens: 1 option(s), 1 rejected" in text
    assert "us-east 1 x L4" in text and "local 1 x cpu: needs 58 CPU replica(s)" in text
    assert "\n\n\n" not in format_answer({**answer, "options": []})


class _Server:
    """The management API as `recommend --server` calls it: its answers
    given, the calls recorded."""

    def __init__(self, answer: dict[str, Any], profiles: list[dict[str, Any]]) -> None:
        self.answer, self.profiles = answer, profiles
        self.calls: list[str] = []

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def recommendations(self, params: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(f"recommendations {sorted(params)}")
        return self.answer

    def call(self, method: str, path: str) -> dict[str, Any]:
        self.calls.append(f"{method} {path}")
        return {"data": self.profiles}


def test_recommend_server_without_a_load_lists_the_measured_profiles(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import inferd.client.cli

    answer = {
        "model": "tiny-chat", "location": None, "currency": "USD", "best": None,
        "options": [], "rejected": [option("local", "cpu", reasons=["too slow"])],
        "assumptions": {"concurrency": 16, "contextTokensPerSequence": 2048},
    }  # fmt: skip
    profile = {"gpuType": "cpu", "gpuCount": 1, "kind": "chat", "measuredAt": "2026-11-27",
               "points": [{"concurrency": 4, "outputTokensPerS": 50.0}]}  # fmt: skip
    server = _Server(answer, [profile])
    monkeypatch.setattr(inferd.client.cli, "client_from_args", lambda args: server)
    assert main(["recommend", "tiny-chat", "--server"]) == 0
    out = capsys.readouterr().out
    assert server.calls == ["recommendations ['modelName']", "GET /models/tiny-chat/profiles"]
    assert "local 1 x cpu: too slow" in out
    assert "1 x cpu, 2026-11-27: 50.0 tokens/s at concurrency 4" in out
