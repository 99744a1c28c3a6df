"""The README's layout table matches the tree: every folder it names exists, and every package of ``verl_ext/`` is
named in its ``verl_ext/`` row (a package added or moved without the table saying so fails here)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_rows(readme: str) -> dict[str, str]:
    """``{first cell's path: the row's description}`` of the table under ``## Layout``."""
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def named_paths(text: str) -> set[str]:
    """The code spans of ``text`` that name a folder (``x/``) or a Python file (``x.py``)."""
    return {span for span in re.findall(r"`([^`\s]+)`", text) if span.endswith("/") or span.endswith(".py")}


def library_packages(root: Path = ROOT) -> set[str]:
    """The packages directly under ``verl_ext/``, as ``name/``."""
    return {f"{p.parent.name}/" for p in (root / "verl_ext").glob("*/__init__.py")}


def test_every_folder_the_table_names_exists():
    rows = layout_rows((ROOT / "README.md").read_text())
    assert "verl_ext/" in rows
    missing = [folder for folder in rows if not (ROOT / folder).is_dir()]
    for name in named_paths(rows["verl_ext/"]):
        if not (ROOT / "verl_ext" / name).exists():
            missing.append(f"verl_ext/{name}")
    assert missing == [], f"the README's layout table names what the tree does not have: {missing}"


def test_every_library_package_is_in_the_table():
    named = named_paths(layout_rows((ROOT / "README.md").read_text())["verl_ext/"])
    unnamed = sorted(library_packages() - named)
    assert unnamed == [], f"packages of verl_ext/ the README's layout table does not name: {unnamed}"


def test_the_table_is_read_from_its_cells():
    readme = "# x\n\n## Layout\n\n| folder | what |\n|---|---|\n| `a/` | one (`b/`), `c.py`, `--flag` |\n\n## Next\n"
    rows = layout_rows(readme)
    assert rows == {"a/": "one (`b/`), `c.py`, `--flag`"}
    assert named_paths(rows["a/"]) == {"b/", "c.py"}
