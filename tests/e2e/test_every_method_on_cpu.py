"""Every method trains the main job's model class for real on the CPU, on both rollouts.

One launch of ``METHOD=<method> [ROLLOUT=vllm] STEPS=2 RESUME_STEPS=0 run_scripts/tiny_cpu.sh`` per method and
rollout: two steps on the tiny Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``, window and full attention blocks,
its processor and chat template), through verl's trainer, FSDP2 workers with gradient checkpointing (the GPU job's
setting) and the rollout: ``hf_cpu`` (transformers), or verl's vLLM rollout configured by the method's own GPU
launcher (vLLM's Qwen2.5-VL model and weight loader in every weight sync). Each launch serves these checks:

* every step trained: a finite, non-zero gradient norm and a finite loss;
* the rollout sampled from the weights the actor trained: ``hf_cpu``: its log-probs equal the actor's old log-probs
  to float rounding; vLLM: the exact check of :mod:`verl_ext.checks.logprob_check` (each step's weights recomputed);
* the advantages the actor consumed are the method's pure function (``verl_ext/algos``; GRPO: verl's own) of the
  logged rewards, ids, log-probs, extra infos and texts;
* the method's metrics are logged each step.

DIVA-GRPO's runs on both rollouts are ``test_tiny_cpu_training_on_cpu.py`` and ``test_tiny_cpu_vllm_on_cpu.py``;
NC-GRPO's are ``test_tiny_cpu_nc_grpo_on_cpu.py`` (its change is in the rollout: they check the noise itself).
GRPO on vLLM is the identity check (``test_grpo_identity_on_cpu.py``). The vLLM launches need the GPU stack's
environment.

PGPO (whose blind pass runs the actor twice per step) trains on vLLM with ``PRECISION=bf16``, the GPU job's mixed
precision, at world size 2 (two Ray nodes, two ranks, two replicas): bf16 compute, fp32 gradient reduction over the
ranks, fp32 master weights, which the fp32 rollout receives in each sync (its log-probs still pass the exact check;
the actor's are a bf16 forward's). CI runs the vLLM launches of CoDaPO and PGPO; AVSPO's, Durian's and MUPO's
(whose step is GRPO's with another advantage function) and the ``hf_cpu`` ones (a CPU-only rollout; GRPO's among them)
are marked ``extended`` for CI time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_launch import run_tiny_cpu, training_metrics

from verl_ext.checks.probe import read_actor_inputs
from verl_ext.cpu.tiny_model import DEFAULT_ARCH, tiny_model_dir_name

STEPS = 2
# The method's key metrics, logged every step.
METRICS = {
    "grpo": ("grpo/collapse_rate", "grpo/accuracy/mean"),
    "avspo": ("avspo/collapse_rate/before", "avspo/collapse_rate/after", "avspo/virtual_samples"),
    "codapo": ("codapo/weight/mean", "codapo/collapse_rate", "codapo/resample/resampled_step"),
    "durian": ("durian/collapse_rate/prompts",),
    "pgpo": ("pgpo/blind_pass_share", "pgpo/share_above_tau", "pgpo/weight_mean", "timing_s/blind_log_prob"),
    "mupo": ("mupo/lambda", "mupo/groups_per_prompt/mean", "mupo/collapse_rate/partition"),
}
# vLLM is the GPU job's rollout: CI trains on it the methods whose step differs from GRPO's beyond the advantage
# (CoDaPO's resampled pass, PGPO's blind pass with the GPU job's bf16 mixed precision at world size 2: two ranks, two
# replicas). AVSPO's, Durian's and MUPO's vLLM runs (the shared advantage step, another function, each function held
# to its reference in CI) and the hf_cpu runs (a CPU-only rollout) are marked extended for CI time (a vLLM launch is
# three minutes on two cores; CI's whole run was 54 min of its 45-minute budget).
VLLM = pytest.mark.vllm_rollout
RUNS = [
    pytest.param(("avspo", "vllm", {}), marks=[pytest.mark.extended, VLLM], id="avspo-vllm"),
    pytest.param(("codapo", "vllm", {}), marks=VLLM, id="codapo-vllm"),
    pytest.param(("durian", "vllm", {}), marks=[pytest.mark.extended, VLLM], id="durian-vllm"),
    pytest.param(
        ("pgpo", "vllm", {"PRECISION": "bf16", "NODES": "2"}), marks=VLLM, id="pgpo-vllm-precisionbf16-nodes2"
    ),
    pytest.param(("mupo", "vllm", {}), marks=[pytest.mark.extended, VLLM], id="mupo-vllm"),
    *(
        pytest.param((method, "hf_cpu", {}), marks=pytest.mark.extended, id=f"{method}-hf_cpu")
        for method in ("avspo", "codapo", "durian", "pgpo", "mupo", "grpo")
    ),
]


def _run_id(run) -> str:
    method, rollout, settings = run
    # Also the run folder's name: no "=" (Hydra would read the checkpoint path as an override).
    return "-".join([method, rollout, *(f"{k.lower()}{v.lower()}" for k, v in settings.items())])


pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One folder for the tiny model and data of every launch of this module."""
    return tmp_path_factory.mktemp("every_method")


@pytest.fixture(scope="module", params=RUNS, ids=_run_id)
def run(request, workdir):
    method, rollout, settings = request.param
    if rollout == "vllm":
        request.getfixturevalue("vllm_required")
    run_dir = workdir / _run_id(request.param)
    launch = {"METHOD": method, "ROLLOUT": rollout, "STEPS": str(STEPS), "RESUME_STEPS": "0", **settings}
    returncode, output = run_tiny_cpu(workdir, run_dir, 800, **launch)
    assert returncode == 0, output[-8000:]
    model = workdir / tiny_model_dir_name(DEFAULT_ARCH)
    return {
        "method": method,
        "rollout": rollout,
        "bf16": settings.get("PRECISION") == "bf16",
        "dir": run_dir,
        "model": model,
        "output": output,
        "records": read_actor_inputs(str(run_dir)),
        "metrics": training_metrics(run_dir),
    }


def real_rows(record) -> list[int]:
    return [i for i, padding in enumerate(record["is_padding"]) if not padding]


def test_every_step_trained_the_tiny_qwen25_vl(run):
    config = json.loads((run["model"] / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert sorted(run["metrics"]) == sorted(run["records"]) == list(range(1, STEPS + 1))
    for step, data in run["metrics"].items():
        assert math.isfinite(data["actor/grad_norm"]) and data["actor/grad_norm"] > 0, step
        assert math.isfinite(data["actor/pg_loss"]), step
    if run["rollout"] == "vllm":
        launcher = "qwen25vl7b_grpo.sh" if run["method"] == "grpo" else f"qwen25vl7b_{run['method']}.sh"
        assert f"GPU launcher run_scripts/{launcher}" in run["output"]
        # vLLM's own Qwen2.5-VL model (and its weight loader, which every weight sync goes through).
        assert "Qwen2_5_VLForConditionalGeneration" in (run["dir"] / "job.log").read_text()


def test_the_rollout_sampled_from_the_weights_the_actor_trained(run):
    if run["rollout"] == "hf_cpu":
        for step, record in run["records"].items():
            rows = torch.as_tensor(real_rows(record))
            mask = record["response_mask"][rows].bool()
            gap = (record["old_log_probs"][rows] - record["rollout_log_probs"][rows]).abs()[mask]
            assert gap.mean().item() < 2e-5 and gap.max().item() < 1e-3, (step, gap.mean().item())
        return
    from transformers import AutoProcessor, AutoTokenizer

    from verl_ext.checks.logprob_check import MAX_TOLERANCE, MEAN_TOLERANCE, step_gap, weights_by_step

    # verl's sampler normalises over the tokens it allows: the exact check recomputes each step's weights in fp32.
    model = str(run["model"])
    weights = weights_by_step(model, [str(run["dir"] / "checkpoints")])
    processor, tokenizer = AutoProcessor.from_pretrained(model), AutoTokenizer.from_pretrained(model)
    for step, record in run["records"].items():
        gap = step_gap(record, weights(step), processor, tokenizer, 1.0)
        # The fp32 rollout got the fp32 master weights, bf16 actor or not.
        assert gap.rollout_mean < MEAN_TOLERANCE and gap.rollout_max < MAX_TOLERANCE, gap
        if run["bf16"]:
            # The actor computed in bf16: its old log-probs are off the fp32 recomputation by far more than rounding.
            assert 1e-4 < gap.actor_mean < 0.1, gap
        else:
            assert gap.actor_mean < MEAN_TOLERANCE and gap.actor_max < MAX_TOLERANCE, gap


def test_bf16_is_verls_default_mixed_precision_the_gpu_jobs(run):
    """No mixed-precision override reaches verl in a ``PRECISION=bf16`` run: verl's FSDP default, the GPU job's
    (bf16 parameters in compute, fp32 gradient reduction over the ranks, fp32 buffers and master weights)."""
    overrides = (run["dir"] / "overrides.txt").read_text()
    assert ("mixed_precision" in overrides) is not run["bf16"]


def _inputs(record) -> dict:
    """One step's real rows as the inputs of the advantage functions."""
    rows = real_rows(record)
    idx = torch.as_tensor(rows)
    mask = record["response_mask"][idx]
    width = mask.shape[1]
    responses = torch.zeros_like(mask)
    for row, i in enumerate(rows):
        tokens = torch.as_tensor(record["responses"][i])[:width]
        responses[row, : tokens.numel()] = tokens
    return {
        "rewards": record["rm_scores"][idx].float(),
        "mask": mask,
        # float32, as the shared advantage step hands them to the methods (bf16 in a PRECISION=bf16 run).
        "old": record["old_log_probs"][idx].float(),
        "blind": record["blind_log_probs"][idx].float() if "blind_log_probs" in record else None,
        "uid": np.array([record["uid"][i] for i in rows], dtype=object),
        "infos": [record["extra_info"][i] for i in rows],
        "acc": [float(record["extra_fields"][i]["reward_extra_info"]["acc"]) for i in rows],
        "responses": responses,
        "consumed": record["advantages"][idx] * mask,
    }


def _mupo_config(run_dir: Path):
    """MUPO's config block with the CPU run's overrides (hashed trigrams, the group size for 8 responses)."""
    from verl_ext.mupo import MupoConfig

    lines = (run_dir / "overrides.txt").read_text().splitlines()
    knobs = dict(line.split("=", 1) for line in lines if line.startswith("mupo."))
    assert knobs == {"mupo.embedding.backend": "hashing", "mupo.min_size": knobs["mupo.min_size"]}, knobs
    default = MupoConfig()
    return MupoConfig(embedding=default.embedding.__class__(backend="hashing"), min_size=int(knobs["mupo.min_size"]))


def expected_advantage(method: str, rows: dict, step: int, run: dict) -> torch.Tensor:
    """The method's advantage from its pure function, on the paper defaults the launchers keep (MUPO: with the CPU
    run's overrides)."""
    from verl_ext import algos

    rewards, mask, uid = rows["rewards"], rows["mask"], rows["uid"]
    if method == "grpo":
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        return compute_grpo_outcome_advantage(rewards, mask, uid)[0]
    if method == "avspo":
        return algos.compute_avspo_advantage(rewards, mask, uid)[0]
    if method == "codapo":
        return algos.compute_codapo_advantage(rewards, mask, rows["old"], uid, rows["acc"])[0]
    if method == "durian":
        entropy = [float(info["visual_entropy"]) for info in rows["infos"]]
        return algos.compute_durian_advantage(rewards, mask, rows["old"], uid, entropy)[0]
    if method == "pgpo":
        assert rows["blind"] is not None, "PGPO's blind log-probs were not recorded"
        return algos.compute_pgpo_advantage(rewards, mask, uid, rows["old"], rows["blind"])[0]
    if method == "mupo":
        from transformers import AutoTokenizer

        from verl_ext.mupo import add_sequence_bonus, decode_responses, mupo_step
        from verl_ext.mupo.hashing_embedder import HashingEmbedder

        config = _mupo_config(run["dir"])
        texts = decode_responses(rows["responses"], mask, AutoTokenizer.from_pretrained(str(run["model"])))
        scores = rewards.sum(-1)
        new_scores, partition, _ = mupo_step(texts, scores, rows["acc"], uid, step, STEPS, config, HashingEmbedder())
        return algos.compute_mupo_advantage(
            add_sequence_bonus(rewards, mask, new_scores - scores), mask, uid, partition
        )[0]
    raise AssertionError(method)


def test_the_actor_consumed_the_methods_advantage(run):
    for step, record in run["records"].items():
        rows = _inputs(record)
        expected = expected_advantage(run["method"], rows, step, run) * rows["mask"]
        assert rows["consumed"].abs().sum() > 0, f"step {step}: no signal, the check would see nothing"
        torch.testing.assert_close(rows["consumed"], expected.float(), rtol=1e-5, atol=1e-5, msg=f"step {step}")


def test_the_methods_metrics_are_logged_every_step(run):
    for step, data in run["metrics"].items():
        for key in METRICS[run["method"]]:
            assert key in data and math.isfinite(data[key]), (step, key)
    if run["method"] == "codapo":
        # Step 1 is fresh, step 2 its resampled pass over step 1's best questions.
        assert [run["metrics"][s]["codapo/resample/resampled_step"] for s in (1, 2)] == [0.0, 1.0]
    if run["method"] == "pgpo":
        assert all(data["pgpo/blind_pass_share"] == 1.0 for data in run["metrics"].values())
