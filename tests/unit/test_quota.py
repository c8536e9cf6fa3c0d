"""Quota policy: settings checks and the autoscaling cap, as tables."""
# ruff: noqa: E501  (case tables read best one case per line)

from __future__ import annotations

import pytest

from inferd.control.accounts.quota import (
    AboveLimit,
    EndpointShape,
    Quota,
    above_limit,
    cap_replicas,
    capped_reason,
    check_settings,
    in_force,
)

A100 = "A100"


def shape(id: str, replicas: int, gpu_type: str = A100, gpu_count: int = 1) -> EndpointShape:
    return EndpointShape(id, gpu_type, gpu_count, replicas)


# (quota, others, changed, max_replicas, new_endpoint) -> violated quota or None
SETTINGS_CASES = [
    ("no quota", Quota(), [shape("a", 5)], shape("b", 9), 9, True, None),
    ("endpoints exactly at limit", Quota(endpoints=2), [shape("a", 0)], shape("b", 0), 1, True, None),
    ("endpoints one over", Quota(endpoints=2), [shape("a", 0), shape("c", 0)], shape("b", 0), 1, True, ("endpoints", 2, 2)),
    ("endpoints: a change is not a new one", Quota(endpoints=1), [shape("a", 0)], shape("a", 1), 1, False, None),
    ("replicas exactly at limit", Quota(replicas=4), [shape("a", 2)], shape("b", 2), 2, True, None),
    ("replicas one over", Quota(replicas=4), [shape("a", 2)], shape("b", 3), 3, True, ("replicas", 4, 2)),
    ("replicas: own old floor not counted", Quota(replicas=4), [shape("a", 2), shape("b", 2)], shape("b", 2), 2, False, None),
    ("one endpoint's ceiling above quota", Quota(replicas=4), [], shape("b", 1), 5, True, ("replicas", 4, 0)),
    ("ceilings may oversubscribe together", Quota(replicas=4), [shape("a", 0)], shape("b", 0), 4, True, None),
    ("gpus exactly at limit", Quota(gpus={A100: 4}), [shape("a", 1, gpu_count=2)], shape("b", 1, gpu_count=2), 1, True, None),
    ("gpus one over", Quota(gpus={A100: 4}), [shape("a", 1, gpu_count=2)], shape("b", 3, gpu_count=1), 3, True, ("gpus:A100", 4, 2)),
    ("gpus of another type", Quota(gpus={A100: 1}), [shape("a", 5, gpu_type="L4")], shape("b", 1), 1, True, None),
    ("gpu ceiling above quota", Quota(gpus={A100: 4}), [], shape("b", 0, gpu_count=2), 3, True, ("gpus:A100", 4, 0)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("quota", "others", "changed", "max_replicas", "new", "expected"),
    [c[1:] for c in SETTINGS_CASES],
    ids=[c[0] for c in SETTINGS_CASES],
)
def test_check_settings(quota, others, changed, max_replicas, new, expected) -> None:
    got = check_settings(quota, others, changed, max_replicas, new_endpoint=new)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert (got.quota, got.limit, got.in_use) == expected
        message = got.message("team")
        assert expected[0] in message and f"limit {expected[1]}" in message
        assert f"in use {expected[2]}" in message
        err = got.error("team")
        assert err.status == 409 and err.code == "quota_exceeded" and err.param == expected[0]


# (quota, others live, endpoint live, desired) -> (allowed, limited quota or None)
CAP_CASES = [
    ("no quota", Quota(), [shape("a", 3)], shape("b", 0), 5, 5, None),
    ("room for all", Quota(replicas=8), [shape("a", 3)], shape("b", 1), 5, 5, None),
    ("exactly at the limit", Quota(replicas=8), [shape("a", 3)], shape("b", 1), 5, 5, None),
    ("capped at the quota", Quota(replicas=6), [shape("a", 3)], shape("b", 1), 5, 3, "replicas"),
    ("no room at all", Quota(replicas=3), [shape("a", 3)], shape("b", 0), 2, 0, "replicas"),
    ("quota lowered below use: keep, no growth", Quota(replicas=2), [shape("a", 3)], shape("b", 2), 4, 2, "replicas"),
    ("scaling down is never capped", Quota(replicas=2), [shape("a", 3)], shape("b", 2), 1, 1, None),
    ("gpus cap in whole replicas", Quota(gpus={A100: 5}), [shape("a", 1, gpu_count=2)], shape("b", 0, gpu_count=2), 3, 1, "gpus:A100"),
    ("tighter of two quotas wins", Quota(replicas=10, gpus={A100: 4}), [], shape("b", 0, gpu_count=2), 4, 2, "gpus:A100"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("quota", "others", "endpoint", "desired", "allowed", "limited"),
    [c[1:] for c in CAP_CASES],
    ids=[c[0] for c in CAP_CASES],
)
def test_cap_replicas(quota, others, endpoint, desired, allowed, limited) -> None:
    cap = cap_replicas(quota, others, endpoint, desired)
    assert cap.allowed == allowed
    if limited is None:
        assert cap.limited_by is None and capped_reason("team", cap) is None
    else:
        assert cap.limited_by is not None and cap.limited_by.quota == limited
        reason = capped_reason("team", cap)
        assert reason is not None and limited in reason and "quota" in reason


@pytest.mark.parametrize(
    ("own", "limit", "expected"),
    [
        (Quota(), Quota(), Quota()),
        (Quota(replicas=5), Quota(), Quota(replicas=5)),
        (Quota(), Quota(replicas=5), Quota(replicas=5)),
        (Quota(replicas=2, endpoints=9), Quota(replicas=5, endpoints=3),
         Quota(replicas=2, endpoints=3)),
        (Quota(gpus={"L4": 4, "A100": 1}), Quota(gpus={"L4": 2, "H100": 8}),
         Quota(gpus={"A100": 1, "H100": 8, "L4": 2})),
    ],
)  # fmt: skip
def test_in_force_is_the_lower_of_quota_and_limit(own, limit, expected) -> None:
    assert in_force(own, limit) == expected


@pytest.mark.parametrize(
    ("own", "limit", "expected"),
    [
        (Quota(replicas=99), Quota(), None),
        (Quota(replicas=3), Quota(replicas=3), None),
        (Quota(replicas=4), Quota(replicas=3), AboveLimit("replicas", 4, 3)),
        (Quota(), Quota(endpoints=2), AboveLimit("endpoints", None, 2)),
        (Quota(gpus={"L4": 1}), Quota(gpus={"L4": 1, "A100": 2}), AboveLimit("gpus:A100", None, 2)),
        (Quota(gpus={"L4": 3}), Quota(gpus={"L4": 2}), AboveLimit("gpus:L4", 3, 2)),
    ],
)  # fmt: skip
def test_above_limit_names_the_first_count_over(own, limit, expected) -> None:
    assert above_limit(own, limit) == expected
