"""Wire models of the management API (`/inference/...`); no I/O.

Requests are strict (a string where an integer belongs is a 400, not a
coercion) and closed (an unknown field is a 400: a misspelt `maxReplica`
must not be silently dropped). Responses are described here for the OpenAPI
document; the server builds read responses as plain dicts of exactly this
shape (`inferd.control.endpoints.records`), and tests hold the two together.

Every integer has an upper bound: the store's integers are 64-bit, and an
unbounded number must be a 400, never an overflow.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferd.api.engine_settings import EngineSettings

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
MAX_GPU_COUNT = 64
MAX_REPLICAS_LIMIT = 1024
MAX_RETENTION_SECONDS = 7 * 24 * 3600
DEFAULT_MIN_REPLICAS = 1
DEFAULT_RETENTION_SECONDS = 600
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"

EndpointStatusName = Literal[
    "pending", "initializing", "running", "updating", "scaledToZero", "failed", "deleting"
]
ReplicaStatusName = Literal["starting", "loading", "ready", "draining", "stopped", "failed"]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _Response(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class CreateEndpointRequest(_Request):
    """Body of `POST /inference/endpoints`."""

    name: str = Field(
        pattern=NAME_PATTERN,
        description="Unique name: lowercase letters, digits and '-', 1-63 characters, "
        "starting with a letter or digit.",
        examples=["my-chat"],
    )
    modelName: str = Field(
        min_length=1, max_length=128, description="A model of GET /inference/models."
    )
    gpuType: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="A GPU type offered in the location. Omitted: the recommended type "
        "for the model (best cost per output token or image).",
    )
    gpuCount: int | None = Field(
        None,
        ge=1,
        le=MAX_GPU_COUNT,
        description="GPUs per replica, one of the counts allowed for the type. Omitted: "
        "the recommended count for the type.",
    )
    locationName: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="A location of GET /inference/locations. Omitted: the server's "
        "default location (setting default_location, 'local' unless configured).",
    )
    minReplicas: int = Field(
        DEFAULT_MIN_REPLICAS,
        ge=0,
        le=MAX_REPLICAS_LIMIT,
        description="Lower bound of replicas; 0 enables scale-to-zero.",
    )
    maxReplicas: int | None = Field(
        None,
        ge=1,
        le=MAX_REPLICAS_LIMIT,
        description="Upper bound of replicas, at most the server's max_replicas_cap. "
        "Omitted: max(1, minReplicas).",
    )
    scaleToZeroRetentionPeriodSeconds: int = Field(
        DEFAULT_RETENTION_SECONDS,
        ge=1,
        le=MAX_RETENTION_SECONDS,
        description="Idle seconds before an endpoint with minReplicas 0 scales to zero.",
    )
    projectId: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="Project the endpoint belongs to. Omitted: the caller's only project "
        "where it may create endpoints (the operator: 'default').",
    )
    engineSettings: EngineSettings | None = Field(
        None,
        description="How the replicas run their engine (context length, dtype, "
        "quantization, KV-cache dtype, batch, prefix caching, chunked prefill, speculative "
        "decoding), checked against the model. Omitted: the server's defaults.",
    )


class RegisterModelRequest(_Request):
    """Body of `POST /inference/models`."""

    source: str = Field(
        min_length=1,
        max_length=1024,
        description="A Hugging Face repository id (org/name) or an absolute directory on "
        "the server holding config.json (a transformers checkpoint) or model_index.json "
        "(a diffusers pipeline).",
        examples=["Qwen/Qwen2.5-7B-Instruct"],
    )
    revision: str | None = Field(
        None, min_length=1, max_length=100, description="Branch, tag or commit of a repository."
    )
    name: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$",
        description="Name endpoints use as modelName. Omitted: the source's last part, lowercased.",
    )
    description: str | None = Field(None, max_length=500)
    projectId: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="The project the model belongs to (only its members see it). Omitted: "
        "the operator key registers a global model; a user's key, in the one project where "
        "the user may create endpoints.",
    )


class ProfilePointBody(_Request):
    concurrency: int = Field(ge=1, le=4096)
    requests: int = Field(ge=1, le=10_000_000)
    outputTokensPerS: float = Field(0.0, ge=0)
    ttftP95S: float = Field(0.0, ge=0)
    tpotP95S: float = Field(0.0, ge=0)
    imagesPerS: float = Field(0.0, ge=0)
    secondsPerImageP95: float = Field(0.0, ge=0)


class RecordProfileRequest(_Request):
    """Body of `POST /inference/models/{name}/profiles`: what `inferd bench` measured."""

    gpuType: str = Field(min_length=1, max_length=128)
    gpuCount: int = Field(ge=1, le=MAX_GPU_COUNT)
    promptTokens: int = Field(0, ge=0, le=10_000_000)
    outputTokens: int = Field(ge=1, le=10_000_000)
    imageSize: str = Field("", max_length=16)
    endpoint: str = Field("", max_length=256)
    points: list[ProfilePointBody] = Field(min_length=1, max_length=64)


class UpdateEndpointRequest(_Request):
    """Body of `PATCH /inference/endpoints/{id}`: omitted or null fields stay as they are."""

    minReplicas: int | None = Field(None, ge=0, le=MAX_REPLICAS_LIMIT)
    maxReplicas: int | None = Field(None, ge=1, le=MAX_REPLICAS_LIMIT)
    scaleToZeroRetentionPeriodSeconds: int | None = Field(None, ge=1, le=MAX_RETENTION_SECONDS)
    gpuType: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="A new GPU type (replicas are replaced). With gpuCount omitted, the "
        "recommended count for the new type.",
    )
    gpuCount: int | None = Field(None, ge=1, le=MAX_GPU_COUNT)
    engineSettings: EngineSettings | None = Field(
        None,
        description="Changes to the engine settings, as a JSON merge patch: a field given "
        "replaces the current one, null clears it (back to the server's default), the others "
        "stay. A change replaces the replicas (new ones start, the old drain once they serve).",
    )


class RegisterAdapterRequest(_Request):
    """Body of `POST /inference/endpoints/{id}/adapters`."""

    name: str = Field(
        pattern=ADAPTER_NAME_PATTERN,
        description="What requests put in `model` to be served with this adapter: letters, "
        "digits, '.', '_', '-' and ':', 1-64 characters, starting with a letter or digit.",
        examples=["sql-lora"],
    )
    source: str = Field(
        min_length=1,
        max_length=1024,
        description="A PEFT LoRA adapter: a Hugging Face repository id (org/name) or an "
        "absolute directory on the server holding adapter_config.json and "
        "adapter_model.safetensors. Checked against the endpoint's base model.",
        examples=["/adapters/sql-lora"],
    )


class Adapter(_Response):
    name: str
    source: str
    rank: int
    baseModel: str | None = Field(
        description="The base the adapter says it was trained on (PEFT's "
        "base_model_name_or_path), as written by its trainer."
    )
    createdAt: str = Field(description="RFC 3339 UTC.")


class AdapterList(_Response):
    data: list[Adapter]


class AdapterUsageRow(_Response):
    hour: str = Field(description="Start of the hour, RFC 3339 UTC.")
    requests: int = Field(description="Requests the adapter answered (2xx).")
    promptTokens: int
    completionTokens: int


class AdapterUsageList(_Response):
    data: list[AdapterUsageRow]


class Replica(_Response):
    gpus: int = Field(description="GPUs used by the replica.")
    status: ReplicaStatusName
    id: str = Field(description="ID of the replica.")
    statusReason: str | None = Field(
        description="Why the replica is in this status (draining, failed), or null."
    )
    since: str | None = Field(
        description="RFC 3339 UTC time the replica entered its status: with `status` "
        "`loading`, how long the model has been loading."
    )
    engine: str | None = Field(
        None,
        description="The engine serving the model (vllm, transformers, diffusers), as the "
        "replica reports it; null until it has chosen one. Chat models run on transformers "
        "where vLLM is not installed.",
    )
    node: str | None = Field(
        None,
        description="Where the replica runs: `local` on the control plane's machine; on a "
        "Ray cluster the node's address and id. Null before it is placed.",
    )
    adapters: list[str] = Field(
        default_factory=list,
        description="The LoRA adapters its engine holds now (the gateway prefers a replica "
        "that holds the adapter a request names), as it last reported.",
    )
    unresponsiveSince: str | None = Field(
        None,
        description="RFC 3339 UTC time since which the replica has not been heard to serve "
        "(no status report, answer or health-probe answer): new requests go to the "
        "endpoint's other ready replicas while there are any, and it is probed. Null while "
        "it is heard. Only silence far longer than this (`replica_dead_after_seconds`) "
        "ends a replica whose process lives.",
    )


class ReplicaFailureInfo(_Response):
    replicaId: str
    reason: str = Field(description="Why it failed (engine death, exit code, lost node, ...).")
    at: str = Field(description="RFC 3339 UTC.")


class EndpointRecord(_Response):
    """The endpoint record of the specification (2.1), plus inferd's extra fields."""

    id: str = Field(description="UUID of the endpoint.", json_schema_extra={"format": "uuid"})
    name: str
    modelName: str
    gpuType: str
    gpuCount: int
    locationName: str
    minReplicas: int
    maxReplicas: int
    currentReplicas: int = Field(description="Replicas that exist now (not stopped or failed).")
    replicas: list[Replica]
    scaleToZeroRetentionPeriodSeconds: int
    hourlyPrice: float = Field(
        description="Price of one replica-hour at this GPU type, count and location, in `currency`."
    )
    status: EndpointStatusName
    url: str = Field(description="Base URL of the endpoint's inference API.")
    exampleCommand: str = Field(
        description="A curl command for this endpoint, with the literal <ACCESS_TOKEN>."
    )
    currency: str = Field(description="ISO 4217 code of hourlyPrice.")
    statusReason: str | None = Field(
        description="Why the endpoint is failed, or pending (for example waiting for GPU "
        "capacity); null otherwise."
    )
    createdAt: str = Field(description="RFC 3339 UTC.")
    updatedAt: str = Field(description="RFC 3339 UTC.")
    projectId: str = Field(description="The project the endpoint belongs to.")
    costSoFar: float = Field(
        description="Cost of the endpoint's replica-hours this calendar month (UTC), in "
        "`currency`, from the price table."
    )
    lastReplicaFailure: ReplicaFailureInfo | None = Field(
        None,
        description="The most recent replica failure of this endpoint (kept after the "
        "replica is replaced), or null.",
    )
    engineSettings: EngineSettings = Field(
        description="The engine settings set on this endpoint; a setting left out is the "
        "server's default.",
    )


class CreatedEndpoint(EndpointRecord):
    accessToken: str = Field(
        description="Bearer token for the endpoint's inference API. Shown only in this "
        "response; POST /inference/endpoints/{id}/access-token issues a new one."
    )


class EndpointList(_Response):
    data: list[EndpointRecord]
    continue_: str | None = Field(
        default=None,
        alias="continue",
        description="Present when more items follow: pass it as the `continue` query "
        "parameter, with the same filters, for the next page. Absent on the last page.",
    )


class AccessToken(_Response):
    accessToken: str = Field(description="The new token; the previous one no longer works.")


CLIENT_TOKEN_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"


class CreateClientTokenRequest(_Request):
    """Body of `POST /inference/endpoints/{id}/tokens`."""

    name: str = Field(
        pattern=CLIENT_TOKEN_NAME_PATTERN,
        description="Who calls with it (an application, a person): lower-case letters, "
        "digits, '.', '_' and '-', 1-63 characters, starting with a letter or digit; "
        "unique on the endpoint; 'owner' is the endpoint's own token. It names the "
        "client in metrics.",
        examples=["billing-app"],
    )
    weight: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="Its share of the endpoint when the endpoint is at capacity, against "
        "the other tokens' weights (the owner's token weighs 1): held requests are "
        "released by weighted fair queuing on tokens served.",
    )
    requestsPerMinute: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="At most this many requests a minute (a burst of up to a minute's "
        "worth); past it a request is answered 429 with Retry-After. Counted by each "
        "server instance. Null: no limit.",
    )


class ClientTokenInfo(_Response):
    name: str
    hint: str = Field(description="The token's prefix and last 4 characters.")
    weight: float
    requestsPerMinute: int | None
    createdAt: str = Field(description="RFC 3339 UTC.")
    lastUsedAt: str | None = Field(description="RFC 3339 UTC, or null if never used.")


class CreatedClientToken(ClientTokenInfo):
    token: str = Field(
        description="The bearer token for the endpoint's inference API. Shown only in "
        "this response; only its digest is kept."
    )


class ClientTokenList(_Response):
    data: list[ClientTokenInfo]


class LeaderStatus(_Response):
    instance: str | None = Field(description="The instance that leads (None: none known yet).")
    term: int | None = Field(description="The leader's term; each new leader's is higher.")
    self: bool = Field(description="Whether the instance that answered leads.")


class Health(_Response):
    status: Literal["ok"]
    instance: str | None = Field(
        None, description="The instance that answered (only with several instances)."
    )
    leader: LeaderStatus | None = Field(
        None, description="Who leads (only with several instances)."
    )


class ErrorDetail(_Response):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(_Response):
    error: ErrorDetail


# --- catalog responses ---------------------------------------------------------------
# Built from the catalog's own `to_dict()` output; fields the catalog adds
# later are left out until they are documented here (extra="ignore"), so the
# answers never carry an undocumented field.


class _CatalogResponse(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ModelInfo(_CatalogResponse):
    name: str
    kind: Literal["chat", "image", "embedding", "rerank"]
    source: str = Field(description="Hugging Face repository id, builtin:NAME, or a directory.")
    description: str
    parameters: int
    architecture: dict[str, Any] = Field(
        description="Architecture facts the GPU recommender uses (layers, heads, dtype, ...)."
    )
    # Chat models only: vLLM's parsers for tool calls and reasoning (null:
    # requests with tools, or reasoning output, are not supported).
    toolCallParser: str | None = None
    reasoningParser: str | None = None
    # Image models only; null for chat models.
    defaultSize: str | None = None
    defaultSteps: int | None = None
    defaultGuidanceScale: float | None = None
    maxN: int | None = None
    minSide: int | None = None
    maxSide: int | None = None
    sideMultiple: int | None = None
    registered: bool = Field(
        False, description="True: added through POST /inference/models (deletable)."
    )
    projectId: str | None = Field(None, description="Owning project; null: global.")
    revision: str | None = None
    architectureClass: str | None = Field(
        None, description="The model class its files name (vLLM architecture or pipeline)."
    )
    chatTemplate: str | None = Field(None, description="Where its chat template was found.")
    createdAt: str | None = None


class ModelList(_Response):
    data: list[ModelInfo]
    continue_: str | None = Field(
        default=None,
        alias="continue",
        description="Present when more models follow: pass it as the `continue` query "
        "parameter, with the same filters, for the next page. Absent on the last page.",
    )


class GpuCapacity(_CatalogResponse):
    """GPUs of one type in one location, as the launcher sees them now."""

    total: int = Field(description="GPUs (for cpu: CPU replica slots) the nodes declare.")
    free: int = Field(description="Of those, not held by a replica.")


class GpuTypeInfo(_CatalogResponse):
    name: str = Field(description="The identifier used as gpuType.")
    displayName: str
    memoryGb: float
    memoryBandwidthGbps: float
    bf16Tflops: float = Field(description="Dense bf16 TFLOP/s.")
    interconnect: Literal["nvlink", "pcie", "none"]
    memoryMib: int | None
    totalMemoryGb: float
    generation: Literal["ampere", "ada", "hopper", "cpu"] = Field(
        default="ampere",
        description="Tensor-core generation: which fitted efficiencies the recommender uses "
        "(ada and hopper have FP8 tensor cores).",
    )
    allowedCounts: list[int] = Field(description="GPUs per replica allowed for this type.")
    capacity: dict[str, GpuCapacity] = Field(
        default_factory=dict,
        description="Live: location -> this type's GPUs there (locations with none are left out).",
    )


class GpuTypeList(_Response):
    data: list[GpuTypeInfo]


class LocationInfo(_CatalogResponse):
    name: str
    description: str
    offers: dict[str, float] = Field(description="GPU type -> price per GPU-hour.")
    capacity: dict[str, GpuCapacity] = Field(
        default_factory=dict,
        description="Live: GPU type -> GPUs of that type here (empty: no node in this location).",
    )


class LocationList(_Response):
    currency: str
    data: list[LocationInfo]


class GpuOptionInfo(_CatalogResponse):
    location: str
    gpuType: str
    gpuCount: int
    fits: bool
    reasons: list[str] = Field(description="Why it fits and how fast, or why it was rejected.")
    hourlyPrice: float = Field(description="One replica-hour.")
    memoryNeededGb: float
    memoryAvailableGb: float
    estOutputTokensPerS: float | None
    costPerMillionTokens: float | None
    estSecondsPerImage: float | None
    costPerImage: float | None
    evidence: str = Field(
        default="", description="What the estimate rests on: the measurements and its error band."
    )
    errorBand: float | None = Field(
        default=None, description="Relative error band of the estimate (0.12: ±12%)."
    )


class RecommendationInfo(_CatalogResponse):
    model: str
    location: str | None = Field(description="null: every location was considered.")
    currency: str
    best: GpuOptionInfo | None
    options: list[GpuOptionInfo] = Field(description="Fitting options, best first.")
    rejected: list[GpuOptionInfo]
    assumptions: dict[str, Any]


class WorkloadOptionInfo(_CatalogResponse):
    location: str
    gpuType: str
    gpuCount: int
    fits: bool
    reasons: list[str] = Field(description="How it serves the load, or why it was rejected.")
    basis: str = Field(description="'estimated', or 'measured on N x TYPE, DATE'.")
    hourlyPrice: float = Field(description="One replica-hour.")
    memoryAvailableGb: float
    memoryNeededGb: float | None
    batch: int | None = Field(description="Largest batch meeting the targets and fitting.")
    outputTokensPerS: float | None = Field(
        description="Per replica at that batch, prefill counted."
    )
    requestsPerS: float | None = Field(description="Requests (or images) per second per replica.")
    ttftP95Ms: float | None
    tpotP95Ms: float | None
    imagesPerMinute: float | None
    secondsPerImageP95: float | None
    replicas: int = Field(description="Replicas the stated load needs.")
    totalHourlyPrice: float = Field(description="All those replicas, per hour.")
    costPerMillionTokens: float | None
    costPerImage: float | None
    minReplicas: int = Field(description="Suggested minReplicas.")
    maxReplicas: int = Field(description="Suggested maxReplicas.")
    evidence: str = Field(
        default="", description="What the estimate rests on: the measurements and its error band."
    )
    errorBand: float | None = Field(
        default=None, description="Relative error band of the estimate (0.12: ±12%)."
    )


class WorkloadRecommendationInfo(_CatalogResponse):
    model: str
    location: str | None
    currency: str
    workload: dict[str, Any] = Field(description="The load and targets the answer is for.")
    best: WorkloadOptionInfo | None
    options: list[WorkloadOptionInfo] = Field(description="Fitting options, cheapest total first.")
    rejected: list[WorkloadOptionInfo]
    assumptions: dict[str, Any]


class ProfileInfo(_CatalogResponse):
    modelName: str
    gpuType: str
    gpuCount: int
    kind: Literal["chat", "image"]
    promptTokens: int
    outputTokens: int
    imageSize: str
    points: list[dict[str, Any]]
    measuredAt: str
    endpoint: str


class ProfileList(_Response):
    data: list[ProfileInfo]
