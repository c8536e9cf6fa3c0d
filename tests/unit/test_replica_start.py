"""A starting replica keeps its event loop free, so its reporter keeps
telling the registry it is alive: the model is resolved and the engine
created (vLLM's import alone takes tens of seconds on a busy machine) in
threads. On the loop, that import silenced the reports past the registry's
start timeout, and the replica was failed and relaunched over and over."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from inferd.replica import server as replica_server
from inferd.replica.config import ReplicaConfig, serving_defaults
from inferd.vocab import ModelKind, ReplicaStatus


def test_the_engine_is_created_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    created_on: list[threading.Thread] = []

    def resolve(config: ReplicaConfig) -> tuple[str, ModelKind, Path, Any]:
        return "tiny-chat", ModelKind.CHAT, Path("/nonexistent"), serving_defaults(None)

    def create_engine(*args: Any) -> Any:
        created_on.append(threading.current_thread())
        raise ValueError("stop here")  # the replica ends as with bad settings

    monkeypatch.setattr(replica_server, "resolve", resolve)
    monkeypatch.setattr(replica_server, "resolve_draft", lambda config: None)
    monkeypatch.setattr(replica_server, "create_engine", create_engine)
    process = replica_server.ReplicaProcess(ReplicaConfig(model="tiny-chat"))
    assert asyncio.run(process._serve()) == 1
    assert process.state.status is ReplicaStatus.FAILED
    assert process.state.reason == "bad engine settings: stop here"
    assert created_on and created_on[0] is not threading.main_thread()
