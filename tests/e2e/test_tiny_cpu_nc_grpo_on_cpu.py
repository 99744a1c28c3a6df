"""NC-GRPO trained for real on the CPU, once per rollout backend, with a checkpoint and a resume.

* ``hf_cpu``: ``METHOD=noise_contrastive_grpo NODES=2 run_scripts/tiny_cpu.sh`` (CI's toolkit method at world size
  2: two Ray nodes, two training ranks, a replica per node), two steps, a checkpoint, a fresh trainer resumes for a
  third; the run's own check reads the method's gap of the tokens sampled from the clean policy (every token of the
  clean responses: the default reading displaces all of a noisy response's tokens). The noisy rollouts differ from the
  clean rollouts the same seeds give: step 1's noisy responses are generated again by the ``hf_cpu`` server's code
  without the noise (the same prompts, images, seeds and initial weights), which gives back every clean response token
  for token and differs from the noisy ones; the branch metric each step logs (from the clean twin the agent loop
  sends with every noisy request) is that by-hand count.
* vLLM (the GPU stack's environment; ``DIVA_REQUIRE_VLLM=1`` fails instead of skipping): the same launch through the
  method's GPU launcher; the exact log-prob check passes on every token of every response, the noisy ones held to
  their own displaced recomputation, and their gap to the clean policy shows the worker extension displaced them.

Both: every step logs the noisy fraction, each half's accuracy, the zero-advantage fraction and the branch metrics;
the actor's inputs of every step hold exactly ``rollout.n / 2`` flagged responses per prompt, the very ones the
seeded choice names for the step and uid, carried in the same row as their response.

Both launches use the method's defaults (``target=layer_input`` at the last layer, ``noise_scale`` 2.0).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tiny_launch import run_tiny_cpu, training_metrics

from verl_ext.cpu.tiny_model import DEFAULT_ARCH, tiny_model_dir_name
from verl_ext.nc_grpo.branching import FIRST_DIFFERENCE_FIELD, NOT_PROBED, first_difference
from verl_ext.nc_grpo.noise import FLAG_FIELD, SEED_FIELD, noise_seed, noisy_responses
from verl_ext.rollout.seeds import request_seed

METHOD = "noise_contrastive_grpo"
N = 8  # responses per prompt on the tiny run (2 x rollout_n)
RESPONSE_LENGTH = 24  # the tiny run's (verl_ext/cpu/launch.py)

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(2400)]


def _launch(workdir: Path, run_dir: Path, timeout: int, **settings: str) -> str:
    returncode, output = run_tiny_cpu(workdir, run_dir, timeout, METHOD=METHOD, **settings)
    assert returncode == 0, output[-8000:]
    return output


def _check_metrics(metrics: dict[int, dict], steps: list[int]) -> None:
    assert sorted(metrics) == steps
    for data in metrics.values():
        assert data[f"{METHOD}/noisy_fraction"] == 0.5
        for key in ("accuracy/noisy", "accuracy/clean", "advantage/zero_fraction", "collapse_rate"):
            assert f"{METHOD}/{key}" in data, key
        # Every noisy response of the step was probed by its clean twin (2 prompts x 4 noisy responses).
        assert data[f"{METHOD}/branch/probed"] == 2 * N // 2
        assert 0 <= data[f"{METHOD}/branch/first_token"] <= data[f"{METHOD}/branch/rate"] <= 1
        assert torch.isfinite(torch.tensor(data["actor/grad_norm"])) and data["actor/grad_norm"] > 0


def _record(run_dir: Path, step: int) -> dict:
    return torch.load(run_dir / "probe" / f"actor_inputs_step{step}.pt", weights_only=False)


def _check_flags(run_dir: Path, steps: list[int], run_seed: int) -> int:
    """Flags of every probed step against the seeded choice; returns the number of flagged responses seen."""
    flagged = 0
    for step in steps:
        record = _record(run_dir, step)
        by_prompt: dict[str, set] = {}
        for key, fields, padding in zip(record["keys"], record["extra_fields"], record["is_padding"], strict=True):
            if padding:
                continue
            uid, session, _ = key.rsplit("_", 2)
            noisy = bool(fields[FLAG_FIELD])
            if noisy:
                by_prompt.setdefault(uid, set()).add(int(session))
                assert fields[SEED_FIELD] == noise_seed(run_seed, step, uid, int(session))
                assert fields[FIRST_DIFFERENCE_FIELD] != NOT_PROBED
            else:
                by_prompt.setdefault(uid, set())
                assert fields[SEED_FIELD] == -1 and fields[FIRST_DIFFERENCE_FIELD] == NOT_PROBED
        assert by_prompt
        for uid, sessions in by_prompt.items():
            assert sessions == set(noisy_responses(run_seed, step, uid, N, 0.5)), (step, uid)
            flagged += len(sessions)
    return flagged


def _clean_rollouts_of_the_same_seeds(model: str, record: dict, run_seed: int) -> dict[int, list[int]]:
    """Row -> the response the ``hf_cpu`` server's generation code gives that row's request without any noise: its
    prompt and image from the actor's inputs, its sampling seed from (seed, step, uid, index), the run's sampling
    settings (temperature 1, top-p 1, the 24-token budget)."""
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode

    from verl_ext.cpu.rollout import HFCpuServer

    rollout = RolloutConfig(name="hf_cpu", prompt_length=1024, response_length=RESPONSE_LENGTH)
    server = HFCpuServer.__ray_actor_class__(rollout, HFModelConfig(path=model), 0, RolloutMode.HYBRID)
    out = {}
    for row, (key, padding) in enumerate(zip(record["keys"], record["is_padding"], strict=True)):
        if padding:
            continue
        uid, session, _ = key.rsplit("_", 2)
        length = len(record["responses"][row])
        ids = [int(t) for t in record["input_ids"][row][: len(record["input_ids"][row]) - length]]
        mm = record["multi_modal_inputs"][row] or {}
        vision = {}
        if "pixel_values" in mm:
            types = (torch.tensor([ids]) == server.image_token_id).to(torch.int32)
            vision = {"pixel_values": mm["pixel_values"], "image_grid_thw": mm["image_grid_thw"]}
            vision["mm_token_type_ids"] = types
        seed = request_seed(run_seed, int(record["step"]), uid, int(session))
        params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": seed}
        out[row] = server._sample(ids, params, vision)[0]
    return out


def test_hf_cpu_trains_checkpoints_resumes_and_its_noisy_rollouts_branch(tmp_path):
    run_dir = tmp_path / "run"
    out = _launch(tmp_path, run_dir, 1500, NODES="2", STEPS="2", RESUME_STEPS="1")
    assert "[cpu] PASSED" in out  # the run's checks, on the tokens sampled from the clean policy (session._checked)
    for role in ("training ranks", "rollout replicas"):  # one of each per node
        placed = re.search(rf"\[cluster\] {role}: (.*)", out).group(1).split(", ")
        assert sorted(p.split()[1] for p in placed) == ["head", "node-1"], (role, placed)
    metrics = training_metrics(run_dir)
    _check_metrics(metrics, [1, 2, 3])
    assert json.loads((run_dir / "probe" / "train_begin_step3.json").read_text())  # the resumed trainer's start
    # rollout.seed: the tiny run's seed (0).
    assert _check_flags(run_dir, [1, 2, 3], 0) == 3 * 2 * N // 2
    for data in metrics.values():
        # hf_cpu's log-probs are the actor's on the clean responses, to float rounding; every token of a noisy one was
        # sampled from the displaced model (the noise reached the server and persisted past the first token).
        other = data[f"{METHOD}/rollout_logprob_gap/other_tokens"]
        assert other < 1e-4
        assert data[f"{METHOD}/rollout_logprob_gap/displaced_tokens"] > 100 * other

    # The noisy rollouts of step 1 against the clean rollouts the same seeds give (the initial weights: step 1).
    record = _record(run_dir, 1)
    clean = _clean_rollouts_of_the_same_seeds(str(tmp_path / tiny_model_dir_name(DEFAULT_ARCH)), record, 0)
    differ, diffs = 0, []
    for row, regenerated in clean.items():
        sampled = [int(t) for t in record["responses"][row][: int(record["response_mask"][row].sum())]]
        fields = record["extra_fields"][row]
        if not fields[FLAG_FIELD]:
            assert regenerated == sampled, row  # the regeneration is the rollout's own draw
            continue
        differ += regenerated != sampled
        # The clean twin of the run's agent loop and this regeneration are the same draw: the same first difference.
        diffs.append(first_difference(sampled, regenerated, RESPONSE_LENGTH))
        assert fields[FIRST_DIFFERENCE_FIELD] == diffs[-1], row
    assert differ > 0, "no noisy rollout of step 1 differs from the clean rollout of its seed"
    branched = [d for d in diffs if d >= 0]
    assert metrics[1][f"{METHOD}/branch/rate"] == pytest.approx(len(branched) / len(diffs))
    assert metrics[1][f"{METHOD}/branch/first_token"] == pytest.approx(diffs.count(0) / len(diffs))


@pytest.mark.extended  # CI time (tests/nc_grpo/test_nc_grpo_backends_on_cpu.py holds vLLM's hook in CI): -m extended
def test_vllm_trains_resumes_and_passes_the_exact_check_with_its_noisy_responses(tmp_path, vllm_required):
    from verl_ext.checks.logprob_check import check_rollout_logprobs, weights_by_step
    from verl_ext.methods.noise_contrastive_grpo import NoiseContrastiveConfig

    run_dir = tmp_path / "run"
    out = _launch(tmp_path, run_dir, 1500, ROLLOUT="vllm", STEPS="2", RESUME_STEPS="1")
    assert f"GPU launcher run_scripts/qwen25vl7b_{METHOD}.sh" in out and "[cpu] PASSED" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    check = summary["logprob_check"]
    assert check["steps"] == [1, 2, 3] and check["rollout_gap_mean"] < 1e-5 and check["actor_gap_mean"] < 1e-5
    metrics = training_metrics(run_dir)
    _check_metrics(metrics, [1, 2, 3])
    assert sum(data[f"{METHOD}/branch/rate"] for data in metrics.values()) > 0
    # rollout.seed: the GPU launcher leaves verl's default, 42.
    assert _check_flags(run_dir, [1, 2, 3], 42) == 3 * 2 * N // 2
    model = str(tmp_path / tiny_model_dir_name(DEFAULT_ARCH))
    knobs = NoiseContrastiveConfig()  # the launcher's defaults
    noise = {"scale": knobs.noise_scale, "target": knobs.target, "layer": knobs.layer}
    gaps = check_rollout_logprobs(
        str(run_dir / "probe"), weights_by_step(model, [str(run_dir / "checkpoints")]), model, 1.0, noise=noise
    )
    for gap in gaps:
        record = _record(run_dir, gap.step)
        noisy_tokens = sum(
            int(record["response_mask"][row].sum())
            for row, fields in enumerate(record["extra_fields"])
            if fields[FLAG_FIELD] and not record["is_padding"][row]
        )
        # Every token of a noisy response was sampled off the clean policy, and the check held it to the displaced one.
        assert gap.displaced_tokens == noisy_tokens > 0
        assert gap.displaced_gap_mean > 100 * gap.rollout_mean
