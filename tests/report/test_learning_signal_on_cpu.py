"""Where a step's learning signal went (verl_ext.lab.learning_signal), on an actor-input record built by hand."""

from __future__ import annotations

import pytest
import torch

from verl_ext.lab.learning_signal import run_means, signal_figures, step_signal


def _record(step=1):
    # 6 responses of 2 tokens (the last one padding), the score on the last real token as verl's reward does.
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1], [1, 1], [1, 1]], dtype=torch.float32)
    last = [1, 1, 0, 1, 1, 1]
    scores = [1.0, 0.1, 0.1, 1.0, 0.1, 1.0]
    rewards = torch.zeros(6, 2)
    for i, (t, s) in enumerate(zip(last, scores, strict=True)):
        rewards[i, t] = s
    advantages = torch.tensor([0.8, -0.4, -0.004, 0.6, -0.6, 0.0]).unsqueeze(1) * mask
    kinds = ["original", "original", "original", "hint", "hint", None]
    extra = [{"variant_kind": k} if k else {"variant_kind": "original"} for k in kinds]
    return {
        "step": step,
        "response_mask": mask,
        "rm_scores": rewards,
        "advantages": advantages,
        "extra_info": extra,
        "is_padding": [False] * 5 + [True],
        "actor_metrics": {"actor/grad_norm": 0.5},
    }


def test_step_figures_by_hand():
    got = step_signal(_record())
    assert got["responses"] == 5 and got["original_responses"] == 3
    assert got["original_accuracy"] == pytest.approx(1 / 3)
    # -0.004 is verl's float32 residue of an equal-score group: no signal.
    assert got["original_signal"] == pytest.approx(2 / 3)
    assert got["original_right_advantage"] == pytest.approx(0.8)
    assert got["original_wrong_advantage"] == pytest.approx((-0.4 - 0.004) / 2)
    assert got["variant_right_advantage"] == {"hint": pytest.approx(0.6)}
    rms = ((0.8**2 + 0.4**2 + 0.004**2 + 0.6**2 + 0.6**2) / 5) ** 0.5
    assert got["advantage_rms"] == pytest.approx(rms)
    assert got["grad_norm"] == 0.5


def test_a_run_without_variant_info_counts_every_response_as_original(tmp_path):
    record = _record()
    record["extra_info"] = [{"split": "train"}] * 6  # verl's own dataset (GRPO): no variant_kind
    assert step_signal(record)["original_responses"] == 5
    (tmp_path / "probe").mkdir()
    for step in (2, 1):
        torch.save(_record(step), tmp_path / "probe" / f"actor_inputs_step{step}.pt")
    steps = signal_figures(str(tmp_path))
    assert [s["step"] for s in steps] == [1, 2]
    assert run_means(steps)["original_accuracy"] == pytest.approx(0.3333)
    with pytest.raises(ValueError, match="no probe/actor_inputs_step"):
        signal_figures(str(tmp_path / "probe"))
