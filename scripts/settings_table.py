"""Rebuild docs/settings.md from the code: every setting of `inferd serve`
(its key, flag, environment variable, default and meaning, from
`inferd.settings.Settings`) and every flag of `inferd replica` (from its
argument parser), so that the page cannot drift from what the programs take.

    python scripts/settings_table.py          # rewrite docs/settings.md
    python scripts/settings_table.py --check  # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from inferd.client.api import DEFAULT_API_URL
from inferd.replica.config import add_arguments
from inferd.settings import Settings, documented_defaults, env_name, setting_keys

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "settings.md"

# Read by the `inferd` client commands, not by `inferd serve`: written here,
# and each checked by the test to be read somewhere in the code.
CLIENT_ENV = (
    ("INFERD_API_URL", DEFAULT_API_URL, "the management API the commands talk to"),
    ("INFERD_ADMIN_KEY", "none", "the operator's key (also read by `inferd serve`: its admin key)"),
    ("INFERD_API_KEY", "none", "a user's management key; used before INFERD_ADMIN_KEY"),
    ("INFERD_TOKEN", "none", "an endpoint's access token, for `inferd bench`"),
    ("INFERD_CONFIG", "none", "the YAML settings file of `inferd serve` (as --config)"),
    (
        "INFERD_CACHE_DIR",
        "$XDG_CACHE_HOME/inferd, else ~/.cache/inferd",
        "where the tiny models are built (below its models/)",
    ),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(key: str, value: Any) -> str:
    if key in ("public_url", "state_dir", "db_path", "database_url", "models_dir", "configs_dir"):
        return "derived (see meaning)"
    if value is None or isinstance(value, SecretStr):
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def serve_rows() -> list[str]:
    defaults = documented_defaults()
    rows = []
    for key in setting_keys():
        field = Settings.model_fields[key]
        flag = "--" + key.replace("_", "-")
        meaning = _cell(field.description or "")
        rows.append(
            f"| `{key}` | `{flag}` | `{env_name(key)}` | {_cell(_default(key, defaults[key]))} "
            f"| {meaning} |"
        )
    return rows


def replica_rows() -> list[str]:
    parser = argparse.ArgumentParser(prog="inferd replica", add_help=False)
    add_arguments(parser)
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings:
            continue
        flag = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.required:
            default = "required"
        elif isinstance(action, argparse._StoreTrueAction):
            default = "off"
        elif action.default in (None, [], ""):
            default = "none"
        else:
            default = str(action.default)
        meaning = action.help or ""
        if action.choices:
            meaning = f"{meaning} (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| {flag} | {_cell(default)} | {_cell(meaning)} |")
    return rows


def render() -> str:
    lines = [
        "# Settings",
        "",
        "(Generated from the code by `python scripts/settings_table.py`;",
        "`tests/unit/test_settings_doc.py` fails when this page and the code differ.)",
        "",
        "## `inferd serve`",
        "",
        "Each setting is a key of the YAML file given with `--config` (or",
        "`INFERD_CONFIG`; `configs/server.yaml` lists them all), an environment",
        "variable and a flag. Precedence, lowest first: the default < the file < the",
        "environment < the flag. A derived default is computed from the settings",
        "around it when the setting is left unset. What the limits mean for a request:",
        "[limits.md](limits.md).",
        "",
        "| key | flag | environment | default | meaning |",
        "| --- | --- | --- | --- | --- |",
        *serve_rows(),
        "",
        "## `inferd replica`",
        "",
        "One replica without the control plane (`inferd serve` starts its replicas",
        "with these flags and a few of its own, hidden from `--help`). No",
        "environment variables; `--engine-settings` takes the management API's",
        "`engineSettings`.",
        "",
        "| flag | default | meaning |",
        "| --- | --- | --- |",
        *replica_rows(),
        "",
        "## The `inferd` commands (client side)",
        "",
        "| environment | default | meaning |",
        "| --- | --- | --- |",
        *(f"| `{name}` | {default} | {meaning} |" for name, default, meaning in CLIENT_ENV),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not DOC.is_file() or DOC.read_text() != text:
            print(f"{DOC} is stale: run python scripts/settings_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
