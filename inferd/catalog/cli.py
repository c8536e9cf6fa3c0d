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
from typing import Any

from inferd.catalog import Catalog, CatalogError, GpuOption, Recommendation, load_catalog
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


def cmd_recommend(args: argparse.Namespace) -> int:
    from inferd.catalog import recommend

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
        if s.kind == "chat":
            detail = f"context {s.chat.context_length}"
        else:
            assert s.default_size is not None
            detail = f"{s.default_size[0]}x{s.default_size[1]}, {_steps(s.default_steps)}"
        arch = s.architecture
        rows.append([s.name, s.kind, _params(arch.parameters), arch.dtype, detail, s.source])
    print(format_table(["name", "kind", "params", "dtype", "defaults", "source"], rows))
    return 0


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
