"""The main job's own stack trained for real on the CPU: verl's vLLM rollout (vLLM 0.24.0's CPU build), its agent
loop and checkpoint-engine weight sync, configured by the GPU launcher (``ROLLOUT=vllm run_scripts/tiny_cpu.sh``).

Runs in the GPU stack's environment (``run_scripts/setup_vllm_cpu.sh``; CI sets ``DIVA_REQUIRE_VLLM=1`` there, so
a missing vLLM fails instead of skipping). One launch on a cluster of two Ray nodes (two training ranks, a vLLM
replica per node, weights synced to both): two DIVA steps on the tiny Qwen2-VL with images and variants, a checkpoint
each step, then a fresh trainer resumes for a third; the launcher's checks pass (finite non-zero loss and gradient,
the exact log-prob check of :mod:`verl_ext.checks.logprob_check` over both replicas' rollouts, difficulty state
restored). The same run
then shows that the check sees a rollout one update behind, and the patch of vLLM's CPU linear layers is tested
against vLLM's own dispatch.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import torch
from tiny_launch import VLLM_NODES, VLLM_RESUME_STEPS, VLLM_STEPS, sockets_off_loopback

from verl_ext.cluster.placement import parse_placement
from verl_ext.cpu.tiny_model import DEFAULT_ARCH, tiny_model_dir_name

STEPS, RESUME_STEPS, NODES = VLLM_STEPS, VLLM_RESUME_STEPS, VLLM_NODES

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def run(tiny_vllm_run):
    """The launch of ``tests/e2e/conftest.py`` (the reshard test resumes its checkpoint at world size 1)."""
    return tiny_vllm_run


def test_vllms_servers_and_the_head_listen_on_loopback_only(run):
    """verl's vLLM server, its engine processes, the checkpoint engine's ZMQ sockets and the Ray head: all bound to
    loopback (``run_scripts/_submit.sh``: the head's node address, ``VLLM_HOST_IP``)."""
    sockets = run["sockets"]
    assert {"gcs_server", "raylet"} <= {s[2] for s in sockets}
    # The one exception, listed in docs/reliability.md ("The local head"): torch.distributed's store, which binds
    # every interface.
    assert sockets_off_loopback(sockets) == []


def test_one_vllm_replica_per_node_beside_its_rank(run):
    report = parse_placement(run["log"])  # its JSON line is in the job's log
    ranks, replicas = report["groups"]["training ranks"], report["groups"]["rollout replicas"]
    assert len(report["nodes"]) == NODES and len(set(ranks)) == NODES and replicas == ranks
    assert set(report["groups"]["agent-loop workers"]) == set(report["nodes"])
    assert report["trainer"]["gpus"] == []


def test_trains_resumes_and_passes_the_runs_checks(run):
    out, summary = run["output"], run["summary"]
    assert "GPU launcher run_scripts/qwen25vl7b_diva.sh" in out
    assert summary["steps"] == [1, 2, 3] and summary["trainer_mode"] == "diva_grpo"
    assert summary["questions_tracked"] > 0  # the resumed trainer started from the checkpoint's difficulty state
    check = summary["logprob_check"]
    assert check["steps"] == [1, 2, 3]
    # Synced fp32 weights on both sides: float rounding only (measured ~2e-7 per token, max ~1e-6).
    assert check["rollout_gap_mean"] < 1e-5 and check["actor_gap_mean"] < 1e-5
    # verl's own metric includes the banned tokens' probability mass: far above the exact gap, never used as proof.
    assert all(step["logprob_gap"] > 10 * check["rollout_gap_mean"] for step in summary["per_step"])


def test_the_run_went_through_verls_vllm_server_and_weight_sync(run):
    metrics, validated = {}, set()
    for path in glob.glob(str(run["dir"] / "metrics" / "*" / "*.jsonl")):
        for line in Path(path).read_text().splitlines():
            entry = json.loads(line)
            if "actor/pg_loss" in entry["data"]:
                metrics[entry["step"]] = entry["data"]
            if any(key.startswith("val-core/") for key in entry["data"]):
                validated.add(entry["step"])
    assert sorted(metrics) == [1, 2, 3]
    # The GPU launcher's validation (val_before_train, val_kwargs) through vLLM: before training, at each part's end.
    assert {0, STEPS, STEPS + RESUME_STEPS} <= validated
    for data in metrics.values():
        assert data["timing_s/update_weights"] > 0  # verl's checkpoint-engine sync ran every step
        assert data["timing_s/gen"] > 0
    overrides = (run["dir"] / "overrides.txt").read_text()
    assert "worker_extension_cls=verl_ext.cpu.vllm_worker.CpuWorkerExtension" in overrides
    assert "rollout.name" not in overrides  # verl's default, vllm, from the recipe yaml and the GPU launcher


def test_the_check_fails_when_the_rollout_keeps_stale_weights(run, tmp_path):
    """A rollout server one update behind, as the check would see it: step 2's record with the log-probs that the
    weights before step 1's update give the same tokens (what a server that missed the sync reports), checked against
    the right weights, must fail as a missed sync; the record as the run wrote it passes. Checking against the wrong
    weights altogether fails on the actor's side first. (~0.1-0.2 per token at this learning rate, ~2e-7 synced.)"""
    from transformers import AutoProcessor, AutoTokenizer

    from verl_ext.checks.logprob_check import (
        LogprobCheckError,
        check_rollout_logprobs,
        recomputed_logprobs,
        weights_by_step,
    )

    model = str(run["workdir"] / tiny_model_dir_name(DEFAULT_ARCH))
    probe = run["dir"] / "probe"
    synced = weights_by_step(model, [str(run["dir"] / "checkpoints")])
    (gap,) = check_rollout_logprobs(str(probe), synced, model, 1.0, steps=[2])
    assert gap.rollout_mean < 1e-5 and gap.tokens > 0

    record = torch.load(probe / "actor_inputs_step2.pt", weights_only=False)
    stale = recomputed_logprobs(
        record, synced(1), AutoProcessor.from_pretrained(model), AutoTokenizer.from_pretrained(model), 1.0
    )
    for i, (_, allowed) in stale.items():
        record["rollout_log_probs"][i, : len(allowed)] = allowed
    stale_probe = tmp_path / "probe"
    stale_probe.mkdir()
    torch.save(record, stale_probe / "actor_inputs_step2.pt")
    with pytest.raises(LogprobCheckError, match="the rollout server did not get the trained weights") as err:
        check_rollout_logprobs(str(stale_probe), synced, model, 1.0)
    assert "step 2:" in str(err.value)

    with pytest.raises(LogprobCheckError, match="the check does not recompute the actor"):
        check_rollout_logprobs(str(probe), lambda step: synced(step - 1), model, 1.0, steps=[2])


def test_no_shared_memory_left_behind(run):
    # vLLM's killed engines left 4 segments in every run seen here; the launcher removed them ("[cpu] removed ...").
    assert run["shm_left"] == set()


def test_keep_cpu_linear_weights_lifts_vllms_drop_of_linear_weights(monkeypatch, vllm_required):
    """vLLM's own CPU dispatch empties a linear layer's weight (oneDNN packing), so verl cannot sync into it; the
    patched dispatch keeps it and computes with the live tensor, so a reloaded weight is the weight used."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers import utils

    from verl_ext.cpu.vllm_worker import keep_cpu_linear_weights

    monkeypatch.setattr(utils, "dispatch_cpu_unquantized_gemm", utils.dispatch_cpu_unquantized_gemm)

    def layer() -> torch.nn.Module:
        mod = torch.nn.Module()
        mod.weight = torch.nn.Parameter(torch.randn(6, 8), requires_grad=False)
        return mod

    x = torch.randn(3, 8)
    if ops._supports_onednn:  # vLLM's path on this machine: the weight is packed and dropped
        plain = layer()
        utils.dispatch_cpu_unquantized_gemm(plain, remove_weight=True)
        assert plain.weight.numel() == 0
    assert keep_cpu_linear_weights() is True
    assert keep_cpu_linear_weights() is False  # idempotent
    kept = layer()
    utils.dispatch_cpu_unquantized_gemm(kept, remove_weight=True)
    assert kept.weight.shape == (6, 8)
    torch.testing.assert_close(utils.cpu_unquantized_gemm(kept, x, kept.weight), x @ kept.weight.T)
    with torch.no_grad():
        kept.weight.copy_(torch.randn(6, 8))  # what verl's weight sync does
    torch.testing.assert_close(utils.cpu_unquantized_gemm(kept, x, kept.weight), x @ kept.weight.T)


def test_warm_up_in_inference_mode_runs_vllms_cpu_warm_up_without_autograd(monkeypatch, vllm_required):
    """vLLM's CPU model runner warms up with autograd on (its GPU worker profiles in inference mode), which a tensor
    parallel all-gather into views refuses; the patched warm-up runs vLLM's own method in inference mode."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from verl_ext.cpu.vllm_worker import warm_up_in_inference_mode

    seen = []
    monkeypatch.setattr(CPUModelRunner, "warming_up_model", lambda self: seen.append(torch.is_inference_mode_enabled()))
    runner = CPUModelRunner.__new__(CPUModelRunner)  # the warm-up's mode is all this checks
    runner.warming_up_model()
    assert warm_up_in_inference_mode() is True
    assert warm_up_in_inference_mode() is False  # idempotent
    runner.warming_up_model()
    assert seen == [False, True]
    assert not torch.is_inference_mode_enabled()


def test_vllm_keeps_cascade_attention_off_as_verls_faq_asks(vllm_required):
    """verl #2996 (rollout and actor log-probs of Qwen-VL disagree): verl's FAQ sets
    ``rollout.engine_kwargs.vllm.disable_cascade_attn=True``. vLLM 0.24 defaults to it, and no launcher turns it on;
    the run above checks the rollout's log-probs against the actor's exactly, on the tiny Qwen2.5-VL."""
    import dataclasses

    from vllm.config import ModelConfig

    from verl_ext.checks.ledger import METHODS, gpu_job_leaves

    assert {f.name: f for f in dataclasses.fields(ModelConfig)}["disable_cascade_attn"].default is True
    for method in METHODS:
        assert gpu_job_leaves(method).get("actor_rollout_ref.rollout.engine_kwargs.vllm.disable_cascade_attn") in (
            None,
            True,
        )
