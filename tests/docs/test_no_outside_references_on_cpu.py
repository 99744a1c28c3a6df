"""The project's files cite only what the repository holds: no design notes of the team's (DESIGN.md, METHODS.md,
the folder beside the checkout) that a user's clone does not have."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Recorded runs keep the words of the session that made them.
RECORDED = "benchmarks/results/"
OUTSIDE = re.compile(r"\b(DESIGN|METHODS)\.md\b|\.\./shared\b")


def outside_references(root: Path) -> list[str]:
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in files:
        if name.startswith(RECORDED) or name == "tests/docs/test_no_outside_references_on_cpu.py":
            continue
        try:
            text = (root / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        found += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    return found


def test_no_file_cites_a_note_outside_the_repository():
    assert outside_references(ROOT) == []


def test_the_check_finds_a_citation(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "a.py").write_text('"""Paper hyperparameters (DESIGN.md section 5)."""\n')
    subprocess.run(["git", "add", "a.py"], cwd=tmp_path, check=True)
    assert outside_references(tmp_path) == ["a.py:1"]
