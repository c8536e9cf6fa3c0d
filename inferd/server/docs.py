"""What an operation of the route table says about itself, for the OpenAPI
document (`inferd.server.openapi`, generated from the table): a summary, the
body it reads, the answers it gives and the errors it can answer with. The
wire models (`inferd.api`) are the schemas; nothing here is written twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class Answer:
    """A success answer: its status, what it means and its body's model
    (None: no body; several: one of them)."""

    status: int
    description: str
    body: type[BaseModel] | tuple[type[BaseModel], ...] | None = None
    # Operations (by id) on the thing this answer made, whose `{id}` is the
    # answer's `id` (clients and stateful fuzzers follow them).
    links: tuple[str, ...] = ()


@dataclass(frozen=True)
class Param:
    """A query parameter: what it means and its JSON schema."""

    description: str | None
    schema: Mapping[str, Any]
    required: bool = False
    # Filled in per server: "locations" is an enum of the catalog's locations.
    catalog: str | None = None


@dataclass(frozen=True)
class Doc:
    operation_id: str
    summary: str
    answers: tuple[Answer, ...]
    # Error statuses besides 401 (every operation that needs a key) and 400
    # (every operation refuses a query parameter it does not read).
    errors: tuple[int, ...] = ()
    body: type[BaseModel] | None = None
    # Query parameters this operation reads that are not list parameters
    # (`inferd.server.paging.QUERY_DOCS`), or that mean something else here.
    query: Mapping[str, Param] = field(default_factory=dict)


def ok(status: int, description: str, body: type[BaseModel] | None = None) -> tuple[Answer]:
    return (Answer(status, description, body),)
