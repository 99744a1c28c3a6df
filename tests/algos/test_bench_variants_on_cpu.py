"""The variants benchmark runs end to end (--quick) and ends with one JSON line of figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_variants.py"
BASELINES = {"grpo", "grpo_vectorized"}


@pytest.mark.launch  # a benchmark script in a fresh interpreter: the launch tier
def test_quick_benchmark_prints_its_figures_as_json():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-record"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "variants" and figures["quick"] is True and figures["targets_met"] is None
    timings = figures["ms"]
    names = set(figures["over_grpo"])  # every case of the benchmark's CASES list
    assert {"avspo", "avspo_released", "codapo"} <= names and set(figures["over_grpo_vectorized"]) == names
    assert set(timings) == BASELINES | names
    assert all(value > 0 for value in timings.values())
    for name in names:
        assert figures["over_grpo"][name] == pytest.approx(timings[name] / timings["grpo"], rel=0.05, abs=1e-3)
        assert figures["over_grpo_vectorized"][name] == pytest.approx(
            timings[name] / timings["grpo_vectorized"], rel=0.05, abs=1e-3
        )
    assert 0 < figures["collapse_rate"] < 1  # the batch has collapsed and mixed groups
