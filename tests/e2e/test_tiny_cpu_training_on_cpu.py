"""Real end-to-end DIVA-GRPO training on the CPU: verl's own trainer, FSDP2 workers and (transformers) rollout server.

One launch of ``run_scripts/tiny_cpu.sh`` (``ray job submit`` to a local head): three DIVA steps on a tiny random
Qwen2-VL with images and variants, a checkpoint, then a fresh trainer that resumes from it for a fourth step.
The checks read what the run wrote: verl's metrics, the checkpoint, and what the actor consumed in each step
(``verl_ext.checks.probe``, read from TransferQueue right before verl's ``update_actor``):

* loss and gradient norm are finite and non-zero in every step;
* the rollout server's log-probs equal the actor's old log-probs (the trained weights reached the server);
* the advantages the actor consumed equal ``compute_diva_advantage`` on the logged rewards, uids, question ids and
  difficulties;
* the difficulty service moved each question by ``D <- clip(D + eta (0.5 - alpha), 1, 9)``;
* the resumed run starts from the checkpoint's difficulty state and dataloader position.
"""

from __future__ import annotations

import glob
import json
import math
import re
from pathlib import Path

import pytest
import torch
from tiny_launch import DIVA_ALL_STEPS, DIVA_RESUME_STEPS, DIVA_STEPS

from verl_ext.algos import compute_diva_advantage
from verl_ext.checks.probe import jsonable
from verl_ext.difficulty.persistence import checkpoint_state_path, load_state

ROOT = Path(__file__).resolve().parents[2]


STEPS, RESUME_STEPS, ALL_STEPS = DIVA_STEPS, DIVA_RESUME_STEPS, DIVA_ALL_STEPS

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def run(tiny_diva_run):
    """The launch of ``tests/e2e/conftest.py`` (shared with the crash tests, which compare their run with it)."""
    return tiny_diva_run


def _real_rows(record) -> list[int]:
    return [i for i, padding in enumerate(record["is_padding"]) if not padding]


def _metrics(run_dir: Path) -> list[dict]:
    entries = []
    for path in sorted(glob.glob(str(run_dir / "metrics" / "*" / "*.jsonl"))):
        with open(path) as f:
            entries += [json.loads(line) for line in f if line.strip()]
    return sorted((e for e in entries if "actor/pg_loss" in e["data"]), key=lambda e: e["step"])


def test_every_step_trained_with_finite_nonzero_loss_and_gradient(run):
    entries = _metrics(run["dir"])
    assert [e["step"] for e in entries] == ALL_STEPS
    assert sorted(run["records"]) == ALL_STEPS
    signal_steps = 0
    for entry in entries:
        step, data = entry["step"], entry["data"]
        assert math.isfinite(data["actor/grad_norm"]) and data["actor/grad_norm"] > 0, step
        record = run["records"][step]
        rows = torch.as_tensor(_real_rows(record))
        # Two questions x (original + variant) x 4 responses, with images and planned variants.
        assert len(rows) == 16, step
        assert {record["extra_info"][i]["variant_kind"] for i in rows.tolist()} - {"original"}, step
        # One on-policy update (ratio 1): verl's token-mean loss is minus the token mean of the advantages the actor
        # consumed. It is non-zero unless every response has the same length (batch-normalised advantages).
        mask = record["response_mask"][rows].float()
        expected = -(record["advantages"][rows] * mask).sum() / mask.sum()
        assert math.isfinite(data["actor/pg_loss"])
        assert data["actor/pg_loss"] == pytest.approx(expected.item(), rel=1e-4, abs=1e-6), step
        if len(set(mask.sum(-1).tolist())) > 1:
            assert data["actor/pg_loss"] != 0.0, step
        signal_steps += bool((record["advantages"][rows] * mask).abs().sum() > 0)
    # The loss check compares against advantages that carry a signal. (Whether some response stops before the
    # length limit, making the loss itself non-zero, is fixed by the seeded rollout: on torch 2.11 seed 0 samples none.)
    assert signal_steps == len(entries), "a step's consumed advantages were all zero: the loss check saw nothing"


def test_rollout_log_probs_equal_the_actors_after_each_weight_sync(run):
    for step, record in run["records"].items():
        rows = torch.as_tensor(_real_rows(record))
        mask = record["response_mask"][rows].bool()
        gap = (record["old_log_probs"][rows] - record["rollout_log_probs"][rows]).abs()[mask]
        assert gap.numel() > 0
        # float32 on both sides: ~1e-6 with the sync; a stale server after a 1e-3 Adam step is far off.
        assert gap.mean().item() < 2e-5 and gap.max().item() < 1e-3, (step, gap.mean().item(), gap.max().item())


def test_the_actor_consumed_the_diva_advantage_of_the_logged_rewards(run):
    kwargs = {k: v for k, v in run["diva"].advantage.items() if not k.startswith("_")}
    for step, record in run["records"].items():
        rows = _real_rows(record)
        idx = torch.as_tensor(rows)
        infos = [record["extra_info"][i] for i in rows]
        rewards = record["rm_scores"][idx].float()
        mask = record["response_mask"][idx]
        expected, _ = compute_diva_advantage(
            rewards,
            mask,
            [record["uid"][i] for i in rows],
            [info["question_id"] for info in infos],
            [float(info["variant_difficulty"]) for info in infos],
            **kwargs,
        )
        consumed = record["advantages"][idx] * mask
        assert consumed.abs().sum() > 0, step
        torch.testing.assert_close(consumed, expected * mask, rtol=1e-5, atol=1e-5, msg=f"step {step}")


def _replay_difficulty(records: dict, steps: list[int], diva, start: dict) -> dict:
    """The rule applied by hand: per step, alpha = mean accuracy over each question's responses (original and
    variants); a question first seen starts from the difficulty the dataset planned with."""
    state = dict(start)
    for step in steps:
        record = records[step]
        accuracy: dict = {}
        for i in _real_rows(record):
            info = record["extra_info"][i]
            qid = info["question_id"]
            state.setdefault(qid, float(info["question_difficulty"]))
            acc = float(record["extra_fields"][i]["reward_extra_info"]["acc"])
            accuracy.setdefault(qid, []).append(acc)
        for qid, values in accuracy.items():
            alpha = sum(values) / len(values)
            moved = state[qid] + diva.difficulty.eta * (0.5 - alpha)
            state[qid] = min(max(moved, diva.difficulty.d_min), diva.difficulty.d_max)
    return state


def _checkpoint_difficulty(run_dir: Path, step: int) -> dict:
    questions = load_state(checkpoint_state_path(str(run_dir / "checkpoints" / f"global_step_{step}")))["questions"]
    return dict(zip(questions["ids"], questions["difficulty"], strict=True))


def test_the_difficulty_service_moved_each_question_by_the_rule(run):
    diva, records = run["diva"], run["records"]
    after_training = _replay_difficulty(records, list(range(1, STEPS + 1)), diva, {})
    saved = _checkpoint_difficulty(run["dir"], STEPS)
    assert saved.keys() == after_training.keys()
    for qid, value in after_training.items():
        assert saved[qid] == pytest.approx(value, abs=1e-9), qid
    assert any(value != diva.difficulty.d_init for value in saved.values())
    after_resume = _replay_difficulty(records, [STEPS + 1], diva, saved)
    final = _checkpoint_difficulty(run["dir"], STEPS + RESUME_STEPS)
    assert final == pytest.approx(after_resume, abs=1e-9)


def test_the_resumed_run_restored_difficulty_state_and_dataloader_position(run):
    # Written by the resumed trainer's train-begin hook, named by the first step it runs.
    with open(run["dir"] / "probe" / f"train_begin_step{STEPS + 1}.json") as f:
        begin = json.load(f)
    assert begin["global_steps"] == STEPS + 1
    assert begin["difficulty"] == _checkpoint_difficulty(run["dir"], STEPS)
    saved_loader = torch.load(run["dir"] / "checkpoints" / f"global_step_{STEPS}" / "data.pt", weights_only=False)
    assert begin["dataloader"] == json.loads(json.dumps(jsonable(saved_loader), sort_keys=True, default=str))
    # The loader went on where it stopped: step 4 trains questions that steps 1-3 of the same epoch did not
    # (a loader restarted from scratch would replay step 1's questions).
    seen = set()
    for step in range(1, STEPS + 1):
        record = run["records"][step]
        seen |= {record["extra_info"][i]["question_id"] for i in _real_rows(record)}
    resumed = run["records"][STEPS + 1]
    assert seen.isdisjoint({resumed["extra_info"][i]["question_id"] for i in _real_rows(resumed)})
    # The launcher's own summary made the same difficulty check and says so.
    assert run["summary"]["steps"] == ALL_STEPS
    assert run["summary"]["questions_tracked"] == len(begin["difficulty"])


def test_the_run_folder_is_one_validated_run_and_its_report_is_written(run):
    """The launcher writes the run's report (diva-report) and names it; diva-report read the folder as one run (the
    resumed part merged), with the validation before training and at the last step."""
    from verl_ext.report.run import load_run
    from verl_ext.report.series import validation_series

    report = run["dir"] / "report"
    assert f"[cpu] report: {report}/report.md (figures beside it)" in run["output"]
    for name in ("report.md", "validation.png", "training.png", "difficulty.png"):
        assert (report / name).is_file(), name
    loaded = load_run(run["dir"])
    assert len(loaded.log.files) == 2  # the first part and the resumed one
    assert set(ALL_STEPS) <= set(loaded.log.steps)
    (val_steps, _), *_ = validation_series(loaded.log).values()
    assert {0, STEPS, STEPS + RESUME_STEPS} <= set(val_steps.tolist())


def test_the_summary_is_read_by_a_person_and_kept_whole(run):
    """A few short lines on the console (one per step), every figure in the run folder's summary.json."""
    summary_lines = [line for line in run["output"].splitlines() if line.startswith("[cpu] summary") or
                     line.startswith("[cpu]   ")]  # fmt: skip
    assert len(summary_lines) >= 2 + len(ALL_STEPS) and all(len(line) <= 160 for line in summary_lines)
    assert all(re.search(rf"^\[cpu\]\s+{step}\s+\S+", run["output"], re.M) for step in ALL_STEPS)
    assert [entry["step"] for entry in run["summary"]["per_step"]] == ALL_STEPS
    # the launch built its tiny model (a fresh WORKDIR) without transformers' progress bar before the header
    assert run["output"].startswith("[cpu] run folder") and "Writing model shards" not in run["output"]


def test_the_console_is_the_runs_own_lines_and_the_job_log_holds_everything(run):
    """One readable line per step on the console, verl's whole metric line of each in the job's log; verl's config
    dump and validation dicts in the log only."""
    console, log = run["output"], run["log"]
    for step in ALL_STEPS:
        line = rf"^step {step}/\d+ \[[#.]+\]  score \S+ \| acc \S+ \| diva/collapse_rate/local \S+ \| [\d.]+ s"
        assert re.search(line, console, re.M)
        assert re.search(rf"step:{step} - .*actor/pg_loss:", log)
    assert "validation before training: acc " in console
    for chatter in ("'actor_rollout_ref'", "Initial validation metrics", "Training Progress"):
        assert chatter not in console and chatter in log
    assert f"the job's full output: {run['dir']}/job.log" in console
    assert len(console.splitlines()) < 120  # the 2-step launch printed 1,180
