"""The replica -> registry wire contract: what a replica reports, typed once.

Both sides use these models: the replica builds its reports with them
(`inferd.replica.reporter`) and the registry's route parses them
(`inferd.control.replicas.registry_api`), so a field cannot mean one thing on one side
and another on the other. Strict: a count that is a string, a status not in
the vocabulary, a negative number is refused (400), never coerced. Fields a
newer replica adds are ignored, so replicas and control plane can be upgraded
one after the other (this is the one contract that crosses machines).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from inferd.vocab import ReplicaStatus

# The gateway -> replica side: where the LoRA adapter a request names is
# (percent-encoded); set by the gateway only, never forwarded from a client.
ADAPTER_SOURCE_HEADER = "x-inferd-adapter-source"
# Set by the gateway only, on a request that continues an answer another
# replica began (its replica died): the final assistant message is this
# request's own earlier output, so its tokens count as completion tokens
# (in usage and against max_tokens/min_tokens), not as prompt tokens.
RESUMED_HEADER = "x-inferd-resumed"
# Set by the gateway only, on a stream it may have to continue elsewhere:
# the replica writes the token ids of each chunk in an SSE comment line
# before its data line (`: ids 12 345`), which the gateway keeps and strips
# (a direct client of a replica reads vLLM-like streams).
TOKEN_IDS_HEADER = "x-inferd-token-ids"
TOKEN_IDS_LINE = b": ids"
# The field of a resumed request's body (with `RESUMED_HEADER`) that carries
# the answer so far as token ids: the replica builds the prompt as the
# original request's prompt ids plus these (`ResumeIn`).
RESUME_FIELD = "inferd_resume"
# Set by the gateway only, on a request of a batch (in-process work): its
# usage is metered by the batch store once, when its result is recorded
# (a request run again after a leader failover would count twice here), so
# the replica reports it apart (`ReplicaUsageReport.batch_*`).
BATCH_REQUEST_HEADER = "x-inferd-batch-request"
# Set by the gateway only, on a request sent to the replica its prompt
# prefix is placed on (`inferd.gateway.placement`): the prefix's key. The
# replica lists the keys placed on it at `PLACED_PREFIXES_PATH`, which is how
# gateway instances that never talk to each other learn where another one
# placed a prefix (`inferd.gateway.placement_claims`).
PLACED_HEADER = "x-inferd-placed"
PLACED_PREFIXES_PATH = "/inferd/placed-prefixes"

MAX_REASON_CHARS = 2000
MAX_URL_CHARS = 2048
MAX_ADAPTERS = 256
# Adapters one report carries usage of (an endpoint has at most 1000).
MAX_ADAPTER_USAGE = 1000

_STRICT = ConfigDict(
    strict=True, extra="ignore", frozen=True, alias_generator=to_camel, populate_by_name=True
)


class ReplicaLoadReport(BaseModel):
    model_config = _STRICT

    # Requests the replica has admitted and not finished (from every gateway).
    in_flight: int = Field(default=0, ge=0)
    # The engine's own counts: running now, queued inside the engine.
    running: int = Field(default=0, ge=0)
    waiting: int = Field(default=0, ge=0)
    kv_cache_usage: float | None = Field(default=None, ge=0, le=1)
    # Tokens the KV cache holds (the gateway places prompt prefixes by it).
    kv_cache_tokens: int | None = Field(default=None, ge=1)
    # Prompt tokens looked up in the engine's prefix cache since the replica
    # started, and those found (cumulative: a lost report loses nothing).
    prefix_cache_queries: int = Field(default=0, ge=0)
    prefix_cache_hits: int = Field(default=0, ge=0)
    # LoRA adapters the engine has loaded now.
    adapters: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list, max_length=MAX_ADAPTERS
    )


class AdapterUsageReport(BaseModel):
    """What the replica has done with one LoRA adapter since it started."""

    model_config = _STRICT

    requests: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)


class ReplicaUsageReport(BaseModel):
    """What the replica has done since it started (cumulative): the control
    plane meters usage from the differences between reports."""

    model_config = _STRICT

    requests: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    images: int = Field(default=0, ge=0)
    # Of the above, what batch requests took (metered by the batch store,
    # not from these reports).
    batch_requests: int = Field(default=0, ge=0)
    batch_prompt_tokens: int = Field(default=0, ge=0)
    batch_completion_tokens: int = Field(default=0, ge=0)
    # Of the above, what each LoRA adapter served (the base model's share is
    # the rest); every adapter used since the replica started.
    adapters: dict[Annotated[str, Field(max_length=200)], AdapterUsageReport] = Field(
        default_factory=dict, max_length=MAX_ADAPTER_USAGE
    )


class ReplicaReport(BaseModel):
    model_config = _STRICT

    replica_id: str = Field(max_length=200)
    endpoint_id: str | None = Field(default=None, max_length=200)
    # Not strict: the JSON text "ready" is the enum's value (unknown words
    # are still refused).
    status: ReplicaStatus = Field(strict=False)
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS)
    # The engine serving the model (vllm, transformers, diffusers, fake);
    # None before it is chosen, and from replicas older than this field.
    engine: str | None = Field(default=None, max_length=40)
    # Where the gateway reaches it; None until it listens.
    url: str | None = Field(default=None, max_length=MAX_URL_CHARS)
    # Increases with every report a replica sends: the registry ignores a
    # report older than one it has applied (they can cross on the wire).
    seq: int = Field(ge=0)
    load: ReplicaLoadReport = ReplicaLoadReport()
    usage: ReplicaUsageReport | None = None
    # Reports are sent from a thread of their own: how long the replica's
    # serving loop has left the reporter's last request for a snapshot
    # unanswered (None: it answered). The process lives either way; a long
    # stall is silence as far as serving goes.
    loop_stalled_s: float | None = Field(default=None, ge=0)

    def to_wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


class ResumeIn(BaseModel):
    """The answer so far of a request the gateway resumes by token ids: the
    output token ids the lost replica streamed, and the text of them the
    client has read (vLLM may hold back the decoded text of the last ones)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    token_ids: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    text: str
