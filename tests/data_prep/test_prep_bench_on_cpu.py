"""The benchmark runs end to end in its --quick form and prints its figures as JSON on the last line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.launch  # a benchmark script in a fresh interpreter: the launch tier
def test_bench_prep_quick():
    completed = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_prep.py"), "--quick", "--no-record"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    figures = json.loads(completed.stdout.strip().splitlines()[-1])
    assert figures["quick"] is True
    assert figures["convert_rows_per_s_1_thread"] > 0 and figures["variants_requests"] == 2 * figures["variant_rows"]
    assert 0 < figures["variants_fraction_of_ideal"]
