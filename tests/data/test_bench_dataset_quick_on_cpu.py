"""Smoke run of benchmarks/bench_dataset.py --quick: it runs and its last line is the JSON figures."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.launch  # a benchmark script in a fresh interpreter: the launch tier
def test_bench_dataset_quick_prints_json_last():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_dataset.py"), "--quick", "--no-record"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["time_per_prompt_ratio"] > 0 and figures["diva_prompts_per_s"] > 0
    assert set(figures["perturb_ms"]) >= {"rotate", "gaussian_noise", "text_band", "png_decode"}
