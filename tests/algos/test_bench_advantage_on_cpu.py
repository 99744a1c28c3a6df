"""The advantage benchmark runs end to end (--quick) and ends with one JSON line of figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_advantage.py"


@pytest.mark.launch  # a benchmark script in a fresh interpreter: the launch tier
def test_quick_benchmark_prints_its_figures_as_json():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-record"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "advantage" and figures["quick"] is True
    for mask_dtype in ("int64", "float32"):
        timings = figures[mask_dtype]["ms"]
        assert set(timings) == {"floor", "diva", "grpo", "grpo_vectorized"}
        assert all(value > 0 for value in timings.values())
        assert figures[mask_dtype]["diva_over_grpo"] == pytest.approx(timings["diva"] / timings["grpo"], rel=0.05)
