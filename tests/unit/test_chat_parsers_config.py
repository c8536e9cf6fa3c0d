"""The chat parsers travel from the catalog entry to the engine options:
catalog -> serving defaults -> the replica's command line -> its config."""

from __future__ import annotations

from inferd.catalog import load_catalog
from inferd.engines.base import ServingDefaults
from inferd.replica.config import (
    ReplicaSettings,
    ReplicaSpec,
    config_for,
    config_from_argv,
    model_source,
    serving_defaults,
    to_argv,
)
from inferd.replica.server import with_parsers_given


def test_catalog_entries_name_their_parsers() -> None:
    models = load_catalog().models
    assert serving_defaults(models.get("tiny-chat")).tool_call_parser == "hermes"
    assert serving_defaults(models.get("qwen2.5-7b-instruct")).tool_call_parser == "hermes"
    assert serving_defaults(models.get("llama-3.1-8b-instruct")).tool_call_parser == "llama3_json"
    assert serving_defaults(models.get("tiny-sdxl")).tool_call_parser is None


def test_parsers_reach_the_replica_config_through_its_command_line() -> None:
    spec = ReplicaSpec(
        replica_id="r1",
        endpoint_id="e1",
        model=model_source(load_catalog().models.get("tiny-chat")),
        gpu_type="cpu",
        gpu_count=0,
        secret="s",
    )
    config = config_for(spec, ReplicaSettings(registry_url="http://127.0.0.1:1"))
    assert config.engine.serving.tool_call_parser == "hermes"
    again = config_from_argv(to_argv(config), env={})
    assert again.engine.serving == config.engine.serving
    assert (again.request_timeout, again.max_connections, again.health_interval) == (
        config.request_timeout,
        config.max_connections,
        config.health_interval,
    )


def test_command_line_parsers_win_over_the_catalog() -> None:
    config = config_from_argv(
        [
            "--model",
            "tiny-chat",
            "--tool-call-parser",
            "llama3_json",
            "--reasoning-parser",
            "qwen3",
        ],
        env={},
    )
    catalog = ServingDefaults(tool_call_parser="hermes")
    merged = with_parsers_given(catalog, config.engine.serving)
    assert (merged.tool_call_parser, merged.reasoning_parser) == ("llama3_json", "qwen3")
    assert with_parsers_given(catalog, ServingDefaults()).tool_call_parser == "hermes"
