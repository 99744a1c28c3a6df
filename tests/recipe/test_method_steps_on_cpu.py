"""verl's GRPO, AVSPO, CoDaPO, Durian, PGPO and MUPO through the toolkit trainer's real step logic on CPU (verl's
fit(), TransferQueue, ReplayBuffer, dataloader; rollout and FSDP workers stood in for): three steps each, the
advantages the actor consumed equal the pure function on the same data, the methods' metrics are logged, and
CoDaPO's resampling alternates, and resumes mid-epoch exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from toolkit_fixtures import compose_toolkit_config, read_metrics, real_rows, write_synth_data

import recipe.diva_grpo.toolkit_trainer
import recipe.diva_grpo.trainer  # noqa: F401  (registers the trainers)
from recipe.diva_grpo.simulation import SimulatedAgentLoopManager, build_simulated_trainer
from recipe.diva_grpo.toolkit_trainer import ToolkitTrainer
from verl_ext.algos import (
    compute_avspo_advantage,
    compute_codapo_advantage,
    compute_durian_advantage,
    compute_mupo_advantage,
    compute_pgpo_advantage,
)
from verl_ext.checks.same_run import metric_differences
from verl_ext.methods import get_method
from verl_ext.methods.avspo import AvspoConfig
from verl_ext.methods.codapo import CodapoConfig
from verl_ext.methods.durian import DurianConfig
from verl_ext.mupo import MupoConfig, add_sequence_bonus, decode_responses, mupo_step
from verl_ext.mupo.hashing_embedder import HashingEmbedder
from verl_ext.reward import compute_score

# Starts Ray, a process group or a fresh interpreter that imports verl: the launch tier (pytest -m launch; CI runs it).
pytestmark = pytest.mark.launch

PROMPTS = 4
N = 3


def add_visual_entropy(path) -> dict:
    """Give every training row an extra_info.visual_entropy (what `diva-prep entropy` writes); returns them."""
    table = pq.read_table(path)
    infos = table.column("extra_info").to_pylist()
    values = {}
    for i, info in enumerate(infos):
        info["visual_entropy"] = 1.0 + (i * 7 % 5) / 4
        values[info["question_id"]] = info["visual_entropy"]
    column = table.schema.get_field_index("extra_info")
    table = table.set_column(column, "extra_info", pa.array(infos))
    pq.write_table(table, path)
    return values


def rows_of(update):
    """The real rows of one actor update, as the inputs of an advantage function."""
    idx = torch.as_tensor(real_rows(update))
    keep = idx.tolist()
    return {
        "rewards": update["rm_scores"][idx],
        "mask": update["response_mask"][idx],
        "old": update["old_log_probs"][idx],
        "uid": np.array([update["uid"][i] for i in keep], dtype=object),
        "infos": [update["extra_info"][i] for i in keep],
        "acc": [update["extra_fields"][i]["reward_extra_info"]["acc"] for i in keep],
        "advantages": update["advantages"][idx],
        "responses": update["responses"][idx],
    }


def run(tmp_path, method, *overrides, monkeypatch, dp_size=5, rollout_n=N):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / f"{method}.jsonl"))
    cfg = compose_toolkit_config(tmp_path, method, *overrides, prompts_per_step=PROMPTS, rollout_n=rollout_n)
    trainer = build_simulated_trainer(ToolkitTrainer, cfg, dp_size=dp_size)
    manager = SimulatedAgentLoopManager(compute_score, n=rollout_n)
    trainer.fit(manager)
    return trainer, read_metrics(tmp_path / f"{method}.jsonl")


def test_method_configs_from_the_recipe_yaml_are_the_paper_defaults(tmp_path):
    for name, cls in (("avspo", AvspoConfig), ("codapo", CodapoConfig), ("durian", DurianConfig), ("mupo", MupoConfig)):
        cfg = compose_toolkit_config(tmp_path, name)
        assert get_method(name).config_from(cfg) == cls()
        with pytest.raises(ValueError, match=f"unknown key.*'{name}'"):
            get_method(name).config_from(compose_toolkit_config(tmp_path, name, f"+{name}.not_a_knob=1"))


def test_avspo_three_steps(ray_and_tq, tmp_path, monkeypatch):
    write_synth_data(tmp_path)
    trainer, logged = run(tmp_path, "avspo", "avspo.mode=released", monkeypatch=monkeypatch)
    assert len(trainer.actor_rollout_wg.updates) == 3
    for update in trainer.actor_rollout_wg.updates:
        rows = rows_of(update)
        expected, _ = compute_avspo_advantage(rows["rewards"], rows["mask"], rows["uid"], mode="released")
        torch.testing.assert_close(rows["advantages"], expected)
    for entry in logged:
        for key in ("avspo/collapse_rate/before", "avspo/collapse_rate/after", "avspo/virtual_samples"):
            assert key in entry["data"], key


def test_grpo_baseline_three_steps_is_verls_grpo_and_logs_its_collapse_rate(ray_and_tq, tmp_path, monkeypatch):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from verl_ext.algos import advantage_collapse_rate

    write_synth_data(tmp_path)
    trainer, logged = run(tmp_path, "grpo", monkeypatch=monkeypatch)
    assert len(trainer.actor_rollout_wg.updates) == len(logged) == 3
    for update, entry in zip(trainer.actor_rollout_wg.updates, logged, strict=True):
        rows = rows_of(update)
        expected, _ = compute_grpo_outcome_advantage(rows["rewards"], rows["mask"], rows["uid"])
        torch.testing.assert_close(rows["advantages"], expected)
        rate = advantage_collapse_rate(rows["rewards"].sum(-1), rows["uid"])
        assert entry["data"]["grpo/collapse_rate"] == pytest.approx(rate)
        assert entry["data"]["grpo/accuracy/mean"] == pytest.approx(float(np.mean(rows["acc"])))


def test_grpo_baseline_refuses_the_mean_only_variant(tmp_path):
    cfg = compose_toolkit_config(tmp_path, "grpo", "algorithm.norm_adv_by_std_in_grpo=false")
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo=false.*trainer_mode=sync"):
        ToolkitTrainer(cfg)


def test_durian_three_steps_reads_visual_entropy_and_old_log_probs(ray_and_tq, tmp_path, monkeypatch):
    write_synth_data(tmp_path)
    entropy_of = add_visual_entropy(tmp_path / "train.parquet")
    trainer, logged = run(tmp_path, "durian", "durian.reason_buckets=2", monkeypatch=monkeypatch)
    for update in trainer.actor_rollout_wg.updates:
        rows = rows_of(update)
        entropy = [entropy_of[info["question_id"]] for info in rows["infos"]]
        assert torch.all(rows["old"][rows["mask"].bool()] < 0), "old log-probs reached the advantage"
        expected, _ = compute_durian_advantage(
            rows["rewards"], rows["mask"], rows["old"], rows["uid"], entropy, reason_buckets=2
        )
        torch.testing.assert_close(rows["advantages"], expected)
    assert all("durian/collapse_rate/prompts" in entry["data"] for entry in logged)


def test_durian_without_visual_entropy_names_the_command(ray_and_tq, tmp_path, monkeypatch):
    write_synth_data(tmp_path)
    with pytest.raises(ValueError, match="diva-prep entropy"):
        run(tmp_path, "durian", monkeypatch=monkeypatch)


def test_codapo_weights_resampling_and_mid_epoch_resume(ray_and_tq, tmp_path, monkeypatch):
    write_synth_data(tmp_path)
    trainer, logged = run(tmp_path, "codapo", "trainer.save_freq=1", monkeypatch=monkeypatch)
    updates = trainer.actor_rollout_wg.updates
    for update in updates:
        rows = rows_of(update)
        expected, _, weights = compute_codapo_advantage(
            rows["rewards"], rows["mask"], rows["old"], rows["uid"], rows["acc"]
        )
        torch.testing.assert_close(rows["advantages"], expected)
    # Step 1 is fresh; step 2 its resampled pass: only step 1's questions whose weight reached the 0.75 quantile,
    # 4 copies each, cycled to fill the batch; step 3 is fresh again.
    first = rows_of(updates[0])
    _, _, weights = compute_codapo_advantage(first["rewards"], first["mask"], first["old"], first["uid"], first["acc"])
    per_prompt = {}
    for uid, info, w in zip(first["uid"], first["infos"], weights.tolist(), strict=True):
        per_prompt[uid] = (info["question_id"], w)
    threshold = np.quantile([w for _, w in per_prompt.values()], 0.75)
    kept = list(dict.fromkeys(q for q, w in per_prompt.values() if w >= threshold))
    second = [info["question_id"] for info in rows_of(updates[1])["infos"]]
    assert set(second) == set(kept)
    assert len(second) == PROMPTS * N
    third = {info["question_id"] for info in rows_of(updates[2])["infos"]}
    assert not third & {q for q, _ in per_prompt.values()}, "step 3 must be a fresh batch"
    assert [entry["data"]["codapo/resample/resampled_step"] for entry in logged] == [0.0, 1.0, 0.0]
    for entry in logged:
        for key in ("codapo/weight/mean", "codapo/collapse_rate", "codapo/resample/budget_share"):
            assert key in entry["data"], key

    # Resume after the fresh step 1: the resampled pass of step 2 is the same questions, then the same fresh step 3.
    resume_cfg = compose_toolkit_config(
        tmp_path,
        "codapo",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path}/ckpt/global_step_1",
        prompts_per_step=PROMPTS,
        rollout_n=N,
    )
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "codapo_resumed.jsonl"))
    resumed = build_simulated_trainer(ToolkitTrainer, resume_cfg, dp_size=5)
    assert resumed.global_steps == 1 and resumed.batch_planner.resampler.resampled_next
    resumed.fit(SimulatedAgentLoopManager(compute_score, n=N))
    again = resumed.actor_rollout_wg.updates
    assert sorted(info["question_id"] for info in rows_of(again[0])["infos"]) == sorted(second)
    assert {info["question_id"] for info in rows_of(again[1])["infos"]} == third
    # And every value steps 2 and 3 logged (the planner's, the advantage's, verl's) is logged again, exactly.
    trained = {entry["step"]: entry["data"] for entry in logged if entry["step"] > 1}
    resumed_log = read_metrics(tmp_path / "codapo_resumed.jsonl")
    again_logged = {entry["step"]: entry["data"] for entry in resumed_log if "codapo/weight/mean" in entry["data"]}
    assert sorted(again_logged) == [2, 3]
    assert metric_differences(trained, again_logged) == []


def test_mupo_three_steps_partition_diversity_reward_and_grouped_advantage(ray_and_tq, tmp_path, monkeypatch):
    write_synth_data(tmp_path)
    n = 9  # k * min_size: every prompt splits into 3 groups of 3
    trainer, logged = run(tmp_path, "mupo", "mupo.embedding.backend=hashing", monkeypatch=monkeypatch, rollout_n=n)
    config = MupoConfig(embedding=MupoConfig().embedding.__class__(backend="hashing"))
    for step, update in enumerate(trainer.actor_rollout_wg.updates, start=1):
        rows = rows_of(update)
        texts = decode_responses(rows["responses"], rows["mask"], trainer.tokenizer)
        assert all("\\boxed{" in text for text in texts)
        scores = rows["rewards"].sum(-1)
        new_scores, partition, _ = mupo_step(
            texts, scores, rows["acc"], rows["uid"], step, 3, config, HashingEmbedder()
        )
        rewards = add_sequence_bonus(rows["rewards"], rows["mask"], new_scores - scores)
        expected, _ = compute_mupo_advantage(rewards, rows["mask"], rows["uid"], partition)
        torch.testing.assert_close(rows["advantages"], expected)
    for entry in logged:
        data = entry["data"]
        assert data["mupo/groups_per_prompt/mean"] == 3
        for key in ("mupo/lambda", "mupo/collapse_rate/partition", "mupo/embed/latency_s"):
            assert key in data, key
    assert logged[0]["data"]["mupo/lambda"] == pytest.approx(0.4)
    assert logged[-1]["data"]["mupo/lambda"] == pytest.approx(0.1)


def test_mupo_refuses_too_few_rollouts_at_start_up(tmp_path):
    cfg = compose_toolkit_config(tmp_path, "mupo", rollout_n=8)
    with pytest.raises(ValueError, match="rollout.n"):
        ToolkitTrainer(cfg)


def test_codapo_epochs_count_both_passes_of_a_batch(ray_and_tq, tmp_path):
    write_synth_data(tmp_path)  # 12 questions, 4 per step: 3 dataloader batches per epoch
    overrides = ("trainer.total_training_steps=null", "trainer.total_epochs=2")
    codapo = build_simulated_trainer(ToolkitTrainer, compose_toolkit_config(tmp_path, "codapo", *overrides))
    assert (codapo.steps_per_epoch, codapo.total_training_steps) == (6, 12)
    assert codapo.config.actor_rollout_ref.actor.optim.total_training_steps == 12
    plain = compose_toolkit_config(tmp_path, "codapo", *overrides, "codapo.resample=false")
    assert build_simulated_trainer(ToolkitTrainer, plain).total_training_steps == 6


def test_pgpo_three_steps_blind_pass_and_token_advantages(ray_and_tq, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from recipe.diva_grpo.simulation import BLIND_SHIFTED_TOKEN, PROCESSOR_STAND_IN

    write_synth_data(tmp_path)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "pgpo.jsonl"))
    cfg = compose_toolkit_config(tmp_path, "pgpo", prompts_per_step=PROMPTS, rollout_n=N)
    # The stand-in rollout's prompts are the bytes of the chat messages: call "{" (in every prompt) the image token.
    processor = SimpleNamespace(image_processor=PROCESSOR_STAND_IN.image_processor, image_token_id=ord("{"))
    trainer = build_simulated_trainer(ToolkitTrainer, cfg, processor=processor, dp_size=2)
    trainer.fit(SimulatedAgentLoopManager(compute_score, n=N))
    for update in trainer.actor_rollout_wg.updates:
        rows = rows_of(update)
        mask = rows["mask"].bool()
        # The stand-in blind view is 1.5 lower on the tokens that are multiples of 7: the advantages follow.
        blind = rows["old"] - 1.5 * (rows["responses"] % BLIND_SHIFTED_TOKEN == 0).float() * mask
        expected, _ = compute_pgpo_advantage(rows["rewards"], rows["mask"], rows["uid"], rows["old"], blind)
        torch.testing.assert_close(rows["advantages"], expected)
        grpo, _ = compute_pgpo_advantage(rows["rewards"], rows["mask"], rows["uid"], rows["old"], blind, tau=0, beta=0)
        live = grpo.abs().sum(-1) > 0
        assert live.any()
        shifted = (rows["responses"] % BLIND_SHIFTED_TOKEN == 0) & mask
        # Visually dependent tokens weigh more than the response's other tokens.
        ratio = (rows["advantages"] / grpo.where(grpo != 0, torch.ones_like(grpo)))[live]
        assert (ratio[shifted[live]].mean() > ratio[~shifted[live] & mask[live]].mean()).item()
    logged = read_metrics(tmp_path / "pgpo.jsonl")
    for entry in logged:
        data = entry["data"]
        assert data["pgpo/blind_pass_share"] == 1.0
        for key in ("timing_s/blind_log_prob", "pgpo/share_above_tau", "pgpo/weight_mean", "pgpo/collapse_rate"):
            assert key in data, key


def test_pgpo_refuses_bypassed_old_log_probs(tmp_path):
    cfg = compose_toolkit_config(tmp_path, "pgpo", "algorithm.rollout_correction.bypass_mode=true")
    with pytest.raises(ValueError, match="bypass_mode"):
        ToolkitTrainer(cfg)


@pytest.mark.parametrize(
    "override, message",
    [("+trainer.v1.sync.parameter_sync_step=2", "parameter_sync_step"), ("data.gen_batch_size=2", "gen_batch_size")],
)
def test_codapo_resampling_refuses_batches_it_cannot_plan_whole(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        ToolkitTrainer(compose_toolkit_config(tmp_path, "codapo", override))


def test_verls_own_rollout_correction_runs_before_the_method(ray_and_tq, tmp_path, monkeypatch):
    """The toolkit trainer calls verl's advantage step as it is (no copy of its KL and rollout-correction code):
    verl's importance weights are logged and written, and the method reads verl's fields after that step."""
    write_synth_data(tmp_path)
    trainer, logged = run(
        tmp_path,
        "avspo",
        "algorithm.rollout_correction.rollout_is=token",
        "avspo.mode=released",
        monkeypatch=monkeypatch,
    )
    for update in trainer.actor_rollout_wg.updates:
        rows = rows_of(update)
        expected, _ = compute_avspo_advantage(rows["rewards"], rows["mask"], rows["uid"], mode="released")
        torch.testing.assert_close(rows["advantages"], expected)
    for entry in logged:
        # verl's own rollout-correction metrics (rollout_corr_helper), from verl's step.
        assert any(key.startswith("rollout_corr/") for key in entry["data"]), sorted(entry["data"])
    # Called, not copied: the trainer's module names neither of verl's functions of that step.
    source = Path(recipe.diva_grpo.toolkit_trainer.__file__).read_text()
    assert "apply_kl_penalty" not in source and "compute_rollout_correction_and_add_to_batch" not in source


def test_the_methods_estimator_defers_only_inside_the_toolkit_step():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from verl_ext.deferral import estimator_deferred

    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.5]])
    mask = torch.ones_like(rewards)
    uid = np.array(["a", "a", "b", "b"], dtype=object)
    avspo = get_adv_estimator_fn("avspo")
    plain, _ = avspo(token_level_rewards=rewards, response_mask=mask, index=uid, config=None)
    assert plain.abs().sum() > 0
    with estimator_deferred("avspo"):
        deferred, returns = avspo(token_level_rewards=rewards, response_mask=mask, index=uid, config=None)
        assert not deferred.any() and not returns.any()
        with pytest.raises(RuntimeError, match="toolkit trainer"):  # another method is not deferred
            get_adv_estimator_fn("durian")(token_level_rewards=rewards, response_mask=mask, index=uid, config=None)
    again, _ = avspo(token_level_rewards=rewards, response_mask=mask, index=uid, config=None)
    torch.testing.assert_close(again, plain)
