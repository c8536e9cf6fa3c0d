"""The shipped Prometheus rules and Grafana dashboard, checked by Prometheus'
own tool: the rules load, each alert's unit test passes, and every dashboard
expression parses. (tests/e2e/test_observability.py then runs them against a
real Prometheus scraping a real `inferd serve`.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from tests.support import needs

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "inferd.json"

pytestmark = needs("prometheus")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def test_rules_and_alerts_load() -> None:
    result = promtool("check", "rules", str(RULES), str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_and_they_pass() -> None:
    tests_file = DEPLOY / "prometheus" / "tests" / "alerts_test.yml"
    alerts = {
        rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"]
        for rule in group["rules"]
    }  # fmt: skip
    tested = {
        case["alertname"]
        for test in yaml.safe_load(tests_file.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts == tested, f"alerts without a firing test: {sorted(alerts - tested)}"
    result = promtool("test", "rules", str(tests_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_expressions_parse(tmp_path: Path) -> None:
    expressions = dashboard_expressions()
    assert len(expressions) >= 10
    # promtool parses PromQL when it checks rules: one recording rule each.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": e.replace("$endpoint", ".+")}
                    for i, e in enumerate(expressions)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_expression_is_caught(tmp_path: Path) -> None:
    """The check above can fail: promtool refuses a bad expression."""
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "bad:expr", "expr": "sum by (endpoint (rate(x[5m]))"}]}]}))  # fmt: skip
    assert promtool("check", "rules", str(path)).returncode != 0
