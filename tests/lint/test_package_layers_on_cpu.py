"""The CPU code's three packages, each a room of its own, and imports that flow one way between them.

``verl_ext.cpu`` is the backend verl needs to train on a CPU at all, ``verl_ext.checks`` the checks that prove a
run right, ``verl_ext.lab`` the experiments (tasks, warm starts, comparisons, sweeps). Imports flow lab -> checks ->
backend -> verl: a check may use the backend, never the lab; the backend uses neither. Every import counts, a
function-level one too (it runs as soon as the function does): the graph is the project's import-graph test's
(``tests/test_import_graph_on_cpu.py``), built from the code with ``ast``. Each module stays readable whole (at most
:data:`MAX_MODULE_LINES` lines) and each function too (at most :data:`MAX_FUNCTION_LINES`, its docstring left out).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Lower layers first: a package may import the ones before it, never the ones after.
LAYERS = ("verl_ext.cpu", "verl_ext.checks", "verl_ext.lab")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _graph_helpers():
    spec = importlib.util.spec_from_file_location("_import_graph", ROOT / "tests" / "test_import_graph_on_cpu.py")
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    return helpers


def layer_of(module: str) -> int | None:
    """The index of ``module``'s package in :data:`LAYERS`, or None outside them."""
    for index, package in enumerate(LAYERS):
        if module == package or module.startswith(package + "."):
            return index
    return None


def upward_imports(graph: dict[str, dict[str, int]], modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """Each import of a module of a higher layer, as ``file:line imports module``."""
    found = []
    for module, imported in sorted(graph.items()):
        own = layer_of(module)
        for target, line in sorted(imported.items()):
            other = layer_of(target)
            if own is not None and other is not None and other > own:
                found.append(f"{modules[module].relative_to(root)}:{line} imports {target}")
    return found


def _docstring_lines(node: ast.AST) -> int:
    body = getattr(node, "body", [])
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first.end_lineno - first.lineno + 1
    return 0


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES, root: Path = ROOT) -> list[str]:
    """Functions of ``path`` longer than ``limit`` lines from ``def`` to their last line, docstring left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            if length > limit:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length} lines")
    return found


def _layer_files() -> list[Path]:
    return [path for package in LAYERS for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py"))]


def test_the_three_packages_exist():
    for package in LAYERS:
        assert (ROOT / package.replace(".", "/") / "__init__.py").is_file(), package


def test_no_package_imports_a_layer_above_it():
    helpers = _graph_helpers()
    modules = helpers.project_modules(ROOT)
    graph = helpers.import_graph(modules)
    assert upward_imports(graph, modules) == [], "imports flow lab -> checks -> cpu (move the shared piece down)"


def test_modules_and_functions_stay_readable_whole():
    too_long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for path in _layer_files()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    too_long += [entry for path in _layer_files() for entry in long_functions(path)]
    assert too_long == [], "split by concern:\n" + "\n".join(too_long)


@pytest.mark.parametrize(
    "files, upward",
    [
        # a lazy import inside a function counts
        (
            {"verl_ext/cpu/a.py": "def f():\n    from verl_ext.lab import b\n", "verl_ext/lab/b.py": ""},
            ["verl_ext/cpu/a.py:2 imports verl_ext.lab.b"],
        ),
        # a check importing the lab
        ({"verl_ext/checks/c.py": "import verl_ext.lab.b\n", "verl_ext/lab/b.py": ""}, None),
        # downward imports are fine
        ({"verl_ext/lab/b.py": "from verl_ext.checks import c\nfrom verl_ext.cpu import a\n"}, []),
    ],
)
def test_an_upward_import_is_found(tmp_path, files, upward):
    files = {"verl_ext/__init__.py": "", **{f"verl_ext/{p}/__init__.py": "" for p in ("cpu", "checks", "lab")}, **files}
    files.setdefault("verl_ext/cpu/a.py", "")
    files.setdefault("verl_ext/checks/c.py", "")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    helpers = _graph_helpers()
    modules = helpers.project_modules(tmp_path, packages=("verl_ext",))
    found = upward_imports(helpers.import_graph(modules), modules, tmp_path)
    assert found == (upward if upward is not None else ["verl_ext/checks/c.py:1 imports verl_ext.lab.b"])


def test_a_long_function_is_found(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('def f():\n    """Doc.\n\n    More."""\n' + "    x = 1\n" * 60 + "\n\ndef g():\n    return 1\n")
    assert long_functions(path, limit=60, root=tmp_path) == ["m.py:1 f: 61 lines"]
