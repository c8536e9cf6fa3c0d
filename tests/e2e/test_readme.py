"""The README, run as a new user runs it: every command and snippet, in the
order of the page, as written, against a real `inferd serve` with the tiny
models (real vLLM and diffusers replicas). A README edit that breaks a
command fails here. How the page becomes commands, and which blocks are not
run and why, is in `tests/readme_snippets.py`.

Two commands are the machine's, not this test's to repeat: `make serve` is
the `inferd serve` this test starts (the Makefile's recipe is
`.venv/bin/inferd serve`; only the port and the state directory are this
test's), and `make test` is the suite this test belongs to. Everything else
runs in bash in a scratch directory that holds the repository's files and
`.venv` (this interpreter's environment), with no `inferd` on PATH until the
README says `source .venv/bin/activate`.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from inferd.testing import ServeHandle
from tests.readme_snippets import (
    NEEDS,
    Snippet,
    commands,
    fill_placeholders,
    linked_pages,
    on_port,
    snippets,
)
from tests.support import require

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

# The first chat request is held while vLLM loads (30-60 s on a quiet CPU,
# minutes when the machine is shared); nothing in the README takes longer.
COMMAND_TIMEOUT_S = 900
# inferd's error body, on every surface.
ERROR_BODY = re.compile(r'\{"error":\s*\{"message"')
# What `make serve` would start, but quicker to settle at the end.
SERVE_SETTINGS = {"replica_drain_timeout_seconds": "10"}


@dataclass
class Session:
    """One user's terminals: the directory, the exported environment, and
    everything printed so far (for the README's `...` placeholders)."""

    workdir: Path
    env_file: Path
    server: ServeHandle
    printed: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def bash(self, command: str) -> subprocess.CompletedProcess[str]:
        script = (
            f"source {shlex.quote(str(self.env_file))}\n"
            f"{command}\n"
            "status=$?\n"
            f"export -p > {shlex.quote(str(self.env_file))}\n"
            "exit $status\n"
        )
        return subprocess.run(
            ["bash", "-c", script],
            cwd=self.workdir,
            env=self.base_env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERD_")}
        # A new terminal: no virtual environment active, `inferd` not on PATH.
        venv_bin = str(Path(sys.prefix) / "bin")
        path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
        env["PATH"] = os.pathsep.join(path)
        env.pop("VIRTUAL_ENV", None)
        return env

    def run(self, command: str, snippet: Snippet) -> None:
        if command == "make test":
            return  # this suite
        if command.startswith("make serve"):
            self.serve(command, snippet)
            return
        filled = fill_placeholders(on_port(command, self.address), self.printed)
        done = self.bash(filled)
        output = done.stdout + done.stderr
        self.printed.append(output)
        self.ran.append(command)
        assert done.returncode == 0, (
            f"{snippet.where}: `{command}` (run as `{filled}`) exited with "
            f"{done.returncode}:\n{output[-4000:]}\n--- server log ---\n{self.server.log()[-3000:]}"
        )
        # curl exits 0 on any HTTP answer: an error body is a failure too.
        assert not ERROR_BODY.search(output), (
            f"{snippet.where}: `{command}` (run as `{filled}`) was answered with an "
            f"error:\n{output[-4000:]}"
        )

    def serve(self, command: str, snippet: Snippet) -> None:
        assert command == "make serve", f"{snippet.where}: a runnable `{command}` is not understood"
        if self.server.process is None:
            self.server.start(timeout=120)
        self.printed.append(self.server.log())
        self.ran.append(command)

    def python(self, snippet: Snippet) -> None:
        path = self.workdir / f"snippet-{snippet.line}.py"
        path.write_text(on_port(snippet.text, self.address))
        done = self.bash(f"python {shlex.quote(path.name)}")
        output = done.stdout + done.stderr
        self.printed.append(output)
        self.ran.append(f"python snippet at {snippet.where}")
        assert done.returncode == 0, (
            f"{snippet.where}: the Python snippet failed:\n{output[-4000:]}\n"
            f"--- server log ---\n{self.server.log()[-3000:]}"
        )


def scratch_directory(root: Path) -> Path:
    """The repository as a user's clone looks after `make`: its files (linked,
    not copied) and `.venv`."""
    workdir = root / "clone"
    workdir.mkdir()
    for entry in REPO.iterdir():
        if entry.name.startswith(".") or entry.name in ("__pycache__",):
            continue
        (workdir / entry.name).symlink_to(entry)
    (workdir / ".venv").symlink_to(Path(sys.prefix))
    return workdir


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    for component in ("vllm", "diffusers", "openai"):
        require(component, "the README's first chat and first image run on it")
    env_file = tmp_path / "exported.sh"
    env_file.write_text("")
    server = ServeHandle(tmp_path / "serve", admin_key=None, settings=SERVE_SETTINGS)
    current = Session(scratch_directory(tmp_path), env_file, server)
    try:
        yield current
    finally:
        server.cleanup()


def test_every_readme_and_docs_command_runs_as_written(session: Session) -> None:
    text = (REPO / "README.md").read_text()
    # The README's blocks, then those of the docs/ pages it links, in one
    # session (a page may use the endpoints and exports the README made).
    every = snippets(text)
    for page in linked_pages(text):
        every += snippets((REPO / page).read_text(), page)
    not_run: list[str] = []
    for snippet in every:
        if snippet.need is not None:
            not_run.append(f"{snippet.where} ({snippet.language}): {NEEDS[snippet.need]}")
            continue
        if snippet.language == "python":
            session.python(snippet)
            continue
        for command in commands(snippet.text):
            session.run(command, snippet)
    # What was run and what was not, for whoever reads the log of a green run.
    print(f"ran {len(session.ran)} commands and snippets; not run here:")
    print("\n".join(f"  {line}" for line in not_run))
    assert session.server.process is not None, "the README never starts the server"
    assert len(session.ran) > len(not_run)
