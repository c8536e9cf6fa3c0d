"""The autoscaling policy: a pure function of settings, observations, its own
previous state and the clock.

- Target: enough replicas that each carries about `target_concurrency`
  requests (in flight plus waiting), within [minReplicas, maxReplicas].
  Concurrency is a weak signal for LLMs (a few long prompts fill a KV cache
  that 8 short ones barely touch), so two engine signals can ask for more:
  - KV cache: enough replicas that their mean KV cache use stays at
    `target_kv_cache_usage` (ready x usage / target, as KServe and llm-d
    scale on it); it also keeps replicas that the KV cache still needs from
    being removed on low concurrency.
  - Engine queue: requests queued inside the engines (admitted by the
    gateway, not yet running: the engine has no room) beyond
    `target_engine_waiting` per replica ask for one replica per that many.
  The largest of the three wins.
- Up: after the load has asked for more for `upscale_delay_s`; at once when a
  request waits and no replica is ready or coming (scale from zero).
- Down: after the load has asked for fewer for `downscale_delay_s`.
- Zero: only when minReplicas is 0 and no request arrived for the
  endpoint's retention period (and nothing is in flight or waiting).

Like Ray Serve's `autoscaling_policy`, it never sleeps or reads a clock:
the reconciler calls it every tick with `now`, and tests call it with a table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# The one default of each autoscaling knob (`inferd.settings` and the
# reconciler take theirs from here).
TARGET_CONCURRENCY = 8.0
UPSCALE_DELAY_S = 5.0
DOWNSCALE_DELAY_S = 60.0
TARGET_KV_CACHE_USAGE = 0.8
TARGET_ENGINE_WAITING = 2.0


@dataclass(frozen=True)
class ScalingSettings:
    min_replicas: int
    max_replicas: int
    retention_s: float
    target_concurrency: float = TARGET_CONCURRENCY
    upscale_delay_s: float = UPSCALE_DELAY_S
    downscale_delay_s: float = DOWNSCALE_DELAY_S
    # None or 0 turns a signal off.
    target_kv_cache_usage: float | None = TARGET_KV_CACHE_USAGE
    target_engine_waiting: float | None = TARGET_ENGINE_WAITING


@dataclass(frozen=True)
class Observations:
    in_flight: int  # requests forwarded to replicas and not finished
    held: int  # requests waiting in the gateway for capacity
    ready: int  # replicas taking traffic
    coming_up: int  # replicas starting or loading
    last_request_at: float | None  # clock seconds; None: never called
    # What the ready replicas' engines last reported: mean KV cache use (None
    # where no engine reports one) and requests queued inside the engines.
    kv_cache_usage: float | None = None
    engine_waiting: int = 0


@dataclass(frozen=True)
class ScalerState:
    desired: int = 0
    # When the load first asked for more (or fewer) replicas than desired;
    # None while it agrees.
    above_since: float | None = None
    below_since: float | None = None


@dataclass(frozen=True)
class Decision:
    desired: int
    state: ScalerState
    reason: str


def target_replicas(settings: ScalingSettings, obs: Observations, now: float) -> tuple[int, str]:
    """What the load alone asks for, clamped to the bounds and the retention rule."""
    load = obs.in_flight + obs.held
    by_load = math.ceil(load / settings.target_concurrency) if load else 0
    signal = f"{load} requests at {settings.target_concurrency:g} per replica"
    target_kv = settings.target_kv_cache_usage
    # The engine signals speak for requests in progress; an idle endpoint's
    # last report must not hold replicas past the retention period.
    if load and target_kv and obs.kv_cache_usage is not None and obs.ready:
        by_kv = math.ceil(obs.ready * obs.kv_cache_usage / target_kv - 1e-9)
        if by_kv > by_load:
            by_load = by_kv
            signal = (
                f"KV cache {obs.kv_cache_usage:.0%} used on {obs.ready} replicas "
                f"at {target_kv:.0%} per replica"
            )
    target_waiting = settings.target_engine_waiting
    if load and target_waiting and obs.engine_waiting > target_waiting * obs.ready:
        by_queue = math.ceil(obs.engine_waiting / target_waiting)
        if by_queue > by_load:
            by_load = by_queue
            signal = (
                f"{obs.engine_waiting} requests queued in the engines "
                f"at {target_waiting:g} per replica"
            )
    idle_for = math.inf if obs.last_request_at is None else now - obs.last_request_at
    if settings.min_replicas > 0:
        floor, why = settings.min_replicas, "minReplicas"
    elif load > 0 or idle_for < settings.retention_s:
        floor, why = 1, "traffic within the retention period"
    else:
        floor, why = 0, "idle past the retention period"
    target = min(max(by_load, floor), settings.max_replicas)
    if by_load > floor:
        why = signal
    if by_load > settings.max_replicas:
        why += f" (capped at maxReplicas {settings.max_replicas})"
    return target, why


def decide(
    settings: ScalingSettings, obs: Observations, state: ScalerState, now: float
) -> Decision:
    target, why = target_replicas(settings, obs, now)
    current = state.desired

    # Bounds changed (PATCH): obey them at once.
    if current > settings.max_replicas or current < settings.min_replicas:
        bounded = min(max(current, settings.min_replicas), settings.max_replicas)
        return Decision(bounded, ScalerState(bounded), "replica bounds changed")

    if target == current:
        return Decision(current, ScalerState(current), why)

    if target > current:
        # Requests are waiting and no replica serves: no delay, and for all
        # of them (a burst at zero asks for what it needs at once, not one
        # replica now and the rest after the upscale delay).
        if obs.held > 0 and obs.ready == 0:
            return Decision(target, ScalerState(target), f"requests waiting with no replica; {why}")
        above_since = state.above_since if state.above_since is not None else now
        if now - above_since >= settings.upscale_delay_s:
            return Decision(target, ScalerState(target), why)
        return Decision(current, replace(state, above_since=above_since, below_since=None), why)

    # target < current
    if target == 0:
        # The retention period was the delay; nothing is running or waiting.
        return Decision(0, ScalerState(0), why)
    below_since = state.below_since if state.below_since is not None else now
    if now - below_since >= settings.downscale_delay_s:
        return Decision(target, ScalerState(target), why)
    return Decision(current, replace(state, below_since=below_since, above_since=None), why)
