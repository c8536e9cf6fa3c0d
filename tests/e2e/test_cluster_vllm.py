"""The whole path across instances with the real engine: an endpoint created
through one `inferd serve` on a shared PostgreSQL answers the official
`openai` client (plain and streamed) through another, served by a real vLLM
tiny-chat replica that the leader launched."""

from __future__ import annotations

import re
from collections.abc import Iterator

import openai
import pytest

from inferd.testing import ServeHandle, free_port
from inferd.testing.postgres import PostgresServer
from tests.support import needs

pytestmark = [needs("vllm"), pytest.mark.slow]

ADMIN_KEY_RE = re.compile(r"infd_admin_[0-9A-Za-z]{38}")


@pytest.fixture(scope="module")
def two(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServeHandle]]:
    url = postgres_server.create_database()
    root = tmp_path_factory.mktemp("vllm-cluster")
    ports = [free_port(), free_port()]
    instances = [
        ServeHandle(
            root / f"i{n}",
            port=port,
            admin_key=None,
            settings={
                "database_url": url,
                "instance_id": f"i{n}",
                "replica_args": "--cpu-kv-cache-gib 1",
                "replica_report_fallback_urls": f"http://127.0.0.1:{ports[1 - n]}",
                "health_period_seconds": "0.5",
                "reconcile_period_seconds": "0.2",
                "gateway_hold_timeout_seconds": "600",
            },
        )
        for n, port in enumerate(ports)
    ]
    try:
        for instance in instances:
            instance.start()
        match = ADMIN_KEY_RE.search(instances[0].log())
        assert match is not None
        for instance in instances:
            instance.admin_key = match.group(0)
        yield instances
    finally:
        for instance in instances:
            instance.cleanup()


def test_created_on_one_instance_answers_the_openai_client_through_the_other(
    two: list[ServeHandle],
) -> None:
    a, b = two
    created = a.create_endpoint(name="chat", modelName="tiny-chat", minReplicas=0, maxReplicas=1)
    # Through B, at zero replicas: held until the leader's vLLM replica is ready.
    client = openai.OpenAI(
        base_url=f"{b.url}/endpoints/{created['id']}/openai/v1",
        api_key=created["accessToken"],
        max_retries=0,
        timeout=600,
    )
    answer = client.chat.completions.create(
        model="tiny-chat", max_tokens=8, messages=[{"role": "user", "content": "Hello!"}]
    )
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert answer.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="tiny-chat",
            max_tokens=8,
            stream=True,
            messages=[{"role": "user", "content": "Hello again!"}],
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Through A as well, the same replica.
    record = b.record(created["id"])
    assert [r["status"] for r in record["replicas"]] == ["ready"]
    via_a = openai.OpenAI(
        base_url=f"{a.url}/endpoints/{created['id']}/openai/v1",
        api_key=created["accessToken"],
        max_retries=0,
        timeout=120,
    )
    assert (
        via_a.chat.completions.create(
            model="tiny-chat", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
        )
        .choices[0]
        .message.content
    )
