"""How the README becomes commands (`tests/readme_snippets.py`), and that the
README itself parses: every block marked as not run names a known reason, and
the blocks that are run are most of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.readme_snippets import (
    NEEDS,
    ReadmeError,
    commands,
    fill_placeholders,
    on_port,
    snippets,
)

README = Path(__file__).resolve().parents[2] / "README.md"


def test_blocks_markers_and_languages() -> None:
    text = (
        "Intro\n```bash\necho one\n```\n\n<!-- readme-test: needs gpu -->\n```bash\n"
        "nvidia-smi\n```\n```\n$ output, not a command\n```\n```python\nprint(1)\n```\n"
    )
    found = snippets(text)
    assert [(s.language, s.need, s.line) for s in found] == [
        ("bash", None, 2),
        ("bash", "gpu", 7),
        ("python", None, 13),
    ]


def test_a_marker_applies_to_the_next_block_only() -> None:
    text = "<!-- readme-test: needs gpu -->\nprose between\n```bash\necho run\n```\n"
    assert [s.need for s in snippets(text)] == [None]


def test_an_unknown_need_or_an_open_fence_is_an_error() -> None:
    with pytest.raises(ReadmeError, match="unknown need 'magic'"):
        snippets("<!-- readme-test: needs magic -->\n```bash\necho\n```\n")
    with pytest.raises(ReadmeError, match="never closes"):
        snippets("```bash\necho\n")


def test_commands_join_continuations_drop_comments_and_split_on_semicolons() -> None:
    bash = (
        "# a comment line\n"
        "inferd a --x 1 \\\n    --y 2        # trailing comment\n"
        "inferd b ; inferd c 'semi;colon # not a comment'\n"
        'curl -d \'{"k": "v"}\' -H "A: b#c"\n'
    )
    assert commands(bash) == [
        "inferd a --x 1 --y 2",
        "inferd b",
        "inferd c 'semi;colon # not a comment'",
        'curl -d \'{"k": "v"}\' -H "A: b#c"',
    ]


def test_placeholders_take_the_last_value_printed() -> None:
    printed = [
        "Admin key:\n  infd_admin_first\n",
        "Key key_abc (laptop), shown only this once:\n  infd_key_secret\n",
        "url  http://127.0.0.1:9/endpoints/0f-1\n  infd_ep_tok1\n",
        "url  http://127.0.0.1:9/endpoints/0f-2\n  infd_ep_tok2\n",
    ]
    assert fill_placeholders("export K=infd_admin_...", printed) == "export K=infd_admin_first"
    # `key_` is not the end of `infd_key_`: the key id, not the key.
    assert fill_placeholders("inferd keys revoke key_...", printed) == "inferd keys revoke key_abc"
    assert fill_placeholders("export URL=http://127.0.0.1:9/endpoints/...", printed) == (
        "export URL=http://127.0.0.1:9/endpoints/0f-2"
    )
    assert fill_placeholders("export TOKEN=infd_ep_...", printed) == "export TOKEN=infd_ep_tok2"
    # Prose ellipses are not placeholders.
    assert fill_placeholders("inferd recommend m --rps 20 ...", printed) == (
        "inferd recommend m --rps 20 ..."
    )
    with pytest.raises(ReadmeError, match="nothing printed so far starts with 'infd_nope_'"):
        fill_placeholders("x infd_nope_...", printed)


def test_the_readme_port_means_the_test_server() -> None:
    assert on_port("curl http://127.0.0.1:8080/x localhost:8080", "127.0.0.1:5") == (
        "curl http://127.0.0.1:5/x 127.0.0.1:5"
    )


def test_the_readme_parses_and_most_of_it_runs() -> None:
    found = snippets(README.read_text())
    not_run = [s for s in found if s.need is not None]
    assert {s.need for s in not_run} <= set(NEEDS)
    # The first chat and first image run here, on a CPU: none of it is marked.
    gpu_section = README.read_text().splitlines().index("## On a GPU machine, with real models")
    first_day = [s for s in found if s.line < gpu_section]
    assert len(first_day) >= 8 and all(s.need is None for s in first_day)
    assert len(not_run) < len(found) - len(not_run)
