"""Where on the server's disk project members may register models from.

A local directory as a model source belongs to the operator: a member of a
project registers one only below a model root the operator configured, for
every project or for theirs (setting `model_roots`: comma-separated entries,
`PATH` for every project or `PROJECT=PATH` for one). The check runs on the
path as written, resolved (`..` and symbolic links followed), before the
disk is looked at, so a refused path reveals nothing about what exists.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from inferd.errors import Forbidden


def is_local_path(source: str) -> bool:
    """Whether a source names a directory on the server (as `parse_source`
    reads it) rather than a Hugging Face repository."""
    text = source.strip()
    return Path(text).expanduser().is_absolute() or text.startswith((".", "~"))


@dataclass(frozen=True)
class ModelRoots:
    everyone: tuple[Path, ...] = ()
    per_project: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> ModelRoots:
        everyone: list[Path] = []
        per_project: dict[str, list[Path]] = {}
        for entry in filter(None, (e.strip() for e in text.split(","))):
            project, sep, path = entry.rpartition("=")
            root = Path(path).expanduser()
            if not root.is_absolute():
                raise ValueError(f"model root {path!r} is not an absolute path")
            resolved = Path(os.path.realpath(root))
            if sep:
                per_project.setdefault(project, []).append(resolved)
            else:
                everyone.append(resolved)
        return cls(tuple(everyone), {p: tuple(r) for p, r in per_project.items()})

    def of(self, project_id: str | None) -> tuple[Path, ...]:
        extra = self.per_project.get(project_id, ()) if project_id is not None else ()
        return (*self.everyone, *extra)

    def check(self, source: str, project_id: str | None) -> None:
        """Raise 403 unless `source` lies below one of the project's roots."""
        where = Path(os.path.realpath(Path(source.strip()).expanduser()))
        roots = self.of(project_id)
        if any(where == root or where.is_relative_to(root) for root in roots):
            return
        allowed = ", ".join(str(r) for r in roots)
        raise Forbidden(
            "A directory on the server is registered as a model by the operator, or from "
            "the model roots the operator configured"
            + (f" for this project: {allowed}." if roots else "; there are none for this project."),
            param="source",
            code="local_source_not_allowed",
        )
