"""A page that names a test says how that test runs, and the test exists.

CI runs every test but those marked ``extended`` (``.ci/run``: ``-m "not gpu_stack and not launch"`` and
``-m "launch and not gpu_stack"`` on the development stack, then
``-m "gpu_stack and not extended"`` on the main job's). So, for each test file a page names (``tests/...py``,
optionally ``::test_name``), in the paragraph or list item that names it:

* the file (and the named test) exists;
* a file with tests marked ``extended`` (all of them, one test, or one parameter of a fixture) is named with the
  command that runs them, ``-m extended``: CI never runs those;
* a file marked ``gpu_stack`` is named with ``gpu_stack`` (or the main job's stack, ``setup_vllm_cpu.sh``): the
  README's development command leaves it out;
* a paragraph that says ``-m extended`` names at least one file that has such tests (a page cannot promise an
  extended run of a test that is not one).

The marks are read from the test files' source (module ``pytestmark``, decorators, ``pytest.param(..., marks=...)``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "recipe/diva_grpo/README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "benchmarks/results").glob("*/NOTES.md"),
    ]
)
MENTION = re.compile(r"(?P<path>tests/[\w/]+\.py)(?:::(?P<test>\w+))?")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# How a page says that a test runs on the main job's stack (CI's second environment).
GPU_STACK_WORDS = ("gpu_stack", "main job's stack", "setup_vllm_cpu.sh")


@dataclass(frozen=True)
class Marks:
    tests: frozenset[str]
    module: frozenset[str]
    extended_somewhere: bool

    @property
    def extended(self) -> bool:
        return "extended" in self.module or self.extended_somewhere


def _mark_names(node: ast.AST) -> set[str]:
    """``pytest.mark.X`` names inside ``node`` (a decorator, a list, a call's argument)."""
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"
    }


def marks_of(path: Path) -> Marks:
    tree = ast.parse(path.read_text())
    module: set[str] = set()
    tests: set[str] = set()
    extended = False
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            module |= _mark_names(node.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name.startswith("test_"):
                tests.add(node.name)
            extended |= any("extended" in _mark_names(d) for d in node.decorator_list)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "param":
            extended |= any(k.arg == "marks" and "extended" in _mark_names(k.value) for k in node.keywords)
    return Marks(frozenset(tests), frozenset(module), extended)


def paragraphs(text: str) -> list[tuple[int, str]]:
    """``(first line, text)`` of each paragraph or list item outside code blocks."""
    text = FENCE.sub(lambda m: "\n" * m.group().count("\n"), text)
    found, current, start = [], [], 0
    for number, line in enumerate(text.splitlines(), start=1):
        new_item = line.lstrip().startswith(("- ", "* ", "| ")) or re.match(r"\s*\d+\. ", line)
        if not line.strip() or new_item:
            if current:
                found.append((start, "\n".join(current)))
            current, start = ([line], number) if line.strip() else ([], number + 1)
        else:
            if not current:
                start = number
            current.append(line)
    if current:
        found.append((start, "\n".join(current)))
    return found


def claim_problems(page: Path, text: str) -> list[str]:
    where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    problems = []
    for line, paragraph in paragraphs(text):
        flat = " ".join(paragraph.split())
        mentions = list(MENTION.finditer(flat))
        any_extended = False
        for mention in mentions:
            path = ROOT / mention["path"]
            if path.name == "conftest.py" or not path.name.startswith("test_"):
                if not path.exists():
                    problems.append(f"{where}:{line}: {mention['path']} does not exist")
                continue
            if not path.exists():
                problems.append(f"{where}:{line}: {mention['path']} does not exist")
                continue
            marks = marks_of(path)
            if mention["test"] and mention["test"] not in marks.tests:
                problems.append(f"{where}:{line}: {mention['path']} has no test {mention['test']}")
            any_extended |= marks.extended
            if marks.extended and "-m extended" not in flat:
                problems.append(
                    f"{where}:{line}: {mention['path']} has tests marked extended, which CI leaves out: say so with"
                    " the command that runs them (-m extended)"
                )
            if "gpu_stack" in marks.module and not any(word in flat for word in GPU_STACK_WORDS):
                problems.append(
                    f"{where}:{line}: {mention['path']} is marked gpu_stack (CI runs it on the main job's stack, not"
                    " under the README's development command): say gpu_stack"
                )
        if mentions and "-m extended" in flat and not any_extended:
            problems.append(f"{where}:{line}: says -m extended, but none of the tests it names is marked extended")
    return problems


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_a_page_says_how_each_test_it_names_runs(page):
    problems = claim_problems(page, page.read_text())
    assert not problems, "\n".join(problems)


def test_the_marks_are_read_from_the_source():
    identity = marks_of(ROOT / "tests/e2e/test_grpo_identity_on_cpu.py")
    assert identity.extended and "extended" not in identity.module  # one parameter (hf_cpu) is extended
    crash = marks_of(ROOT / "tests/e2e/test_crash_resume_on_cpu.py")
    assert {"gpu_stack", "extended"} <= crash.module
    assert not marks_of(ROOT / "tests/algos/test_pgpo_on_cpu.py").extended


@pytest.mark.parametrize(
    "text, expected",
    [
        ("- `tests/e2e/test_crash_resume_on_cpu.py` (`gpu_stack`) runs in CI.", "-m extended"),
        ("- `tests/e2e/test_tiny_cpu_training_on_cpu.py` (CPU, in `pytest tests`).", "gpu_stack"),
        ("`tests/e2e/test_no_such_test_on_cpu.py` checks it.", "does not exist"),
        ("`tests/algos/test_pgpo_on_cpu.py::test_nothing_here` checks it.", "has no test"),
        ("`tests/algos/test_pgpo_on_cpu.py` (run it with `pytest -m extended`).", "none of the tests"),
    ],
)
def test_a_wrong_claim_is_caught(text, expected):
    problems = claim_problems(ROOT / "docs/example.md", text)
    assert any(expected in p for p in problems), problems


def test_a_right_claim_passes():
    text = (
        "- `tests/e2e/test_crash_resume_on_cpu.py` (`gpu_stack`, marked `extended`: CI leaves it out; run it with\n"
        "  `DIVA_REQUIRE_VLLM=1 ~/venvs/diva-vllm-cpu/bin/python -m pytest tests -q -m extended`).\n"
    )
    assert claim_problems(ROOT / "docs/example.md", text) == []
