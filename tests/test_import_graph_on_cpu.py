"""Imports flow one way: the import graph of the project's packages (``verl_ext``, ``data_prep``, ``recipe.diva_grpo``),
built from the code with ``ast``, has no cycle.

An edge ``a -> b`` is an ``import`` or ``from ... import`` statement in module ``a`` that names module ``b`` of these
packages, wherever it stands: at module level, inside a function or a class (a function-level import only delays
a cycle until the function first runs), relative imports resolved, ``from pkg import sub`` to the submodule
``sub``, ``from pkg import name`` to ``pkg``, ``importlib.import_module("literal")`` too. Left out: imports under
``if TYPE_CHECKING:`` (they never run), and the package ``__init__`` that Python runs before any of its submodules
(``import a.b.c`` is an edge to ``a.b.c`` only: counting the parents would make every package whose ``__init__``
re-exports a submodule a cycle with it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("verl_ext", "data_prep", "recipe/diva_grpo")


def project_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` (folders relative to ``root``)."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_statements(tree: ast.AST):
    """Every import node of ``tree`` outside ``if TYPE_CHECKING:`` blocks, at any depth."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _named_modules(node, module: str, is_package: bool, modules: dict) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.Call):
        return [node.args[0].value]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``{module: {imported project module: line of the first such import}}``."""
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _import_statements(tree):
            for name in _named_modules(node, module, path.name == "__init__.py", modules):
                while name and name not in modules:  # `import a.b.func`-style names: the module that holds them
                    name = name.rpartition(".")[0]
                if name and name != module:
                    line = graph[module].get(name)
                    graph[module][name] = node.lineno if line is None else min(line, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict, modules: dict) -> str:
    """The edges inside one cycle, as ``file:line imports module``."""
    members = set(component)
    lines = [
        f"  {modules[a].relative_to(ROOT) if modules[a].is_relative_to(ROOT) else modules[a]}:{line} imports {b}"
        for a in component
        for b, line in sorted(graph[a].items())
        if b in members
    ]
    return "\n".join(lines)


def test_the_project_imports_flow_one_way():
    modules = project_modules(ROOT)
    graph = import_graph(modules)
    found = cycles(graph)
    assert found == [], "import cycles (break each by moving what both sides need into a leaf module):\n" + "\n".join(
        describe(c, graph, modules) for c in found
    )


def test_the_graph_counts_function_level_and_relative_imports():
    """What the graph is built from, on the real code: a function-level import (the plugin's lazy look-up of the
    methods) and a module-level one are edges; the leaf modules that broke the former cycles import nothing of ours."""
    graph = import_graph(project_modules(ROOT))
    assert "verl_ext.methods" in graph["verl_ext.plugin"]  # inside check_registered()
    assert "verl_ext.mupo.embeddings_client" in graph["verl_ext.mupo.embedder"]  # inside build_embedder()
    assert "verl_ext.cpu.rollout" in graph["verl_ext.cpu"]  # inside _load_hf_cpu_replica()
    assert "verl_ext.method_names" in graph["verl_ext.methods"]
    for leaf in ("verl_ext.method_names", "verl_ext.mupo.backend", "verl_ext.cpu.names"):
        assert graph[leaf] == {}, leaf


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    "files, cycle",
    [
        # a function-level import closes the loop
        (
            {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "def f():\n    import pkg.a\n"},
            ["pkg.a", "pkg.b"],
        ),
        # a relative import, through three modules
        (
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from .b import x\n",
                "pkg/b.py": "from . import c\nx = 1\n",
                "pkg/c.py": "from pkg.a import y\n",
            },
            ["pkg.a", "pkg.b", "pkg.c"],
        ),
        # a package __init__ and its submodule, by name
        (
            {"pkg/__init__.py": "def load():\n    from pkg.sub import K\n", "pkg/sub.py": "from pkg import load\n"},
            ["pkg", "pkg.sub"],
        ),
        # importlib with a literal name
        (
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "import importlib\nimportlib.import_module('pkg.b')\n",
                "pkg/b.py": "import pkg.a\n",
            },
            ["pkg.a", "pkg.b"],
        ),
    ],
)
def test_a_cycle_fails(tmp_path, files, cycle):
    _write(tmp_path, files)
    assert cycles(import_graph(project_modules(tmp_path, ("pkg",)))) == [cycle]


def test_what_is_not_a_cycle(tmp_path):
    """A TYPE_CHECKING import never runs, and a submodule re-exported by its package's __init__ is not a cycle."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\n",
            "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\nA = 1\n",
            "pkg/b.py": "from pkg.a import A\nB = A\n",
        },
    )
    assert cycles(import_graph(project_modules(tmp_path, ("pkg",)))) == []
