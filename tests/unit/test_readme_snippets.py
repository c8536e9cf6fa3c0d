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
    linked_pages,
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


def test_the_quick_start_on_the_first_screen_reaches_a_chat() -> None:
    """The first blocks start the server, create an endpoint that waits for
    its replica, and chat with it: no placeholder but the banner's key."""
    text = README.read_text()
    first_screen = "\n".join(text.splitlines()[:60])
    quick = [c for s in snippets(first_screen) for c in commands(s.text)]
    assert quick[0] == "make serve"
    assert any("endpoints create demo" in c and "--wait" in c and "--env" in c for c in quick)
    assert any(c.startswith("curl $URL/openai/v1/chat/completions") for c in quick)
    assert [c for c in quick if "..." in c] == ["export INFERD_ADMIN_KEY=infd_admin_..."]


def test_the_endpoints_exports_paste_without_edits() -> None:
    """Every endpoint's URL and token come from `create --env`, never typed."""
    pages = [README.read_text()] + [
        (README.parent / page).read_text() for page in linked_pages(README.read_text())
    ]
    for text in pages:
        for snippet in snippets(text):
            for command in commands(snippet.text):
                assert "infd_ep_..." not in command and "/endpoints/..." not in command


def test_docs_pages_are_found_in_link_order_and_named_where_they_fail() -> None:
    readme = "see [limits](docs/limits.md), [api](docs/api.md#x) and [limits](docs/limits.md)"
    assert linked_pages(readme) == ["docs/limits.md", "docs/api.md"]
    (snippet,) = snippets("text\n```bash\necho hi\n```\n", "docs/api.md")
    assert snippet.where == "docs/api.md:2"
    for page in linked_pages(README.read_text()):
        assert (README.parent / page).is_file(), f"README links {page}, which does not exist"
