"""Finding a model's description files: a local directory, the local Hugging
Face cache (as `huggingface_hub` lays it out: `models--org--name/refs/REV`,
`snapshots/COMMIT/...`), or the Hub itself where a network exists.

Only the small JSON files are read (`config.json`, `model_index.json`, the
tokenizer's config, the chat template, component configs) and the headers of
safetensors files already present; weights are never downloaded here.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd.catalog.hub import download_hint, hub_unreachable
from inferd.catalog.inspect import InspectError

HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
_TRUE = ("1", "true", "yes", "on")
# A safetensors header is a JSON document; a real one is at most a few MB.
_MAX_HEADER_BYTES = 64 * 1024 * 1024
PIPELINE_COMPONENTS = ("unet", "transformer", "text_encoder", "text_encoder_2", "vae")


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a Hugging Face repository (optionally at a
    revision) or a local directory."""

    repo_id: str | None = None
    revision: str | None = None
    directory: Path | None = None

    @property
    def reference(self) -> str:
        """What a replica is given as `--model`: the directory, or
        `org/name` (`org/name@revision` when pinned)."""
        if self.directory is not None:
            return str(self.directory)
        assert self.repo_id is not None
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_source(source: str, revision: str | None = None) -> ModelSource:
    """A source string as given by a user; raises InspectError for anything else."""
    text = source.strip()
    if not text:
        raise InspectError("source is empty: give a Hugging Face repository id or a directory")
    if revision is not None and not _REVISION.match(revision):
        raise InspectError(f"revision {revision!r} is not a branch, tag or commit name")
    path = Path(text).expanduser()
    if text.startswith("."):
        # The server's working directory is nobody's idea of "here".
        raise InspectError(
            f"source {text!r} is a relative path: give the directory's absolute path "
            "(`inferd models add` turns a relative path into one)"
        )
    if path.is_absolute() or text.startswith("~"):
        if revision is not None:
            raise InspectError("a revision applies to a Hugging Face repository, not a directory")
        if not path.is_dir():
            raise InspectError(f"directory {path} does not exist on the server")
        return ModelSource(directory=path.resolve())
    if HF_REPO_ID.match(text):
        return ModelSource(repo_id=text, revision=revision)
    raise InspectError(
        f"source {text!r} is neither a Hugging Face repository id (org/name) nor an "
        "absolute directory path"
    )


@dataclass(frozen=True)
class ModelFiles:
    """The description files of one model, parsed."""

    where: str  # for messages: the directory or the cache snapshot
    config: Mapping[str, Any] | None = None
    model_index: Mapping[str, Any] | None = None
    tokenizer_config: Mapping[str, Any] | None = None
    chat_template: str | None = None
    inferd_defaults: Mapping[str, Any] | None = None
    component_parameters: Mapping[str, int] = field(default_factory=dict)
    commit: str | None = None  # the snapshot read, for a Hugging Face source


def _read_json(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InspectError(f"{path.name} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InspectError(f"{path.name} is not a JSON object")
    return data


def safetensors_parameters(path: Path) -> int:
    """Elements in a safetensors file, from its header alone."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise InspectError(f"{path} is not a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER_BYTES:
            raise InspectError(f"{path}: safetensors header of {size} bytes is implausible")
        try:
            header = json.loads(f.read(size))
        except json.JSONDecodeError:
            raise InspectError(f"{path}: safetensors header is not JSON") from None
    return sum(
        math.prod(entry.get("shape", []))
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict)
    )


def _component_parameters(root: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for component in PIPELINE_COMPONENTS:
        files = sorted((root / component).glob("*.safetensors"))
        # Prefer one variant: fp16 files sit beside fp32 ones in many repos.
        plain = [f for f in files if ".fp16." not in f.name] or files
        if plain:
            counts[component] = sum(safetensors_parameters(f) for f in plain)
    return counts


def read_directory(root: Path) -> ModelFiles:
    """The files of a local checkpoint or pipeline directory."""
    model_index = root / "model_index.json"
    config = root / "config.json"
    if model_index.is_file():
        defaults = root / "inferd.json"
        return ModelFiles(
            where=str(root),
            model_index=_read_json(model_index),
            inferd_defaults=_read_json(defaults) if defaults.is_file() else None,
            component_parameters=_component_parameters(root),
        )
    if config.is_file():
        tokenizer = root / "tokenizer_config.json"
        template = root / "chat_template.jinja"
        return ModelFiles(
            where=str(root),
            config=_read_json(config),
            tokenizer_config=_read_json(tokenizer) if tokenizer.is_file() else None,
            chat_template=template.read_text(encoding="utf-8") if template.is_file() else None,
        )
    raise InspectError(
        f"{root} holds neither a diffusers pipeline (model_index.json) nor a transformers "
        "checkpoint (config.json)"
    )


# One file of a Hugging Face repository: its local path, or None when the
# repository does not have it. Raises InspectError when it cannot be had.
FileGetter = Callable[[str], Path | None]


def hub_file_getter(
    repo_id: str, revision: str | None, cache_dir: Path | None, offline: bool
) -> FileGetter:
    """Files from the local Hugging Face cache, then (unless offline) the Hub."""
    try:
        import huggingface_hub as hub
        from huggingface_hub.utils import EntryNotFoundError
    except ImportError:
        raise InspectError(
            "huggingface_hub is not installed: a Hugging Face source cannot be read; "
            "give a local directory"
        ) from None

    unreachable: list[str | None] = []  # asked once, at the first file not cached

    def get(filename: str) -> Path | None:
        cached = hub.try_to_load_from_cache(
            repo_id, filename, cache_dir=cache_dir, revision=revision
        )
        if isinstance(cached, str):
            return Path(cached)
        if cached is not None:  # the cache recorded that the file does not exist
            return None
        if offline:
            return None
        if not unreachable:
            unreachable.append(hub_unreachable())
        if unreachable[0] is not None:
            raise InspectError(
                f"{repo_id!r} is not in the local Hugging Face cache and the Hub cannot be "
                f"reached from the server: {unreachable[0]}. Download it where a network "
                f"exists ({download_hint(repo_id)}) and register that directory "
                "(--source /absolute/DIR)"
            )
        try:
            return Path(
                hub.hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir)
            )
        except EntryNotFoundError:
            return None
        except Exception as exc:  # no network, unknown repository, gated, ...
            raise InspectError(
                f"cannot fetch {filename} of {repo_id!r} from the Hugging Face Hub: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    return get


def read_hub(source: ModelSource, get: FileGetter) -> ModelFiles:
    """The description files of a Hugging Face repository, through `get`."""
    assert source.repo_id is not None
    at = f" at revision {source.revision}" if source.revision else ""
    model_index = get("model_index.json")
    config = None if model_index is not None else get("config.json")
    found = model_index or config
    if found is None:
        raise InspectError(
            f"Hugging Face repository {source.repo_id!r}{at}: neither model_index.json nor "
            "config.json is in the local Hugging Face cache, and it cannot be fetched here "
            "(no network, or HF_HUB_OFFLINE is set). Download it where a network exists "
            f"({download_hint(source.repo_id)}) and register that directory"
        )
    snapshot = found.parent
    commit = snapshot.name if snapshot.parent.name == "snapshots" else None
    if model_index is not None:
        defaults = get("inferd.json")
        return ModelFiles(
            where=f"{source.repo_id}{at}",
            model_index=_read_json(model_index),
            inferd_defaults=_read_json(defaults) if defaults else None,
            component_parameters=_component_parameters(snapshot),
            commit=commit,
        )
    assert config is not None
    tokenizer = get("tokenizer_config.json")
    template = get("chat_template.jinja")
    return ModelFiles(
        where=f"{source.repo_id}{at}",
        config=_read_json(config),
        tokenizer_config=_read_json(tokenizer) if tokenizer else None,
        chat_template=template.read_text(encoding="utf-8") if template else None,
        commit=commit,
    )


def hub_offline(env: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if env is None else env
    return environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def read_model_files(
    source: ModelSource, *, hf_cache_dir: Path | None = None, offline: bool | None = None
) -> ModelFiles:
    """The description files `source` points at (a blocking call: file and
    possibly network I/O)."""
    if source.directory is not None:
        return read_directory(source.directory)
    assert source.repo_id is not None
    if offline is None:
        offline = hub_offline()
    return read_hub(source, hub_file_getter(source.repo_id, source.revision, hf_cache_dir, offline))
