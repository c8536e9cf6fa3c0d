"""Run the reliability tests alone and print their results as one table.

    python scripts/reliability_report.py            # every test marked `reliability`
    python scripts/reliability_report.py -- -x      # extra pytest arguments after --

Runs pytest in this process with the report's plugin
(tests/reliability/report.py), prints the table ordered by item and writes
it, with the date and the command, to docs/reliability.md. Exits with
pytest's status. The test command (`make test`) writes the same page from
the whole suite's run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO / "docs" / "reliability.md"
sys.path.insert(0, str(REPO))  # run as a script: the tests package is beside it

from tests.reliability.report import Collector, current_commit, markdown, text_table  # noqa: E402

# Every test carrying the marker, wherever it lives.
PYTEST_ARGS = ["-m", "reliability", "tests", "-p", "no:cacheprovider"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="markdown file")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    output = args.output.resolve()
    os.chdir(REPO)
    pytest_args = [*PYTEST_ARGS, *args.pytest_args]
    command = shlex.join(["python", "scripts/reliability_report.py", *sys.argv[1:]])
    command += f"  (runs: {shlex.join(['python', '-m', 'pytest', *pytest_args])})"
    collector = Collector()
    exit_code = int(pytest.main(pytest_args, plugins=[collector]))
    rows = collector.ordered()
    print()
    print(text_table(rows) if rows else "no test marked `reliability` ran")
    why_not = collector.why_not_written(whole_suite=True)
    if why_not is not None:
        print(f"\n{output} not written: {why_not}")
        return exit_code or 1
    output.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, command, exit_code, collector.wall_s, current_commit(REPO))
    output.write_text(text)
    print(f"\nwritten to {output}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
