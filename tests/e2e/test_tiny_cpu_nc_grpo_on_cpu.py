"""NC-GRPO trained for real on the CPU, once per rollout backend, with a checkpoint and a resume.

* vLLM (the GPU stack's environment; ``DIVA_REQUIRE_VLLM=1`` fails instead of skipping): ``ROLLOUT=vllm
  METHOD=noise_contrastive_grpo run_scripts/tiny_cpu.sh``, two steps, a checkpoint, a fresh trainer resumes for a
  third; the launcher's checks pass, the exact log-prob check among them, with the noisy first tokens left out,
  and those tokens' own gap shows that vLLM's worker extension noised them.
* ``hf_cpu``: the same launch; the run's own check reads the method's gap of every token but the noisy first ones
  (verl's ``rollout_corr/log_ppl_abs_diff`` includes them by design, README, NC-GRPO).

Both: every step logs the noisy fraction, each half's accuracy and the zero-advantage fraction; the actor's inputs
of every step hold exactly ``rollout.n / 2`` flagged responses per prompt, the very ones the seeded choice names
for the step and uid, carried in the same row as their response.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import torch
from tiny_launch import run_tiny_cpu

from verl_ext.nc_grpo.noise import FLAG_FIELD, SEED_FIELD, noise_seed, noisy_responses

METHOD = "noise_contrastive_grpo"
N = 8  # responses per prompt on the tiny run (2 x rollout_n)

pytestmark = [pytest.mark.gpu_stack, pytest.mark.timeout(2400)]


def _launch(workdir: Path, run_dir: Path, timeout: int, **settings: str) -> str:
    returncode, output = run_tiny_cpu(workdir, run_dir, timeout, METHOD=METHOD, **settings)
    assert returncode == 0, output[-8000:]
    return output


def _metrics(run_dir: Path) -> dict[int, dict]:
    out = {}
    for path in glob.glob(str(run_dir / "metrics" / "*" / "*.jsonl")):
        for line in Path(path).read_text().splitlines():
            entry = json.loads(line)
            if "actor/pg_loss" in entry["data"]:
                out[entry["step"]] = entry["data"]
    return out


def _check_metrics(metrics: dict[int, dict], steps: list[int]) -> None:
    assert sorted(metrics) == steps
    for data in metrics.values():
        assert data[f"{METHOD}/noisy_fraction"] == 0.5
        for key in ("accuracy/noisy", "accuracy/clean", "advantage/zero_fraction", "collapse_rate"):
            assert f"{METHOD}/{key}" in data, key
        assert torch.isfinite(torch.tensor(data["actor/grad_norm"])) and data["actor/grad_norm"] > 0


def _check_flags(run_dir: Path, steps: list[int], run_seed: int) -> int:
    """Flags of every probed step against the seeded choice; returns the number of flagged responses seen."""
    flagged = 0
    for step in steps:
        record = torch.load(run_dir / "probe" / f"actor_inputs_step{step}.pt", weights_only=False)
        by_prompt: dict[str, set] = {}
        for key, fields, padding in zip(record["keys"], record["extra_fields"], record["is_padding"], strict=True):
            if padding:
                continue
            uid, session, _ = key.rsplit("_", 2)
            noisy = bool(fields[FLAG_FIELD])
            if noisy:
                by_prompt.setdefault(uid, set()).add(int(session))
                assert fields[SEED_FIELD] == noise_seed(run_seed, step, uid, int(session))
            else:
                by_prompt.setdefault(uid, set())
                assert fields[SEED_FIELD] == -1
        assert by_prompt
        for uid, sessions in by_prompt.items():
            assert sessions == set(noisy_responses(run_seed, step, uid, N, 0.5)), (step, uid)
            flagged += len(sessions)
    return flagged


def test_hf_cpu_trains_checkpoints_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    out = _launch(tmp_path, run_dir, 1100, STEPS="2", RESUME_STEPS="1")
    assert "[cpu] PASSED" in out  # the run's checks, on every token but the noisy first ones (session._checked)
    metrics = _metrics(run_dir)
    _check_metrics(metrics, [1, 2, 3])
    assert json.loads((run_dir / "probe" / "train_begin_step3.json").read_text())  # the resumed trainer's start
    # rollout.seed: the tiny run's seed (0).
    assert _check_flags(run_dir, [1, 2, 3], 0) == 3 * 2 * N // 2
    for data in metrics.values():
        # hf_cpu's log-probs are the actor's: every token but the noisy first ones agrees to float rounding, and
        # those were sampled from the displaced distribution (the noise reached the server).
        other = data[f"{METHOD}/rollout_logprob_gap/other_tokens"]
        assert other < 1e-4
        assert data[f"{METHOD}/rollout_logprob_gap/noisy_first_token"] > 100 * other


def test_vllm_trains_resumes_and_passes_the_exact_check_without_the_noisy_first_tokens(tmp_path, vllm_required):
    from verl_ext.cpu.logprob_check import check_rollout_logprobs, weights_by_step

    run_dir = tmp_path / "run"
    out = _launch(tmp_path, run_dir, 1500, ROLLOUT="vllm", STEPS="2", RESUME_STEPS="1")
    assert f"GPU launcher run_scripts/qwen25vl7b_{METHOD}.sh" in out and "[cpu] PASSED" in out
    summary = json.loads([line for line in out.splitlines() if "[cpu] summary " in line][-1].split("summary ", 1)[1])
    check = summary["logprob_check"]
    assert check["steps"] == [1, 2, 3] and check["rollout_gap_mean"] < 1e-5 and check["actor_gap_mean"] < 1e-5
    _check_metrics(_metrics(run_dir), [1, 2, 3])
    # rollout.seed: the GPU launcher leaves verl's default, 42.
    assert _check_flags(run_dir, [1, 2, 3], 42) == 3 * 2 * N // 2
    model = str(tmp_path / "tiny_qwen2_vl")
    gaps = check_rollout_logprobs(
        str(run_dir / "probe"), weights_by_step(model, [str(run_dir / "checkpoints")]), model, 1.0
    )
    for gap in gaps:
        assert gap.noisy_first_tokens == 2 * N // 2
        # The noisy first tokens left out were sampled from the displaced distribution: far beyond rounding.
        assert gap.noisy_first_gap_mean > 100 * gap.rollout_mean
