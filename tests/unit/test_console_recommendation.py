"""The console's GPU options are the API's answer: `recommend_for_workload`
through the model service, engine settings included (not a ranking of its
own)."""

from __future__ import annotations

from typing import Any, cast

from inferd.api.engine_settings import EngineSettings
from inferd.catalog import load_catalog
from inferd.catalog.workload import (
    Workload,
    WorkloadRecommendation,
    recommend_for_workload,
)
from inferd.console.sources import CONSOLE_CHAT_WORKLOAD, ConsoleSources

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
