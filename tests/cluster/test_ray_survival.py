"""Replicas that survive a node and cannot be reached around the gateway, on
a real local Ray cluster (two CPU replica slots on each us-east node).

The replicas run the fake engine with its stand-in for vLLM's engine core
(`child_process`: a child that ignores SIGTERM, as the real one does), so
that "no orphaned engine process" is counted for real without loading vLLM.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd import procfs
from inferd.engines.fake import FAKE_ENGINE_CORE
from inferd.replica.groups import REAPER_NAME
from inferd.testing import ServeHandle, open_loop
from inferd.testing.cluster import FakeNode, LocalCluster, start_cluster, wait_until

NAMESPACE = "inferd-test-survival"
SETTINGS = {
    "launcher": "ray",
    "ray_node_ip_address": "127.0.0.2",
    "replica_args": (
        "--engine fake --engine-arg token_delay_s=0.02 --engine-arg child_process=true"
    ),
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    "replica_drain_timeout_seconds": "10",
    "replica_orphan_timeout_seconds": "10",
}
CHAT = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def start_serve(cluster: LocalCluster, state: Path, namespace: str) -> ServeHandle:
    handle = ServeHandle(
        state,
        settings={**SETTINGS, "ray_address": cluster.address, "ray_namespace": namespace},
    )
    handle.env.update(cluster.env())
    return handle.start(timeout=90)


@pytest.fixture(scope="module")
def serve(
    ray_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeHandle]:
    handle = start_serve(ray_cluster, tmp_path_factory.mktemp("survival"), NAMESPACE)
    try:
        yield handle
    finally:
        handle.stop()


_names = itertools.count()


def create(serve: ServeHandle, replicas: int) -> dict[str, Any]:
    return serve.create_endpoint(
        name=f"survivor-{next(_names)}",
        modelName="tiny-chat",
        locationName="us-east",
        gpuType="cpu",
        minReplicas=replicas,
        maxReplicas=replicas,
    )


def delete(serve: ServeHandle, endpoint_id: str) -> None:
    with serve.api() as api:
        assert api.delete(f"/inference/endpoints/{endpoint_id}").status_code == 204


def ready(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in record["replicas"] if r["status"] == "ready"]


def wait_ready(serve: ServeHandle, endpoint_id: str, count: int, timeout: float = 90) -> Any:
    return serve.wait_record(
        endpoint_id,
        lambda r: r["status"] == "running" and len(ready(r)) == count,
        timeout=timeout,
    )


def actor_info(replica_id: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    import ray

    actor = ray.get_actor(f"inferd-replica-{replica_id}", namespace=namespace)
    return dict(ray.get(actor.info.remote(), timeout=10))


def processes_named(name: str, group: int | None = None) -> list[int]:
    """Live processes on this machine whose command line carries `name`
    (in process group `group`, when given)."""
    found = []
    for pid in procfs.all_pids():
        stat = procfs.process_stat(pid)
        if stat is None or stat.zombie or (group is not None and stat.pgrp != group):
            continue
        if name.encode() in b" ".join(procfs.command_line(pid) or []):
            found.append(pid)
    return found


def tree_gone(replica_pid: int) -> bool:
    """Nothing of a replica's process tree is left (it leads its group)."""
    return not processes_named("", group=replica_pid)


def node_of(cluster: LocalCluster, node_id: str) -> str:
    return next(name for name in cluster.nodes if cluster.node_id(name) == node_id)


def under_load(endpoint: dict[str, Any], seconds: float, rate: float = 6.0) -> Any:
    """Chats sent at `rate` a second for `seconds` from a thread; `.join()`
    then `.results` (status of each)."""

    class Load(threading.Thread):
        results: list[tuple[float, int, float]] = []

        def run(self) -> None:
            url = f"{endpoint['url']}/openai/v1/chat/completions"
            self.results = asyncio.run(
                open_loop([url], endpoint["accessToken"], CHAT, rate, seconds)
            )

    load = Load()
    load.start()
    return load


def test_replicas_spread_over_nodes_and_the_record_names_them(
    serve: ServeHandle, ray_cluster: LocalCluster
) -> None:
    """Two replicas, two us-east nodes with two free slots each: one replica
    on each (Ray alone would have packed one node)."""
    endpoint = create(serve, 2)
    try:
        record = wait_ready(serve, endpoint["id"], 2)
        nodes = {actor_info(r["id"])["nodeId"] for r in ready(record)}
        assert nodes == {ray_cluster.node_id("east-a"), ray_cluster.node_id("east-b")}
        shown = {r["node"] for r in ready(record)}
        assert shown == {f"127.0.0.2 ({node_id[:12]})" for node_id in nodes}
    finally:
        delete(serve, endpoint["id"])


def test_a_replica_answers_the_gateway_only(serve: ServeHandle) -> None:
    """Called directly at its node's address without the gateway's key: 401
    (health stays open for probes); through the gateway: answered."""
    endpoint = create(serve, 1)
    try:
        (replica,) = ready(wait_ready(serve, endpoint["id"], 1))
        log = Path(actor_info(replica["id"])["logPath"]).read_text()
        url = re.findall(r"serving .* on (http://\S+)", log)[-1]
        direct = httpx.post(f"{url}/openai/v1/chat/completions", json=CHAT, timeout=30)
        assert direct.status_code == 401, direct.text
        assert direct.json()["error"]["code"] == "replica_key_required"
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        through = httpx.post(
            f"{endpoint['url']}/openai/v1/chat/completions",
            headers={"Authorization": f"Bearer {endpoint['accessToken']}"},
            json=CHAT,
            timeout=30,
        )
        assert through.status_code == 200, through.text
    finally:
        delete(serve, endpoint["id"])


def test_a_lost_node_under_load_fails_nothing_and_leaves_no_process(
    serve: ServeHandle, ray_cluster: LocalCluster
) -> None:
    """Two replicas on two nodes under steady load; one node leaves. Not a
    request fails, the lost replica's whole tree (its engine core included)
    is gone, and the endpoint is back to two replicas, both on the node left
    (two slots)."""
    endpoint = create(serve, 2)
    removed: str | None = None
    try:
        record = wait_ready(serve, endpoint["id"], 2)
        infos = {r["id"]: actor_info(r["id"]) for r in ready(record)}
        assert all(processes_named(FAKE_ENGINE_CORE, i["pid"]) for i in infos.values())
        lost_id, lost = next(iter(infos.items()))
        removed = node_of(ray_cluster, lost["nodeId"])
        load = under_load(endpoint, seconds=12)
        wait_until(lambda: len(load.results) >= 12, timeout=30)  # two seconds of load
        ray_cluster.remove(removed)
        wait_until(lambda: tree_gone(lost["pid"]), timeout=15)
        record = serve.wait_record(
            endpoint["id"],
            lambda r: len(ready(r)) == 2 and lost_id not in {x["id"] for x in ready(r)},
            timeout=60,
        )
        load.join(timeout=90)
        statuses = [status for _, status, _ in load.results]
        assert len(statuses) == 72 and statuses.count(200) == 72, statuses
        survivor = {i["nodeId"] for i in infos.values()} - {lost["nodeId"]}
        assert {actor_info(r["id"])["nodeId"] for r in ready(record)} == survivor
    finally:
        delete(serve, endpoint["id"])
        if removed is not None:
            from tests.conftest import RAY_NODES

            ray_cluster.add(removed, FakeNode(*RAY_NODES[removed]))
    assert processes_named(FAKE_ENGINE_CORE, lost["pid"]) == []


def test_a_killed_actor_takes_the_replicas_tree_and_is_replaced(serve: ServeHandle) -> None:
    endpoint = create(serve, 1)
    try:
        (old,) = ready(wait_ready(serve, endpoint["id"], 1))
        info = actor_info(old["id"])
        (core,) = processes_named(FAKE_ENGINE_CORE, info["pid"])
        worker = procfs.process_stat(info["pid"])
        assert worker is not None
        os.kill(worker.ppid, signal.SIGKILL)  # the actor's worker process
        wait_until(lambda: tree_gone(info["pid"]), timeout=10)
        assert not procfs.alive(core)
        serve.wait_record(
            endpoint["id"],
            lambda r: len(ready(r)) == 1 and ready(r)[0]["id"] != old["id"],
            timeout=60,
        )
    finally:
        delete(serve, endpoint["id"])


def test_a_cluster_shut_down_leaves_no_replica_process(tmp_path: Path) -> None:
    """A cluster of its own (one node, two slots, two replicas) shut down
    whole under its control plane: no replica, engine core or reaper stays."""
    tmpdir = os.environ.get("RAY_TMPDIR")
    cluster = start_cluster({"solo": FakeNode("us-east", None, 0, 2)}, connect=False)
    if tmpdir is not None:
        os.environ["RAY_TMPDIR"] = tmpdir  # the session cluster's, for this driver
    handle = start_serve(cluster, tmp_path / "serve", "inferd-test-shutdown")
    before = set(processes_named(FAKE_ENGINE_CORE))
    groups: set[int] = set()
    down = False
    try:
        endpoint = create(handle, 2)
        wait_ready(handle, endpoint["id"], 2)
        cores = set(processes_named(FAKE_ENGINE_CORE)) - before
        assert len(cores) == 2
        groups = {stat.pgrp for pid in cores if (stat := procfs.process_stat(pid)) is not None}
        assert len(groups) == 2 and all(processes_named(REAPER_NAME, g) for g in groups)
        cluster.shutdown()
        down = True
        wait_until(lambda: all(tree_gone(g) for g in groups), timeout=30)
    finally:
        handle.stop(signal.SIGKILL)
        if not down:
            cluster.shutdown()
    assert groups and all(tree_gone(g) for g in groups)


def test_an_endpoint_that_fits_nowhere_is_refused_at_once_with_why(serve: ServeHandle) -> None:
    """us-west has no node: a request is answered 503 with the reason and
    Retry-After in moments, not held for minutes; the record is pending
    with the same reason."""
    endpoint = serve.create_endpoint(
        name="nowhere", modelName="tiny-chat", locationName="us-west", gpuType="cpu",
        minReplicas=0, maxReplicas=1,
    )  # fmt: skip
    try:
        answer = httpx.post(
            f"{endpoint['url']}/openai/v1/chat/completions",
            headers={"Authorization": f"Bearer {endpoint['accessToken']}"},
            json=CHAT,
            timeout=60,
        )
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "no_capacity"
        assert "us-west" in answer.json()["error"]["message"]
        assert int(answer.headers["retry-after"]) >= 1
        assert answer.elapsed.total_seconds() < 10
        record = serve.wait_record(endpoint["id"], lambda r: r["statusReason"], timeout=30)
        assert record["status"] == "pending" and "us-west" in record["statusReason"]
    finally:
        delete(serve, endpoint["id"])
