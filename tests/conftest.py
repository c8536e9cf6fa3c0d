"""Shared fixtures. Expensive things (tiny model builds, loaded engines,
replica processes) are built once per session and shared."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferd.testing import LoopThread, ReplicaHandle
from inferd.testing.postgres import PostgresServer

REPO = Path(__file__).resolve().parent.parent

# Tiny models are built once and reused across runs (gitignored).
os.environ.setdefault("INFERD_CACHE_DIR", str(REPO / ".inferd" / "test-cache"))
# vLLM on CPU: a small KV cache (GiB) and quiet logs.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.support import require  # noqa: E402

# Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`) the
# unit of scheduling is a group. Each test file is one, so that its module
# fixtures (a served endpoint, a reference vLLM server) are built once. Files
# that share a machine-wide resource are one group, run by one worker: one Ray
# cluster at a time (its head binds fixed ports), and one copy of the session
# engines (a vLLM replica is about 3 GB; two workers each holding all three
# shared engines beside their own endpoints would not fit in 24 GiB).
SHARED_GROUPS = {
    "ray_cluster": "ray",
    "vllm_replica": "shared-engines",
    "pooling_replica": "shared-engines",
    "diffusers_replica": "shared-engines",
}


# The groups that took longest in a fresh-clone `make test` on 2 cores go
# first (`--no-loadscope-reorder` keeps this order; xdist would otherwise
# start the groups with the most tests first, and the README's one test of
# seven minutes started last kept one worker busy while the other idled).
LONGEST_GROUPS = ("shared-engines", "test_endpoint_e2e", "test_readme", "test_engine_death", "ray")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    give_generated_cases_their_own_ids(items)
    if hasattr(config, "workerinput"):  # one process runs everything: nothing to group
        items[:] = grouped_for_xdist(items)


def grouped_for_xdist(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items in groups (each named in its node id), longest groups first,
    then the other groups that start real engines, then the quick ones."""
    fixtures_by_file: dict[str, set[str]] = {}
    for item in items:
        path = file_of(item)
        if path not in fixtures_by_file:
            # Also the shared fixtures a file asks for by name
            # (`request.getfixturevalue("ray_cluster")`).
            source = item.path.read_text() if item.path.suffix == ".py" else ""
            fixtures_by_file[path] = {f for f in SHARED_GROUPS if f in source}
        fixtures_by_file[path].update(getattr(item, "fixturenames", ()))
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        path = file_of(item)
        shared = sorted({SHARED_GROUPS[f] for f in fixtures_by_file[path] if f in SHARED_GROUPS})
        group = shared[0] if shared else Path(path).stem
        name_xdist_group(item, group)
        groups.setdefault(group, []).append(item)

    def rank(group: str) -> tuple[int, int]:
        if group in LONGEST_GROUPS:
            return (0, LONGEST_GROUPS.index(group))
        starts_engines = any(item.get_closest_marker("slow") for item in groups[group])
        return (1 if starts_engines else 2, 0)

    ordered = sorted(groups, key=rank)  # stable: collection order within a rank
    return [item for group in ordered for item in groups[group]]


def file_of(item: pytest.Item) -> str:
    """The test's file from its node id: `item.location` names the file that
    defines the function, a plugin's for schemathesis' generated tests."""
    return item.nodeid.split("::", 1)[0]


def give_generated_cases_their_own_ids(items: list[pytest.Item]) -> None:
    """schemathesis names each generated case after its operation
    (`test_x[GET /healthz]`), but pytest 9.2 builds a node id from the
    function's name and its own parameters only, so all of a schema's cases
    shared one id. pytest-xdist schedules by node id: under two workers it
    ran one case of the 72 (and the test counting calls per operation
    failed), and results keyed by id were merged. Each case's id is its name."""
    for item in items:
        if item.parent is not None and item.nodeid.rsplit("::", 1)[-1] != item.name:
            set_node_id(item, f"{item.parent.nodeid}::{item.name}")


def name_xdist_group(item: pytest.Item, group: str) -> None:
    """`--dist loadgroup` reads a test's group from its node id
    (`path::test@group`)."""
    set_node_id(item, f"{item.nodeid}@{group}")


def set_node_id(item: pytest.Item, nodeid: str) -> None:
    """pytest-xdist 3.8 writes a node id to a field that pytest 9.2 no longer
    reads (`_nodeid`; the id is `_id` now): both are written."""
    from _pytest.nodeid import coerce_node_id

    item._nodeid = nodeid  # type: ignore[attr-defined]
    item._id = coerce_node_id(nodeid)  # type: ignore[attr-defined]


def pytest_runtest_setup(item: pytest.Item) -> None:
    # `needs(...)` marks: skipped where a component is missing, failed under CI.
    for mark in item.iter_markers("needs"):
        for component in mark.args:
            require(component)


@pytest.fixture(scope="session")
def tiny_chat_dir() -> Path:
    from inferd.catalog.tiny import ensure_tiny_model

    return ensure_tiny_model("tiny-chat")


@pytest.fixture(scope="session")
def tiny_lora_dir(tiny_chat_dir: Path) -> Path:
    """A random rank-8 PEFT LoRA adapter of tiny-chat (beside it, so below
    the same model root)."""
    require("peft", "tiny LoRA adapters are built with it")
    from inferd.catalog.tiny_lora import ensure_tiny_lora

    return ensure_tiny_lora(tiny_chat_dir, rank=8, seed=1)


@pytest.fixture(scope="session")
def tiny_sdxl_dir() -> Path:
    from inferd.catalog.tiny import ensure_tiny_model

    return ensure_tiny_model("tiny-sdxl")


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def vllm_replica(
    tiny_chat_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReplicaHandle]:
    """One real replica process serving tiny-chat through vLLM, shared by
    every test that needs the real engine behind real HTTP. Its clean stop
    at the end logs no engine traceback (vLLM's shutdown order once made
    every stop log an EngineDeadError)."""
    require("vllm", "the shared tiny-chat replica runs on it")
    log_path = tmp_path_factory.mktemp("vllm-replica") / "replica.log"
    handle = ReplicaHandle(
        str(tiny_chat_dir),
        # The catalog entry's parser, given by flag: a directory has no entry.
        [
            *("--engine", "vllm", "--device", "cpu", "--served-model-name", "tiny-chat"),
            *("--tool-call-parser", "hermes"),
        ],
        log_path=log_path,
    )
    try:
        yield handle.wait_ready(timeout=300)
    finally:
        handle.stop()
    assert "EngineDeadError" not in log_path.read_text()


@pytest.fixture(scope="session")
def tiny_embed_dir() -> Path:
    from inferd.catalog.tiny import ensure_tiny_model

    return ensure_tiny_model("tiny-embed")


@pytest.fixture(scope="session")
def pooling_replica(tiny_embed_dir: Path) -> Iterator[ReplicaHandle]:
    """One real replica process serving the tiny BERT embedder through
    vLLM's pooling runner, shared by every embeddings and score test (the
    kind, embedding, is read from the checkpoint)."""
    require("vllm", "the shared tiny-embed replica runs on it")
    handle = ReplicaHandle(
        str(tiny_embed_dir),
        ["--engine", "vllm", "--device", "cpu", "--served-model-name", "tiny-embed"],
    )
    try:
        yield handle.wait_ready(timeout=300)
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def diffusers_replica(tiny_sdxl_dir: Path) -> Iterator[ReplicaHandle]:
    require("diffusers", "the shared tiny-sdxl replica runs on it")
    handle = ReplicaHandle(
        str(tiny_sdxl_dir),
        ["--engine", "diffusers", "--device", "cpu", "--served-model-name", "tiny-sdxl"],
    )
    try:
        yield handle.wait_ready(timeout=300)
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session (a fresh database per test:
    `postgres_server.create_database()`). Skipped where PostgreSQL is not
    installed, a failure when `CI` is set."""
    from inferd.testing.postgres import find_postgres_bin, start_postgres

    require("postgresql", "the PostgreSQL store's tests run against a real server")
    bin_dir = find_postgres_bin()
    assert bin_dir is not None
    server = start_postgres(bin_dir)
    try:
        yield server
    finally:
        server.destroy()


# -- a local Ray cluster ------------------------------------------------------------------

# One for the whole session (starting one costs 10-30 s and about 1 GB
# here): a head that takes no work and three nodes with fake GPUs in two
# locations. Tests that remove a node put it back; tests that add one
# remove it.
RAY_NODES = {
    # name: (location, GPU type, GPUs, CPU replica slots)
    # Two CPU replica slots on each us-east node: spread is a choice, not
    # forced by one slot per node.
    "east-a": ("us-east", "H100-80GB", 2, 2),
    "east-b": ("us-east", "H100-80GB", 1, 2),
    "west": ("eu-west", "L4", 1, 1),
}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    require("ray", "the Ray launcher's tests need a Ray cluster")
    from inferd.testing.cluster import FakeNode, start_cluster

    cluster = start_cluster({name: FakeNode(*spec) for name, spec in RAY_NODES.items()})
    try:
        yield cluster
    finally:
        cluster.shutdown()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-report",
        metavar="PATH",
        default=None,
        help="write the reliability report (docs/reliability.md) from this run's results",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--reliability-report"):
        from tests.reliability.report import Collector

        config.pluginmanager.register(Collector(), "reliability-report")


def pytest_unconfigure(config: pytest.Config) -> None:
    collector = config.pluginmanager.get_plugin("reliability-report")
    if collector is None or collector.is_worker or not collector.ordered():
        return  # a pytest-xdist worker hands its results to the controller, which writes
    import shlex
    import sys

    from tests.reliability.report import current_commit, markdown

    page = Path(config.getoption("--reliability-report"))
    whole_suite = [Path(a).resolve() for a in config.args] == [REPO / "tests"]
    why_not = collector.why_not_written(whole_suite)
    if why_not is not None:
        print(f"\n{page} not written: {why_not}", file=sys.stderr)
        return
    command = shlex.join(["python", "-m", "pytest", *sys.argv[1:]])
    text = markdown(
        collector.ordered(),
        command,
        collector.exit_status,
        collector.wall_s,
        current_commit(REPO),
    )
    page.write_text(text)
