"""The blind pass through verl's real actor worker group (Ray, FSDP2 engine on the CPU platform, TransferQueue,
verl's dispatch), in its own process: ``tests/pgpo/blind_worker_run.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).with_name("blind_worker_run.py")

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(900)]


def test_blind_log_probs_through_verls_worker_group(tmp_path):
    result = subprocess.run(
        [sys.executable, str(RUNNER), str(tmp_path)], capture_output=True, text=True, timeout=840, cwd=RUNNER.parents[2]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["returned_same_batch"]
    metrics = report["metrics"]
    assert metrics["pgpo/visual_share"] == 0.5 and metrics["pgpo/blind_pass_share"] == 0.5
    assert metrics["timing_s/blind_log_prob"] > 0
    # The text-only rows make the sighted pass's second micro-batch: one without pixels (verl_ext/no_pixels_patch.py
    # in the worker process); their log-probs are checked against a forward by hand below.
    assert [row["image"] for row in report["rows"]] == [True, True, False, False]
    for row in report["rows"]:
        # The worker's blind log-probs are a forward of the sequence without its visual tokens, positions kept.
        assert row["blind_vs_by_hand"] < 1e-4, row
        if row["image"]:
            assert row["blind_vs_sighted"] > 1e-3, row
        else:  # text only: not run, old_log_probs copied
            assert row["blind_vs_sighted"] == 0.0, row
