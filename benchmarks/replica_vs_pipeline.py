"""Images per second through an inferd replica against the same diffusers
pipeline called directly, in one run.

    .venv/bin/python benchmarks/replica_vs_pipeline.py [--sizes 1024x1024 512x512]
        [--concurrency 1 4] [--images 8] [--rounds 3] [--model tiny-sdxl]

- replica: a real replica process (`python -m inferd.replica --engine
  diffusers --device cpu`) over HTTP, OpenAI image requests (n=1, b64_json),
  each answer's PNG decoded in the client.
- direct: `StableDiffusionXLPipeline.from_pretrained(dir)` in this process,
  with the steps and guidance the engine serves (the model directory's
  `inferd.json`), the image encoded as the replica encodes it (PNG at the
  engine's compression level, then base64). With several clients, one
  thread per client and one call per image, all calls made by one pipeline
  thread (a pipeline holds per-call state) while the clients encode, so the
  PNG encoding of one image overlaps the next call, as in the engine.
- direct-batch (with several clients, reference only): the same pipeline
  called with a list of `concurrency` prompts, as the replica's batching
  does with compatible concurrent requests on a GPU (on the CPU it serves
  one image per call unless `--engine-arg max_batch_images=N`).

Both sides are loaded at once and measured in alternating rounds; the rate
is the median over rounds. Goal: replica >= 0.95 of direct at every size and
client count.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import io
import json
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    ImageRun,
    alternating,
    closed_loop_images,
    cpu_seconds,
    load_average,
    pooled_images,
    print_table,
    write_report,
)
from results_format import all_met, goal, not_measured, table

from inferd.testing import ReplicaHandle

GOAL = 0.95
PROMPT = "a watercolor painting of a lighthouse by the sea at sunset"
COLUMNS = [
    "setting", "label", "images", "errors", "images_per_s", "images_per_s_rounds",
    "latency_p50_ms", "cpu_ms_per_image", "vs direct", "cpu vs direct",
]  # fmt: skip


def model_dir(model: str) -> Path:
    if Path(model).is_dir():
        return Path(model)
    from inferd.catalog import load_catalog, resolve_model

    return resolve_model(model, load_catalog().models).path


def serving_defaults(path: Path) -> tuple[int, float]:
    """(steps, guidance) as the diffusers engine resolves them for a model
    directory served without catalog overrides."""
    from inferd.engines.diffusers import FALLBACK_GUIDANCE, FALLBACK_STEPS

    sidecar = path / "inferd.json"
    served = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    return (
        int(served.get("default_steps", FALLBACK_STEPS)),
        float(served.get("default_guidance_scale", FALLBACK_GUIDANCE)),
    )


class DirectPipeline:
    """The bare pipeline in this process. One thread makes every pipeline
    call (as the engine's worker does: torch keeps a thread team per calling
    thread, and a pipeline holds per-call state); callers encode their own
    images, so encoding overlaps the next call."""

    def __init__(self, path: Path, steps: int, guidance: float) -> None:
        from diffusers import StableDiffusionXLPipeline
        from diffusers.utils import logging as diffusers_logging

        from inferd.engines.diffusers import PNG_COMPRESS_LEVEL

        diffusers_logging.disable_progress_bar()
        self.pipeline = StableDiffusionXLPipeline.from_pretrained(str(path))
        self.pipeline.set_progress_bar_config(disable=True)
        self.steps = steps
        self.guidance = guidance
        self.compress_level = PNG_COMPRESS_LEVEL
        self._calls = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pipeline")

    def _call(self, prompts: list[str], width: int, height: int) -> list[Any]:
        return list(
            self.pipeline(
                prompt=prompts if len(prompts) > 1 else prompts[0],
                width=width,
                height=height,
                num_inference_steps=self.steps,
                guidance_scale=self.guidance,
            ).images
        )

    def generate(self, prompts: list[str], width: int, height: int) -> list[str]:
        """One pipeline call (PIL images), each image as base64 PNG text."""
        images = self._calls.submit(self._call, prompts, width, height).result()
        out = []
        for image in images:
            buf = io.BytesIO()
            image.save(buf, format="PNG", compress_level=self.compress_level)
            out.append(base64.b64encode(buf.getvalue()).decode("ascii"))
        return out

    def close(self) -> None:
        self._calls.shutdown()

    def closed_loop(
        self,
        label: str,
        *,
        images: int,
        concurrency: int,
        width: int,
        height: int,
        batch: int = 1,
        timeout_s: float = 600,
    ) -> ImageRun:
        """`concurrency` threads, each generating `batch` images per call until
        `images` were made (or `timeout_s`)."""
        result = ImageRun(label)
        counter = threading.Lock()
        remaining = images
        deadline = time.monotonic() + timeout_s

        def worker() -> None:
            nonlocal remaining
            while time.monotonic() < deadline:
                with counter:
                    take = min(batch, remaining)
                    remaining -= take
                if take <= 0:
                    return
                start = time.perf_counter()
                try:
                    made = self.generate([PROMPT] * take, width, height)
                except Exception:
                    with counter:
                        result.errors += take
                    continue
                latency = time.perf_counter() - start
                with counter:
                    result.images += len(made)
                    result.latency_s.extend([latency] * len(made))

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result.wall_s = time.perf_counter() - started
        return result


def measure_block(
    direct: DirectPipeline,
    replica_url: str,
    replica_pid: int,
    *,
    size: str,
    concurrency: int,
    images: int,
    rounds: int,
    with_batch: bool,
) -> dict[str, list[ImageRun]]:
    width, height = (int(x) for x in size.split("x"))
    url = f"{replica_url}/v1/images/generations"

    def run(name: str) -> ImageRun:
        cpu_before = cpu_seconds([replica_pid])
        if name == "replica":
            result = asyncio.run(
                closed_loop_images(
                    name, url, requests=images, concurrency=concurrency, size=size, prompt=PROMPT
                )
            )
        else:
            batch = concurrency if name == "direct-batch" else 1
            clients = 1 if name == "direct-batch" else concurrency
            result = direct.closed_loop(
                name, images=images, concurrency=clients, width=width, height=height, batch=batch
            )
        # Both processes, whichever side ran: the idle one costs ~nothing.
        result.cpu_s = cpu_seconds([replica_pid]) - cpu_before
        return result

    names = ["direct", "replica"] + (["direct-batch"] if with_batch else [])
    runs: dict[str, list[ImageRun]] = {name: [] for name in names}
    for name in alternating(names, rounds):
        runs[name].append(run(name))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny-sdxl", help="catalog name or local directory")
    parser.add_argument("--sizes", nargs="+", default=["1024x1024", "512x512"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--images", type=int, default=8, help="per round, side and setting")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-direct-batch", action="store_true", help="skip the batched direct reference"
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the replica (e.g. max_batch_images=4 to batch on the CPU)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    path = model_dir(args.model)
    steps, guidance = serving_defaults(path)
    print(f"model {path}: {steps} steps, guidance {guidance}; {load_average()}")
    engine_args = [arg for item in args.engine_arg for arg in ("--engine-arg", item)]
    replica = ReplicaHandle(str(path), ["--engine", "diffusers", "--device", "cpu", *engine_args])
    direct: DirectPipeline | None = None
    try:
        direct = DirectPipeline(path, steps, guidance)
        replica.wait_ready(timeout=600)
        rows: list[dict[str, Any]] = []
        results: dict[str, Any] = {}
        for size in args.sizes:
            # First calls at a size pay for allocation; not measured.
            measure_block(
                direct, replica.url, replica.pid, size=size, concurrency=1, images=1, rounds=1,
                with_batch=False,
            )  # fmt: skip
            for concurrency in args.concurrency:
                load_before = load_average()
                runs = measure_block(
                    direct,
                    replica.url,
                    replica.pid,
                    size=size,
                    concurrency=concurrency,
                    images=args.images,
                    rounds=args.rounds,
                    with_batch=concurrency > 1 and not args.no_direct_batch,
                )
                setting = f"{size} c={concurrency}"
                base = pooled_images("direct", runs["direct"])
                summary: dict[str, Any] = {"load_before": load_before}
                for name, run_list in runs.items():
                    row = base if name == "direct" else pooled_images(name, run_list)
                    if name != "direct" and base["images_per_s"]:
                        row["vs direct"] = round(row["images_per_s"] / base["images_per_s"], 3)
                    if name != "direct" and base["cpu_ms_per_image"] and row["cpu_ms_per_image"]:
                        # Direct's CPU per image over this side's: > 1 is cheaper.
                        row["cpu vs direct"] = round(
                            base["cpu_ms_per_image"] / row["cpu_ms_per_image"], 3
                        )
                    rows.append({"setting": setting, **row})
                    summary[name] = row
                ratio = summary["replica"].get("vs direct", 0.0)
                summary["replica_vs_direct"] = ratio
                summary["goal_met"] = ratio >= GOAL
                summary["load_after"] = load_average()
                results[setting] = summary
        print_table(
            f"replica vs direct pipeline ({path.name}, {steps} steps): {args.images} images "
            f"x {args.rounds} alternating rounds per side; {load_average()}",
            rows,
            COLUMNS,
        )
        met = all(r["goal_met"] for r in results.values())
        short = [k for k, r in results.items() if not r["goal_met"]]
        print(
            f"\ngoal: replica >= {GOAL} of direct images/s at every setting: "
            + ("met" if met else f"NOT met ({', '.join(short)})")
        )
        report = report_of(args, (path, steps, guidance), rows, results)
        write_report("replica_vs_pipeline", report, args.out)
    finally:
        replica.stop()
        if direct is not None:
            direct.close()
    return 0


def setting_goal(setting: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Replica against direct at one size and client count; an image either
    side failed to make fails the goal, whatever the rate."""
    name = f"{setting}: replica images/s / direct's"
    target = f">= {GOAL}x"
    ratio = summary["replica"].get("vs direct")
    errors = {side: summary[side]["errors"] for side in ("replica", "direct")}
    if any(errors.values()):
        counts = ", ".join(f"{side} {n}" for side, n in errors.items())
        figure = ratio if ratio is not None else "no direct image"
        return goal(name, target, figure, False, f"{sum(errors.values())} errors ({counts})")
    if ratio is None:
        return not_measured(name, target, "no image made on either side (--images 0)")
    met = ratio >= GOAL
    why = "" if met else "slower than the pipeline called directly in this run"
    return goal(name, target, ratio, met, why)


def report_of(
    args: argparse.Namespace,
    model: tuple[Path, int, float],
    rows: list[dict[str, Any]],
    results: dict[str, Any],
) -> dict[str, Any]:
    """The result file: the figures measured, a goal per setting judged."""
    path, steps, guidance = model
    goals = [setting_goal(setting, summary) for setting, summary in results.items()]
    batch = "" if args.no_direct_batch else "; direct-batch (several clients only): a reference"
    engine = f" (engine args: {', '.join(args.engine_arg)})" if args.engine_arg else ""
    return {
        "title": f"Images: an inferd replica against the diffusers pipeline called directly "
        f"({path.name}, CPU)",
        "workload": f"{path.name}, {steps} steps, guidance {guidance:g}; sizes "
        f"{', '.join(args.sizes)} x clients {', '.join(map(str, args.concurrency))}; "
        f"{args.images} images per round x {args.rounds} alternating rounds per side and "
        f"setting, images/s the median over rounds; replica: OpenAI image requests over "
        f"HTTP (n=1, b64_json){engine}; direct: the pipeline in this process, each image "
        f"encoded as the engine encodes it{batch}",
        "config": {**vars(args), "out": str(args.out), "steps": steps, "guidance": guidance},
        "tables": [table("Images per second by setting and side", COLUMNS, rows)],
        "goals": goals,
        "notes": [
            "`cpu_ms_per_image`: CPU of this process and the replica's, whichever side ran; "
            "`cpu vs direct` is direct's over this side's (> 1 is cheaper).",
        ],
        "goal": f"replica images/s >= {GOAL} x direct",
        "goal_met": all_met(goals),
        "results": results,
    }


if __name__ == "__main__":
    raise SystemExit(main())
