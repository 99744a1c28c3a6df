"""GRPO inside DIVA, value by value, on the real CPU path of both rollouts.

With every addition off (``WITHOUT=all``: no variants, so each question's one prompt gets all 2n responses; no global
stream, no difficulty weighting, no batch normalisation, no reward-range rescaling) the DIVA trainer must train as the
GRPO baseline does (``METHOD=grpo``: verl's estimator on the toolkit trainer, verl's ``RLHFDataset``). For each
rollout (``hf_cpu``; ``vllm``: verl's vLLM rollout through the GPU launchers), both are launched with
``run_scripts/tiny_cpu.sh`` at the same seed, data and responses per question, two steps, no resume, and compared by
:func:`verl_ext.checks.grpo_identity.compare_runs`: every metric both log at every step (validation before training and
at step 2 included) and, response by response, what the actor consumed.

Tolerances (:mod:`verl_ext.checks.grpo_identity`, with why):

* prompt and response tokens, response masks, rewards: exact. The same seeds (per request, from the run's seed, the
  step and the prompt's place: :mod:`verl_ext.rollout.seeds`) on the same weights draw the same tokens.
* advantages: 1e-6 absolute. verl's GRPO computes ``(s - mean) / (std + eps)`` in float32 and leaves an equal-score
  group a rounding residue; the DIVA advantage computes in float64, writes 0 there and rounds once to float32: they
  agree to about one float32 ulp of a z-score (measured: 1.2e-7).
* old and rollout log-probs: 1e-4 absolute; the logged metrics (losses, gradient norms, scores, lengths, ...):
  1e-4 relative with 1e-6 absolute (the issue's 1e-4; the absolute part for values near 0, such as the policy loss,
  minus a token mean of advantages). The advantages' ~1e-7 flows into the loss, the gradient and, after the update,
  the weights and log-probs of the next step. Measured (docs/algo/diva_grpo.md, "GRPO inside DIVA"): loss 2e-6
  relative on ``hf_cpu``, 2e-5 on vLLM, gradient norm 1.2e-7, log-probs 1e-6 absolute.

The task is prepared (:func:`verl_ext.checks.grpo_identity.prepare_task`) with every image at the model's input size:
DIVA's dataset gives each image ``diva.variants.max_pixels`` for the processor and verl's gives none, so a larger
image reaches the two models through different resizes and different pixels (a 1.5e-4 gradient-norm gap at step 2
before the task was prepared; ``tests/report/test_grpo_identity_compare_on_cpu.py`` shows the two routes).

Four launches of two to six minutes each on 2 cores (16.5 min in all beside another CPU job); CI runs them
(``gpu_stack``) in the main job's stack.
"""

from __future__ import annotations

import json
import time

import pytest
from tiny_launch import run_tiny_cpu

from verl_ext.checks.grpo_identity import compare_runs, format_result, prepare_task
from verl_ext.checks.probe import read_actor_inputs

STEPS = 2
LAUNCH_TIMEOUT_S = 900
# Each test's first item runs two launches (measured on 2 cores: hf_cpu 2-4 min each, vLLM 4-6 min each).
pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    pytest.importorskip("torchvision", reason="Qwen2-VL's processor and verl's qwen_vl_utils import torchvision")
    workdir = tmp_path_factory.mktemp("grpo_identity")
    prepare_task(str(workdir))
    return workdir


# CI runs the main job's rollout (vLLM through the GPU launcher, ~6 minutes on two cores); hf_cpu's form (~4 minutes)
# is marked extended for CI's time: -m extended runs it (docs/algo/diva_grpo.md, "GRPO inside DIVA").
@pytest.fixture(
    scope="module",
    params=[pytest.param("hf_cpu", marks=pytest.mark.extended), pytest.param("vllm", marks=pytest.mark.vllm_rollout)],
)
def runs(request, task):
    """GRPO and DIVA-GRPO without its additions, at the same seed, on one rollout; each launch's duration."""
    rollout = request.param
    if rollout == "vllm":
        request.getfixturevalue("vllm_required")
    out = {"rollout": rollout, "seconds": {}}
    # vLLM validates with the GPU launcher's sampling (0.6 / 0.95), hf_cpu greedily: a sampled validation request's
    # seed is keyed on its question's content without its images' resize hints (verl_ext.rollout.agent_loop), so the
    # two methods draw the same validation responses from the same weights.
    for name, settings in (("grpo", {"METHOD": "grpo"}), ("diva", {"METHOD": "diva", "WITHOUT": "all"})):
        run_dir = task / f"{rollout}_{name}"
        start = time.monotonic()
        returncode, output = run_tiny_cpu(
            task, run_dir, LAUNCH_TIMEOUT_S, ROLLOUT=rollout, STEPS=str(STEPS), RESUME_STEPS="0", **settings
        )
        out["seconds"][name] = round(time.monotonic() - start, 1)
        assert returncode == 0, output[-8000:]
        out[name] = run_dir
    print(f"[grpo identity] {rollout} launches (s): {json.dumps(out['seconds'])}")
    return out


def test_diva_without_its_additions_logs_what_grpo_logs(runs):
    result = compare_runs(str(runs["grpo"]), str(runs["diva"]))
    (runs["diva"] / "grpo_identity.json").write_text(json.dumps({**result.to_json(), "seconds": runs["seconds"]}))
    assert result.ok, format_result(result)
    # Validation before training and at the last step, both training steps.
    assert result.steps == [0, 1, 2]
    compared = {key: stats.values for key, stats in result.stats.items()}
    for key in (
        "metric/actor/pg_loss",
        "metric/actor/grad_norm",
        "metric/critic/score/mean",
        "metric/critic/advantages/mean",
        "metric/response_length/mean",
        "metric/grpo/collapse_rate",
        "metric/grpo/advantage/zero_fraction",
    ):
        assert compared.get(key) == STEPS, key
    assert compared["metric/val-core/diva_synth/acc/mean@1"] == 2
    # 2 questions x 8 responses per step; every response token's advantage and log-probs.
    for key in ("record/prompt_tokens", "record/response_tokens", "record/response_mask", "record/reward"):
        assert compared[key] == STEPS * 16, key
    tokens = compared["record/advantage"]
    assert tokens >= STEPS * 16 and compared["record/old_log_probs"] == compared["record/rollout_log_probs"] == tokens


def test_the_diva_run_had_one_prompt_per_question_and_no_additions(runs):
    """What makes the comparison the identity: DIVA's dataset gave only originals, each with all 8 responses."""
    for step, record in read_actor_inputs(str(runs["diva"])).items():
        kinds = [info["variant_kind"] for info in record["extra_info"]]
        assert kinds == ["original"] * 16, step
        questions = [info["question_id"] for info in record["extra_info"]]
        assert sorted(questions.count(q) for q in set(questions)) == [8, 8], step
    # The settings the launch was given (hf_cpu: Hydra overrides; vllm: the GPU launcher's variables, then the
    # overrides it has no variable for).
    settings = set((runs["diva"] / "overrides.txt").read_text().split())
    if runs["rollout"] == "vllm":
        settings |= set((runs["diva"] / "launcher_env.txt").read_text().split())
        expected = {"DIVA_GPU_LAUNCHER=qwen25vl7b_diva.sh", "VARIANTS_PER_QUESTION=0", "ROLLOUT_N=8", "DIFFICULTY_K=0"}
    else:
        expected = {
            "diva.variants.variants_per_question=0",
            "actor_rollout_ref.rollout.n=8",
            "diva.advantage.k=0",
            "trainer.v1.trainer_mode=diva_grpo",
        }
    expected |= {"diva.advantage.global_coef=0", "diva.advantage.batch_norm=false", "diva.advantage.rrb=false"}
    assert expected <= settings, sorted(expected - settings)
