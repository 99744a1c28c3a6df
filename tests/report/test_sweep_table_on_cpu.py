"""The seed sweep's table (verl_ext.lab.sweep_table.summarise) from run folders written as the sweep leaves them,
against numbers worked out by hand: best and final accuracy over seeds, paired differences from GRPO at the same
seed, steps to GRPO's best, the zero-advantage fraction and responses; an unfinished run is left out."""

from __future__ import annotations

import json

import pytest
from report_fixtures import write_log

from verl_ext.lab.sweep_configs import CONFIGS
from verl_ext.lab.sweep_runs import run_config, run_dir, run_protocol
from verl_ext.lab.sweep_table import summarise, table_lines

STEPS = (0, 2, 4)
PROTOCOL = run_protocol(steps=4, test_freq=2, questions=8, rollout_n=4, warm_start="0123456789abcdef")


def _run(out, config, seed, sampled, greedy, zero, responses_per_question=8, done=True, protocol=PROTOCOL):
    folder = run_dir(out, config, seed)
    prefix = "diva" if CONFIGS[config].method == "diva_grpo" else CONFIGS[config].method
    records = []
    for step in range(0, STEPS[-1] + 1):
        data = {}
        if step in STEPS:
            i = STEPS.index(step)
            data["val-core/diva_swatch_sampled/acc/mean@4"] = sampled[i]
            data["val-core/diva_swatch_greedy/acc/mean@1"] = greedy[i]
        if step > 0:
            data["actor/pg_loss"] = 0.01
            data[f"{prefix}/advantage/zero_fraction"] = zero[step - 1]
        records.append((step, data))
    write_log(folder / "metrics" / "proj" / "run.jsonl", records)
    if done:
        record = {
            "config": config,
            "seed": seed,
            "minutes": 3.0,
            "responses_per_question": responses_per_question,
            "protocol": protocol,
        }
        (folder / "done.json").write_text(json.dumps(record))


def test_table_pairs_each_configuration_with_grpo_by_seed(tmp_path):
    _run(tmp_path, "grpo", 0, [0.3, 0.5, 0.6], [0.25, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5])
    _run(tmp_path, "grpo", 1, [0.3, 0.4, 0.4], [0.25, 0.25, 0.5], [0.6, 0.6, 0.6, 0.6])
    _run(tmp_path, "diva_grpo", 0, [0.3, 0.6, 0.55], [0.25, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2])
    _run(tmp_path, "diva_grpo", 1, [0.3, 0.35, 0.38], [0.25, 0.25, 0.25], [0.1, 0.3, 0.1, 0.3])
    _run(tmp_path, "diva_no_rrb", 0, [0.3, 0.3, 0.3], [0.25, 0.25, 0.25], [0, 0, 0, 0], done=False)
    _run(tmp_path, "grpo_2x", 0, [0.3, 0.7, 0.7], [0.25, 0.75, 0.75], [0.4] * 4, responses_per_question=16)

    summary = summarise(tmp_path, ["grpo", "diva_grpo", "diva_no_rrb", "grpo_2x"], [0, 1])
    table = summary["table"]
    assert list(table) == ["grpo", "diva_grpo", "grpo_2x"]  # the unfinished run is not in the table
    diva = table["diva_grpo"]
    assert diva["seeds"] == [0, 1]
    assert diva["best_sampled"] == {"mean": pytest.approx(0.49), "min": 0.38, "max": 0.6, "n": 2}
    assert diva["final_sampled"] == {"mean": pytest.approx(0.465), "min": 0.38, "max": 0.55, "n": 2}
    assert diva["best_greedy"]["mean"] == pytest.approx(0.375)
    # Paired: seed 0 best 0.6 - 0.6 = 0, seed 1 0.38 - 0.4 = -0.02; final 0.55 - 0.6, 0.38 - 0.4.
    assert diva["best_sampled_minus_grpo"] == pytest.approx({"mean": -0.01, "min": -0.02, "max": 0.0, "n": 2})
    assert diva["final_sampled_minus_grpo"]["mean"] == pytest.approx(-0.035)
    # GRPO's best: 0.6 (seed 0) reached by DIVA at step 2; 0.4 (seed 1) never reached by DIVA (0.38).
    assert diva["steps_to_grpo_best"] == {"per_seed": {"0": 2, "1": None}, "reached": 1}
    assert diva["zero_advantage_fraction"]["mean"] == pytest.approx(0.2)
    assert diva["responses"]["mean"] == 4 * 8 * 8  # steps x questions per step x responses per question
    assert table["grpo_2x"]["responses"]["mean"] == 4 * 8 * 16
    assert table["grpo"]["best_sampled_minus_grpo"] == {"mean": 0.0, "min": 0.0, "max": 0.0, "n": 2}
    lines = table_lines(table)
    assert len(lines) == 4 and lines[2].startswith("diva_grpo") and "1/2 ~2" in lines[2]


def test_a_run_without_both_validations_is_named(tmp_path):
    folder = run_dir(tmp_path, "grpo", 0)
    write_log(folder / "metrics" / "p" / "r.jsonl", [(0, {"val-core/diva_swatch/acc/mean@1": 0.3})])
    (folder / "done.json").write_text(
        json.dumps({"config": "grpo", "seed": 0, "minutes": 1, "responses_per_question": 8})
    )
    with pytest.raises(ValueError, match=r"seed0: no \['greedy', 'sampled'\] validation"):
        summarise(tmp_path, ["grpo"], [0])


def test_the_tables_round_each_figure_once(tmp_path):
    from verl_ext.lab.sweep_table import table_markdown

    # 165/256 = 0.64453125 is 0.645 to three decimals; rounding it to four first (0.6445) printed 0.644.
    _run(tmp_path, "grpo", 0, [0.3, 0.5, 165 / 256], [0.25, 0.5, 0.5], [0.5] * 4)
    table = summarise(tmp_path, ["grpo"], [0])["table"]
    assert table["grpo"]["best_sampled"]["mean"] == 165 / 256
    assert table_markdown(table)[2].startswith("| `grpo` | 0 | 0.645 | 0.645 |")
    assert " 0.645 " in table_lines(table)[1]


def test_markdown_table_has_a_row_per_configuration_with_its_paired_difference(tmp_path):
    from verl_ext.lab.sweep_table import table_markdown

    _run(tmp_path, "grpo", 0, [0.3, 0.5, 0.6], [0.25, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5])
    _run(tmp_path, "grpo", 1, [0.3, 0.4, 0.4], [0.25, 0.25, 0.5], [0.6, 0.6, 0.6, 0.6])
    _run(tmp_path, "diva_grpo", 0, [0.3, 0.6, 0.55], [0.25, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2])
    lines = table_markdown(summarise(tmp_path, ["grpo", "diva_grpo"], [0, 1])["table"])
    assert lines[1].startswith("|---")
    grpo, diva = lines[2], lines[3]
    assert grpo == (
        "| `grpo` | 0, 1 | 0.500 [0.400, 0.600] | 0.500 [0.400, 0.600] | 0.500 [0.500, 0.500] | "
        "0.000 [0.000, 0.000] | 2/2 at 4, 2 | 0.550 | 256 |"
    )
    # DIVA-GRPO reaches GRPO's best at seed 0 (0.6 at step 2); 4 steps x 8 questions x 8 responses.
    assert diva == "| `diva_grpo` | 0 | 0.600 | 0.550 | 0.500 | 0.000 | 1/1 at 2 | 0.200 | 256 |"


def test_runs_of_another_protocol_are_neither_reused_nor_pooled(tmp_path):
    """A finished run is reused only under its own protocol (steps, validation, batch, warm start): a sweep at
    other settings in the same OUT stops naming the run and what differs, and the table refuses to pair runs of two
    protocols (or a run that recorded none)."""
    _run(tmp_path, "grpo", 0, [0.3, 0.5, 0.6], [0.25, 0.5, 0.5], [0.5] * 4)
    assert run_config(tmp_path, "grpo", 0, {}, protocol=PROTOCOL)["seed"] == 0  # reused: nothing trains
    longer = {**PROTOCOL, "steps": 20}
    with pytest.raises(ValueError, match=r"grpo/seed0 finished under another protocol: steps 4 \(here 20\)"):
        run_config(tmp_path, "grpo", 0, {}, protocol=longer)

    _run(
        tmp_path,
        "diva_grpo",
        0,
        [0.3, 0.6, 0.55],
        [0.25, 0.5, 0.5],
        [0.2] * 4,
        protocol={**PROTOCOL, "warm_start": "f" * 16},
    )
    with pytest.raises(
        ValueError, match=r"different protocols cannot be paired or pooled: grpo/seed0: .*diva_grpo/seed0"
    ):
        summarise(tmp_path, ["grpo", "diva_grpo"], [0])
    _run(tmp_path, "diva_grpo", 0, [0.3, 0.6, 0.55], [0.25, 0.5, 0.5], [0.2] * 4, protocol=None)
    with pytest.raises(ValueError, match="different protocols"):
        summarise(tmp_path, ["grpo", "diva_grpo"], [0])


def test_the_warm_start_fingerprint_is_its_weights(tmp_path):
    from verl_ext.lab.sweep_runs import warm_start_fingerprint

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "model.safetensors").write_bytes(b"weights" * 300_000)
    (tmp_path / "b" / "model.safetensors").write_bytes(b"weights" * 299_999 + b"weightz")
    first = warm_start_fingerprint(str(tmp_path / "a"))
    assert len(first) == 16 and first == warm_start_fingerprint(str(tmp_path / "a"))
    assert first != warm_start_fingerprint(str(tmp_path / "b"))


def test_a_sweep_on_another_warm_start_stops_before_training_and_names_both_machines(tmp_path):
    """Rebuilt on another CPU kind, the warm start's weights differ (float kernels sum in another order): the sweep
    stops before any run trains, naming the run, both fingerprints and the machine each came from."""
    from verl_ext.lab.sweep_runs import check_protocol, machine_kind

    here = machine_kind()
    assert here["threads"] >= 1 and here["torch"] and here["cpu"]
    assert set(here["cpu_extensions"]) <= {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile"}

    recorded = {"cpu": "Another Xeon", "cpu_extensions": ["avx2", "avx512f"], "torch_cpu_capability": "AVX512"}
    _run(tmp_path, "grpo", 0, [0.3, 0.5, 0.6], [0.25, 0.5, 0.5], [0.5] * 4)
    done = run_dir(tmp_path, "grpo", 0) / "done.json"
    done.write_text(json.dumps({**json.loads(done.read_text()), "machine": recorded}))
    check_protocol(tmp_path, ["grpo", "diva_grpo"], [0, 1], PROTOCOL)  # same protocol: nothing to refuse

    other_start = {**PROTOCOL, "warm_start": "fedcba9876543210"}
    with pytest.raises(ValueError) as refused:
        check_protocol(tmp_path, ["grpo", "diva_grpo"], [0, 1], other_start)
    message = str(refused.value)
    assert "grpo/seed0 finished under another protocol: warm_start '0123456789abcdef' (here 'fedcba9876543210')" in (
        message
    )
    assert "Another Xeon" in message and repr(here["cpu"]) in message and "machine kind that recorded it" in message

    # Another step count is not a machine question: the message names the setting and stops there.
    with pytest.raises(ValueError) as refused:
        check_protocol(tmp_path, ["grpo"], [0], {**PROTOCOL, "steps": 20})
    assert "steps 4 (here 20)" in str(refused.value) and "machine" not in str(refused.value)


def test_the_sparse_tasks_columns_come_from_each_runs_recorded_files(tmp_path):
    """The sparse task's runs leave ``questions.json`` (the unsolved questions their final policy solves) and
    ``signal.json`` (the learning-signal means, so the probe records need not be kept): the table gains the
    originals' zero-advantage fraction and the solved share, over seeds; a swatch table stays as it was. The sparse
    protocol names its task; the swatch one has no ``task`` key (its recorded runs predate it)."""
    from verl_ext.lab.sweep_runs import SIGNAL_FILE
    from verl_ext.lab.sweep_table import table_markdown

    assert "task" not in PROTOCOL
    sparse = run_protocol(steps=4, test_freq=2, questions=8, rollout_n=4, warm_start="0" * 16, task="sparse")
    assert sparse == {
        **run_protocol(steps=4, test_freq=2, questions=8, rollout_n=4, warm_start="0" * 16),
        "task": "sparse",
    }
    figures = {("grpo", 0): (1.0, 0.1, -6.5), ("grpo", 1): (0.9, 0.3, -7.5), ("diva_grpo", 0): (0.5, 0.6, -5.0)}
    for (config, seed), (zero, solved, end) in figures.items():
        _run(tmp_path, config, seed, [0.3, 0.5, 0.6], [0.25, 0.5, 0.5], [0.5] * 4, protocol=sparse)
        folder = run_dir(tmp_path, config, seed)
        (folder / SIGNAL_FILE).write_text(json.dumps({"original_signal": 1 - zero}))
        moved = {"start": -7.0, "end": end}
        (folder / "questions.json").write_text(json.dumps({"solved_share": solved, "unsolved_right_log_prob": moved}))
    table = summarise(tmp_path, ["grpo", "diva_grpo"], [0, 1])["table"]
    assert table["grpo"]["original_zero_advantage_fraction"] == pytest.approx(
        {"mean": 0.95, "min": 0.9, "max": 1.0, "n": 2}
    )
    assert table["grpo"]["unsolved_solved_share"]["mean"] == pytest.approx(0.2)
    assert table["diva_grpo"]["unsolved_solved_share"] == pytest.approx({"mean": 0.6, "min": 0.6, "max": 0.6, "n": 1})
    assert table["grpo"]["unsolved_log_prob_change"] == pytest.approx({"mean": 0.0, "min": -0.5, "max": 0.5, "n": 2})
    lines = table_markdown(table)
    assert (
        "originals' zero-advantage fraction | unsolved at the start, solved at the end | their right answer's "
        "log-probability, change | responses |" in lines[0]
    )
    assert lines[1].count("---") == 12
    assert lines[3].endswith("| 1/1 at 4 | 0.500 | 0.50 | 0.60 | 2.00 | 256 |")
    assert (
        "zero-advantage fraction | responses |"
        in table_markdown(
            {
                k: {
                    f: v
                    for f, v in row.items()
                    if f
                    not in ("original_zero_advantage_fraction", "unsolved_solved_share", "unsolved_log_prob_change")
                }
                for k, row in table.items()
            }
        )[0]
    )
