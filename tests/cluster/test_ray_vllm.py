"""One real vLLM replica placed by Ray and answered through the gateway.

The endpoint asks for one L4 in eu-west; Ray places the replica's actor on
the eu-west node and hands it a (fake) GPU, so the replica is forced to the
CPU (`--device cpu`: CUDA_VISIBLE_DEVICES names a GPU this machine lacks).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from inferd.testing import ServeHandle
from inferd.testing.cluster import LocalCluster
from tests.support import needs

pytestmark = [needs("vllm"), pytest.mark.slow]


@pytest.fixture
def serve(ray_cluster: LocalCluster, tmp_path: Path) -> Iterator[ServeHandle]:
    handle = ServeHandle(
        tmp_path,
        settings={
            "launcher": "ray",
            "ray_address": ray_cluster.address,
            "ray_namespace": "inferd-test-vllm",
            "ray_node_ip_address": "127.0.0.2",
            "replica_args": "--device cpu --cpu-kv-cache-gib 1",
            "replica_start_timeout_seconds": "300",
        },
    )
    handle.env.update(ray_cluster.env())
    try:
        yield handle.start(timeout=90)
    finally:
        handle.stop()


def test_a_vllm_replica_placed_by_ray_answers_the_openai_client(
    serve: ServeHandle, ray_cluster: LocalCluster
) -> None:
    created = serve.create_endpoint(
        name="chat-eu",
        modelName="tiny-chat",
        locationName="eu-west",
        gpuType="L4",
        gpuCount=1,
        minReplicas=1,
        maxReplicas=1,
    )
    record = serve.wait_record(created["id"], lambda r: r["status"] == "running", timeout=400)
    (replica,) = record["replicas"]
    # Placed by Ray: the replica's actor, on the eu-west node, holds its GPU.
    import ray

    actor = ray.get_actor(f"inferd-replica-{replica['id']}", namespace="inferd-test-vllm")
    info = ray.get(actor.info.remote(), timeout=10)
    assert info["nodeId"] == ray_cluster.node_id("west")
    assert info["cudaVisibleDevices"] == "0"

    client = openai.OpenAI(
        base_url=f"{created['url']}/openai/v1",
        api_key=created["accessToken"],
        max_retries=0,
        timeout=300,
    )
    answer = client.chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
    )
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=8,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    # The replica's actor dies (SIGKILL to its worker, as when its node is
    # lost): the replica goes by its parent-death signal, and its group's
    # reaper takes vLLM's engine core, which would otherwise stay with
    # parent 1 (it ignores SIGTERM).
    import os
    import signal

    from inferd import procfs
    from inferd.replica.groups import group_members
    from inferd.testing.cluster import wait_until

    serve.stop(signal.SIGKILL)  # nobody replaces it: this test ends here
    tree = group_members(info["pid"])
    named = [b" ".join(procfs.command_line(pid) or []) for pid in tree]
    assert any(b"EngineCore" in name for name in named), named
    worker = procfs.process_stat(info["pid"])
    assert worker is not None
    os.kill(worker.ppid, signal.SIGKILL)
    wait_until(lambda: not group_members(info["pid"]), timeout=30)
