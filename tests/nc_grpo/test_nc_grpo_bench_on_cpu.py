"""The branching benchmark runs end to end (--quick: the random tiny model) and ends with one JSON line of figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The hf_cpu server's generation code (transformers): the main job's stack in CI (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_nc_grpo_branching.py"


def test_quick_benchmark_reruns_without_noise_and_prints_its_figures_as_json(tmp_path):
    command = [sys.executable, str(BENCH), "--quick", "--no-record", "--workdir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["benchmark"] == "nc_grpo_branching" and figures["quick"] is True
    configs = figures["tasks"]["random_tiny"]["configs"]
    assert set(configs) == {f"{t}@{c:g}" for t in ("layer_input", "final_hidden") for c in (0.5, 8.0)}
    for entry in configs.values():
        assert entry["noisy_rollouts"] == 4  # 2 prompts x half of 4 responses, each rerun without noise
        assert 0 <= entry["first_token"] <= entry["branched"] <= 1
        assert (entry["first_diff"] is None) == (entry["branched"] == 0)
        # A configuration that branched (almost) nothing says so, in the JSON and on the console.
        assert (entry["warning"] is not None) == (entry["branched"] < 0.01)
        if entry["warning"]:
            assert entry["warning"] in result.stdout
    # The random model's near-uniform distributions: a large kick on the persisting reading does branch.
    assert configs["layer_input@8"]["branched"] > 0
