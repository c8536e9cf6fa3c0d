"""The stored tables, each described once: its columns, how each column is
stored, and the record a row becomes. Statements and the row <-> record
mapping are derived from here, for every engine (a dialect says how each
storage kind is written: `time` is RFC 3339 text in SQLite, TIMESTAMPTZ in
PostgreSQL). A new column: add it here and to the record, and append a
migration step (`migrations.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from inferd.api.engine_settings import EngineSettings
from inferd.catalog.registered import MeasuredProfile, RegisteredModel
from inferd.control.accounts.model import (
    AuditAction,
    AuditEntry,
    Membership,
    Project,
    UsageRow,
    User,
    UserKey,
)
from inferd.control.accounts.quota import Quota
from inferd.control.accounts.roles import Role
from inferd.control.batches.model import Batch, BatchFile, BatchStatus, Capacity, Counts, Usage
from inferd.control.model import (
    Adapter,
    AdapterUsage,
    ClientToken,
    Endpoint,
    ReplicaRecord,
    parse_rfc3339,
    rfc3339,
)
from inferd.control.stores.sql.database import Dialect, Row

R = TypeVar("R")


@dataclass(frozen=True)
class Type:
    """How a column is stored (`storage`: text, int, real, bytes, time, json)
    and, for a domain value, how it becomes a plain one and back."""

    storage: str
    dump: Callable[[Any], Any] | None = None
    load: Callable[[Any], Any] | None = None


def quota_from_plain(data: Mapping[str, Any] | None) -> Quota:
    data = data or {}
    return Quota(
        endpoints=data.get("endpoints"),
        replicas=data.get("replicas"),
        gpus={str(k): int(v) for k, v in (data.get("gpus") or {}).items()},
    )


TEXT, INT, REAL, BYTES, TIME = Type("text"), Type("int"), Type("real"), Type("bytes"), Type("time")
JSON = Type("json", dump=dict)
JSON_LIST = Type("json", dump=list)
ENGINE = Type("text", dump=EngineSettings.to_json, load=EngineSettings.from_json)
PLACEMENT = Type("json", dump=dict, load=lambda v: {str(k): str(x) for k, x in v.items()})
QUOTA = Type("json", dump=Quota.to_dict, load=quota_from_plain)
ROLE = Type("text", dump=lambda role: role.value, load=Role)
ACTION = Type("text", dump=lambda action: action.value, load=AuditAction)
CAPACITY = Type("text", dump=lambda capacity: capacity.value, load=Capacity)


@dataclass(frozen=True)
class Column:
    name: str
    type: Type = TEXT
    field: str = ""  # the record's attribute, where it is named otherwise

    @property
    def attribute(self) -> str:
        return self.field or self.name


class Table(Generic[R]):
    """`record(**values)` builds a record from a row (or `load(values)`);
    `dump(record)` gives the values of a row (default: its attributes)."""

    def __init__(
        self,
        name: str,
        columns: tuple[Column, ...],
        record: Callable[..., R],
        *,
        dump: Callable[[R], Mapping[str, Any]] | None = None,
        generated: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.columns = columns
        self._record = record
        self._dump = dump
        self._by_name = {c.name: c for c in columns}
        self.names = ", ".join(c.name for c in columns)
        self.select = f"SELECT {self.names} FROM {name}"
        written = [c.name for c in columns if c.name not in generated]
        self._written = [self._by_name[n] for n in written]
        self.insert = (
            f"INSERT INTO {name} ({', '.join(written)}) VALUES ({', '.join('?' for _ in written)})"
        )
        self._decoders: dict[str, list[tuple[str, Callable[[Any], Any] | None]]] = {}

    def encode(self, dialect: Dialect, column: str, value: Any) -> Any:
        """A value of `column` as the engine stores it (also for a WHERE)."""
        type_ = self._by_name[column].type
        if value is None:
            return None
        if type_.dump is not None:
            value = type_.dump(value)
        return dialect.encode(type_.storage, value)

    def values(self, dialect: Dialect, record: R) -> tuple[Any, ...]:
        """The parameters of `insert` for `record`."""
        if self._dump is not None:
            plain = self._dump(record)
            return tuple(self.encode(dialect, c.name, plain[c.name]) for c in self._written)
        return tuple(
            self.encode(dialect, c.name, getattr(record, c.attribute)) for c in self._written
        )

    def record(self, dialect: Dialect, row: Row) -> R:
        decoders = self._decoders.get(dialect.name)
        if decoders is None:
            decoders = self._decoders[dialect.name] = [
                (c.attribute, _composed(dialect.decoder(c.type.storage), c.type.load))
                for c in self.columns
            ]
        values = {
            attribute: value if decode is None or value is None else decode(value)
            for (attribute, decode), value in zip(decoders, row, strict=True)
        }
        return self._record(**values)


def _composed(
    first: Callable[[Any], Any] | None, then: Callable[[Any], Any] | None
) -> Callable[[Any], Any] | None:
    if first is None or then is None:
        return first or then
    return lambda value: then(first(value))


_ENDPOINT_COLUMNS = (
    Column("id"), Column("name"), Column("model_name"), Column("model_kind"),
    Column("gpu_type"), Column("gpu_count", INT), Column("location_name"),
    Column("min_replicas", INT), Column("max_replicas", INT), Column("retention_seconds", INT),
    Column("hourly_price", REAL), Column("currency"), Column("created_at", TIME),
    Column("updated_at", TIME), Column("deleting_at", TIME), Column("generation", INT),
    Column("project_id"), Column("engine_settings", ENGINE),
)  # fmt: skip
ENDPOINTS = Table("endpoints", _ENDPOINT_COLUMNS, Endpoint)

REPLICAS = Table("replicas", (
    Column("id"), Column("endpoint_id"), Column("generation", INT), Column("gpu_type"),
    Column("gpu_count", INT), Column("secret_hash", BYTES), Column("status"),
    Column("created_at", TIME), Column("updated_at", TIME), Column("node"),
    Column("placement", PLACEMENT), Column("reason"), Column("url"),
    Column("unresponsive_since", TIME),
), ReplicaRecord)  # fmt: skip

ADAPTERS = Table("endpoint_adapters", (
    Column("endpoint_id"), Column("name"), Column("source"), Column("rank", INT),
    Column("base_model"), Column("created_at", TIME),
), Adapter)  # fmt: skip

CLIENT_TOKENS = Table("endpoint_client_tokens", (
    Column("endpoint_id"), Column("name"), Column("token_hash", BYTES), Column("hint"),
    Column("created_at", TIME), Column("weight", REAL), Column("requests_per_minute", INT),
    Column("last_used_at", TIME),
), ClientToken)  # fmt: skip

ADAPTER_USAGE = Table("adapter_usage_hourly", (
    Column("endpoint_id"), Column("adapter"), Column("hour", TIME), Column("requests", INT),
    Column("prompt_tokens", INT), Column("completion_tokens", INT),
), AdapterUsage)  # fmt: skip

# One JSON document per record (the documented fields of the API), so that
# a newly derived fact needs no migration.
MODELS = Table("registered_models", (
    Column("name"), Column("project_id"), Column("document", JSON), Column("created_at"),
), lambda document, **_: RegisteredModel.from_dict(document),
   dump=lambda m: {"name": m.name, "project_id": m.project_id, "document": m.to_dict(),
                   "created_at": m.created_at})  # fmt: skip

PROFILES = Table("model_profiles", (
    Column("model_name"), Column("gpu_type"), Column("gpu_count", INT),
    Column("document", JSON), Column("measured_at"),
), lambda document, **_: MeasuredProfile.from_dict(document),
   dump=lambda p: {"model_name": p.model_name, "gpu_type": p.gpu_type,
                   "gpu_count": p.gpu_count, "document": p.to_dict(),
                   "measured_at": p.measured_at})  # fmt: skip

PROJECTS = Table("projects", (
    Column("id"), Column("created_at", TIME), Column("quota", QUOTA),
    Column("quota_limit", QUOTA, field="limit"),
), Project)  # fmt: skip

USERS = Table("users", (Column("id"), Column("created_at", TIME)), User)

MEMBERSHIPS = Table("memberships", (
    Column("project_id"), Column("user_id"), Column("role", ROLE), Column("created_at", TIME),
), Membership)  # fmt: skip

USER_KEYS = Table("user_keys", (
    Column("id"), Column("user_id"), Column("name"), Column("key_hash", BYTES), Column("hint"),
    Column("created_at", TIME), Column("last_used_at", TIME), Column("revoked_at", TIME),
    Column("project_id"),
), UserKey)  # fmt: skip

AUDIT_LOG = Table("audit_log", (
    Column("id", INT), Column("at", TIME), Column("project_id"), Column("actor"),
    Column("action", ACTION), Column("target"), Column("detail", JSON),
), AuditEntry, generated=("id",))  # fmt: skip

USAGE = Table("usage_hourly", (
    Column("endpoint_id"), Column("project_id"), Column("hour", TIME), Column("gpu_type"),
    Column("gpu_count", INT), Column("replica_seconds", REAL), Column("requests", INT),
    Column("prompt_tokens", INT), Column("completion_tokens", INT), Column("images", INT),
    Column("cost", REAL),
), UsageRow)  # fmt: skip

# The Batch API (`inferd.control.batches`). A file's content is kept in
# chunks (`batch_file_chunks`), a batch's requests and results one row each
# (`batch_requests`, read by the repository itself).
BATCH_FILES = Table("batch_files", (
    Column("id"), Column("endpoint_id"), Column("project_id"), Column("purpose"),
    Column("filename"), Column("bytes", INT), Column("created_at", TIME), Column("lines", INT),
    Column("batch_id"), Column("holds"),
), BatchFile)  # fmt: skip


def _batch(
    *, status: str, times: dict[str, str], total: int, completed: int, failed: int,
    requests: int, prompt_tokens: int, completion_tokens: int, cost: float, **rest: Any,
) -> Batch:  # fmt: skip
    return Batch(
        status=BatchStatus(status),
        times={name: parse_rfc3339(at) for name, at in times.items()},
        counts=Counts(total, completed, failed),
        usage=Usage(requests, prompt_tokens, completion_tokens, cost),
        **rest,
    )


def _batch_row(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.id, "endpoint_id": batch.endpoint_id, "project_id": batch.project_id,
        "url": batch.url, "input_file_id": batch.input_file_id, "status": batch.status.value,
        "created_at": batch.created_at, "expires_at": batch.expires_at,
        "metadata": batch.metadata,
        "times": {name: rfc3339(at) for name, at in batch.times.items()},
        "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        "errors": batch.errors, "total": batch.counts.total,
        "completed": batch.counts.completed, "failed": batch.counts.failed,
        "requests": batch.usage.requests, "prompt_tokens": batch.usage.prompt_tokens,
        "completion_tokens": batch.usage.completion_tokens, "cost": batch.usage.cost,
        "client": batch.client, "capacity": batch.capacity,
    }  # fmt: skip


BATCHES = Table("batches", (
    Column("id"), Column("endpoint_id"), Column("project_id"), Column("url"),
    Column("input_file_id"), Column("status"), Column("created_at", TIME),
    Column("expires_at", TIME), Column("metadata", JSON), Column("times", JSON),
    Column("output_file_id"), Column("error_file_id"), Column("errors", JSON_LIST),
    Column("total", INT), Column("completed", INT), Column("failed", INT),
    Column("requests", INT), Column("prompt_tokens", INT), Column("completion_tokens", INT),
    Column("cost", REAL), Column("client"), Column("capacity", CAPACITY),
), _batch, dump=_batch_row)  # fmt: skip
