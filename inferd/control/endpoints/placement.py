"""Where an endpoint runs: model, location, GPU type and count, and its price.

Checks a request against the catalog and the recommender, filling in what
was left out (the recommended type and count), and says exactly which field
is wrong otherwise. Unknown names in a request body are 400s naming the
field (the URL's resource exists; the body is what is wrong); 404 is kept
for the resource in the path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inferd.api.engine_settings import EngineSettings
from inferd.catalog import Catalog, GpuOption, recommend
from inferd.control.model import Endpoint
from inferd.errors import BadRequest


@dataclass(frozen=True)
class Placement:
    model_name: str
    model_kind: str
    location: str
    gpu_type: str
    gpu_count: int
    hourly_price: float
    currency: str


def _known(names: Iterable[str]) -> str:
    listed = sorted(names)
    return ", ".join(listed) if listed else "(none)"


def _reasons(option: GpuOption) -> str:
    return "; ".join(option.reasons) if option.reasons else "it does not fit"


def resolve_placement(
    catalog: Catalog,
    *,
    model_name: str,
    location_name: str,
    gpu_type: str | None,
    gpu_count: int | None,
    engine_settings: EngineSettings | None = None,
) -> Placement:
    """`engine_settings`: the endpoint's; the fit is of the model as its
    engine holds it under them (context, dtype, FP8 weights or KV cache)."""
    try:
        model = catalog.models.get(model_name)
    except KeyError:
        raise BadRequest(
            f"Unknown model '{model_name}'. Known models: "
            f"{_known(m.name for m in catalog.models.all())}.",
            param="modelName",
            code="model_not_found",
        ) from None
    gpus = catalog.gpus
    location = gpus.locations.get(location_name)
    if location is None:
        raise BadRequest(
            f"Unknown location '{location_name}'. Known locations: {_known(gpus.locations)}.",
            param="locationName",
            code="location_not_found",
        )
    if gpu_type is not None:
        if gpu_type not in gpus.gpu_types:
            raise BadRequest(
                f"Unknown GPU type '{gpu_type}'. Known GPU types: {_known(gpus.gpu_types)}.",
                param="gpuType",
                code="gpu_type_not_found",
            )
        if gpu_type not in location.offers:
            raise BadRequest(
                f"GPU type '{gpu_type}' is not offered in location '{location_name}'. "
                f"Offered there: {_known(location.offers)}.",
                param="gpuType",
                code="gpu_type_not_offered",
            )
        if gpu_count is not None and gpu_count not in gpus.allowed_counts_for(gpu_type):
            allowed = ", ".join(str(c) for c in gpus.allowed_counts_for(gpu_type))
            raise BadRequest(
                f"gpuCount {gpu_count} is not allowed for GPU type '{gpu_type}'; "
                f"allowed: {allowed}.",
                param="gpuCount",
                code="gpu_count_not_allowed",
            )
    elif gpu_count is not None and gpu_count not in gpus.allowed_counts:
        allowed = ", ".join(str(c) for c in gpus.allowed_counts)
        raise BadRequest(
            f"gpuCount {gpu_count} is not allowed; allowed: {allowed}.",
            param="gpuCount",
            code="gpu_count_not_allowed",
        )

    rec = recommend(
        model,
        gpus,
        location_name,
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        engine_settings=engine_settings,
    )
    fitting = [o for o in rec.options if o.fits]
    if not fitting:
        raise _does_not_fit(model_name, location_name, gpu_type, gpu_count, rec.rejected)
    best = fitting[0]
    return Placement(
        model_name=model.name,
        model_kind=model.kind,
        location=location_name,
        gpu_type=best.gpu_type,
        gpu_count=best.gpu_count,
        hourly_price=float(gpus.hourly_price(location_name, best.gpu_type, best.gpu_count)),
        currency=gpus.currency,
    )


def placement_for_change(
    catalog: Catalog,
    row: Endpoint,
    gpu_type: str | None,
    gpu_count: int | None,
    engine_settings: EngineSettings,
) -> Placement | None:
    """Where a change of `row`'s GPU type or count puts it (with the engine
    settings it will have); None when it names neither. A new count alone
    keeps the type; a new type without a count gets the recommended count
    for it (as a create does)."""
    if gpu_type is None and gpu_count is None:
        return None
    if gpu_count is None and gpu_type in (None, row.gpu_type):
        gpu_count = row.gpu_count
    return resolve_placement(
        catalog,
        model_name=row.model_name,
        location_name=row.location_name,
        gpu_type=gpu_type or row.gpu_type,
        gpu_count=gpu_count,
        engine_settings=engine_settings,
    )


def _does_not_fit(
    model_name: str,
    location_name: str,
    gpu_type: str | None,
    gpu_count: int | None,
    rejected: tuple[GpuOption, ...],
) -> BadRequest:
    if gpu_type is not None and gpu_count is not None:
        exact = [o for o in rejected if o.gpu_type == gpu_type and o.gpu_count == gpu_count]
        why = _reasons(exact[0]) if exact else "it does not fit"
        return BadRequest(
            f"Model '{model_name}' does not fit on {gpu_count} x {gpu_type}: {why}.",
            param="gpuCount",
            code="model_does_not_fit",
        )
    if gpu_type is not None:
        counts = ", ".join(f"{o.gpu_count}: {_reasons(o)}" for o in rejected) or "none offered"
        return BadRequest(
            f"Model '{model_name}' does not fit on any allowed count of {gpu_type} "
            f"in '{location_name}' ({counts}).",
            param="gpuType",
            code="model_does_not_fit",
        )
    summary = (
        "; ".join(f"{o.gpu_count} x {o.gpu_type}: {_reasons(o)}" for o in rejected[:6])
        or "no GPU types offered"
    )
    return BadRequest(
        f"No GPU offered in '{location_name}' fits model '{model_name}' ({summary}).",
        param="gpuCount" if gpu_count is not None else "modelName",
        code="model_does_not_fit",
    )
