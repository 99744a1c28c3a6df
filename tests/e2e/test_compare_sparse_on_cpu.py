"""``TASK=sparse bash run_scripts/compare_tiny.sh`` from nothing (the tiny model, the warm start, the data and the
properties built in a fresh OUT): verl's GRPO and DIVA-GRPO trained for real on the sparse task
(``verl_ext/lab/sparse_task.py``), 8 steps each. It checks what the task must be and what the comparison records:

* the three properties are printed before training, each holding (the task refuses to train otherwise);
* ``comparison.json`` holds the properties and, per method, the share of the warm start's unsolved validation
  questions that its final policy solves (read from the last checkpoint's Hugging Face weights);
* DIVA-GRPO keeps more advantage signal than GRPO: on this task most of GRPO's groups agree (the easy half all
  right, the hard half all wrong), while DIVA's hints and perturbations disagree.

The whole launch (warm start included) is timed and printed; the issue asks for under 40 minutes on 2 cores, and
docs/learning.md quotes the recorded time. Marked ``extended`` (about 15 minutes): run it with ``-m extended`` on
the main job's stack."""

from __future__ import annotations

import json
import time

import pytest
from tiny_launch import run_compare_tiny

METHODS = ("grpo", "diva_grpo")

pytestmark = [pytest.mark.gpu_stack, pytest.mark.extended, pytest.mark.timeout(2700)]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare_sparse")
    started = time.perf_counter()
    proc = run_compare_tiny(out, 2600, TASK="sparse", METHODS=" ".join(METHODS))
    minutes = (time.perf_counter() - started) / 60
    print(f"TASK=sparse compare_tiny.sh, {' and '.join(METHODS)} from nothing: {minutes:.1f} min")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return {"stdout": proc.stdout, "comparison": json.loads((out / "comparison.json").read_text())}


def test_the_three_properties_are_printed_and_hold(compared):
    lines = [line for line in compared["stdout"].splitlines() if line.startswith("[sparse] ")]
    assert [line.split(" (")[0] for line in lines] == [
        "[sparse] 1. unsolved",
        "[sparse] 2. hints solvable",
        "[sparse] 3. hints transfer",
    ]
    assert all("(holds)" in line for line in lines), lines
    properties = compared["comparison"]["properties"]
    assert all(properties[k]["held"] for k in ("unsolved", "hints_solvable", "hints_transfer"))


def test_each_method_records_the_unsolved_questions_it_solves(compared):
    for method in METHODS:
        share = compared["comparison"]["methods"][method]["unsolved_solved_share"]
        assert 0.0 <= share <= 1.0, method


def test_diva_keeps_more_advantage_signal_than_grpo(compared):
    methods = compared["comparison"]["methods"]
    mean = {m: sum(v for _, v in methods[m]["zero_advantage_fraction"]) / methods[m]["steps"] for m in METHODS}
    assert mean["diva_grpo"] < mean["grpo"], mean
