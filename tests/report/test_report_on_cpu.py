"""``diva-report`` end to end on run folders written like training runs: one run, two runs, a run still going, a run
without checkpoints, malformed logs; the figures exist, are PNGs, and hold the expected series."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from report_fixtures import training_run, write_log

from verl_ext.report.cli import main
from verl_ext.report.logs import ReportError, merge_logs
from verl_ext.report.run import load_run

FIGURES = ("collapse_rate.png", "difficulty.png", "variants.png", "training.png", "validation.png")
BASE_ACC = {"mathvista": [0.30, 0.40, 0.50, 0.58, 0.60, 0.59], "wemath": [0.40, 0.45, 0.52, 0.55, 0.57, 0.60]}
FAST_ACC = {"mathvista": [0.30, 0.50, 0.61, 0.63, 0.64, 0.66], "wemath": [0.40, 0.55, 0.58, 0.61, 0.63, 0.64]}


@pytest.fixture
def runs(tmp_path):
    grpo = training_run(tmp_path / "grpo", steps=50, val_every=10, accs=BASE_ACC, seed=1, diva=False)
    diva = training_run(tmp_path / "diva", steps=50, val_every=10, accs=FAST_ACC, seed=2, save_every=10, files=2)
    return grpo, diva


def drawn(output) -> dict:
    return json.loads((output / "figures.json").read_text())


def series_of(figure: list, panel: str, run: str) -> dict[str, tuple[list, list]]:
    return {s["label"]: (s["steps"], s["values"]) for s in figure if s["panel"] == panel and s["run"] == run}


def check_pngs(output, names) -> None:
    for name in names:
        with Image.open(output / name) as image:
            assert image.format == "PNG" and image.width >= 600 and image.height >= 300


def test_two_runs_side_by_side(runs, tmp_path, capsys):
    grpo, diva = runs
    out = tmp_path / "report"
    assert main([str(grpo), str(diva), "--output", str(out)]) == 0
    check_pngs(out, FIGURES)
    figures = drawn(out)
    # collapse rate: every */collapse_rate* key of each run, values as logged
    collapse = series_of(figures["collapse_rate.png"], "collapse rate", "diva")
    assert set(collapse) == {"diva/collapse_rate/local", "diva/collapse_rate/global"}
    assert collapse["diva/collapse_rate/local"][0] == list(range(1, 51))
    assert set(series_of(figures["collapse_rate.png"], "collapse rate", "grpo")) == {"grpo/collapse_rate"}
    # difficulty heatmap: one column per saved step, counts summing to the questions seen
    heat = series_of(figures["difficulty.png"], "difficulty heatmap", "diva")
    assert set(heat) == {f"level {level}" for level in range(1, 10)}
    assert heat["level 5"][0] == [10, 20, 30, 40, 50]
    totals = np.sum([values for _, values in heat.values()], axis=0)
    assert totals.tolist() == [len(load_run(diva).states.difficulties[s]) for s in (10, 20, 30, 40, 50)]
    # validation: per benchmark and their mean, for both runs (the baseline's curve exactly as logged)
    validation = figures["validation.png"]
    assert series_of(validation, "mathvista", "grpo")["mathvista"] == ([0, 10, 20, 30, 40, 50], BASE_ACC["mathvista"])
    assert {s["panel"] for s in validation} == {"mathvista", "wemath", "mean"}
    assert series_of(figures["training.png"], "Reward (mean per response)", "grpo")
    # steps to the baseline's best: mathvista best 0.60 at step 40, reached by diva at step 20 -> 2.0x
    summary = json.loads((out / "summary.json").read_text())
    rows = {row["benchmark"]: row for row in summary["steps_to_baseline_best"]}
    assert (rows["mathvista"]["baseline_step"], rows["mathvista"]["run_step"]) == (40, 20)
    assert rows["mathvista"]["speedup"] == pytest.approx(2.0)
    assert (rows["wemath"]["baseline_step"], rows["wemath"]["run_step"]) == (50, 30)  # best 0.60 at 50; 0.61 at 30
    report = (out / "report.md").read_text()
    assert "| diva | mathvista | 0.600 at step 40 | step 20 | 2.00x fewer steps |" in report
    for name in FIGURES:
        assert f"]({name})" in report
    assert "wrote" in capsys.readouterr().out


def test_one_run_and_a_run_without_checkpoints(runs, tmp_path):
    grpo, diva = runs
    out = tmp_path / "one"
    assert main([str(diva), "-o", str(out)]) == 0
    check_pngs(out, FIGURES)
    assert "Steps to reach" not in (out / "report.md").read_text()
    out = tmp_path / "no_ckpt"
    assert main([str(grpo), "-o", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert not (out / "difficulty.png").exists() and not (out / "variants.png").exists()
    assert "_Skipped: no difficulty states in the checkpoints" in report
    assert "no difficulty states in" in report and "difficulty figures skipped" in report  # the run's note


def test_a_run_still_going(runs, tmp_path):
    _, diva = runs
    log = sorted((diva / "logs").glob("*.jsonl"))[-1]
    with open(log, "a") as handle:
        handle.write('{"step": 51, "data": {"diva/collapse_rate/local": 0.')  # the writer is on this line
    (diva / "global_step_60").mkdir()
    (diva / "global_step_60" / ".diva_difficulty.json.abc.tmp").write_text("{")  # a save in progress
    out = tmp_path / "live"
    assert main([str(diva), "-o", str(out)]) == 0
    run = load_run(diva)
    assert max(run.log.steps) == 50 and sorted(run.states.difficulties) == [10, 20, 30, 40, 50]
    assert "is incomplete (the run is still writing it); left out" in (out / "report.md").read_text()


def test_logs_of_a_resumed_run_merge_in_write_order(tmp_path):
    first = write_log(tmp_path / "logs" / "b_first.jsonl", [(1, {"x": 1.0}), (2, {"x": 2.0, "y": 5.0})])
    second = write_log(tmp_path / "logs" / "a_second.jsonl", [(2, {"x": 20.0}), (3, {"x": 3.0})])
    import os

    os.utime(first, (100, 100))
    os.utime(second, (200, 200))
    log = merge_logs([second, first])
    assert log.files == [first, second]
    assert log.steps == {1: {"x": 1.0}, 2: {"x": 20.0, "y": 5.0}, 3: {"x": 3.0}}


@pytest.mark.parametrize(
    "line, problem",
    [
        ("not json at all", "not a JSON line"),
        ('{"step": 3}', 'expected {"step": <int>, "data": {...}}'),
        ('{"step": "three", "data": {}}', "'step' must be an integer"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, capsys, line, problem):
    log = tmp_path / "run" / "metrics.jsonl"
    write_log(log, [(1, {"x": 1.0})])
    with open(log, "a") as handle:
        handle.write(line + "\n" + json.dumps({"step": 3, "data": {"x": 3.0}}) + "\n")
    with pytest.raises(ReportError, match=f"{log}:2: "):
        load_run(tmp_path / "run")
    assert main([str(tmp_path / "run"), "-o", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert f"{log}:2: {problem}" in error and "Traceback" not in error


def test_no_log_and_other_jsonl_files(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rows.quarantine.jsonl").write_text('{"row": 1, "reason": "x"}\n')
    assert main([str(tmp_path / "run"), "-o", str(tmp_path / "out")]) == 2
    assert "no metrics log found" in capsys.readouterr().err
    write_log(tmp_path / "run" / "logs" / "m.jsonl", [(1, {"diva/collapse_rate/local": 0.5})])
    run = load_run(tmp_path / "run")
    assert any("ignored 1 .jsonl file(s)" in note for note in run.notes)
    assert main([str(tmp_path / "run"), "-o", str(tmp_path / "out")]) == 0


def test_module_entry_point(runs, tmp_path):
    _, diva = runs
    out = subprocess.run(
        [sys.executable, "-m", "verl_ext.report", str(diva), "--output", str(tmp_path / "m")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "m" / "report.md").exists()


def test_cpu_run_folder_and_its_resumed_part_are_one_run(tmp_path):
    """A tiny_cpu.sh run folder: verl's file logger under metrics/<project>/, the resumed part in its own file."""
    run_dir = tmp_path / "run_1"
    metrics = run_dir / "metrics" / "diva_grpo"
    first = write_log(metrics / "tiny_cpu_diva.jsonl", [(s, {"diva/collapse_rate/local": 0.1 * s}) for s in (1, 2)])
    resumed = write_log(metrics / "tiny_cpu_diva_resumed.jsonl", [(3, {"diva/collapse_rate/local": 0.3})])
    assert sorted(load_run(run_dir).log.steps) == [1, 2, 3]
    # The two files given one by one: still one run, merged in write order.
    out = tmp_path / "report"
    assert main([str(first), str(resumed), "--output", str(out)]) == 0
    collapse = drawn(out)["collapse_rate.png"]
    assert [(s["run"], s["steps"]) for s in collapse] == [("tiny_cpu_diva", [1, 2, 3])]
    # A resumed part given without its first part, and unrelated files, stay runs of their own.
    other = write_log(tmp_path / "other.jsonl", [(1, {"grpo/collapse_rate": 0.5})])
    assert main([str(resumed), str(other), "--output", str(out)]) == 0
    assert {s["run"] for s in drawn(out)["collapse_rate.png"]} == {"tiny_cpu_diva_resumed", "other"}


def test_collapse_curves_distinguishable(runs, tmp_path):
    """Every curve of the collapse figure has its own (colour, line style, marker); a run's local and global curves
    differ in marker as well as line style (the legend shows a few pixels of each)."""
    grpo, diva = runs
    out = tmp_path / "report"
    assert main([str(grpo), str(diva), "--output", str(out)]) == 0
    collapse = drawn(out)["collapse_rate.png"]
    styles = [(tuple(s["style"]["color"]), s["style"]["linestyle"], s["style"]["marker"]) for s in collapse]
    assert len(styles) == 3 and len(set(styles)) == 3
    local, global_ = (
        next(s["style"] for s in collapse if s["run"] == "diva" and s["label"].endswith(kind))
        for kind in ("local", "global")
    )
    assert local["color"] == global_["color"] and local["marker"] != global_["marker"]
    assert local["linestyle"] != global_["linestyle"]
