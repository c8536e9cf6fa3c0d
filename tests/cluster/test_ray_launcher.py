"""`inferd serve --launcher ray` on a real local Ray cluster (nothing mocked).

The replicas run the fake engine (these tests are about placement and
faults; the real-engine path is `test_ray_vllm.py`). One control plane is
shared by the module; each test creates its own endpoints and deletes them.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd import procfs
from inferd.testing import ServeHandle
from inferd.testing.cluster import LocalCluster, wait_until

NAMESPACE = "inferd-test-faults"
ADOPT_NS = "inferd-test-adopt"
SERVE_SETTINGS = {
    "launcher": "ray",
    "ray_namespace": NAMESPACE,
    "ray_node_ip_address": "127.0.0.2",
    "replica_args": "--engine fake --engine-arg token_delay_s=0.02",
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    "replica_drain_timeout_seconds": "10",
    "replica_orphan_timeout_seconds": "10",
    "autoscale_upscale_delay_seconds": "0.5",
    "autoscale_downscale_delay_seconds": "1",
}


def start_serve(
    cluster: LocalCluster, state: Path, namespace: str = NAMESPACE, **more: str
) -> ServeHandle:
    settings = {
        **SERVE_SETTINGS,
        "ray_address": cluster.address,
        "ray_namespace": namespace,
        **more,
    }
    handle = ServeHandle(state, settings=settings)
    handle.env.update(cluster.env())
    return handle.start(timeout=90)


@pytest.fixture(scope="module")
def serve(
    ray_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeHandle]:
    handle = start_serve(ray_cluster, tmp_path_factory.mktemp("ray-serve"))
    try:
        yield handle
    finally:
        handle.stop()
        _remove_actors()


def _actors(namespace: str = NAMESPACE) -> dict[str, Any]:
    """A control plane's replica actors, by replica id."""
    import ray

    named = ray.util.list_named_actors(all_namespaces=True)
    return {
        a["name"][len("inferd-replica-") :]: ray.get_actor(a["name"], namespace=namespace)
        for a in named
        if a["namespace"] == namespace and a["name"].startswith("inferd-replica-")
    }


def _remove_actors() -> None:
    import ray

    for actor in _actors().values():
        ray.kill(actor, no_restart=True)


def info(replica_id: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    import ray

    return dict(ray.get(_actors(namespace)[replica_id].info.remote(), timeout=10))


_names = itertools.count()


def create(serve: ServeHandle, **body: Any) -> dict[str, Any]:
    body = {
        "name": f"ep-{next(_names)}",
        "modelName": "tiny-chat",
        "minReplicas": 1,
        "maxReplicas": 1,
        **body,
    }
    return serve.create_endpoint(**body)


def delete(serve: ServeHandle, endpoint_id: str) -> None:
    with serve.api() as api:
        assert api.delete(f"/inference/endpoints/{endpoint_id}").status_code == 204


def ready_ids(record: dict[str, Any]) -> list[str]:
    return [r["id"] for r in record["replicas"] if r["status"] == "ready"]


def wait_ready(serve: ServeHandle, endpoint_id: str, count: int = 1) -> dict[str, Any]:
    return serve.wait_record(
        endpoint_id, lambda r: r["status"] == "running" and len(ready_ids(r)) == count, timeout=90
    )


def chat(serve: ServeHandle, endpoint: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{endpoint['url']}/openai/v1/chat/completions",
        headers={"Authorization": f"Bearer {endpoint['accessToken']}"},
        json={"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )


def capacity(serve: ServeHandle) -> dict[str, dict[str, Any]]:
    with serve.api() as api:
        locations = api.get("/inference/locations").json()["data"]
    return {loc["name"]: loc["capacity"] for loc in locations}


def failure_logged(serve: ServeHandle, replica_id: str) -> str | None:
    match = re.search(rf"replica {replica_id} of endpoint \S+ failed \((.*)\); next", serve.log())
    return match.group(1) if match else None


def alive(pid: int) -> bool:
    stat = procfs.process_stat(pid)
    return stat is not None and not stat.zombie


# -- capacity and placement -------------------------------------------------------------


def test_locations_and_gpu_types_show_the_cluster_live(serve: ServeHandle) -> None:
    """The nodes' declared locations and GPUs are the API's capacity, and a
    placed replica takes one GPU off the free count of its location."""
    live = capacity(serve)
    assert live["us-east"]["H100-80GB"] == {"total": 3, "free": 3}
    assert live["eu-west"]["L4"]["total"] == 1
    assert live["us-west"] == {} and "H100-80GB" not in live["eu-west"]
    with serve.api() as api:
        types = {g["name"]: g["capacity"] for g in api.get("/inference/gpu-types").json()["data"]}
    assert types["L4"] == {"eu-west": {"total": 1, "free": 1}}
    assert set(types["cpu"]) == {"us-east", "eu-west"}

    endpoint = create(serve, locationName="us-east", gpuType="H100-80GB", gpuCount=2)
    try:
        wait_ready(serve, endpoint["id"])
        wait_until(lambda: capacity(serve)["us-east"]["H100-80GB"]["free"] == 1, timeout=10)
    finally:
        delete(serve, endpoint["id"])
    # DELETE returns once the actor is killed, but Ray's resource view learns
    # of the freed GPUs from the node's next report, a moment later.
    wait_until(lambda: capacity(serve)["us-east"]["H100-80GB"]["free"] == 3, timeout=30)


def test_replicas_land_only_on_nodes_of_their_location_and_type(
    serve: ServeHandle, ray_cluster: LocalCluster
) -> None:
    """An eu-west L4 replica runs on the eu-west node, a 2-GPU us-east H100
    replica on the one us-east node with two; each gets Ray's GPUs and is
    answered through the gateway at the address its node advertises."""
    west = create(serve, locationName="eu-west", gpuType="L4", gpuCount=1)
    east = create(serve, locationName="us-east", gpuType="H100-80GB", gpuCount=2)
    try:
        (west_replica,) = ready_ids(wait_ready(serve, west["id"]))
        (east_replica,) = ready_ids(wait_ready(serve, east["id"]))
        assert info(west_replica)["nodeId"] == ray_cluster.node_id("west")
        assert info(east_replica)["nodeId"] == ray_cluster.node_id("east-a")
        assert info(east_replica)["cudaVisibleDevices"] in ("0,1", "1,0")
        assert info(west_replica)["nodeIp"] == "127.0.0.2"
        response = chat(serve, west)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"]
    finally:
        delete(serve, west["id"])
        delete(serve, east["id"])


def test_pending_says_which_location_type_and_count_is_missing(serve: ServeHandle) -> None:
    """No us-east node has an L4; and once a replica holds the two H100s of
    one node, a second 2-GPU replica fits on no single node (one H100 free
    on each): both endpoints stay pending with the reason, nothing placed."""
    no_type = create(serve, locationName="us-east", gpuType="L4", gpuCount=1)
    holder = create(serve, locationName="us-east", gpuType="H100-80GB", gpuCount=2)
    wait_ready(serve, holder["id"])
    too_big = create(serve, locationName="us-east", gpuType="H100-80GB", gpuCount=2)
    try:
        record = serve.wait_record(no_type["id"], lambda r: r["statusReason"], timeout=30)
        assert record["status"] == "pending"
        assert "location 'us-east' has L4" in record["statusReason"]
        record = serve.wait_record(too_big["id"], lambda r: r["statusReason"], timeout=30)
        assert record["status"] == "pending"
        assert record["statusReason"] == (
            "no node in location 'us-east' has 2 H100-80GB GPU(s) free: "
            "1 of 3 free on 2 node(s), at most 1 on one"
        )
        assert record["replicas"] == []
    finally:
        for endpoint in (no_type, holder, too_big):
            delete(serve, endpoint["id"])
    # Deleting the holder frees room that the pending endpoint may take just
    # before its own delete: whatever it launched must not outlive it.
    wait_until(lambda: capacity(serve)["us-east"]["H100-80GB"]["free"] == 3, timeout=30)


# -- stop and faults ------------------------------------------------------------------


def test_delete_drains_the_replica_and_removes_its_actor(serve: ServeHandle) -> None:
    """DELETE answers once the replica drained and exited; its actor is gone
    and its process too."""
    endpoint = create(serve, locationName="eu-west", gpuType="L4", gpuCount=1)
    (replica_id,) = ready_ids(wait_ready(serve, endpoint["id"]))
    pid = info(replica_id)["pid"]
    delete(serve, endpoint["id"])
    assert replica_id not in _actors()
    assert not alive(pid)
    assert f"draining replica {replica_id}" in serve.log()


def _replaced(serve: ServeHandle, endpoint_id: str, old: str) -> dict[str, Any]:
    return serve.wait_record(
        endpoint_id,
        lambda r: r["status"] == "running" and ready_ids(r) and old not in ready_ids(r),
        timeout=60,
    )


def test_a_killed_replica_process_is_failed_and_replaced(serve: ServeHandle) -> None:
    endpoint = create(serve, locationName="eu-west", gpuType="cpu")
    try:
        (old,) = ready_ids(wait_ready(serve, endpoint["id"]))
        os.kill(info(old)["pid"], signal.SIGKILL)
        record = _replaced(serve, endpoint["id"], old)
        assert (failure_logged(serve, old) or "").startswith("process exited with code -9")
        assert old not in _actors()
        assert chat(serve, endpoint).status_code == 200
        assert len(record["replicas"]) == 1
    finally:
        delete(serve, endpoint["id"])


def test_a_dead_actor_takes_its_replica_with_it_and_is_replaced(serve: ServeHandle) -> None:
    """The actor's worker is SIGKILLed: the replica process dies with it
    (parent-death signal), the replica is failed with why, and replaced."""
    endpoint = create(serve, locationName="us-east", gpuType="cpu")
    try:
        (old,) = ready_ids(wait_ready(serve, endpoint["id"]))
        pid = info(old)["pid"]
        worker = procfs.process_stat(pid)
        assert worker is not None
        os.kill(worker.ppid, signal.SIGKILL)  # the actor's worker process
        wait_until(lambda: not alive(pid), timeout=5)
        _replaced(serve, endpoint["id"], old)
        assert "Ray actor died" in (failure_logged(serve, old) or "")
    finally:
        delete(serve, endpoint["id"])


def test_a_lost_node_is_noticed_and_its_replica_replaced_on_another(
    serve: ServeHandle, ray_cluster: LocalCluster
) -> None:
    """The us-east node holding the replica leaves the cluster: the replica
    is failed naming the node, its process is gone, and the replacement
    runs on the other us-east node."""
    from inferd.testing.cluster import NODE_IP

    endpoint = create(serve, locationName="us-east", gpuType="H100-80GB", gpuCount=1)
    removed: str | None = None
    try:
        (old,) = ready_ids(wait_ready(serve, endpoint["id"]))
        where = info(old)
        removed = next(n for n in ray_cluster.nodes if ray_cluster.node_id(n) == where["nodeId"])
        survivor = "east-b" if removed == "east-a" else "east-a"
        ray_cluster.remove(removed)
        (new,) = ready_ids(_replaced(serve, endpoint["id"], old))
        assert info(new)["nodeId"] == ray_cluster.node_id(survivor)
        assert failure_logged(serve, old) == (
            "the replica's process was lost: "
            f"node {NODE_IP} ({where['nodeId'][:12]}) left the Ray cluster"
        )
        wait_until(lambda: not alive(where["pid"]), timeout=10)
    finally:
        delete(serve, endpoint["id"])
        if removed is not None:
            from inferd.testing.cluster import FakeNode
            from tests.conftest import RAY_NODES

            ray_cluster.add(removed, FakeNode(*RAY_NODES[removed]))


def test_a_missing_model_directory_fails_the_replica_with_that_reason(
    ray_cluster: LocalCluster, tmp_path: Path
) -> None:
    """A catalog model whose weights are a directory that the node lacks:
    the endpoint fails, saying which directory on which node."""
    models = tmp_path / "models"
    models.mkdir()
    repo_models = Path(__file__).resolve().parents[2] / "models" / "catalog"
    entry = (repo_models / "tiny-chat.yaml").read_text()
    entry = entry.replace("name: tiny-chat", "name: local-weights").replace(
        "source: builtin:tiny-chat", "source: /nonexistent/weights/local-weights"
    )
    (models / "local-weights.yaml").write_text(entry)
    handle = ServeHandle(
        tmp_path / "serve",
        settings={
            **SERVE_SETTINGS,
            "ray_address": ray_cluster.address,
            "ray_namespace": "inferd-test-weights",
            "replica_args": "",
            "models_dir": str(models),
        },
    )
    handle.env.update(ray_cluster.env())
    handle.start(timeout=90)
    try:
        endpoint = create(handle, modelName="local-weights", locationName="eu-west", gpuType="cpu")
        record = handle.wait_record(endpoint["id"], lambda r: r["status"] == "failed", timeout=60)
        assert record["statusReason"].startswith(
            "the replica did not start: model directory /nonexistent/weights/local-weights "
            "does not exist on node 127.0.0.2"
        )
    finally:
        handle.stop()


def test_a_restarted_control_plane_adopts_its_replicas(
    ray_cluster: LocalCluster, tmp_path: Path
) -> None:
    """`inferd serve` killed outright and started again on the same store
    and cluster takes the running replicas back by actor name: the same
    replicas, no new actor, the same processes, still answering. A replica
    actor the store never recorded (placed just before a crash) is removed,
    with its process."""
    import ray

    from inferd.control.launchers.ray_host import ReplicaHost

    # Replicas wait for their control plane longer than its restart takes.
    handle = start_serve(ray_cluster, tmp_path, ADOPT_NS, replica_orphan_timeout_seconds="120")
    try:
        east = create(handle, locationName="us-east", gpuType="cpu")
        west = create(handle, locationName="eu-west", gpuType="L4", gpuCount=1)
        before = {e["id"]: ready_ids(wait_ready(handle, e["id"])) for e in (east, west)}
        pids = {rid: info(rid, ADOPT_NS)["pid"] for ids in before.values() for rid in ids}
        handle.stop(signal.SIGKILL)
        stray = (
            ray.remote(ReplicaHost)
            .options(
                name="inferd-replica-r-stray",
                namespace=ADOPT_NS,
                lifetime="detached",
                num_cpus=0,
                resources={"location:us-east": 0.001},
            )
            .remote("r-stray", ["sleep", "300"], {}, "builtin:tiny-chat")
        )
        stray_pid = ray.get(stray.start.remote(), timeout=60)["pid"]
        handle.start(timeout=90)
        for endpoint in (east, west):
            record = wait_ready(handle, endpoint["id"])
            assert ready_ids(record) == before[endpoint["id"]]
        assert set(_actors(ADOPT_NS)) == set(pids)  # the stray one is gone
        wait_until(lambda: not alive(stray_pid), timeout=10)
        assert {rid: info(rid, ADOPT_NS)["pid"] for rid in pids} == pids
        assert chat(handle, west).status_code == 200
        assert "adopted 2 of 2 replicas" in handle.log()
    finally:
        handle.stop()
    # A clean stop leaves nothing behind on the cluster.
    assert _actors(ADOPT_NS) == {}
    assert not any(alive(pid) for pid in pids.values())


def test_the_consoles_log_panel_shows_a_ray_replicas_log(serve: ServeHandle) -> None:
    """The replica's log file is on its node: the console reads it through
    the launcher, which asks the replica's actor there."""
    endpoint = create(serve, locationName="eu-west", gpuType="L4", gpuCount=1)
    (replica_id,) = ready_ids(wait_ready(serve, endpoint["id"]))
    with httpx.Client(base_url=serve.url, timeout=10) as web:
        form = web.get("/console/signin").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', form)
        assert csrf is not None
        signed_in = web.post(
            "/console/signin", data={"key": serve.admin_key, "csrf": csrf.group(1)}
        )
        assert signed_in.status_code == 303, signed_in.text
        download = web.get(f"/console/endpoints/{endpoint['id']}/logs.txt")
        panel = web.get(f"/console/endpoints/{endpoint['id']}/logs")
    assert download.status_code == 200
    assert f"==> replica {replica_id} <==" in download.text
    assert "replica ready" in download.text
    assert "replica ready" in panel.text
    delete(serve, endpoint["id"])
