"""Rules of the code's shape that a review would otherwise have to re-check
by hand: one vocabulary for model kinds, and control/ in layers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

INFERD = Path(__file__).resolve().parents[2] / "inferd"

# A kind compared with a bare string ("chat", 'image'): a typo there is a
# silent False, where `ModelKind.CHAT` (or `kinds.CHAT` in a template) fails loudly.
BARE_KIND_COMPARISON = re.compile(r"kind ?[!=]= ?['\"]")


def test_model_kinds_are_compared_only_through_model_kind() -> None:
    found = [
        f"{path.relative_to(INFERD.parent)}:{n}: {line.strip()}"
        for path in sorted(INFERD.rglob("*"))
        if path.suffix in (".py", ".html")
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if BARE_KIND_COMPARISON.search(line)
    ]
    assert found == []


def test_the_rule_finds_what_it_is_for() -> None:
    assert BARE_KIND_COMPARISON.search('if model.kind == "chat":')
    assert BARE_KIND_COMPARISON.search("{% if row.model_kind != 'image' %}")
    assert not BARE_KIND_COMPARISON.search("if model.kind == ModelKind.CHAT:")


def _runtime_imports(path: Path) -> list[str]:
    """Modules `path` imports when it runs (not those named only for type checking)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    return [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and id(node) not in typing_only
    ]


def package_graph(root: Path = INFERD / "control") -> dict[str, set[str]]:
    """control/'s subpackages (and leaf modules), each with those it imports."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        unit = parts[0]
        for module in _runtime_imports(path):
            if module.startswith("inferd.control."):
                target = module.split(".")[2]
                if target != unit:
                    graph.setdefault(unit, set()).add(target)
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_control_subpackages_form_no_import_loop() -> None:
    """Layers, not a knot: a subpackage may import those below it, never one
    that imports it back (types for annotations only are allowed)."""
    assert loops(package_graph()) == []


def test_the_loop_finder_finds_loops() -> None:
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []


# The HTTP layer: routes, the route table's access check, the app and the
# console's pages. They parse, call a service and render; the services
# authorize, audit and read the stores (docs/application-layer.md).
HTTP_MODULES = (
    *(INFERD / "server").glob("*_routes.py"),
    *(INFERD / "server" / name for name in ("management.py", "access.py", "app.py", "console.py")),
    *(INFERD / "console").rglob("*.py"),
)
DECIDES_IN_HTTP = re.compile(
    r"(?<![.\w])(authorize|require_operator)\("  # the role check itself (a service's is fine)
    r"|\baudit_event\("  # writing the audit log
    r"|\.store\b"  # reaching a store through a service
    r"|^from inferd\.control\.stores\b"
    r"|^from inferd\.control\.(accounts\.)?ports import .*\w+Store\b"
)


def test_routes_and_console_pages_are_http_only() -> None:
    found = [
        f"{path.relative_to(INFERD.parent)}:{n}: {line.strip()}"
        for path in sorted(HTTP_MODULES)
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if DECIDES_IN_HTTP.search(line)
    ]
    assert found == []


def test_the_http_rule_finds_what_it_is_for() -> None:
    assert DECIDES_IN_HTTP.search("authorize(principal, project_id, Action.WRITE, hidden=x)")
    assert DECIDES_IN_HTTP.search("await self.accounts.audit_event(principal, action, p, t)")
    assert DECIDES_IN_HTTP.search("stored = await self.usage.store.adapter_usage(e, n)")
    assert DECIDES_IN_HTTP.search("from inferd.control.ports import AdapterStore")
    assert not DECIDES_IN_HTTP.search("self.models.authorize(principal, name, op.action)")
    assert not DECIDES_IN_HTTP.search("from inferd.control.ports import Capacity")
