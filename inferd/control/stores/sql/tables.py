"""The stored tables, each described once: its columns, how each column is
stored, and the record a row becomes. Statements and the row <-> record
mapping are derived from here, for every engine (a dialect says how each
storage kind is written: `time` is RFC 3339 text in SQLite, TIMESTAMPTZ in
PostgreSQL). A new column: add it here and to the record, and append a
migration step (`migrations.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import attrgetter
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


_ENUMS = {"role": Role, "action": AuditAction, "status": BatchStatus, "capacity": Capacity}
TYPES = {
    **{storage: Type(storage) for storage in ("text", "int", "real", "bytes", "time")},
    # Enumerations, stored by value.
    **{name: Type("text", dump=lambda v: v.value, load=enum) for name, enum in _ENUMS.items()},
    "json": Type("json", dump=dict), "json_list": Type("json", dump=list),
    "engine": Type("text", dump=EngineSettings.to_json, load=EngineSettings.from_json),
    "placement": Type("json", dump=dict, load=lambda v: {str(k): str(x) for k, x in v.items()}),
    "quota": Type("json", dump=Quota.to_dict, load=quota_from_plain),
    # A batch's times by name, a JSON object of RFC 3339 strings.
    "times": Type("json", dump=lambda times: {name: rfc3339(at) for name, at in times.items()},
                  load=lambda times: {name: parse_rfc3339(at) for name, at in times.items()}),
    # The whole record as its JSON document (the column's field: `*`).
    "document": Type("json", dump=lambda record: record.to_dict()),
}  # fmt: skip


@dataclass(frozen=True)
class Column:
    name: str
    type: Type
    # The record's attribute where it is named otherwise: `part.attribute`
    # (a part of the record, see `Table`), or `*`: the record itself.
    field: str = ""

    @property
    def attribute(self) -> str:
        return self.name if self.field in ("", "*") else self.field

    def getter(self) -> Callable[[Any], Any]:
        return (lambda record: record) if self.field == "*" else attrgetter(self.attribute)


def columns(spec: str) -> tuple[Column, ...]:
    """Columns written `name`, `name:type` (a key of `TYPES`) or
    `name:type=field`, white space apart."""
    found = []
    for word in spec.split():
        word, _, field = word.partition("=")
        name, _, type_ = word.partition(":")
        found.append(Column(name, TYPES[type_ or "text"], field))
    return tuple(found)


class Table(Generic[R]):
    """`record(**values)` builds a record from a row, `parts` its parts (by
    name, for the columns whose field is `part.attribute`); `key`: the primary
    key's columns (by default the first)."""

    def __init__(
        self,
        name: str,
        columns: tuple[Column, ...],
        record: Callable[..., R],
        *,
        key: tuple[str, ...] = (),
        generated: tuple[str, ...] = (),
        parts: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        self.name = name
        self.key = key or (columns[0].name,)
        self.columns = columns
        self._record = record
        self._parts = parts or {}
        self._by_name = {c.name: c for c in columns}
        self.names = ", ".join(c.name for c in columns)
        self.select = f"SELECT {self.names} FROM {name}"
        self.by_key = " AND ".join(f"{c} = ?" for c in self.key)
        self.get = f"{self.select} WHERE {self.by_key}"
        self.delete = f"DELETE FROM {name} WHERE {self.by_key}"
        written = [c for c in columns if c.name not in generated]
        self._written = [(c.name, c.getter()) for c in written]
        self.insert = f"INSERT INTO {name} ({', '.join(c.name for c in written)})" + (
            f" VALUES ({', '.join('?' for _ in written)})"
        )
        self._attributes = tuple(c.attribute for c in columns)
        # A dataclass whose first fields are the columns, in order, is built
        # from the row by position (no keyword dict per row).
        leading = _init_fields(record)[: len(self._attributes)]
        self._positional = not self._parts and leading == self._attributes
        # Per dialect: (position, attribute, decode) of the columns whose
        # stored value is not the record's value as it is.
        self._decoders: dict[str, list[tuple[int, str, Callable[[Any], Any]]]] = {}

    def upsert(self, *, added: tuple[str, ...] = (), replaced: tuple[str, ...] = ()) -> str:
        """`insert`, or where a row of its key is there already: the `added`
        columns added to its own, the `replaced` ones set."""
        sets = [f"{c} = {self.name}.{c} + excluded.{c}" for c in added]
        sets += [f"{c} = excluded.{c}" for c in replaced]
        return f"{self.insert} ON CONFLICT ({', '.join(self.key)}) DO UPDATE SET {', '.join(sets)}"

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
        return tuple(self.encode(dialect, name, get(record)) for name, get in self._written)

    def record(self, dialect: Dialect, row: Row) -> R:
        decoders = self._decoders.get(dialect.name)
        if decoders is None:
            decoders = self._decoders[dialect.name] = self._decoders_for(dialect)
        # The hottest read (every list of endpoints): the row is taken as it
        # is, in C, and only the columns with a codec go through Python.
        if self._positional:
            decoded = list(row)
            for position, _, decode in decoders:
                value = decoded[position]
                if value is not None:
                    decoded[position] = decode(value)
            return self._record(*decoded)
        values = dict(zip(self._attributes, row, strict=True))
        for position, attribute, decode in decoders:
            value = row[position]
            if value is not None:
                values[attribute] = decode(value)
        for part, build in self._parts.items():
            prefix = f"{part}."
            fields = {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}
            values = {k: v for k, v in values.items() if not k.startswith(prefix)}
            values[part] = build(**fields)
        return self._record(**values)

    def _decoders_for(self, dialect: Dialect) -> list[tuple[int, str, Callable[[Any], Any]]]:
        found = []
        for position, column in enumerate(self.columns):
            decode = _composed(dialect.decoders.get(column.type.storage), column.type.load)
            if decode is not None:
                found.append((position, column.attribute, decode))
        return found


def _init_fields(record: Callable[..., Any]) -> tuple[str, ...]:
    """The parameters of a dataclass's constructor, in order (none for
    another callable)."""
    if not isinstance(record, type) or not dataclasses.is_dataclass(record):
        return ()
    return tuple(f.name for f in dataclasses.fields(record) if f.init)


def _composed(
    first: Callable[[Any], Any] | None, then: Callable[[Any], Any] | None
) -> Callable[[Any], Any] | None:
    if first is None or then is None:
        return first or then
    return lambda value: then(first(value))


# fmt: off
_ENDPOINT_COLUMNS = columns("""id name model_name model_kind gpu_type gpu_count:int location_name
    min_replicas:int max_replicas:int retention_seconds:int hourly_price:real currency
    created_at:time updated_at:time deleting_at:time generation:int project_id
    engine_settings:engine""")
ENDPOINTS = Table("endpoints", _ENDPOINT_COLUMNS, Endpoint)
REPLICAS = Table("replicas", columns("""id endpoint_id generation:int gpu_type gpu_count:int
    secret_hash:bytes status created_at:time updated_at:time node placement:placement reason url
    unresponsive_since:time"""), ReplicaRecord)
ADAPTERS = Table("endpoint_adapters", columns(
    "endpoint_id name source rank:int base_model created_at:time"), Adapter,
    key=("endpoint_id", "name"))
CLIENT_TOKENS = Table("endpoint_client_tokens", columns("""endpoint_id name token_hash:bytes hint
    created_at:time weight:real requests_per_minute:int last_used_at:time"""), ClientToken,
    key=("endpoint_id", "name"))
ADAPTER_USAGE = Table("adapter_usage_hourly", columns("""endpoint_id adapter hour:time
    requests:int prompt_tokens:int completion_tokens:int"""), AdapterUsage,
    key=("endpoint_id", "adapter", "hour"))

# One JSON document per record (the documented fields of the API), so that
# a newly derived fact needs no migration.
MODELS = Table("registered_models", columns("name project_id document:document=* created_at"),
               lambda document, **_: RegisteredModel.from_dict(document))
PROFILES = Table("model_profiles", columns(
    "model_name gpu_type gpu_count:int document:document=* measured_at"),
    lambda document, **_: MeasuredProfile.from_dict(document),
    key=("model_name", "gpu_type", "gpu_count"))

PROJECTS = Table("projects", columns("id created_at:time quota:quota quota_limit:quota=limit"),
                 Project)
USERS = Table("users", columns("id created_at:time"), User)
MEMBERSHIPS = Table("memberships", columns("project_id user_id role:role created_at:time"),
                    Membership, key=("project_id", "user_id"))
USER_KEYS = Table("user_keys", columns("""id user_id name key_hash:bytes hint created_at:time
    last_used_at:time revoked_at:time project_id"""), UserKey)
AUDIT_LOG = Table("audit_log", columns(
    "id:int at:time project_id actor action:action target detail:json"), AuditEntry,
    generated=("id",))
USAGE = Table("usage_hourly", columns("""endpoint_id project_id hour:time gpu_type gpu_count:int
    replica_seconds:real requests:int prompt_tokens:int completion_tokens:int images:int
    cost:real"""), UsageRow, key=("endpoint_id", "hour", "gpu_type", "gpu_count"))

# The Batch API (`inferd.control.batches`). A file's content is kept in
# chunks (`batch_file_chunks`), a batch's requests and results one row each
# (`batch_requests`, read by the repository itself).
BATCH_FILES = Table("batch_files", columns("""id endpoint_id project_id purpose filename
    bytes:int created_at:time lines:int batch_id holds"""), BatchFile)
BATCHES = Table("batches", columns("""id endpoint_id project_id url input_file_id status:status
    created_at:time expires_at:time metadata:json times:times output_file_id error_file_id
    errors:json_list total:int=counts.total completed:int=counts.completed
    failed:int=counts.failed requests:int=usage.requests prompt_tokens:int=usage.prompt_tokens
    completion_tokens:int=usage.completion_tokens cost:real=usage.cost client
    capacity:capacity"""),
    Batch, parts={"counts": Counts, "usage": Usage})
# fmt: on
