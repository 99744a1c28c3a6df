"""Did a move of documentation keep every measured figure? A one-off check, not a test (it compares with a file of
the past): ``python tests/docs/figures_moved.py OLD.md [OLD.md ...]``, e.g. with the README before the move
(``git show <commit>:README.md > /tmp/README_before.md``).

It lists, for the old files:

* every figure outside option tables (a number, with its unit when one follows: ``%``, ``x``/``×``, ``s``, ``ms``,
  ``min``, ``GB``, ``MiB``, ``nats``, ...) that appears nowhere in today's pages (``README.md``,
  ``recipe/diva_grpo/README.md``, ``docs/**/*.md``); the defaults of option tables are left to the docs test, which
  checks them against the code;
* every row of a table of measurements (a row with a digit, in a table that is not an option or layout table) that
  is not a row of a table of today's pages, whitespace and link targets aside.

Exit status 1 when something is missing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNITS = r"%|×|x\b|ms\b|s\b|min\b|minutes\b|GB\b|GiB\b|MiB\b|MB\b|nats\b|°|B\b|d\b|points\b"
FIGURE = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)(?:\s?(" + UNITS + "))?")
# Tables that are not measurements: options and their defaults (the docs test checks those against the code), the
# folders of the layout.
NOT_MEASUREMENTS = ("key", "knob", "option", "reward_kwargs key", "variable", "setting", "folder")


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "recipe/diva_grpo/README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def figures(text: str) -> set[tuple[str, str]]:
    return {(number.rstrip(","), unit or "") for number, unit in FIGURE.findall(text)}


def table_rows(text: str, measurements_only: bool) -> list[str]:
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if re.fullmatch(r"[-: |]+", line):
            continue
        first = re.sub(r"\s*\(.*\)$", "", header[0].strip("` ")).lower()
        if measurements_only and (first in NOT_MEASUREMENTS or not re.search(r"\d", line)):
            continue
        rows.append(_normal(line))
    return rows


def _normal(row: str) -> str:
    """A table row with whitespace collapsed and links reduced to their text."""
    return " ".join(re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", row).split())


def outside_option_tables(text: str) -> str:
    """``text`` without the rows of its option tables (defaults, not measurements)."""
    kept, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            kept.append(line)
            continue
        if header is None:
            header = re.sub(r"\s*\(.*\)$", "", line.strip().strip("|").split("|")[0].strip("` ")).lower()
        if header not in NOT_MEASUREMENTS[:-1]:
            kept.append(line)
    return "\n".join(kept)


def main(old_files: list[str]) -> int:
    new = "\n".join(p.read_text() for p in pages())
    new_figures = figures(new)
    new_rows = set(table_rows(new, measurements_only=False))
    missing = 0
    for name in old_files:
        old = Path(name).read_text()
        lost = sorted(figures(outside_option_tables(old)) - new_figures)
        rows = [row for row in table_rows(old, measurements_only=True) if row not in new_rows]
        old_figures = figures(outside_option_tables(old))
        print(
            f"{name}: {len(old_figures)} distinct figures, {len(lost)} not on any page; "
            f"{len(table_rows(old, True))} measurement-table rows, {len(rows)} not on any page"
        )
        for number, unit in lost:
            where = [i for i, line in enumerate(old.splitlines(), 1) if number in line]
            print(f"  figure {number}{' ' + unit if unit else ''} (line {', '.join(map(str, where[:5]))})")
        for row in rows:
            print(f"  row {row[:150]}")
        missing += len(lost) + len(rows)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
