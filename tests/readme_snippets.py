"""The README's commands and snippets, as `tests/e2e/test_readme.py` runs them.

What is run: every fenced block tagged `bash` or `python`, in the order of the
page, then those of each `docs/` page the README links, in the order of their
first link (`linked_pages`), in the same session. Untagged fences are output
shown to the reader (tables, diagrams), not commands. A block preceded by a
line `<!-- readme-test: needs NEED -->` is not run here, for the reason
`NEEDS` gives; those are few, and each names what this test cannot have (a
GPU, the Hugging Face Hub, more machines).

How a bash block becomes commands: continuation lines (`\\` at the end) are
joined, comments are dropped, and `;` between commands splits them (a later
command may use what an earlier one printed). Each command then runs in bash
as pasted, with the environment that the commands before it exported.

Placeholders. The README writes what the reader copies from an earlier
answer as its visible start followed by `...`: `infd_admin_...` (the key the
banner printed), `infd_ep_...` (the token a create printed), `key_...` (a
key id), `http://127.0.0.1:8080/endpoints/...`. A word ending in `_...` or
`/...` is filled with the last value printed so far that starts the same
way; none printed is a failure (the README asks for something it never
shows). The server this test runs listens on a free port, not 8080:
`127.0.0.1:8080` and `localhost:8080` in a command mean it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

NEEDS = {
    "gpu": "needs an NVIDIA GPU (CUDA vLLM and real model weights)",
    "network": "needs the Hugging Face Hub (real model weights are downloaded)",
    "cluster": "needs several machines joined in a Ray cluster",
    "postgresql": "needs a PostgreSQL server at the address the snippet names",
    "kubernetes": "needs a Kubernetes cluster with the KubeRay operator and GPU nodes",
    "image-build": "builds a container image (docker or buildah; half an hour on a 2-core machine)",
}
MARKER = re.compile(r"^<!-- readme-test: needs ([a-z-]+) -->\s*$")
FENCE = re.compile(r"^```([A-Za-z0-9_-]*)\s*$")
RUN_LANGUAGES = ("bash", "python")
README_PORT_ADDRESSES = ("127.0.0.1:8080", "localhost:8080")
# A placeholder: its start (which printed values begin with), then "...".
_PLACEHOLDER = re.compile(r"(?<![A-Za-z0-9_.:/-])([A-Za-z0-9_.:/-]*[_/])\.\.\.")


@dataclass(frozen=True)
class Snippet:
    language: str
    text: str
    line: int  # of the opening fence, 1-based
    need: str | None  # None: run it
    page: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


class ReadmeError(ValueError):
    """The README cannot be run as written (an unknown need, an open fence)."""


_DOC_LINK = re.compile(r"\]\((docs/[A-Za-z0-9_./-]+\.md)(?:#[^)]*)?\)")


def linked_pages(readme: str) -> list[str]:
    """The `docs/` pages the README links, in the order of their first link."""
    return list(dict.fromkeys(_DOC_LINK.findall(readme)))


def snippets(readme: str, page: str = "README.md") -> list[Snippet]:
    found: list[Snippet] = []
    lines = readme.splitlines()
    index = 0
    need: str | None = None
    while index < len(lines):
        line = lines[index]
        marker = MARKER.match(line)
        if marker:
            need = marker.group(1)
            if need not in NEEDS:
                raise ReadmeError(
                    f"{page}:{index + 1}: unknown need {need!r}; known: {', '.join(NEEDS)}"
                )
            index += 1
            continue
        fence = FENCE.match(line)
        if fence is None:
            if line.strip():
                need = None  # a marker applies to the block right below it only
            index += 1
            continue
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and not lines[index].startswith("```"):
            body.append(lines[index])
            index += 1
        if index == len(lines):
            raise ReadmeError(f"{page}:{start + 1}: a code fence that never closes")
        index += 1
        language = fence.group(1)
        if language in RUN_LANGUAGES:
            found.append(Snippet(language, "\n".join(body) + "\n", start + 1, need, page))
        need = None
    return found


def strip_comment(line: str) -> str:
    """`line` without a shell comment (a `#` at a word start, outside quotes)."""
    quote: str | None = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _split_top_level(line: str, separator: str = ";") -> list[str]:
    parts, quote, current = [], None, []
    for char in line:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == separator:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def commands(bash: str) -> list[str]:
    """The commands of a bash block, one string each."""
    found: list[str] = []
    pending = ""
    for raw in bash.splitlines():
        line = strip_comment(raw)
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        found.extend(_split_top_level(pending + line.strip()))
        pending = ""
    if pending.strip():
        found.append(pending.strip())
    return found


def on_port(text: str, address: str) -> str:
    for readme_address in README_PORT_ADDRESSES:
        text = text.replace(readme_address, address)
    return text


def fill_placeholders(command: str, printed: Sequence[str]) -> str:
    """`command` with each placeholder replaced by the last value printed
    so far that starts with the placeholder's visible part."""

    def value(match: re.Match[str]) -> str:
        start = match.group(1)
        pattern = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(start)}[A-Za-z0-9_-]+")
        for text in reversed(printed):
            values = pattern.findall(text)
            if values:
                return str(values[-1])
        raise ReadmeError(f"{start}... : nothing printed so far starts with {start!r}")

    return _PLACEHOLDER.sub(value, command)
