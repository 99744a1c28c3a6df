"""The toolkit trainer's shared advantage step on CPU: verl's fit(), TransferQueue, ReplayBuffer and dataloader, the
rollout and FSDP workers stood in for (recipe/diva_grpo/simulation.py), and a probe method that declares every
input a method can ask for, a pre-advantage pass and a batch planner."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import transfer_queue as tq
from tensordict import TensorDict
from toolkit_fixtures import compose_toolkit_config, read_metrics, real_rows, write_synth_data
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

import recipe.diva_grpo.trainer  # noqa: F401  (registers the trainers)
from recipe.diva_grpo.simulation import SimulatedAgentLoopManager, build_simulated_trainer
from recipe.diva_grpo.toolkit_trainer import ToolkitTrainer
from verl_ext.methods import METHODS, AdvantageMethod, AdvantageResult, register_method
from verl_ext.reward import compute_score

PROMPTS = 4
N = 3


class ProbePlanner:
    """Rolls out the first two questions it saw, twice each, on every even step; verl's dataloader otherwise."""

    def __init__(self, config):
        self.seen: list = []
        self.step = 0
        self.loaded_state = None

    def observe(self, inputs, result):
        self.step += 1
        for qid in inputs.info_values("question_id", "probe"):
            if qid not in self.seen:
                self.seen.append(qid)

    def plan(self, batch_size):
        if self.step % 2 == 1:
            return [self.seen[i % 2] for i in range(batch_size)]
        return None

    def metrics(self):
        return {"probe/planner/seen": float(len(self.seen))}

    def state_dict(self):
        return {"seen": list(self.seen), "step": self.step}

    def load_state_dict(self, state):
        self.loaded_state = state
        self.seen, self.step = list(state["seen"]), int(state["step"])


CALLS: list = []


def probe_compute(inputs, config):
    CALLS.append(inputs)
    advantages, returns = compute_grpo_outcome_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index)
    return AdvantageResult(advantages, returns, {"probe/collapse_rate": 0.0})


def probe_blind_pass(trainer, batch, metrics, config):
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["old_log_probs"])
    blind = data["old_log_probs"] - 1.0
    tq.kv_batch_put(
        keys=batch.keys,
        partition_id=batch.partition_id,
        fields=TensorDict({"blind_log_probs": blind}, batch_size=len(batch)),
    )
    metrics["probe/blind_pass_ran"] = 1.0
    return batch


if "toolkit_probe" not in METHODS:
    register_method(
        AdvantageMethod(
            name="toolkit_probe",
            compute=probe_compute,
            needs=frozenset(
                KNOWN for KNOWN in ("old_log_probs", "responses", "blind_log_probs", "extra_info", "reward_extra_info")
            ),
            metric_prefix="probe",
            batch_planner=ProbePlanner,
            pre_advantage=probe_blind_pass,
        )
    )


@pytest.mark.launch  # Ray and TransferQueue: the launch tier
def test_every_declared_input_reaches_the_method_and_its_advantages_reach_the_actor(ray_and_tq, tmp_path, monkeypatch):
    write_synth_data(tmp_path)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "metrics.jsonl"))
    CALLS.clear()
    cfg = compose_toolkit_config(tmp_path, "toolkit_probe", prompts_per_step=PROMPTS, rollout_n=N)
    # dp_size=5 makes verl's _balance_batch append synthetic padding rows: the method must never see them.
    trainer = build_simulated_trainer(ToolkitTrainer, cfg, dp_size=5)
    manager = SimulatedAgentLoopManager(compute_score, n=N)
    trainer.fit(manager)

    updates = trainer.actor_rollout_wg.updates
    assert len(updates) == len(CALLS) == 3
    for step, (update, inputs) in enumerate(zip(updates, CALLS, strict=True), start=1):
        rows = real_rows(update)
        assert len(rows) < len(update["tags"]), "expected padding rows from dp_size=5"
        assert len(inputs) == len(rows) == PROMPTS * N
        assert list(inputs.index) == [update["uid"][i] for i in rows]
        assert inputs.global_step == step and inputs.total_steps == 3
        mask = inputs.response_mask.bool()
        responses = inputs.tensor("responses")
        old = inputs.tensor("old_log_probs")
        # The stand-in actor's log-probs are a known function of each sampled token.
        expected_old = -(0.05 + (responses % 13).float() / 20)
        torch.testing.assert_close(old[mask], expected_old[mask])
        torch.testing.assert_close(inputs.tensor("blind_log_probs")[mask], old[mask] - 1.0)
        assert all("question_id" in info for info in inputs.extra_info)
        assert all(set(extras) >= {"acc", "format"} for extras in inputs.reward_extra_info)
        text = inputs.tokenizer.decode(responses[0][mask[0]].tolist())
        assert "\\boxed{" in text
        # What the actor consumed is what the method returned; padding rows got zero.
        idx = torch.as_tensor(rows)
        expected, _ = compute_grpo_outcome_advantage(inputs.token_level_rewards, inputs.response_mask, inputs.index)
        torch.testing.assert_close(update["advantages"][idx], expected)
        pad = torch.as_tensor([i for i in range(len(update["tags"])) if i not in rows])
        assert torch.all(update["advantages"][pad] == 0)

    # The planner picked step 2's prompts: the first two questions of step 1, twice each.
    first_questions = list(dict.fromkeys(info["question_id"] for info in CALLS[0].extra_info))
    question_of_prompt = {
        uid: info["question_id"] for uid, info in zip(CALLS[1].index, CALLS[1].extra_info, strict=True)
    }
    assert sorted(question_of_prompt.values()) == sorted(first_questions[i % 2] for i in range(PROMPTS))
    assert len(question_of_prompt) == PROMPTS, "each planned prompt gets its own uid"

    logged = read_metrics(tmp_path / "metrics.jsonl")
    assert [entry["step"] for entry in logged] == [1, 2, 3]
    for entry in logged:
        keys = ("probe/collapse_rate", "probe/timing_s/advantage", "probe/blind_pass_ran", "probe/planner/seen")
        for key in (*keys, "probe/accuracy/mean"):
            assert key in entry["data"], key

    # The planner's state is saved with the checkpoint of step 2 and restored on resume.
    state_file = tmp_path / "ckpt" / "global_step_2" / "toolkit_probe_planner.json"
    assert state_file.exists()
    resume_cfg = compose_toolkit_config(
        tmp_path,
        "toolkit_probe",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path}/ckpt/global_step_2",
        prompts_per_step=PROMPTS,
        rollout_n=N,
    )
    resumed = build_simulated_trainer(ToolkitTrainer, resume_cfg)
    assert resumed.global_steps == 2
    assert resumed.batch_planner.loaded_state == {"seen": trainer_seen_after(CALLS[:2]), "step": 2}
    os.remove(state_file)
    with pytest.raises(FileNotFoundError, match="toolkit_probe batch planner state file .*toolkit_probe_planner.json"):
        build_simulated_trainer(ToolkitTrainer, resume_cfg)


def trainer_seen_after(calls) -> list:
    return list(dict.fromkeys(info["question_id"] for inputs in calls for info in inputs.extra_info))


@pytest.mark.parametrize(
    "override, error, message",
    [
        ("algorithm.adv_estimator=not_a_method", ValueError, "not a method of this toolkit"),
        ("trainer.v1.trainer_mode=diva_grpo", ValueError, "adv_estimator=diva_grpo"),
    ],
)
def test_toolkit_trainer_refuses_unknown_methods_and_the_wrong_trainer(tmp_path, override, error, message):
    from verl.trainer.ppo.v1 import get_trainer_cls

    cfg = compose_toolkit_config(tmp_path, "toolkit_probe", override)
    with pytest.raises(error, match=message):
        get_trainer_cls(cfg.trainer.v1.trainer_mode)(cfg)


def test_diva_on_the_toolkit_trainer_names_its_own_trainer(tmp_path):
    cfg = compose_toolkit_config(tmp_path, "diva_grpo")
    with pytest.raises(ValueError, match="trainer_mode=diva_grpo"):
        ToolkitTrainer(cfg)


def test_plain_dispatcher_refusal_names_the_toolkit_trainer():
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    estimator = get_adv_estimator_fn("toolkit_probe")
    with pytest.raises(RuntimeError, match="trainer.v1.trainer_mode=toolkit"):
        estimator(
            token_level_rewards=torch.zeros(2, 3),
            response_mask=torch.ones(2, 3),
            index=np.array(["a", "a"], dtype=object),
            config=None,
        )


def test_bf16_log_probs_reach_the_method_as_float32():
    """verl's actor computes log-probs with torch where flash-attn's cross entropy is absent (the CPU) or disabled
    (``VERL_DISABLE_FLASH_ATTN_CE=1``): in the logits' dtype, bf16 under verl's default mixed precision. The methods'
    math takes float32 (PGPO's refuses anything else): the shared step hands them float32 copies."""
    from verl import DataProto

    old = torch.randn(4, 3).to(torch.bfloat16)
    data = DataProto.from_dict(
        tensors={"old_log_probs": old, "blind_log_probs": old - 1, "responses": torch.arange(12).view(4, 3)}
    )
    needs = frozenset({"old_log_probs", "blind_log_probs", "responses"})
    tensors = ToolkitTrainer._method_tensors(ToolkitTrainer, data, needs, torch.tensor([2, 0]))
    assert tensors["old_log_probs"].dtype == tensors["blind_log_probs"].dtype == torch.float32
    assert torch.equal(tensors["old_log_probs"], old[[2, 0]].float())
    assert tensors["responses"].dtype == torch.int64
    assert data.batch["old_log_probs"].dtype == torch.bfloat16  # verl's own tensors are left as they are
