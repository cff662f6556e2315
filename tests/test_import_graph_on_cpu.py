"""The import graph of ``verl_ext``, function-level imports included: no cycle, and no edge from a
plugin family up to the command line, the entry point or the start-up checks (those sit on top and
import the families, never the other way round). The table the checks and the entry point share is
``verl_ext.registry``, which imports nothing heavy.

``from package import submodule`` is an edge to the submodule (Python runs the package's
``__init__`` for every submodule import anyway, so that edge is not a choice the code makes)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl_ext"
TOP = ("verl_ext.cli", "verl_ext.doctor", "verl_ext.plugin", "verl_ext.validation", "verl_ext.listing")
FAMILIES = ("verl_ext.advantages", "verl_ext.old_logits", "verl_ext.losses", "verl_ext.rewards", "verl_ext.envs",
            "verl_ext.agent_loops", "verl_ext.backends", "verl_ext.data", "verl_ext.registry", "verl_ext.trainer_modes",
            "verl_ext.config_data", "verl_ext.preconditions")


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """module -> the verl_ext modules it imports anywhere in its file."""
    modules = _modules()

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                submodules = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules}
                targets |= submodules if len(submodules) == len(node.names) else {base, *submodules}
        graph[name] = {owner(t) for t in targets if t.startswith("verl_ext")} - {None, name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_a_cycle_is_found():  # the detector itself, on a graph with one
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_family_imports_the_command_line_the_entry_point_or_the_checks():
    upward = {name: sorted(t for t in targets if t in TOP)
              for name, targets in import_graph().items() if name.startswith(FAMILIES)}
    assert {name: targets for name, targets in upward.items() if targets} == {}


def test_the_registry_imports_nothing_heavy():
    code = ("import sys; import verl_ext.registry, verl_ext.trainer_modes; "
            "print(sorted(m for m in ('torch', 'verl', 'ray', 'transformers', 'verl_ext.plugin') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "[]"


def test_the_pure_math_imports_without_verl():
    code = ("import sys; import verl_ext.losses.decoupled_ppo, verl_ext.rewards.tool_path, verl_ext.advantages.gigpo; "
            "print(sorted(m for m in ('verl', 'ray') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "[]"


def test_the_envs_do_not_import_the_agent_loops_or_the_datasets_built_on_them():
    """The env contract sits below the agent loops and the verl datasets, which import it."""
    found = {name: sorted(t for t in targets if t.startswith(("verl_ext.agent_loops", "verl_ext.datasets")))
             for name, targets in import_graph().items() if name.startswith("verl_ext.envs")}
    assert {name: targets for name, targets in found.items() if targets} == {}


def test_the_envs_import_neither_verl_nor_ray():
    """The env contract is plain Python: verl's tool and dataset adapters live above it."""
    found = {}
    for name, path in _modules().items():
        if not name.startswith("verl_ext.envs"):
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
        if imported & {"verl", "ray"}:
            found[name] = sorted(imported & {"verl", "ray"})
    assert found == {}
