"""The package's shape: no import cycle, and every import points down the layers of DESIGN section 3.1.

Every import statement of `raygrpo/` counts, wherever it is (module level, inside functions, under
`TYPE_CHECKING`). A module imports only from its own layer or below; every module must have a layer, so a new module
has to be placed here deliberately.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(__file__).resolve().parent.parent / "raygrpo"

#: Lowest first. A module belongs to the layer of the longest prefix listed here (the root package's own name matches
#: only its `__init__`).
LAYERS: list[list[str]] = [
    # records shared by every layer, errors, user-code loading, process environment, asyncio helpers, patches of
    # libraries, scratch folders
    ["raygrpo.core"],
    # pure data: environment specs and run settings
    ["raygrpo.specs", "raygrpo.config"],
    # environments, sandbox backends, leases, provider governors, policies
    ["raygrpo.envs", "raygrpo.sandbox", "raygrpo.docker", "raygrpo.leases", "raygrpo.governor", "raygrpo.policy"],
    # one rollout and the worker running many: chat rendering, tool calls, the agent loop
    ["raygrpo.agent"],
    # thin Ray shells
    ["raygrpo.actors"],
    # the driver: resolve, launch, dispatch, pools, summary, check
    ["raygrpo.driver"],
    # the learner, and exporting a run's trajectories
    ["raygrpo.train", "raygrpo.export"],
    ["raygrpo.cli"],
    # test support: imported by no runtime module
    ["raygrpo.testing"],
]


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file of every module under `package_dir` (packages by their `__init__`)."""
    out = {}
    for file in package_dir.rglob("*.py"):
        parts = list(file.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = file
    return out


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, from every import statement at any depth."""
    modules = module_names(package_dir)
    root = package_dir.name
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, file in modules.items():
        is_package = file.name == "__init__.py"
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] == root:
                    # `from pkg import sub` inside pkg resolves to the submodule, not to pkg's own __init__.
                    if not (modules[target].name == "__init__.py" and name.startswith(target + ".")):
                        graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def layer_of(module: str, layers: list[list[str]]) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for number, prefixes in enumerate(layers):
        for prefix in prefixes:
            if module == prefix or ("." in prefix and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), number)
    return None if best is None else best[1]


def layer_problems(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Modules without a layer, and imports that point up the layers."""
    root = min(graph, key=len)  # the root package's `__init__` (its public API) stands outside the order
    problems = [f"{m} has no layer" for m in sorted(graph) if m != root and layer_of(m, layers) is None]
    for source in sorted(graph):
        if source == root:
            continue
        for target in sorted(graph[source]):
            src, dst = layer_of(source, layers), layer_of(target, layers)
            if src is not None and dst is not None and dst > src:
                problems.append(f"{source} (layer {src}) imports {target} (layer {dst})")
    return problems


def test_raygrpo_has_no_import_cycle():
    assert find_cycles(import_graph(PACKAGE)) == []


def test_raygrpo_imports_point_down_the_layers():
    assert layer_problems(import_graph(PACKAGE), LAYERS) == []


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "pkg"


def test_the_checks_catch_a_planted_cycle_and_an_upward_import(tmp_path):
    package = _plant(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from pkg.high import g\n",  # function-local: counts
        "high.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import low\n",
        "mid/__init__.py": "",
        "mid/a.py": "from pkg.mid import b\n",
        "mid/b.py": "import pkg.mid.a\n",
        "loose.py": "",
    })
    graph = import_graph(package)
    assert graph["pkg.low"] == {"pkg.high"} and graph["pkg.high"] == {"pkg.low"}
    assert find_cycles(graph) == [["pkg.high", "pkg.low"], ["pkg.mid.a", "pkg.mid.b"]]
    layers = [["pkg", "pkg.low"], ["pkg.mid"], ["pkg.high"]]
    assert layer_problems(graph, layers) == [
        "pkg.loose has no layer",
        "pkg.low (layer 0) imports pkg.high (layer 2)",
    ]


def test_a_clean_planted_package_passes(tmp_path):
    package = _plant(tmp_path, {"__init__.py": "", "a.py": "", "b.py": "from pkg import a\n"})
    graph = import_graph(package)
    assert find_cycles(graph) == []
    assert layer_problems(graph, [["pkg", "pkg.a"], ["pkg.b"]]) == []



#: The most lines a module of the package may have (issue 39): past it, a module holds more than one job.
MAX_MODULE_LINES = 400


def test_no_module_is_over_the_line_limit():
    long = {str(path.relative_to(PACKAGE.parent)): n for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"
