"""The recorded sweeps still repeat, value for value: their first steps trained again with today's code.

``run_scripts/sweep_tiny.sh`` trains GRPO, DIVA-GRPO and NC-GRPO with verl's rollout correction (``nc_grpo_rc``)
for two steps at seed 0, from this machine's warm start; each run must log every value the recorded run of the same
configuration, seed and warm start logged over those steps (validation before training, then steps 1-2), wall
times aside (:func:`verl_ext.checks.same_run.metric_differences`). What changed since those runs were recorded
(the CPU runs' replay-buffer poll interval, the toolkit trainer calling verl's own advantage step, the packages'
moves) must change no value.

A warm start is the same only on one machine kind (docs/learning.md, "Which runs pair"): the recorded folder is the
one whose runs began from this machine's warm start (its fingerprint in each ``done.json``); on a kind with no
recorded sweep the test skips, naming the fingerprint. The recorded runs' validation batches came out of the replay
buffer in the order their requests finished, which it has fixed since
(``tests/rollout/test_validation_order_on_cpu.py``): verl's bootstrap statistics of validation (``best@k``,
``worst@k``, ``std@k``), which resample each question in that order, are not compared, validation means are compared
to the last bits (relative 1e-12), every other value exactly. About 10 minutes on two idle cores, most of it the warm
start (``DIVA_SWEEP_WORKDIR=DIR`` keeps and reuses it): marked ``extended``, run with ``-m extended`` (CI leaves it
out for time).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest

from verl_ext.checks.same_run import metric_differences
from verl_ext.report.run import load_run

pytestmark = [pytest.mark.launch, pytest.mark.extended, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = ("grpo", "diva_grpo", "nc_grpo_rc")
STEPS = 2
# verl's validation bootstrap statistics, drawn over the questions in the order the recorded runs' requests finished;
# and the validation means, summed in that order.
BOOTSTRAP = re.compile(r"^val-(aux|core)/.*/(best|worst|std)@")
VALIDATION_MEAN = re.compile(r"^val-(aux|core)/.*/mean@")


def recorded_run(config: str, warm_start: str) -> Path | None:
    """A recorded run of ``config`` at seed 0 that began from the warm start ``warm_start``."""
    for done in sorted(RESULTS.glob(f"sweep_tiny*/{config}/seed0/done.json")):
        if json.loads(done.read_text())["protocol"]["warm_start"] == warm_start:
            return done.parent
    return None


def differences_from(recorded: Path, run: Path) -> list[str]:
    """What ``run`` does not repeat of ``recorded``'s steps 0 to :data:`STEPS` (see the module docstring)."""
    expected = {step: values for step, values in load_run(recorded).log.steps.items() if step <= STEPS}
    actual = load_run(run).log.steps
    exact = {
        step: {k: v for k, v in values.items() if not (BOOTSTRAP.search(k) or VALIDATION_MEAN.search(k))}
        for step, values in expected.items()
    }
    differences = metric_differences(exact, actual)
    for step, values in expected.items():
        for key, value in values.items():
            got = actual.get(step, {}).get(key)
            if VALIDATION_MEAN.search(key) and (got is None or not math.isclose(got, value, rel_tol=1e-12)):
                differences.append(f"step {step}: {key} expected {value!r}, got {got!r}")
    return differences


def compare_with_recorded(out: Path) -> int:
    """Assert each run of ``out`` repeats its recorded run; how many were compared."""
    warm_start = json.loads((out / "grpo" / "seed0" / "done.json").read_text())["protocol"]["warm_start"]
    compared = 0
    for config in CONFIGS:
        recorded = recorded_run(config, warm_start)
        if recorded is None:
            continue
        differences = differences_from(recorded, out / config / "seed0")
        assert differences == [], f"{config} differs from {recorded.relative_to(ROOT)}:\n" + "\n".join(differences[:20])
        compared += 1
    if compared == 0:
        pytest.skip(
            f"no recorded sweep began from this machine's warm start {warm_start}: another machine kind, or another "
            "torch than the recorded runs' (their done.json says which; command 1's stack is theirs)"
        )
    assert compared == len(CONFIGS), f"only {compared} of {CONFIGS} have a recorded run from warm start {warm_start}"
    return compared


def test_the_first_steps_of_the_recorded_sweeps_repeat(tmp_path):
    out = tmp_path / "sweep"
    env = {**os.environ, "OUT": str(out), "CONFIGS": " ".join(CONFIGS), "SEEDS": "0", "STEPS": str(STEPS)}
    env["WORKDIR"] = os.environ.get("DIVA_SWEEP_WORKDIR") or str(tmp_path / "work")
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        ["bash", "run_scripts/sweep_tiny.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3500
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert compare_with_recorded(out) == len(CONFIGS)
