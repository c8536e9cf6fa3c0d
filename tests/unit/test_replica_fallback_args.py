"""The registry fallback URLs survive the trip to a replica's command line, and
a replica started by hand has an id of its own."""

from __future__ import annotations

from inferd.replica.config import ReplicaConfig, config_from_argv, to_argv


def test_fallback_urls_round_trip_through_argv() -> None:
    config = ReplicaConfig(
        model="tiny-chat",
        registry_url="http://127.0.0.1:1/internal/registry",
        registry_fallback_urls=(
            "http://127.0.0.1:2/internal/registry",
            "http://lb.example/internal/registry",
        ),
        replica_id="r1",
    )
    back = config_from_argv(to_argv(config), env={})
    assert back.registry_fallback_urls == config.registry_fallback_urls
    assert back.registry_url == config.registry_url


def test_no_fallback_by_default() -> None:
    config = ReplicaConfig(model="tiny-chat", registry_url="http://127.0.0.1:1/x")
    assert "--registry-fallback-url" not in to_argv(config)
    assert config_from_argv(to_argv(config), env={}).registry_fallback_urls == ()


def test_a_standalone_replica_names_itself() -> None:
    """`inferd replica --model ...` by hand: its logs said "replica  serving"."""
    first = config_from_argv(["--model", "tiny-chat"], env={}).replica_id
    second = config_from_argv(["--model", "tiny-chat"], env={}).replica_id
    assert first.startswith("r-standalone-") and len(first) > len("r-standalone-")
    assert first != second
    named = ReplicaConfig(model="tiny-chat", replica_id="r-1")
    assert config_from_argv(to_argv(named), env={}).replica_id == "r-1"
