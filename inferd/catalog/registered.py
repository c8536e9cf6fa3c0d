"""Models registered at run time, measured performance profiles, and the
store ports they live behind.

A registered model is a `ModelSpec` built from the model's own files (see
`describe`), with who owns it (a project, or None: global, added by the
operator) and what was inferred for serving it. A profile is what
`inferd bench` measured for one model on one GPU type and count.

The ports are async so that SQLite (a worker thread) and PostgreSQL (an
async driver) adapters look the same to callers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from inferd.catalog.inspect import (
    InspectError,
    ServingHints,
    inspect_chat,
    inspect_pipeline,
)
from inferd.catalog.models import ModelSpec, parse_model
from inferd.catalog.sources import ModelFiles, ModelSource
from inferd.catalog.support import EngineSupport

_NAME_PART = re.compile(r"[^a-z0-9._-]+")
# A project's model is named `<project>:<name>`: each project has its own
# namespace, so that no name collides with (and so reveals) another
# project's. Global models (the operator's, the catalog's) have bare names.
OWNER_SEP = ":"


def qualified_name(project_id: str | None, name: str) -> str:
    return name if project_id is None else f"{project_id}{OWNER_SEP}{name}"


@dataclass(frozen=True)
class RegisteredModel:
    spec: ModelSpec
    project_id: str | None  # None: global (the operator's)
    revision: str | None
    architecture_class: str  # "LlamaForCausalLM" or the pipeline class
    hints: ServingHints
    created_at: str

    @property
    def name(self) -> str:
        return self.spec.name

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.spec.to_dict(),
            "registered": True,
            "projectId": self.project_id,
            "revision": self.revision,
            "architectureClass": self.architecture_class,
            **self.hints.to_dict(),
            "createdAt": self.created_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegisteredModel:
        """The inverse of `to_dict` (how stores keep the record: one JSON
        document of documented fields, never a pickle)."""
        name = str(data.get("name"))
        # The catalog's name rules hold for the name within its namespace.
        bare = name.rpartition(OWNER_SEP)[2]
        spec = parse_model({**data, "name": bare}, f"registered model {name!r}")
        return cls(
            spec=dataclasses.replace(spec, name=name),
            project_id=data.get("projectId"),
            revision=data.get("revision"),
            architecture_class=str(data["architectureClass"]),
            hints=ServingHints(
                chat_template=data.get("chatTemplate"),
                tool_call_parser=data.get("toolCallParser"),
                reasoning_parser=data.get("reasoningParser"),
            ),
            created_at=str(data["createdAt"]),
        )


@dataclass(frozen=True)
class ProfilePoint:
    """One concurrency level of a benchmark run."""

    concurrency: int
    requests: int
    output_tokens_per_s: float = 0.0  # chat: every sequence together
    ttft_p95_s: float = 0.0
    tpot_p95_s: float = 0.0
    images_per_s: float = 0.0  # image
    seconds_per_image_p95: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "outputTokensPerS": self.output_tokens_per_s,
            "ttftP95S": self.ttft_p95_s,
            "tpotP95S": self.tpot_p95_s,
            "imagesPerS": self.images_per_s,
            "secondsPerImageP95": self.seconds_per_image_p95,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfilePoint:
        return cls(
            concurrency=int(d["concurrency"]),
            requests=int(d["requests"]),
            output_tokens_per_s=float(d.get("outputTokensPerS", 0.0)),
            ttft_p95_s=float(d.get("ttftP95S", 0.0)),
            tpot_p95_s=float(d.get("tpotP95S", 0.0)),
            images_per_s=float(d.get("imagesPerS", 0.0)),
            seconds_per_image_p95=float(d.get("secondsPerImageP95", 0.0)),
        )


@dataclass(frozen=True)
class MeasuredProfile:
    """Throughput and latency of one model on `gpu_count x gpu_type`, measured."""

    model_name: str
    gpu_type: str
    gpu_count: int
    kind: str  # "chat" | "image"
    prompt_tokens: int  # chat: per request; image: 0
    output_tokens: int  # chat: per request; image: steps
    points: tuple[ProfilePoint, ...] = field(default=())
    measured_at: str = ""
    endpoint: str = ""  # what was measured (endpoint name or URL)
    image_size: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.model_name, self.gpu_type, self.gpu_count)

    def to_dict(self) -> dict[str, Any]:
        return {
            "modelName": self.model_name,
            "gpuType": self.gpu_type,
            "gpuCount": self.gpu_count,
            "kind": self.kind,
            "promptTokens": self.prompt_tokens,
            "outputTokens": self.output_tokens,
            "imageSize": self.image_size,
            "points": [p.to_dict() for p in self.points],
            "measuredAt": self.measured_at,
            "endpoint": self.endpoint,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeasuredProfile:
        return cls(
            model_name=str(d["modelName"]),
            gpu_type=str(d["gpuType"]),
            gpu_count=int(d["gpuCount"]),
            kind=str(d["kind"]),
            prompt_tokens=int(d.get("promptTokens", 0)),
            output_tokens=int(d.get("outputTokens", 0)),
            image_size=str(d.get("imageSize", "")),
            points=tuple(ProfilePoint.from_dict(p) for p in d.get("points", [])),
            measured_at=str(d.get("measuredAt", "")),
            endpoint=str(d.get("endpoint", "")),
        )


class DuplicateModel(Exception):
    """A model of that name is already registered."""


class ModelStore(Protocol):
    async def add_model(self, model: RegisteredModel) -> None:
        """Raises DuplicateModel when the name is taken."""
        ...

    async def get_model(self, name: str) -> RegisteredModel | None: ...

    async def list_models(self) -> list[RegisteredModel]:
        """Oldest first."""
        ...

    async def delete_model(self, name: str) -> bool: ...


class ProfileStore(Protocol):
    async def put_profile(self, profile: MeasuredProfile) -> None:
        """Insert, or replace the profile of the same model, GPU type and count."""
        ...

    async def list_profiles(self) -> list[MeasuredProfile]: ...


# --- building a registered model from its files -----------------------------------------


def default_name(source: ModelSource) -> str:
    """A catalog-style name for a source: the repository's or directory's
    last part, lowercased (`Qwen/Qwen2.5-0.5B-Instruct` -> `qwen2.5-0.5b-instruct`)."""
    raw = source.repo_id.split("/")[-1] if source.repo_id else str(source.directory).rsplit("/")[-1]
    name = _NAME_PART.sub("-", raw.lower()).strip("-._")
    return name[:63] or "model"


def describe(
    files: ModelFiles,
    source: ModelSource,
    name: str,
    support: EngineSupport,
    *,
    project_id: str | None,
    created_at: str,
    description: str | None = None,
) -> RegisteredModel:
    """A registered model from its files, checked against what the engines serve."""
    if files.model_index is not None:
        image = inspect_pipeline(
            files.model_index, files.component_parameters, files.inferd_defaults
        )
        support.check_image(image.pipeline_class)
        spec = ModelSpec(
            name=name,
            kind="image",
            source=source.reference,
            description=description or f"{image.pipeline_class} from {files.where}",
            architecture=image.architecture,
            default_size=image.default_size,
            default_steps=image.default_steps,
            default_guidance_scale=image.default_guidance_scale,
            max_n=4,
            min_side=256,
            max_side=2048,
            side_multiple=64 if image.architecture.family == "sdxl" else 8,
        )
        return RegisteredModel(
            spec, project_id, source.revision, image.pipeline_class,
            ServingHints(None, None, None), created_at,
        )  # fmt: skip
    if files.config is None:
        raise InspectError(f"{files.where}: no config.json or model_index.json")
    chat = inspect_chat(files.config, files.tokenizer_config, files.chat_template)
    support.check_chat(chat.architecture_class)
    if chat.hints.chat_template is None:
        raise InspectError(
            f"{files.where} has no chat template (tokenizer_config.json 'chat_template' or "
            "chat_template.jinja): the chat completions API cannot render its conversations"
        )
    spec = ModelSpec(
        name=name,
        kind="chat",
        source=source.reference,
        description=description or f"{chat.architecture_class} from {files.where}",
        architecture=chat.architecture,
    )
    return RegisteredModel(
        spec, project_id, source.revision, chat.architecture_class, chat.hints, created_at
    )
