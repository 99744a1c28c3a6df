"""The blind-pass benchmark runs end to end (--quick) and ends with one JSON line of figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_blind_pass.py"


def test_quick_benchmark_prints_its_figures_as_json():
    result = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-record"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "blind_pass" and figures["quick"] is True
    assert set(figures["ms"]) == {"sighted", "blind", "blind_view_only"}
    assert all(value > 0 for value in figures["ms"].values())
    assert figures["blind_over_sighted"] == pytest.approx(figures["ms"]["blind"] / figures["ms"]["sighted"], rel=0.01)
    assert 0 < figures["visual_tokens"] < figures["tokens"]
