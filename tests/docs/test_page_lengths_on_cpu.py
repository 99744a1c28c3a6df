"""Pages shaped like verl's (issue 55): a method's page is one screen of maths, its options, a minimal config, the
run command, its metrics and a short "what was measured" with links; the run-by-run reading of the runs lives in
their folder's ``benchmarks/results/<sweep>/NOTES.md``. So each page stays under a line limit."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {
    **{f"docs/algo/{page.name}": 200 for page in sorted((ROOT / "docs/algo").glob("*.md"))},
    "docs/learning.md": 300,
    "docs/reliability.md": 300,
}


@pytest.mark.parametrize("page, limit", sorted(LIMITS.items()), ids=[page for page in sorted(LIMITS)])
def test_a_page_stays_under_its_line_limit(page, limit):
    lines = len((ROOT / page).read_text().splitlines())
    assert lines <= limit, (
        f"{page} has {lines} lines, over its {limit}: move the lab notebook (run-by-run readings, per-seed tables) to"
        " the runs' benchmarks/results/<sweep>/NOTES.md and link to it"
    )


def test_the_method_pages_are_found():
    assert {"docs/algo/diva_grpo.md", "docs/algo/noise_contrastive_grpo.md"} <= set(LIMITS)
