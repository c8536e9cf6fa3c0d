"""The console's GPU options are the API's answer: `recommend_for_workload`
through the model service, engine settings included (not a ranking of its
own), held to the machines replicas are placed on; its table groups the
options rejected for the same reasons and says which were measured."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, cast

from inferd.api.engine_settings import EngineSettings
from inferd.catalog import load_catalog
from inferd.catalog.workload import (
    Workload,
    WorkloadRecommendation,
    recommend_for_workload,
)
from inferd.console.sources import CONSOLE_CHAT_WORKLOAD, ConsoleSources, rejected_groups
from inferd.console.web import environment

CATALOG = load_catalog()
NOT_USED = cast(Any, None)  # the parts of the console these reads never touch


def sources(recommender: Any = None) -> ConsoleSources:
    return ConsoleSources(
        endpoints=NOT_USED, usage=NOT_USED, accounts=NOT_USED, catalog=CATALOG,
        resolve=NOT_USED, public_url="http://x", cost_so_far=lambda _: 0.0,
        model_owner=lambda _: None, recommender=recommender,
    )  # fmt: skip


def test_the_console_asks_the_service_with_the_endpoints_engine_settings() -> None:
    asked: list[tuple[str, Workload, str, EngineSettings | None]] = []

    def service(
        name: str, work: Workload, location: str, settings: EngineSettings | None
    ) -> WorkloadRecommendation:
        asked.append((name, work, location, settings))
        return recommend_for_workload(
            CATALOG.models.get(name), CATALOG.gpus, work, location, engine_settings=settings
        )

    settings = EngineSettings(enableChunkedPrefill=False, maxNumSeqs=8)
    rec = sources(service).recommendation("llama-3.1-8b-instruct", "us-east", settings)
    assert asked == [("llama-3.1-8b-instruct", CONSOLE_CHAT_WORKLOAD, "us-east", settings)]
    expected = recommend_for_workload(
        CATALOG.models.get("llama-3.1-8b-instruct"), CATALOG.gpus, CONSOLE_CHAT_WORKLOAD,
        "us-east", engine_settings=settings,
    )  # fmt: skip
    assert rec.to_dict() == expected.to_dict()


def test_without_a_service_the_console_gives_the_same_answer() -> None:
    rec = sources().recommendation("llama-3.1-8b-instruct", "us-east")
    expected = recommend_for_workload(
        CATALOG.models.get("llama-3.1-8b-instruct"), CATALOG.gpus, CONSOLE_CHAT_WORKLOAD, "us-east"
    )
    assert rec.to_dict() == expected.to_dict()
    # The settings change the answer: prompts as passes of their own.
    off = sources().recommendation(
        "llama-3.1-8b-instruct", "us-east", EngineSettings(enableChunkedPrefill=False)
    )
    best, best_off = rec.best(), off.best()
    assert best is not None and best_off is not None
    assert best.to_dict()["tpotP95Ms"] != best_off.to_dict()["tpotP95Ms"]


def test_options_beyond_the_machines_are_rejected_as_the_api_rejects_them() -> None:
    # A 4-slot machine: the recommender alone sizes an 8B chat model on CPU
    # at one request/s with dozens of CPU replicas, and ranks it first.
    alone = sources().recommendation("llama-3.1-8b-instruct", "local")
    best = alone.best()
    assert best is not None and best.gpu_type == "cpu" and best.replicas > 4
    held = sources().placeable("llama-3.1-8b-instruct", "local", {("local", "cpu"): 4})
    assert held.best() is None
    moved = held.rejected[0]
    assert (moved.gpu_type, moved.fits) == ("cpu", False)
    assert moved.reasons == (
        f"needs {best.replicas} CPU replica(s); the machines of local run 4 (cpu_replica_slots)",
    )
    # What fits the machine stays, and a location the launcher does not know keeps its options.
    tiny = sources().placeable("tiny-chat", "local", {("local", "cpu"): 4})
    assert (
        tiny.best() is not None
        and tiny.best() == sources().recommendation("tiny-chat", "local").best()
    )
    elsewhere = sources().placeable("llama-3.1-8b-instruct", "us-east", {("local", "cpu"): 4})
    assert elsewhere == sources().recommendation("llama-3.1-8b-instruct", "us-east")


def test_the_options_table_groups_rejections_and_says_what_was_measured() -> None:
    def service(
        name: str, work: Workload, location: str, settings: EngineSettings | None
    ) -> WorkloadRecommendation:
        rec = recommend_for_workload(CATALOG.models.get(name), CATALOG.gpus, work, location)
        first = dataclasses.replace(rec.options[0], basis="measured on 1 x cpu, 2026-11-20")
        return dataclasses.replace(rec, options=(first, *rec.options[1:]))

    rec = sources(service).placeable("tiny-chat", "us-east", {})
    groups = rejected_groups(rec.rejected)
    # tiny-chat's 2 heads split over neither 4 nor 8 GPUs: 14 options, 2 reasons.
    assert len(rec.rejected) == 14 and [len(g.options) for g in groups] == [7, 7]
    html = (
        environment()
        .get_template("_options.html")
        .render(rec=rec, rejected=groups, location="us-east", model_kind="chat", chosen="")
    )
    assert html.count('class="rejected"') == 2 and html.count("7 options") == 2
    assert groups[0].reasons in html and groups[0].shapes in html
    assert groups[0].shapes.startswith("us-east 4 x ") and ", 4 x L4" in groups[0].shapes
    basis = re.findall(r'<td data-testid="basis">([^<]*)</td>', html)
    assert basis[0] == "measured on 1 x cpu, 2026-11-20" and set(basis[1:]) == {"estimated"}
    assert len(basis) == len(rec.options)
