"""The DIVA trainer's real step logic on CPU: verl's fit(), TransferQueue, ReplayBuffer, dataloader and metrics,
with only the vLLM rollout and the FSDP workers stood in for (recipe/diva_grpo/simulation.py)."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

import recipe.diva_grpo.trainer  # noqa: F401  (registers the trainer)
from data_prep.synth import synth
from recipe.diva_grpo.simulation import SimulatedAgentLoopManager, build_simulated_trainer
from recipe.diva_grpo.trainer import DivaTrainer
from verl_ext.algos import compute_diva_advantage
from verl_ext.difficulty.persistence import checkpoint_state_path
from verl_ext.reward import compute_score

# Starts Ray, a process group or a fresh interpreter that imports verl: the launch tier (pytest -m launch; CI runs it).
pytestmark = pytest.mark.launch

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "recipe", "diva_grpo", "config")
QUESTIONS = 12
QUESTIONS_PER_STEP = 4
ROLLOUT_N = 3


def compose_config(tmp_path, *overrides):
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        return compose(
            "diva_grpo",
            overrides=[
                f"data.train_files={tmp_path}/train.parquet",
                f"data.val_files={tmp_path}/val.parquet",
                f"data.train_batch_size={QUESTIONS_PER_STEP * 2}",
                "data.dataloader_num_workers=0",
                "data.filter_overlong_prompts=false",
                f"actor_rollout_ref.rollout.n={ROLLOUT_N}",
                f"actor_rollout_ref.actor.ppo_mini_batch_size={QUESTIONS_PER_STEP * 2}",
                "trainer.total_training_steps=3",
                "trainer.save_freq=2",
                "trainer.test_freq=-1",
                "trainer.val_before_train=false",
                f"trainer.default_local_dir={tmp_path}/ckpt",
                "trainer.logger=[file]",
                "trainer.experiment_name=test_trainer",
                "transfer_queue.enable=true",
                *overrides,
            ],
        )


@pytest.fixture()
def data_dir(tmp_path):
    synth(tmp_path / "train.parquet", QUESTIONS, seed=0, split="train")
    synth(tmp_path / "val.parquet", 4, seed=1, split="test")
    return tmp_path


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_three_steps_groups_advantages_difficulty_metrics_and_resume(ray_and_tq, data_dir, monkeypatch):
    cfg = compose_config(data_dir)
    metrics_file = data_dir / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_file))
    # dp_size=5 makes verl's _balance_batch append synthetic padding rows: they must join no group.
    trainer = build_simulated_trainer(DivaTrainer, cfg, dp_size=5)
    table = trainer.train_dataset.difficulty_table
    assert torch.all(table.values == 5.0)

    trainer.fit(SimulatedAgentLoopManager(compute_score, n=ROLLOUT_N))
    updates = trainer.actor_rollout_wg.updates
    assert len(updates) == 3

    seen_questions = set()
    expected_difficulty = {}
    for update in updates:
        real = np.array([not tag.get("is_padding", False) for tag in update["tags"]])
        assert (~real).any(), "expected padding rows from dp_size=5"
        # Padding rows: zero advantage.
        assert torch.all(update["advantages"][torch.as_tensor(~real)] == 0)

        infos = [info for info, keep in zip(update["extra_info"], real, strict=True) if keep]
        qids = np.array([info["question_id"] for info in infos], dtype=object)
        uids = np.array([u for u, keep in zip(update["uid"], real, strict=True) if keep], dtype=object)
        # No global group is split: every question of the step brings its original and variant, n responses each.
        per_question = defaultdict(set)
        for info, uid in zip(infos, uids, strict=True):
            per_question[info["question_id"]].add((uid, info["variant_slot"]))
        assert len(per_question) == QUESTIONS_PER_STEP
        for prompts in per_question.values():
            assert {slot for _, slot in prompts} == {0, 1}
        counts = {q: int((qids == q).sum()) for q in per_question}
        assert set(counts.values()) == {2 * ROLLOUT_N}
        assert not (seen_questions & set(per_question)), "a question came back within one epoch"
        seen_questions |= set(per_question)

        # Advantages equal compute_diva_advantage on the same data.
        idx = torch.as_tensor(np.flatnonzero(real))
        rewards, mask = update["rm_scores"][idx], update["response_mask"][idx]
        difficulty = np.array([float(info["variant_difficulty"]) for info in infos])
        expected, _ = compute_diva_advantage(rewards, mask, uids, qids, difficulty)
        torch.testing.assert_close(update["advantages"][idx], expected)
        assert update["advantages"][idx].abs().sum() > 0

        # Difficulty rule (continuous, eta 4, from 5): alpha = fraction correct over original and variant.
        accs = [
            fields["reward_extra_info"]["acc"]
            for fields, keep in zip(update["extra_fields"], real, strict=True)
            if keep
        ]
        for q in per_question:
            alpha = np.mean([a for a, qq in zip(accs, qids, strict=True) if qq == q])
            expected_difficulty[q] = float(np.clip(5.0 + 4.0 * (0.5 - alpha), 1.0, 9.0))

    snapshot = trainer.difficulty.snapshot()
    assert snapshot == pytest.approx(expected_difficulty)
    for q, d in expected_difficulty.items():
        assert table.read(table.row_of(q)) == pytest.approx(d), "shared table not refreshed"

    logged = read_metrics(metrics_file)
    assert [entry["step"] for entry in logged] == [1, 2, 3]
    for entry in logged:
        data = entry["data"]
        for key in (
            "diva/collapse_rate/local",
            "diva/collapse_rate/global",
            "diva/advantage/mean",
            "diva/difficulty/mean",
            "diva/difficulty/updates_in_step",
            "diva/timing_s/advantage",
            "diva/timing_s/difficulty_finish",
        ):
            assert key in data, key
        assert data["diva/difficulty/updates_in_step"] == QUESTIONS_PER_STEP
        assert data["diva/variant_mix/original"] == pytest.approx(0.5)

    # Checkpoint of step 2 holds the state after step 2: resume restores it exactly (new actor, new table).
    state_file = checkpoint_state_path(str(data_dir / "ckpt" / "global_step_2"))
    assert os.path.exists(state_file)
    trainer.difficulty.stop()
    resume_cfg = compose_config(
        data_dir, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={data_dir}/ckpt/global_step_2"
    )
    resumed = build_simulated_trainer(DivaTrainer, resume_cfg)
    assert resumed.global_steps == 2
    after_two = {q: d for q, d in expected_difficulty.items() if q not in _questions_of(updates[2])}
    assert resumed.difficulty.snapshot() == pytest.approx(after_two)
    resumed_table = resumed.train_dataset.difficulty_table
    for q in after_two:
        assert resumed_table.read(resumed_table.row_of(q)) == pytest.approx(after_two[q])
    # And the sampler resumes where step 2 left off: step 3 trains the same questions as the first run did.
    resumed.fit(SimulatedAgentLoopManager(compute_score, n=ROLLOUT_N))
    assert _questions_of(resumed.actor_rollout_wg.updates[0]) == _questions_of(updates[2])
    assert resumed.difficulty.snapshot() == pytest.approx(expected_difficulty)


def _questions_of(update) -> set:
    return {
        info["question_id"]
        for info, tag in zip(update["extra_info"], update["tags"], strict=True)
        if not tag.get("is_padding")
    }


def test_resume_with_missing_difficulty_state_fails_naming_the_file(ray_and_tq, data_dir, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(data_dir / "m.jsonl"))
    cfg = compose_config(data_dir, "trainer.total_training_steps=2", "trainer.experiment_name=missing_state")
    trainer = build_simulated_trainer(DivaTrainer, cfg)
    trainer.fit(SimulatedAgentLoopManager(compute_score, n=ROLLOUT_N))
    trainer.difficulty.stop()
    state_file = checkpoint_state_path(str(data_dir / "ckpt" / "global_step_2"))
    os.remove(state_file)
    with pytest.raises(Exception, match="diva_difficulty"):
        build_simulated_trainer(DivaTrainer, cfg)


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.adv_estimator=grpo", "adv_estimator=diva_grpo"),
        ("data.train_batch_size=7", "multiple of 1 \\+ diva.variants.variants_per_question"),
        ("algorithm.filter_groups.enable=true", "filter_groups"),
        ("+diva.advantage.kk=1", "unknown key"),
        ("+trainer.v1.sync.parameter_sync_step=2", "parameter_sync_step must be 1"),
    ],
)
def test_trainer_refuses_settings_that_break_diva(tmp_path, override, message):
    cfg = compose_config(tmp_path, override)
    with pytest.raises(ValueError, match=message):
        DivaTrainer(cfg)


def test_diva_trainer_runs_the_sync_schedule(ray_and_tq, data_dir):
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

    assert get_trainer_cls("diva_grpo") is DivaTrainer
    trainer = DivaTrainer(compose_config(data_dir))
    # Registered as "diva_grpo" but verl's `trainer_mode != "sync"` branches must take the sync path.
    assert trainer.trainer_mode == "sync"
    assert trainer.registered_mode == "diva_grpo"
    assert not isinstance(trainer.replay_buffer, ReplayBufferAsync)


def test_initial_difficulty_from_parquet_is_honoured(ray_and_tq, data_dir, monkeypatch):
    import pyarrow.parquet as pq

    path = data_dir / "train.parquet"
    table = pq.read_table(path)
    column = table.schema.get_field_index("difficulty")
    table = table.set_column(column, table.schema.field(column), [[8.0] * table.num_rows])
    pq.write_table(table, path)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(data_dir / "m.jsonl"))
    cfg = compose_config(data_dir, "trainer.total_training_steps=1", "trainer.experiment_name=initial_difficulty")
    trainer = build_simulated_trainer(DivaTrainer, cfg)
    shared = trainer.train_dataset.difficulty_table
    assert torch.all(shared.values == 8.0), "attaching the service must keep the parquet's start values"

    trainer.fit(SimulatedAgentLoopManager(compute_score, n=ROLLOUT_N))
    update = trainer.actor_rollout_wg.updates[0]
    assert {info["question_difficulty"] for info in update["extra_info"]} == {8.0}
    per_question = defaultdict(list)
    for info, fields in zip(update["extra_info"], update["extra_fields"], strict=True):
        per_question[info["question_id"]].append(fields["reward_extra_info"]["acc"])
    expected = {q: float(np.clip(8.0 + 4.0 * (0.5 - np.mean(accs)), 1, 9)) for q, accs in per_question.items()}
    assert trainer.difficulty.snapshot() == pytest.approx(expected)
    untouched = [q for q in trainer.train_dataset.question_ids if q not in expected]
    assert all(shared.read(shared.row_of(q)) == 8.0 for q in untouched)


def test_trainer_needs_the_diva_dataset(ray_and_tq, data_dir):
    cfg = compose_config(data_dir, "data.custom_cls.path=null", "data.custom_cls.name=null")
    with pytest.raises(ValueError, match="DivaDataset"):
        build_simulated_trainer(DivaTrainer, cfg)
