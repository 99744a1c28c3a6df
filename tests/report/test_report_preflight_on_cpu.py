"""A report rendered from a real CPU preflight run (DRY_RUN=1 through the launcher and `ray job submit`): the real
DIVA trainer's metrics log, its checkpoints' difficulty states, its validation; and a quiet preflight console."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from verl_ext.report.cli import main
from verl_ext.report.run import load_run

# Starts Ray, a process group or a fresh interpreter that imports verl: the launch tier (pytest -m launch; CI runs it).
pytestmark = pytest.mark.launch


@pytest.fixture(scope="module")
def preflight(diva_dry_run):
    """The launcher's DRY_RUN preflight (``tests/conftest.py``'s ``diva_dry_run``, one launch for its tests and
    ``tests/recipe/test_launchers_on_cpu.py``'s): its run folder and console."""
    console = diva_dry_run["console"]
    assert diva_dry_run["returncode"] == 0, console[-4000:]
    (workdir,) = diva_dry_run["dir"].glob("diva_preflight_*")
    return workdir, console


def test_preflight_console_keeps_third_party_chatter_in_the_full_log(preflight):
    workdir, console = preflight
    assert "[preflight] PASSED" in console
    assert "target_num_threads" not in console and "transfer_queue" not in console
    assert "Initial validation metrics" not in console  # verl's full metric dump: in the full log
    full_log = (workdir / "preflight.log").read_text()
    assert "Initial validation metrics" in full_log and "Disabled critic" in full_log
    assert f"diva-report {workdir}" in console


def test_report_from_the_preflight_run(preflight, tmp_path):
    workdir, _ = preflight
    out = tmp_path / "report"
    assert main([str(workdir), "--output", str(out)]) == 0
    figures = json.loads((out / "figures.json").read_text())
    for name in ("collapse_rate.png", "difficulty.png", "variants.png", "training.png", "validation.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG"

    def drawn(figure, panel):
        return {s["label"]: (s["steps"], s["values"]) for s in figures[figure] if s["panel"] == panel}

    run = load_run(workdir)
    collapse = drawn("collapse_rate.png", "collapse rate")
    assert set(collapse) == {"diva/collapse_rate/local", "diva/collapse_rate/global"}
    assert collapse["diva/collapse_rate/local"][0] == [1, 2, 3]  # two launches (before and after resume) merged
    assert collapse["diva/collapse_rate/local"][1] == [run.log.steps[s]["diva/collapse_rate/local"] for s in (1, 2, 3)]
    heat = drawn("difficulty.png", "difficulty heatmap")
    saved = sorted(run.states.difficulties)
    assert saved == [2, 3] and all(steps == saved for steps, _ in heat.values())
    assert [sum(values[i] for _, values in heat.values()) for i in range(2)] == [
        len(run.states.difficulties[s]) for s in saved
    ]
    # the logged mean difficulty at a saved step is the mean of that checkpoint's state
    logged = dict(zip(*drawn("difficulty.png", "mean difficulty")["diva/difficulty/mean"], strict=True))
    state = dict(zip(*drawn("difficulty.png", "mean difficulty")["checkpoint state"], strict=True))
    assert logged[2] == pytest.approx(state[2]) and logged[3] == pytest.approx(state[3])
    assert set(drawn("variants.png", "variant mix")) >= {"original"}
    assert drawn("training.png", "Reward (mean per response)")["critic/score/mean"][0] == [1, 2, 3]
    validation = drawn("validation.png", "diva_synth")["diva_synth"]
    assert validation[0] == [0, 1, 2, 3]  # before training, then after every step
    report = (out / "report.md").read_text()
    assert "best validation accuracy: diva_synth" in report and "![Question difficulty](difficulty.png)" in report
