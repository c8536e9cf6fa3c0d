"""`inferd recommend MODEL` and `inferd models list|build`.

These read the catalog files directly (no server needed): the same
functions the management API calls, printed as tables or `--json`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferd.client.api import ManagementClient

from inferd.catalog import Catalog, CatalogError, GpuOption, Recommendation, load_catalog
from inferd.catalog.models import TEXT_KINDS, parse_size
from inferd.catalog.recommend import DEFAULT_CONCURRENCY, DEFAULT_CONTEXT_TOKENS


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    rec = subparsers.add_parser(
        "recommend",
        help="rank GPU types and counts for a model by cost per output",
        description="Rank every GPU type and count offered (in one location or all) by "
        "the cost of a million output tokens or of one image, with the reasons "
        "each rejected option does not fit.",
    )
    rec.add_argument("model", metavar="MODEL", help="catalog model name (see `inferd models list`)")
    rec.add_argument("--location", help="one location (default: all)")
    rec.add_argument("--gpu-type", help="only this GPU type")
    rec.add_argument("--gpu-count", type=int, help="only this many GPUs per replica")
    rec.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="sequences decoded at once, for KV cache and throughput "
        f"(default {DEFAULT_CONCURRENCY})",
    )
    rec.add_argument(
        "--context-tokens",
        type=int,
        default=DEFAULT_CONTEXT_TOKENS,
        help="KV cache per sequence, capped at the model's context length "
        f"(default {DEFAULT_CONTEXT_TOKENS})",
    )
    rec.add_argument("--json", action="store_true", help="print JSON instead of a table")
    load = rec.add_argument_group(
        "workload (with these, each option's batch, replicas and total cost for the load)"
    )
    load.add_argument("--requests-per-second", type=float, help="chat requests per second")
    load.add_argument("--prompt-tokens", type=int, help="prompt tokens per request")
    load.add_argument("--output-tokens", type=int, help="output tokens per request")
    load.add_argument("--ttft-p95-ms", type=float, help="time-to-first-token target, p95")
    load.add_argument("--tpot-p95-ms", type=float, help="time-per-output-token target, p95")
    load.add_argument("--images-per-minute", type=float, help="image requests per minute")
    load.add_argument("--size", help="image size WxH (default: the model's)")
    load.add_argument("--steps", type=int, help="denoising steps (default: the model's)")
    load.add_argument("--seconds-per-image", type=float, help="seconds per image target, p95")
    load.add_argument(
        "--server",
        action="store_true",
        help="ask the management API (--api-url, --admin-key): registered models and "
        "measured profiles count",
    )
    load.add_argument("--api-url", help="management API URL (with --server)")
    load.add_argument("--admin-key", help="admin key (with --server)")
    _catalog_args(rec)
    rec.set_defaults(func=cmd_recommend)

    models = subparsers.add_parser("models", help="the model catalog and the tiny local models")
    sub = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    ls = sub.add_parser("list", help="list catalog models")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _catalog_args(ls)
    ls.set_defaults(func=cmd_models_list)
    build = sub.add_parser("build", help="build a tiny local model (tiny-chat, tiny-sdxl)")
    build.add_argument("name", metavar="NAME")
    build.add_argument("--cache-dir", type=Path, help="where to build (default: the model cache)")
    build.set_defaults(func=cmd_models_build)

    from inferd.client.cli import api_args, command

    api = api_args()
    add = sub.add_parser(
        "add",
        parents=[api],
        help="register a model on the server from a Hugging Face repository or a directory",
    )
    add.add_argument("--source", required=True, help="org/name or an absolute directory")
    add.add_argument("--revision", help="branch, tag or commit of a repository")
    add.add_argument("--name", help="name for endpoints (default: from the source)")
    add.add_argument("--description")
    # The first registration imports vLLM's model registry on the server: seconds.
    add.set_defaults(func=command(_models_add), timeout=180.0)
    show = sub.add_parser("show", parents=[api], help="show a model the server knows")
    show.add_argument("name", metavar="NAME")
    show.set_defaults(func=command(_models_show))
    delete = sub.add_parser("delete", parents=[api], help="delete a registered model")
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(func=command(_models_delete))


def _catalog_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models-dir", type=Path, help="model catalog directory")
    parser.add_argument("--configs-dir", type=Path, help="directory of gpus.yaml, locations.yaml")


def _load(args: argparse.Namespace) -> Catalog:
    return load_catalog(args.models_dir, args.configs_dir)


def _fail(message: str) -> int:
    print(f"inferd: {message}", file=sys.stderr)
    return 2


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _money(value: float | None, currency: str) -> str:
    """Three significant digits, never scientific: 3.48, 0.494, 0.0000399."""
    if value is None:
        return "-"
    if value == 0:
        return f"0.00 {currency}"
    decimals = max(2, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f} {currency}"


def _steps(count: int | None) -> str:
    return f"{count} step{'' if count == 1 else 's'}"


def _option_row(option: GpuOption, currency: str) -> list[str]:
    if option.est_seconds_per_image is not None:
        speed = f"{option.est_seconds_per_image:.2f} s/image"
        cost = _money(option.cost_per_image, currency) + " /image"
    elif option.est_output_tokens_per_s is not None:
        speed = f"{option.est_output_tokens_per_s:,.0f} tokens/s"
        cost = _money(option.cost_per_million_tokens, currency) + " /1M tokens"
    else:
        speed, cost = "-", "-"
    return [
        f"{option.location} {option.gpu_count} x {option.gpu_type}",
        "yes" if option.fits else "no",
        f"{option.hourly_price:,.2f} {currency}/h",
        f"{option.memory_needed_gb:.1f} / {option.memory_available_gb:.1f} GB",
        speed,
        cost,
    ]


def format_recommendation(rec: Recommendation) -> str:
    where = f"in {rec.location}" if rec.location else "in every location"
    a = rec.assumptions
    if "concurrency" in a:
        basis = f"{a['concurrency']} concurrent sequences of {a['contextTokensPerSequence']} tokens"
    else:
        basis = (
            f"{_steps(a['steps'])} at {a['size']}, batches of up to {a['imagesPerBatch']} images"
        )
    lines = [
        f"{rec.model} {where}: {len(rec.options)} option(s) fit, {len(rec.rejected)} rejected "
        f"({basis})",
        "",
    ]
    headers = ["option", "fits", "hourly price", "memory needed", "est. speed", "cost"]
    rows = [_option_row(o, rec.currency) for o in (*rec.options, *rec.rejected)]
    if rows:
        lines.append(format_table(headers, rows))
    best = rec.best()
    if best is not None:
        lines += ["", f"Recommended: {best.location} {best.gpu_count} x {best.gpu_type}"]
        lines += [f"  - {reason}" for reason in best.reasons]
    if rec.rejected:
        lines += ["", "Rejected:"]
        for o in rec.rejected:
            lines.append(f"  {o.location} {o.gpu_count} x {o.gpu_type}: {'; '.join(o.reasons)}")
    return "\n".join(lines)


def workload_args(args: argparse.Namespace) -> dict[str, Any]:
    """The workload flags given, as the API's query parameters."""
    names = {
        "requests_per_second": "requestsPerSecond",
        "prompt_tokens": "promptTokens",
        "output_tokens": "outputTokens",
        "ttft_p95_ms": "ttftP95Ms",
        "tpot_p95_ms": "tpotP95Ms",
        "images_per_minute": "imagesPerMinute",
        "size": "size",
        "steps": "steps",
        "seconds_per_image": "secondsPerImageP95",
    }
    return {api: getattr(args, flag) for flag, api in names.items() if getattr(args, flag)}


def format_workload(rec: dict[str, Any]) -> str:
    currency = rec["currency"]
    work = ", ".join(f"{k} {v}" for k, v in rec["workload"].items() if v is not None)
    lines = [f"{rec['model']} for {work}: {len(rec['options'])} option(s), "
             f"{len(rec['rejected'])} rejected", ""]  # fmt: skip
    rows = []
    for o in rec["options"]:
        speed = (
            f"{o['imagesPerMinute']:.1f} img/min/replica"
            if o["imagesPerMinute"] is not None
            else f"{o['outputTokensPerS']:,.0f} tok/s/replica"
        )
        unit = (
            _money(o["costPerImage"], currency) + " /image"
            if o["costPerImage"] is not None
            else _money(o["costPerMillionTokens"], currency) + " /1M tokens"
        )
        rows.append([
            f"{o['location']} {o['gpuCount']} x {o['gpuType']}", str(o["batch"]), speed,
            f"{o['replicas']} ({o['minReplicas']}-{o['maxReplicas']})",
            f"{o['totalHourlyPrice']:,.2f} {currency}/h", unit, o["basis"],
        ])  # fmt: skip
    if rows:
        headers = ["option", "batch", "throughput", "replicas (min-max)", "total", "unit cost",
                   "basis"]  # fmt: skip
        lines.append(format_table(headers, rows))
    best = rec["best"]
    if best is not None:
        lines += ["", f"Recommended: {best['location']} {best['gpuCount']} x {best['gpuType']}"]
        lines += [f"  - {reason}" for reason in best["reasons"]]
    if rec["rejected"]:
        lines += ["", "Rejected:"]
        for o in rec["rejected"]:
            lines.append(f"  {o['location']} {o['gpuCount']} x {o['gpuType']}: "
                         f"{'; '.join(o['reasons'])}")  # fmt: skip
    return "\n".join(lines)


def _recommend_workload(args: argparse.Namespace, query: dict[str, Any]) -> int:
    from inferd.catalog.workload import ChatWorkload, ImageWorkload, recommend_for_workload

    if args.server:
        from inferd.client.api import ApiError
        from inferd.client.cli import client_from_args

        args.timeout = 60.0
        params = {"modelName": args.model, **query}
        if args.location:
            params["locationName"] = args.location
        try:
            with client_from_args(args) as client:
                rec = client.recommendations(params)
        except ApiError as exc:
            return _fail(str(exc))
    else:
        try:
            catalog = _load(args)
            model = catalog.models.get(args.model)
            work: ChatWorkload | ImageWorkload
            if model.kind == "chat":
                if None in (args.requests_per_second, args.prompt_tokens, args.output_tokens):
                    return _fail("a chat workload needs --requests-per-second, --prompt-tokens "
                                 "and --output-tokens")  # fmt: skip
                work = ChatWorkload(
                    args.requests_per_second, args.prompt_tokens, args.output_tokens,
                    None if args.ttft_p95_ms is None else args.ttft_p95_ms / 1000,
                    None if args.tpot_p95_ms is None else args.tpot_p95_ms / 1000,
                )  # fmt: skip
            else:
                if args.images_per_minute is None:
                    return _fail("an image workload needs --images-per-minute")
                size = parse_size(args.size, "--size") if args.size else None
                work = ImageWorkload(args.images_per_minute, size, args.steps,
                                     args.seconds_per_image)  # fmt: skip
            rec = recommend_for_workload(
                model, catalog.gpus, work, args.location,
                gpu_type=args.gpu_type, gpu_count=args.gpu_count,
            ).to_dict()  # fmt: skip
        except KeyError as exc:
            return _fail(str(exc.args[0]) if exc.args else str(exc))
        except (CatalogError, ValueError) as exc:
            return _fail(str(exc))
    print(json.dumps(rec, indent=2) if args.json else format_workload(rec))
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    from inferd.catalog import recommend

    query = workload_args(args)
    if query or args.server:
        return _recommend_workload(args, query)
    try:
        catalog = _load(args)
        model = catalog.models.get(args.model)
        rec = recommend(
            model,
            catalog.gpus,
            args.location,
            gpu_type=args.gpu_type,
            gpu_count=args.gpu_count,
            concurrency=args.concurrency,
            context_tokens=args.context_tokens,
        )
    except KeyError as exc:
        return _fail(str(exc.args[0]) if exc.args else str(exc))
    except (CatalogError, ValueError) as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(rec.to_dict(), indent=2))
    else:
        print(format_recommendation(rec))
    return 0


def _params(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.{1 if count < 100 * size else 0}f}{unit}"
    return str(count)


def cmd_models_list(args: argparse.Namespace) -> int:
    try:
        catalog = _load(args)
    except CatalogError as exc:
        return _fail(str(exc))
    specs = catalog.models.all()
    if args.json:
        print(json.dumps([s.to_dict() for s in specs], indent=2))
        return 0
    rows = []
    for s in specs:
        if s.kind in TEXT_KINDS:
            detail = f"context {s.chat.context_length}"
        else:
            assert s.default_size is not None
            detail = f"{s.default_size[0]}x{s.default_size[1]}, {_steps(s.default_steps)}"
        arch = s.architecture
        rows.append([s.name, s.kind, _params(arch.parameters), arch.dtype, detail, s.source])
    print(format_table(["name", "kind", "params", "dtype", "defaults", "source"], rows))
    return 0


def _models_add(client: ManagementClient, args: argparse.Namespace) -> int:
    body = {"source": args.source}
    for key in ("revision", "name", "description"):
        if getattr(args, key):
            body[key] = getattr(args, key)
    model = client.register_model(body)
    if args.json:
        print(json.dumps(model, indent=2))
    else:
        _print_model(model)
    return 0


def _models_show(client: ManagementClient, args: argparse.Namespace) -> int:
    model = client.get_model(args.name)
    print(json.dumps(model, indent=2)) if args.json else _print_model(model)
    return 0


def _models_delete(client: ManagementClient, args: argparse.Namespace) -> int:
    client.delete_model(args.name)
    print(json.dumps({"name": args.name, "deleted": True}) if args.json
          else f"Deleted model {args.name}.")  # fmt: skip
    return 0


def _print_model(model: dict[str, Any]) -> None:
    arch = model["architecture"]
    print(f"{model['name']} ({model['kind']}, {_params(model['parameters'])} parameters, "
          f"{arch.get('dtype')}) from {model['source']}")  # fmt: skip
    keys = ("architectureClass", "projectId", "revision", "chatTemplate", "toolCallParser",
            "reasoningParser")  # fmt: skip
    for key in keys:
        if key in model:
            print(f"  {key:<18} {model[key]}")
    for key in ("layers", "kvHeads", "headDim", "contextLength", "quantization", "weightBits"):
        if key in arch:
            print(f"  {key:<18} {arch[key]}")


def cmd_models_build(args: argparse.Namespace) -> int:
    from inferd.catalog.tiny import TINY_BUILDERS, ensure_tiny_model

    name = args.name.removeprefix("builtin:")
    if name not in TINY_BUILDERS:
        return _fail(
            f"only the built-in tiny models can be built: {', '.join(TINY_BUILDERS)} "
            f"(got {args.name!r})"
        )
    print(ensure_tiny_model(name, args.cache_dir))
    return 0
