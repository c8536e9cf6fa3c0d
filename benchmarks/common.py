"""Shared pieces of the benchmarks: closed-loop OpenAI load generators (chat
and images), percentiles, a printed table, a JSON report, and starting and
stopping vLLM's own OpenAI server with inferd's engine configuration.

Every benchmark measures inferd side by side with its reference in the same
run, on the same machine, with the same load; the goal is a ratio, never an
absolute number asserted in a test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import results_format

from inferd import procfs
from inferd.testing import WEATHER_TOOL

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The machine's load when the benchmark started; each result states it with
# the load at its end, since on a shared machine every figure reads against it.
LOAD_AT_START = tuple(round(x, 2) for x in os.getloadavg())


@dataclass
class LoadResult:
    label: str
    requests: int
    errors: int
    wall_s: float
    output_tokens: int
    ttft_s: list[float] = field(default_factory=list, repr=False)
    latency_s: list[float] = field(default_factory=list, repr=False)
    # CPU seconds the measured server process spent in the round (set by
    # chat_rounds when it is given the process's pid).
    cpu_s: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_s_per_request(self) -> float | None:
        done = self.requests + self.errors
        return None if self.cpu_s is None or not done else self.cpu_s / done

    def summary(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "requests": self.requests,
            "errors": self.errors,
            "wall_s": round(self.wall_s, 4),
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": round(self.tokens_per_s, 2),
            "requests_per_s": round(self.requests_per_s, 2),
            "ttft_p50_ms": ms(percentile(self.ttft_s, 50)),
            "ttft_p99_ms": ms(percentile(self.ttft_s, 99)),
            "latency_p50_ms": ms(percentile(self.latency_s, 50)),
            "latency_p99_ms": ms(percentile(self.latency_s, 99)),
        }


def percentile(values: Sequence[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def chat_body(model: str, max_tokens: int, stream: bool, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
        # Fixed-length outputs: a random-weight model would stop anywhere.
        "ignore_eos": True,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def one_chat(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[float | None, float, int]:
    """(time to first content token, latency, completion tokens)."""
    start = time.perf_counter()
    if not body["stream"]:
        response = await client.post(url, json=body, headers=headers)
        response.raise_for_status()
        tokens = response.json()["usage"]["completion_tokens"]
        return None, time.perf_counter() - start, tokens
    ttft = None
    tokens = 0
    async with client.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any(
                c["delta"].get("content") or c["delta"].get("tool_calls") for c in chunk["choices"]
            ):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft, time.perf_counter() - start, tokens


async def closed_loop_chat(
    label: str,
    url: str,
    *,
    model: str,
    requests: int,
    concurrency: int,
    max_tokens: int,
    stream: bool,
    headers: dict[str, str] | None = None,
    prompt: str = "Write a short story about a fox who learns to fly.",
    timeout_s: float = 600,
    extra: Mapping[str, Any] | None = None,
) -> LoadResult:
    """`concurrency` workers, each sending its next request as soon as the
    previous one finished, until `requests` were sent (or `timeout_s`).
    `extra` adds fields to every request body (tools, ...)."""
    body = {**chat_body(model, max_tokens, stream, prompt), **(extra or {})}
    result = LoadResult(label, 0, 0, 0.0, 0)
    remaining = requests
    deadline = time.monotonic() + timeout_s
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0 and time.monotonic() < deadline:
                remaining -= 1
                try:
                    ttft, latency, tokens = await one_chat(client, url, body, headers or {})
                except (httpx.HTTPError, KeyError, ValueError):
                    result.errors += 1
                    continue
                result.requests += 1
                result.output_tokens += tokens
                result.latency_s.append(latency)
                if ttft is not None:
                    result.ttft_s.append(ttft)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - started
    return result


def pooled(label: str, runs: Sequence[LoadResult]) -> dict[str, Any]:
    """One summary row over rounds: latencies pooled, rates the rounds' median
    (robust to one disturbed round on a shared machine)."""
    total = LoadResult(label, 0, 0, 0.0, 0)
    for run in runs:
        total.requests += run.requests
        total.errors += run.errors
        total.output_tokens += run.output_tokens
        total.wall_s += run.wall_s
        total.ttft_s += run.ttft_s
        total.latency_s += run.latency_s
    row = total.summary()
    row["output_tokens_per_s"] = round(statistics.median(r.tokens_per_s for r in runs), 2)
    return row


def alternating(names: Sequence[str], rounds: int) -> Iterator[str]:
    """Every side once per round, the order reversed every other round, so
    drift on a shared machine (another tenant, a warming cache) hits every
    side alike instead of whichever runs last."""
    for index in range(rounds):
        yield from (names if index % 2 == 0 else reversed(names))


async def chat_rounds(
    targets: Mapping[str, tuple[str, Mapping[str, str]]],
    *,
    model: str,
    rounds: int,
    requests: int,
    concurrency: int,
    max_tokens: int,
    stream: bool,
    cpu_pids: Mapping[str, int] | None = None,
    timeout_s: float = 600,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, list[LoadResult]]:
    """`closed_loop_chat` on every target (name -> chat completions URL and
    request headers), `rounds` times in alternating order. A target named in
    `cpu_pids` gets the CPU seconds of that process in each round's `cpu_s`."""
    runs: dict[str, list[LoadResult]] = {name: [] for name in targets}
    for name in alternating(list(targets), rounds):
        url, headers = targets[name]
        pid = (cpu_pids or {}).get(name)
        before = process_cpu_seconds(pid) if pid else 0.0
        result = await closed_loop_chat(
            name,
            url,
            model=model,
            requests=requests,
            concurrency=concurrency,
            max_tokens=max_tokens,
            stream=stream,
            headers=dict(headers),
            timeout_s=timeout_s,
            extra=extra,
        )
        if pid:
            result.cpu_s = process_cpu_seconds(pid) - before
        runs[name].append(result)
    return runs


# --- images -------------------------------------------------------------------------


@dataclass
class ImageRun:
    """One round of image generation: images delivered (PNG bytes in the
    caller's hands) over the round's wall time."""

    label: str
    images: int = 0
    errors: int = 0
    wall_s: float = 0.0
    latency_s: list[float] = field(default_factory=list, repr=False)
    # CPU seconds the processes involved spent in the round (set by the caller).
    cpu_s: float | None = None

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_s_per_image(self) -> float | None:
        return None if self.cpu_s is None or not self.images else self.cpu_s / self.images


def pooled_images(label: str, runs: Sequence[ImageRun]) -> dict[str, Any]:
    latencies = [x for run in runs for x in run.latency_s]
    return {
        "label": label,
        "images": sum(r.images for r in runs),
        "errors": sum(r.errors for r in runs),
        "images_per_s": round(statistics.median(r.images_per_s for r in runs), 3),
        "images_per_s_rounds": [round(r.images_per_s, 3) for r in runs],
        "latency_p50_ms": ms(percentile(latencies, 50)),
        "latency_p99_ms": ms(percentile(latencies, 99)),
        "cpu_ms_per_image": ms(
            statistics.median(c for r in runs if (c := r.cpu_s_per_image) is not None)
            if any(r.cpu_s_per_image is not None for r in runs)
            else None
        ),
    }


def cpu_seconds(pids: Sequence[int] = ()) -> float:
    """CPU time (user + system, all threads) of this process plus `pids`.
    On a shared machine CPU seconds per unit of work vary far less than wall
    time: the other tenants' load stretches the wall clock, not the work."""
    return time.process_time() + sum(process_cpu_seconds(pid) for pid in pids)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far; 0 once it is gone."""
    stat = procfs.process_stat(pid)
    return 0.0 if stat is None else stat.cpu_s


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


async def closed_loop_images(
    label: str,
    url: str,
    *,
    requests: int,
    concurrency: int,
    size: str,
    headers: dict[str, str] | None = None,
    prompt: str = "a watercolor painting of a lighthouse by the sea at sunset",
    timeout_s: float = 600,
) -> ImageRun:
    """`concurrency` workers sending OpenAI image requests (n=1, b64_json) one
    after another until `requests` were sent (or `timeout_s`); each answer's
    image is decoded and checked to be a PNG."""
    body = {"prompt": prompt, "n": 1, "size": size, "response_format": "b64_json"}
    result = ImageRun(label)
    remaining = requests
    deadline = time.monotonic() + timeout_s
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0 and time.monotonic() < deadline:
                remaining -= 1
                start = time.perf_counter()
                try:
                    response = await client.post(url, json=body, headers=headers or {})
                    response.raise_for_status()
                    png = base64.b64decode(response.json()["data"][0]["b64_json"])
                    if not png.startswith(PNG_SIGNATURE):
                        raise ValueError("not a PNG")
                except (httpx.HTTPError, KeyError, IndexError, ValueError):
                    result.errors += 1
                    continue
                result.latency_s.append(time.perf_counter() - start)
                result.images += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - started
    return result


def print_table(title: str, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print(f"\n{title}")
    print("  ".join(c.ljust(widths[c]) for c in columns))
    print("  ".join("-" * widths[c] for c in columns))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).ljust(widths[c]) for c in columns))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def load_average() -> str:
    """The machine's 1/5/15-minute load, as `uptime` prints it: on a shared
    machine every figure is read against it."""
    one, five, fifteen = os.getloadavg()
    return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} CPUs)"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": load_average(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def write_report(name: str, report: dict[str, Any], out: Path | None = None) -> Path:
    """Write one run's result to benchmarks/results/<name>.json in the shape
    `results_format` describes; the provenance (command, commit, date,
    machine, load at start and end) is filled in here."""
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "format": results_format.FORMAT,
        "benchmark": name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        **git_commit(),
        "machine": machine(),
        "load": {"start": list(LOAD_AT_START), "end": [round(x, 2) for x in os.getloadavg()]},
        **report,
    }
    for problem in results_format.problems(report):
        print(f"warning: {path.name}: {problem}", file=sys.stderr)
    path.write_text(json.dumps(report, indent=2, default=_json_default) + "\n")
    print(f"\nwrote {path}")
    return path


def git_commit() -> dict[str, Any]:
    """The commit the run measured, and whether the tree had changes to
    tracked files outside benchmarks/results (a dirty run is still reported,
    and says so)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    changed = git("status", "--porcelain", "-uno", "--", ".", ":!benchmarks/results")
    return {"commit": git("rev-parse", "HEAD") or "unknown", "dirty": bool(changed)}


def _json_default(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return str(value)


def wait_http_ok(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout}s")


# --- vLLM's own OpenAI server ----------------------------------------------------------


def vllm_cli_flags(args: dict[str, Any]) -> list[str]:
    """AsyncEngineArgs keywords -> vLLM CLI flags (the same configuration)."""
    flags = []
    for key, value in args.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False or value is None:
            continue
        else:
            flags += [flag, str(value)]
    return flags


# The tool-calling part: the same tools and parser on both sides (vLLM's
# server: --enable-auto-tool-choice --tool-call-parser hermes; inferd: the
# catalog's toolCallParser, or --tool-call-parser for a directory).
TOOL_PARSER = "hermes"
TOOLS_BODY: dict[str, Any] = {
    "tools": [WEATHER_TOOL],
    # "auto": every delta goes through the tool parser (the random model
    # writes text, so the lengths stay fixed by ignore_eos on both sides).
    "tool_choice": "auto",
}


def start_vllm_server(
    model_path: Path, options: Any, port: int, log: Path, served_name: str = "tiny-chat"
) -> subprocess.Popen[bytes]:
    """`python -m vllm.entrypoints.openai.api_server` with the engine arguments
    inferd itself uses for `options` (an `EngineOptions`) and the tool parser
    inferd's replica gets, in its own process group. Set VLLM_CPU_KVCACHE_SPACE
    in the environment first on a CPU."""
    from inferd.engines.vllm import engine_args_for

    engine_args = engine_args_for(model_path, served_name, options)
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_path), "--host", "127.0.0.1", "--port", str(port),
        "--disable-uvicorn-access-log", *vllm_cli_flags(engine_args),
        "--enable-auto-tool-choice", "--tool-call-parser", TOOL_PARSER,
    ]  # fmt: skip
    return subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def pin_engine_cores(group_pid: int) -> dict[int, list[int]]:
    """Give the vLLM engine cores in a process group the placement inferd's
    replica gives its own on a CPU (`keep_engine_core_with_its_workers`: on
    its workers' cores), for a reference run with the same OS scheduling.
    Returns {engine-core PID: the CPUs it now runs on}."""
    from inferd.engines.vllm import pin_to_its_workers

    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != group_pid:
                continue
            if (proc / "comm").read_text().startswith("VLLM::EngineCor"):
                found[int(proc.name)] = sorted(pin_to_its_workers(int(proc.name)))
        except OSError:
            continue
    return found


def stop_process_group(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL of the process's whole group (started with
    `start_new_session=True`) if it lingers."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


def vllm_bench_serve(
    base_url: str,
    endpoint: str,
    *,
    model: str,
    tokenizer: Path,
    num_prompts: int,
    concurrency: int,
    input_len: int,
    output_len: int,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """vLLM's own benchmark client (`vllm bench serve`, called from Python:
    the `vllm` console script fails under vllm-cpu) with `--backend
    openai-chat` and random prompts of fixed lengths; returns its result."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = [
        "--backend", "openai-chat", "--base-url", base_url, "--endpoint", endpoint,
        "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--ignore-eos", "--temperature", "0", "--disable-tqdm",
    ]  # fmt: skip
    if headers:
        argv += ["--header", *(f"{name}={value}" for name, value in headers.items())]
    result: dict[str, Any] = bench_main(parser.parse_args(argv))
    return result
