"""Autoscaler decisions as a table, with the clock passed in: no sleeps."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from inferd.control.replicas.autoscaler import (
    Decision,
    Observations,
    ScalerState,
    ScalingSettings,
    decide,
)

S = ScalingSettings(
    min_replicas=0,
    max_replicas=4,
    retention_s=60,
    target_concurrency=4,
    upscale_delay_s=2,
    downscale_delay_s=10,
)


def obs(
    in_flight: int = 0,
    held: int = 0,
    ready: int = 0,
    coming_up: int = 0,
    last: float | None = 100.0,
) -> Observations:
    return Observations(in_flight, held, ready, coming_up, last)


@dataclass(frozen=True)
class Case:
    name: str
    settings: ScalingSettings
    obs: Observations
    state: ScalerState
    now: float
    desired: int
    state_after: ScalerState | None = None


CASES = [
    Case("never called, min 0: stays at zero", S, obs(last=None), ScalerState(0), 0, 0),
    Case("held request at zero: up at once", S, obs(held=1, last=100), ScalerState(0), 100, 1),
    Case("held burst at zero: up at once to what the load needs",
         S, obs(held=9, last=100), ScalerState(0), 100, 3),
    Case("held burst beyond max: capped",
         S, obs(held=40, last=100), ScalerState(0), 100, 4),
    Case("held but a replica is coming up: no extra jump",
         S, obs(held=1, coming_up=1), ScalerState(1), 100, 1),
    Case("a burst held while the first replica loads: the rest at once",
         S, obs(held=9, coming_up=1), ScalerState(1), 100, 3),
    Case("load asks for more: waits for the up delay",
         S, obs(in_flight=12, ready=1), ScalerState(1), 100, 1, ScalerState(1, above_since=100)),
    Case("load asked for more long enough: up",
         S, obs(in_flight=12, ready=1), ScalerState(1, above_since=100), 102, 3),
    Case("load within target: steady", S, obs(in_flight=4, ready=1), ScalerState(1), 100, 1,
         ScalerState(1)),
    Case("load fell: waits for the down delay",
         S, obs(in_flight=2, ready=3), ScalerState(3), 100, 3, ScalerState(3, below_since=100)),
    Case("load fell long enough: down to what it needs, not below 1 within retention",
         S, obs(in_flight=0, ready=3, last=99), ScalerState(3, below_since=100), 110, 1),
    Case("idle within retention, min 0: keeps one",
         S, obs(ready=1, last=100), ScalerState(1), 159, 1),
    Case("idle past retention, min 0: to zero",
         S, obs(ready=1, last=100), ScalerState(1), 160, 0),
    Case("idle past retention but a request in flight: keeps one",
         S, obs(in_flight=1, ready=1, last=100), ScalerState(1), 500, 1),
    Case("min 1 never goes to zero",
         ScalingSettings(1, 4, 60), obs(ready=1, last=0), ScalerState(1), 10_000, 1),
    Case("min raised by PATCH: up at once",
         ScalingSettings(2, 4, 60), obs(ready=1), ScalerState(1), 100, 2),
    Case("max lowered by PATCH: down at once",
         ScalingSettings(0, 1, 60), obs(in_flight=30, ready=3), ScalerState(3), 100, 1),
    Case("spike that ended before the up delay: the timer resets",
         S, obs(in_flight=4, ready=1), ScalerState(1, above_since=100), 101, 1, ScalerState(1)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case) -> None:
    decision = decide(case.settings, case.obs, case.state, case.now)
    assert isinstance(decision, Decision)
    assert decision.desired == case.desired, decision.reason
    assert case.settings.min_replicas <= decision.desired <= case.settings.max_replicas
    if case.state_after is not None:
        assert decision.state == case.state_after
    assert decision.reason


def test_scale_to_zero_then_back_sequence() -> None:
    """1 -> 0 after the retention, then a held request brings it back at once."""
    state = ScalerState(1)
    last = 0.0
    for now in range(0, 60, 5):
        d = decide(S, obs(ready=1, last=last), state, now)
        state = d.state
        assert d.desired == 1
    d = decide(S, obs(ready=1, last=last), state, 60)
    assert d.desired == 0
    d = decide(S, obs(held=1, ready=0, last=61), d.state, 61)
    assert d.desired == 1


def engine(
    in_flight: int, ready: int, kv: float | None = None, waiting: int = 0, last: float = 100.0
) -> Observations:
    return Observations(in_flight, 0, ready, 0, last, kv_cache_usage=kv, engine_waiting=waiting)


ENGINE_CASES = [
    # (name, observations, target, reason contains)
    # 2 requests at 4 per replica want 1 replica; their long prompts fill
    # 95% of both replicas' KV caches: 2 x 0.95 / 0.8 -> 3.
    ("KV cache full on few requests: more replicas", engine(2, 2, kv=0.95), 3, "KV cache 95%"),
    ("KV cache half used on 2: consolidating would overfill, keep 2",
     engine(1, 2, kv=0.5), 2, "KV cache 50%"),
    ("KV cache quiet: concurrency decides", engine(8, 3, kv=0.1), 2, "8 requests"),
    ("KV cache at the target exactly: no more", engine(1, 2, kv=0.8), 2, "KV cache"),
    ("no KV figure (engine without one): concurrency decides", engine(1, 2), 1, "traffic"),
    ("engine queue beyond 2 per replica: one replica per 2 queued",
     engine(4, 1, waiting=6), 3, "6 requests queued"),
    ("engine queue within its target: concurrency decides", engine(4, 2, waiting=4), 1,
     "traffic"),
    ("engine figures beyond maxReplicas: capped", engine(4, 2, kv=1.0, waiting=40), 4,
     "capped at maxReplicas"),
    ("idle with a stale KV report: retention rules alone",
     engine(0, 2, kv=0.9, waiting=5, last=0), 0, "idle past the retention period"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("observations", "target", "reason"),
    [case[1:] for case in ENGINE_CASES],
    ids=[case[0] for case in ENGINE_CASES],
)
def test_engine_signals(observations: Observations, target: int, reason: str) -> None:
    from inferd.control.replicas.autoscaler import target_replicas

    got, why = target_replicas(S, observations, 100.0)
    assert got == target and reason in why, why


def test_engine_signals_can_be_turned_off() -> None:
    from dataclasses import replace

    from inferd.control.replicas.autoscaler import target_replicas

    off = replace(S, target_kv_cache_usage=None, target_engine_waiting=None)
    assert target_replicas(off, engine(2, 2, kv=0.95, waiting=9), 100.0)[0] == 1


def test_engine_signal_goes_through_the_up_delay() -> None:
    full = engine(2, 2, kv=0.95)
    waiting = decide(S, full, ScalerState(2), 100)
    assert waiting.desired == 2 and waiting.state.above_since == 100
    assert decide(S, full, waiting.state, 102).desired == 3
