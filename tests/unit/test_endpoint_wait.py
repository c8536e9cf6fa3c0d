"""`inferd endpoints wait`: the stage read from an endpoint record, and the
progress shown on a terminal and elsewhere."""

from __future__ import annotations

import io
from typing import Any

from inferd.client.wait import Progress, Stage, stage_of, wait_until_ready


def record(status: str, *replicas: tuple[str, str | None], **extra: Any) -> dict[str, Any]:
    return {
        "status": status,
        "statusReason": extra.pop("reason", None),
        "replicas": [{"status": s, "statusReason": why} for s, why in replicas],
        **extra,
    }


def test_the_stage_follows_the_replica_furthest_along() -> None:
    building = ("starting", "preparing tiny-chat: building or downloading its weights")
    loading = ("loading", "loading tiny-chat with the vllm engine")
    warming = ("loading", "warming up: one request through the engine")
    assert stage_of(record("initializing", ("starting", None))).name == "starting"
    assert stage_of(record("initializing", building)).name == "building weights"
    assert stage_of(record("initializing", building, loading)).name == "loading"
    assert stage_of(record("initializing", loading, warming)) == Stage("warming up", warming[1])
    assert stage_of(record("running", ("ready", None), loading)).done
    # A ready replica that drains (scaling down) is not one that serves.
    assert not stage_of(record("updating", ("draining", None))).done


def test_states_off_the_way_say_why_and_end_the_wait_when_final() -> None:
    zero = stage_of(record("scaledToZero"))
    assert (zero.name, zero.final, zero.step) == ("scaled to zero", False, None)
    pending = stage_of(record("pending", reason="no free cpu slot in local"))
    assert pending == Stage("pending", "no free cpu slot in local") and not pending.final
    failed = stage_of(record("failed", reason="process exited with code 1"))
    assert failed.final and failed.detail == "process exited with code 1"
    assert stage_of(record("deleting")).final


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_plain_lines_per_change_off_a_terminal_until_ready() -> None:
    answers = iter(
        [record("initializing", ("starting", None))] * 2
        + [record("initializing", ("loading", "loading x with the vllm engine"))] * 3
        + [record("running", ("ready", None))]
    )
    out = io.StringIO()
    clock = Clock()
    stage, waited = wait_until_ready(
        lambda: next(answers), Progress(out, "demo", tty=False), max_wait_s=60,
        clock=clock, sleep=clock.sleep, poll_s=2,
    )  # fmt: skip
    assert stage.done and waited == 10
    assert out.getvalue().splitlines() == [
        "demo [#....]     0 s  starting",
        "demo [###..]     4 s  loading x with the vllm engine",
        "demo [#####]    10 s  ready",
    ]


def test_one_line_redrawn_on_a_terminal_and_a_deadline() -> None:
    out = io.StringIO()
    clock = Clock()
    stage, waited = wait_until_ready(
        lambda: record("initializing", ("starting", None)), Progress(out, "demo", tty=True),
        max_wait_s=3, clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    assert stage.name == "starting" and waited == 3
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 4 and text.endswith("     3 s  starting\n")
    assert "\n" not in text[:-1]  # the same line, redrawn
