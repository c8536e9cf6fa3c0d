"""The package's import graph: no cycles between modules, and the leaves stay
leaves (errors, vocab, redact and the engines import nothing from the control
plane; the engines and errors pull no web framework).

Every import counts, lazy ones inside functions and `TYPE_CHECKING` ones
included: a cycle hidden behind a lazy import is still a cycle for whoever
reads or moves the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

import inferd

ROOT = Path(inferd.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from pkg import module` imports the module; else the package.
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        node = todo.pop()
        for nxt in graph.get(node, ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of two or more modules that all reach each other."""
    reach = {node: reachable(graph, node) for node in graph}
    found: list[list[str]] = []
    seen: set[str] = set()
    for node in sorted(graph):
        if node in seen:
            continue
        group = sorted(m for m in reach[node] if node in reach.get(m, ()))
        if len(group) > 1:
            found.append(group)
            seen.update(group)
    return found


def test_the_scan_sees_the_package() -> None:
    graph = import_graph()
    assert "inferd.control.replicas.reconciler" in graph
    assert "inferd.control.ports" in graph["inferd.control.replicas.reconciler"]


def test_no_import_cycles() -> None:
    assert cycles(import_graph()) == []


def test_cycle_detection_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_leaves_import_nothing_from_the_control_plane() -> None:
    graph = import_graph()
    leaves = ["inferd.errors", "inferd.vocab", "inferd.redact"]
    leaves += [m for m in graph if m.startswith("inferd.engines")]
    for leaf in leaves:
        control = sorted(m for m in reachable(graph, leaf) if m.startswith("inferd.control"))
        assert control == [], f"{leaf} reaches {control}"
    for leaf in ("inferd.errors", "inferd.vocab", "inferd.redact"):
        assert not any(m.startswith("inferd.") for m in graph[leaf] - {"inferd.redact"}), leaf


def test_errors_and_engines_pull_no_web_framework() -> None:
    for leaf in ["inferd.errors", "inferd.engines.base", "inferd.engines.factory"]:
        modules = {leaf} | reachable(import_graph(), leaf)
        for module in modules:
            path = ROOT.parent / (module.replace(".", "/") + ".py")
            if not path.exists():
                path = ROOT.parent / module.replace(".", "/") / "__init__.py"
            source = path.read_text()
            tree = ast.parse(source)
            imported = {
                alias.name.split(".")[0]
                for node in ast.walk(tree)
                if isinstance(node, ast.Import)
                for alias in node.names
            } | {
                (node.module or "").split(".")[0]
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and not node.level
            }
            assert not imported & {"starlette", "uvicorn", "httpx"}, module


def test_the_composition_assigns_nothing_after_construction() -> None:
    """`build` wires by constructor arguments only: no attribute of a built
    part is set afterwards (the `holder`/hook pattern)."""
    tree = ast.parse((ROOT / "server" / "compose.py").read_text(encoding="utf-8"))
    build = next(
        n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "build"
    )
    late = [
        ast.unparse(target)
        for node in ast.walk(build)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute | ast.Subscript)
    ]
    assert late == []


def test_process_ids_stay_in_the_launchers_that_own_processes() -> None:
    # The local launcher and the Ray actor host (which runs the replica process
    # on its node) own processes; everything else sees opaque handles.
    owners = {
        ROOT / "control" / "launchers" / "local.py",
        ROOT / "control" / "launchers" / "ray_host.py",
    }
    # Migrations keep the history of the schema, which once had a pid column.
    control = [
        p for p in (ROOT / "control").rglob("*.py") if p not in owners and p.name != "migrations.py"
    ]
    mentions = [
        str(p.relative_to(ROOT))
        for p in [*control, ROOT / "server" / "compose.py"]
        if "pid" in {t.lower() for t in _words(p.read_text(encoding="utf-8"))}
    ]
    assert mentions == []


def _words(text: str) -> set[str]:
    import re

    return set(re.findall(r"[A-Za-z]+", text))
