"""`inferd recommend MODEL` and `inferd models list|build`.

These read the catalog files directly (no server needed): the same
functions the management API calls, printed as tables or `--json`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferd.vocab import ModelKind

if TYPE_CHECKING:
    from inferd.client.api import ManagementClient

from pydantic import ValidationError

from inferd.api.engine_settings import SIZING_QUERY, EngineSettings
from inferd.catalog import Catalog, CatalogError, load_catalog
from inferd.catalog.models import TEXT_KINDS, parse_size
from inferd.catalog.recommend import DEFAULT_CONCURRENCY, DEFAULT_CONTEXT_TOKENS, POOLING_KINDS


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
    tuned = rec.add_argument_group(
        "engine settings", "size the model as an endpoint with these engineSettings runs it"
    )
    for flag, setting in _SETTING_FLAGS.items():
        kind = int if SIZING_QUERY[setting] is int else str
        tuned.add_argument(f"--{flag}", dest=flag.replace("-", "_"), type=kind, help=setting)
    load.add_argument("--api-url", help="management API URL (with --server)")
    load.add_argument("--admin-key", help="admin key (with --server)")
    _catalog_args(rec)
    rec.set_defaults(func=cmd_recommend)

    models = subparsers.add_parser("models", help="the model catalog and the tiny local models")
    sub = models.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    from inferd.client.cli import api_args, command

    api = api_args()
    ls = sub.add_parser(
        "list",
        parents=[api],
        help="list the models endpoints can use",
        description="With a management key (--key, INFERD_API_KEY or INFERD_ADMIN_KEY): "
        "the server's models, registered ones included. Without one, or with --catalog: "
        "the bundled catalog.",
    )
    ls.add_argument("--catalog", action="store_true", help="the bundled catalog only")
    _catalog_args(ls)
    ls.set_defaults(func=cmd_models_list)
    build = sub.add_parser("build", help="build a tiny local model (tiny-chat, tiny-sdxl)")
    build.add_argument("name", metavar="NAME")
    build.add_argument("--cache-dir", type=Path, help="where to build (default: the model cache)")
    build.set_defaults(func=cmd_models_build)

    add = sub.add_parser(
        "add",
        parents=[api],
        help="register a model on the server from a Hugging Face repository or a directory",
    )
    add.add_argument(
        "--source",
        required=True,
        help="a Hugging Face repository (org/name) or a directory (on the server's machine; "
        "an existing relative one is made absolute)",
    )
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


def _unknown_model(exc: KeyError) -> str:
    # The local catalog has only the bundled models: a registered one is on
    # the server.
    message = str(exc.args[0]) if exc.args else str(exc)
    return f"{message}. A model registered on the server (`inferd models add`): add --server"


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


def _option_row(option: Mapping[str, Any], currency: str) -> list[str]:
    if option["estSecondsPerImage"] is not None:
        speed = f"{option['estSecondsPerImage']:.2f} s/image"
        cost = _money(option["costPerImage"], currency) + " /image"
    elif option["estOutputTokensPerS"] is not None:
        speed = f"{option['estOutputTokensPerS']:,.0f} tokens/s"
        cost = _money(option["costPerMillionTokens"], currency) + " /1M tokens"
    else:
        speed, cost = "-", "-"
    return [
        f"{option['location']} {option['gpuCount']} x {option['gpuType']}",
        "yes" if option["fits"] else "no",
        f"{option['hourlyPrice']:,.2f} {currency}/h",
        f"{option['memoryNeededGb']:.1f} / {option['memoryAvailableGb']:.1f} GB",
        speed,
        cost,
        "-" if option.get("errorBand") is None else f"±{option['errorBand']:.0%}",
    ]


def format_recommendation(rec: Mapping[str, Any]) -> str:
    """A recommendation without a workload, as `Recommendation.to_dict()`
    (and the API) give it: the same table for the catalog and `--server`."""
    where = f"in {rec['location']}" if rec["location"] else "in every location"
    a = rec["assumptions"]
    if "concurrency" in a:
        basis = f"{a['concurrency']} concurrent sequences of {a['contextTokensPerSequence']} tokens"
    else:
        basis = (
            f"{_steps(a['steps'])} at {a['size']}, batches of up to {a['imagesPerBatch']} images"
        )
    options, rejected, currency = rec["options"], rec["rejected"], rec["currency"]
    lines = [
        f"{rec['model']} {where}: {len(options)} option(s) fit, {len(rejected)} rejected ({basis})",
        "",
    ]
    headers = ["option", "fits", "hourly price", "memory needed", "est. speed", "cost", "error"]
    rows = [_option_row(o, currency) for o in (*options, *rejected)]
    if rows:
        lines.append(format_table(headers, rows))
    best = rec["best"]
    if best is not None:
        lines += ["", f"Recommended: {best['location']} {best['gpuCount']} x {best['gpuType']}"]
        lines += [f"  - {reason}" for reason in best["reasons"]]
    if rejected:
        lines += ["", "Rejected:"]
        for o in rejected:
            lines.append(
                f"  {o['location']} {o['gpuCount']} x {o['gpuType']}: {'; '.join(o['reasons'])}"
            )
    return "\n".join(lines)


# `inferd recommend` flag -> the engine setting (and query parameter) it sets.
_SETTING_FLAGS = {
    "max-model-len": "maxModelLen",
    "dtype": "dtype",
    "quantization": "quantization",
    "kv-cache-dtype": "kvCacheDtype",
    "max-num-seqs": "maxNumSeqs",
}


def settings_args(args: argparse.Namespace) -> dict[str, Any]:
    """The engine-settings flags given, as the API's query parameters."""
    values = {s: getattr(args, f.replace("-", "_"), None) for f, s in _SETTING_FLAGS.items()}
    return {k: v for k, v in values.items() if v is not None}


def _engine_settings(args: argparse.Namespace) -> EngineSettings:
    try:
        return EngineSettings.model_validate(settings_args(args))
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise ValueError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


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
            f"{o['totalHourlyPrice']:,.2f} {currency}/h", unit,
            "-" if o.get("errorBand") is None else f"±{o['errorBand']:.0%}", o["basis"],
        ])  # fmt: skip
    if rows:
        headers = ["option", "batch", "throughput", "replicas (min-max)", "total", "unit cost",
                   "error", "basis"]  # fmt: skip
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


def _recommend_pooling(args: argparse.Namespace, catalog: Catalog, model: Any) -> int:
    """An embedding or rerank load: requests/s x tokens per input, no decode."""
    from inferd.catalog.pooling_workload import PoolingWorkload, size_pooling

    if None in (args.requests_per_second, args.prompt_tokens) or args.output_tokens:
        return _fail("an embedding or rerank workload needs --requests-per-second and "
                     "--prompt-tokens (tokens per input); it decodes nothing")  # fmt: skip
    work = PoolingWorkload(args.requests_per_second, args.prompt_tokens)
    sized = size_pooling(model, catalog.gpus, work, args.location)
    if args.json:
        print(json.dumps(sized, indent=2))
        return 0
    rows = [
        [f"{o['location']} {o['gpuCount']} x {o['gpuType']}",
         f"{o['inputTokensPerSPerReplica']:,.0f} input tok/s", str(o["replicas"]),
         f"{o['totalHourlyPrice']:.2f} {sized['currency']}/h",
         f"{o['costPerMillionTokens']:.4f} {sized['currency']} /1M input tokens"]
        for o in sized["options"]
    ]  # fmt: skip
    print(format_table(["option", "per replica", "replicas", "total", "unit cost"], rows))
    return 0


def _recommend_workload(args: argparse.Namespace, query: dict[str, Any]) -> int:
    from inferd.catalog.workload import ChatWorkload, ImageWorkload, recommend_for_workload

    if args.server:
        from inferd.client.api import ApiError
        from inferd.client.cli import client_from_args

        args.timeout = 60.0
        params = {"modelName": args.model, **query, **settings_args(args)}
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
            if model.kind in POOLING_KINDS:
                return _recommend_pooling(args, catalog, model)
            if model.kind == ModelKind.CHAT:
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
                engine_settings=_engine_settings(args),
            ).to_dict()  # fmt: skip
        except KeyError as exc:
            return _fail(_unknown_model(exc))
        except (CatalogError, ValueError) as exc:
            return _fail(str(exc))
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        # The server answers a workload's sizing only when one was asked for.
        print(format_workload(rec) if "workload" in rec else format_recommendation(rec))
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
            engine_settings=_engine_settings(args),
        )
    except KeyError as exc:
        return _fail(_unknown_model(exc))
    except (CatalogError, ValueError) as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(rec.to_dict(), indent=2))
    else:
        print(format_recommendation(rec.to_dict()))
    return 0


def _params(count: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= size:
            return f"{count / size:.{1 if count < 100 * size else 0}f}{unit}"
    return str(count)


def cmd_models_list(args: argparse.Namespace) -> int:
    import os

    from inferd.client.cli import command, key_from

    if not args.catalog and key_from(args, os.environ):
        return command(_models_list_server)(args)
    try:
        catalog = _load(args)
    except CatalogError as exc:
        return _fail(str(exc))
    models = [{**spec.to_dict(), "registered": False} for spec in catalog.models.all()]
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    print(format_models(models))
    if not args.catalog:
        print("\n(the bundled catalog: pass --key or set INFERD_API_KEY/INFERD_ADMIN_KEY to "
              "include the models registered on the server)")  # fmt: skip
    return 0


def _models_list_server(client: ManagementClient, args: argparse.Namespace) -> int:
    models = client.list_models()
    print(json.dumps(models, indent=2) if args.json else format_models(models))
    return 0


def format_models(models: Sequence[Mapping[str, Any]]) -> str:
    """Models as the API lists them (catalog and registered alike)."""
    rows = []
    for m in models:
        arch = m["architecture"]
        if m["kind"] in TEXT_KINDS:
            detail = f"context {arch.get('contextLength')}"
        else:
            detail = f"{m['defaultSize']}, {_steps(m['defaultSteps'])}"
        origin = "catalog"
        if m.get("registered"):
            origin = f"registered ({m['projectId'] or 'global'})"
        rows.append(
            [m["name"], m["kind"], _params(m["parameters"]), str(arch.get("dtype")), detail,
             origin, m["source"]]
        )  # fmt: skip
    headers = ["name", "kind", "params", "dtype", "defaults", "from", "source"]
    return format_table(headers, rows) if rows else "No models."


def _models_add(client: ManagementClient, args: argparse.Namespace) -> int:
    body = {"source": local_source(args.source)}
    for key in ("revision", "name", "description"):
        if getattr(args, key):
            body[key] = getattr(args, key)
    model = client.register_model(body)
    if args.json:
        print(json.dumps(model, indent=2))
    else:
        _print_model(model)
    return 0


def local_source(source: str) -> str:
    """A directory that exists here, relative or not (`models/x`, `./x`), as
    the absolute path the server needs; anything else (an `org/name`
    repository id) as given."""
    path = Path(source).expanduser()
    # `./x` is a path even where nothing is there yet: sent as given, the
    # server blamed it for being relative instead of saying it is missing.
    if not path.is_absolute() and (path.is_dir() or source.startswith(".")):
        return str(path.resolve())
    return source


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
        if key == "projectId" and key in model and model[key] is None:
            print(f"  {key:<18} - (global: every project sees it)")
        elif key in model:
            print(f"  {key:<18} {'-' if model[key] is None else model[key]}")
    for key in ("layers", "kvHeads", "headDim", "contextLength", "quantization", "weightBits"):
        if key in arch:
            print(f"  {key:<18} {'-' if arch[key] is None else arch[key]}")


def cmd_models_build(args: argparse.Namespace) -> int:
    from inferd.catalog.tiny import TINY_BUILDERS, ensure_tiny_model

    name = args.name.removeprefix("builtin:")
    if name not in TINY_BUILDERS:
        return _fail(
            f"only the built-in tiny models can be built: {', '.join(TINY_BUILDERS)} "
            f"(got {args.name!r})"
        )
    from inferd.catalog.tiny import default_cache_dir, fingerprint

    target = (args.cache_dir or default_cache_dir()) / f"{name}-{fingerprint(name)}"
    if not (target / ".complete").exists():
        # Seconds to a minute on a CPU: say so before it starts (stderr, so
        # that stdout stays the directory alone, for scripts).
        print(f"building {name} into {target} (once; later runs reuse it) ...",
              file=sys.stderr, flush=True)  # fmt: skip
    print(ensure_tiny_model(name, args.cache_dir))
    return 0
