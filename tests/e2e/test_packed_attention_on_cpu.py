"""Packed sequences on a CPU (``use_remove_padding=true``) through verl's own patched Qwen2.5-VL attention, with the
named CPU stand-in for flash-attn (``verl_ext/cpu/varlen_attention.py``).

The stand-in against a slow reference (a softmax written out per query); then verl's engine steps on the tiny
Qwen2.5-VL: packed through ``qwen2_vl_attn_forward`` against padded through the model's own attention (what every CPU
run did before), for rows with images, text-only rows, PGPO's blind view and a micro-batch without pixels; the
stand-in is installed only in CPU mode and refuses CUDA tensors.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_ext.cpu import varlen_attention
from verl_ext.cpu.varlen_attention import flash_attention_forward
from verl_ext.cpu.varlen_attention import varlen_attention as stand_in

ROOT = Path(__file__).resolve().parents[2]


def slow_attention(q, k, v, bounds, causal, window, scale):
    """Per sequence, per head, per query: the softmax over the keys the kernel's mask allows, written out."""
    out = torch.zeros_like(q, dtype=torch.float64)
    heads, heads_k = q.shape[1], k.shape[1]
    for start, end in zip(bounds, bounds[1:], strict=False):
        length = end - start
        for h in range(heads):
            hk = h // (heads // heads_k)
            for i in range(length):
                keys = [
                    j
                    for j in range(length)
                    if (not causal or j <= i)
                    and (window[0] < 0 or j >= i - window[0])
                    and (window[1] < 0 or causal or j <= i + window[1])
                ]
                logits = [float(q[start + i, h].double() @ k[start + j, hk].double()) * scale for j in keys]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                for w, j in zip(weights, keys, strict=True):
                    out[start + i, h] += w / total * v[start + j, hk].double()
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [(-1, -1), (2, 2)])
def test_the_stand_in_is_the_attention_of_each_sequence_alone(causal, window):
    generator = torch.Generator().manual_seed(0)
    bounds = [0, 3, 4, 9, 15]
    q = torch.randn(15, 4, 8, generator=generator)
    k = torch.randn(15, 2, 8, generator=generator)  # grouped queries: 2 query heads per key/value head
    v = torch.randn(15, 2, 8, generator=generator)
    cu = torch.tensor(bounds, dtype=torch.int32)
    got = stand_in(q, k, v, cu, cu, 6, 6, softmax_scale=0.3, causal=causal, window_size=window)
    expected = slow_attention(q, k, v, bounds, causal, window, 0.3)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-6)
    assert got.dtype == q.dtype


def test_the_padded_form_leaves_padding_at_zero_and_equals_the_packed_form():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 2, 4, generator=generator) for _ in range(3))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # left padding, as verl pads prompts
    out = flash_attention_forward(q, k, v, mask, 5, is_causal=True)
    assert torch.equal(out[0, :2], torch.zeros(2, 2, 4))
    keep = mask.bool()
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    packed = stand_in(q[keep], k[keep], v[keep], cu, cu, causal=True)
    torch.testing.assert_close(out[keep], packed)


def test_cuda_tensors_are_refused():
    class OnCuda(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    q = torch.Tensor._make_subclass(OnCuda, torch.zeros(2, 1, 4))
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="CUDA tensors.*flash-attn"):
        stand_in(q, q, q, cu, cu, causal=True)


@pytest.mark.gpu_stack
def test_installed_in_cpu_mode_only():
    script = (
        "import verl\nfrom verl.models.transformers import qwen2_vl\n"
        "print(getattr(qwen2_vl, 'flash_attn_varlen_func', None).__module__ "
        "if hasattr(qwen2_vl, 'flash_attn_varlen_func') else 'absent')"
    )
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    plain = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=ROOT)
    cpu = subprocess.run(
        [sys.executable, "-c", script], env={**env, "VERL_PLATFORM": "cpu"}, capture_output=True, text=True, cwd=ROOT
    )
    assert plain.stdout.strip().splitlines()[-1] == "absent", plain.stderr[-2000:]
    assert cpu.stdout.strip().splitlines()[-1] == "verl_ext.cpu.varlen_attention", cpu.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------
# verl's engine steps on the tiny Qwen2.5-VL: packed (verl's patched attention) against padded
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def verls_packed_attention(monkeypatch):
    """verl's monkey patch with ``use_remove_padding=True`` and the stand-in, both undone after the test (verl patches
    the model classes for the whole process); counts the stand-in's calls."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf25
    from transformers.models.qwen2_vl import modeling_qwen2_vl as hf2
    from verl.models.transformers import qwen2_vl
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    for module, names in (
        (hf25, ("Qwen2_5_VLModel", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLAttention")),
        (hf2, ("Qwen2VLModel", "Qwen2VLForConditionalGeneration", "Qwen2VLAttention")),
    ):
        for name in names:
            cls = getattr(module, name)
            monkeypatch.setattr(cls, "forward", cls.forward)
    for name in (
        "flash_attn_varlen_func",
        "_flash_attention_forward",
        "fa_peft_integration_check",
        "_flash_supports_window_size",
        "_flash_supports_deterministic",
        "_flash_use_top_left_mask",
    ):
        monkeypatch.setattr(qwen2_vl, name, getattr(qwen2_vl, name, None), raising=False)
    varlen_attention.install()
    calls = {"varlen": 0, "padded": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(qwen2_vl, "flash_attn_varlen_func", counted("varlen", qwen2_vl.flash_attn_varlen_func))
    monkeypatch.setattr(qwen2_vl, "_flash_attention_forward", counted("padded", qwen2_vl._flash_attention_forward))

    def patch(model, use_remove_padding: bool):
        apply_monkey_patch(model, use_remove_padding=use_remove_padding)

    return patch, calls


@pytest.mark.gpu_stack
@pytest.mark.parametrize("micro_batch_size", [2, 4, 1])
def test_packed_log_probs_are_the_padded_ones(verls_packed_attention, micro_batch_size):
    from verl.workers.utils.padding import response_from_nested

    from verl_ext.pgpo.tiny import Trajectory, engine_infer, tiny_qwen25_vl, verl_batch

    patch, calls = verls_packed_attention
    model = tiny_qwen25_vl()
    trajectories = [
        Trajectory([5, 6, None, 7, 8], [10, 11, 12, 13], [(1, 4, 4)]),  # one image
        Trajectory([5, 9, 8], [20, 21, 22]),  # text only
        Trajectory([3, None, 4, None, 9], [30, 31, 32, 33, 34], [(1, 4, 4), (1, 2, 4)]),  # two images
        Trajectory([7, 7, 3, 2], [1, 4]),  # text only: with micro-batches of 2, a micro-batch without pixels
    ]
    data, _ = verl_batch(model, trajectories)
    patch(model, use_remove_padding=False)
    padded = engine_infer(model, use_remove_padding=False, micro_batch_size=4)(data.copy())["log_probs"]
    assert calls == {"varlen": 0, "padded": 0}  # the padded run is the model's own attention
    patch(model, use_remove_padding=True)
    packed = engine_infer(model, use_remove_padding=True, micro_batch_size=micro_batch_size)(data.copy())["log_probs"]
    padded, packed = (response_from_nested(x, data["response_mask"]) for x in (padded, packed))
    for i in range(len(trajectories)):
        torch.testing.assert_close(packed[i], padded[i], rtol=1e-5, atol=1e-5)
    layers = model.config.text_config.num_hidden_layers
    micro_batches = math.ceil(len(trajectories) / micro_batch_size)
    if micro_batch_size == 1:  # one sequence a micro-batch: its positions never restart, transformers' path
        assert calls == {"varlen": 0, "padded": layers * micro_batches}
    else:  # packed sequences: flash_attn_varlen_func, at every layer of every micro-batch
        assert calls == {"varlen": layers * micro_batches, "padded": 0}


@pytest.mark.gpu_stack
def test_pgpos_blind_view_packed_is_the_padded_one(verls_packed_attention):
    from verl.utils import tensordict_utils as tu

    from verl_ext.pgpo import blind_log_prob_pass
    from verl_ext.pgpo.blind_view import VISUAL_TOKEN_IDS_KEY, visual_token_ids_from_config
    from verl_ext.pgpo.tiny import IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, Trajectory, engine_infer, tiny_qwen25_vl, verl_batch

    patch, calls = verls_packed_attention
    model = tiny_qwen25_vl()
    trajectories = [
        Trajectory([5, 6, None, 7, 8], [10, 11, 12, 13], [(1, 4, 4)]),
        Trajectory([5, 9, 8], [20, 21, 22]),
        Trajectory([None, 5], [40, 41], [(1, 2, 2)]),
        Trajectory([7, 7, 3, 2], [1, 4]),
    ]
    data, _ = verl_batch(model, trajectories)
    tu.assign_non_tensor_data(data, VISUAL_TOKEN_IDS_KEY, [IMAGE_TOKEN_ID, VIDEO_TOKEN_ID])
    ids = visual_token_ids_from_config(model.config)
    patch(model, use_remove_padding=False)
    padded = blind_log_prob_pass(data.copy(), engine_infer(model, use_remove_padding=False, micro_batch_size=4), ids)
    patch(model, use_remove_padding=True)
    packed = blind_log_prob_pass(data.copy(), engine_infer(model, use_remove_padding=True, micro_batch_size=2), ids)
    assert calls["varlen"] > 0
    for i in range(len(trajectories)):
        torch.testing.assert_close(packed["blind_log_probs"][i], padded["blind_log_probs"][i], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# A training run with packing logs the padded run's values
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.gpu_stack
def test_a_packed_training_run_logs_the_padded_runs_values(tiny_diva_world1):
    """``USE_REMOVE_PADDING=1 bash run_scripts/tiny_cpu.sh``: the shared world-size-1 DIVA run's settings and seed with
    verl's packed sequences. Tokens, rewards, advantages and difficulties exactly, the actor's values (loss, gradient
    norm, log-probs) to float tolerance (:mod:`verl_ext.cluster.world_size`, the comparison of two world sizes: packing
    changes the order of float sums as a world size does), validation and the resumed step included."""
    from tiny_launch import DIVA_ALL_STEPS, job_log, launch_diva_world1

    from verl_ext.cluster.world_size import compare_runs

    run_dir = tiny_diva_world1["workdir"] / "packed"
    launch_diva_world1(tiny_diva_world1["workdir"], run_dir, USE_REMOVE_PADDING="1")
    assert "actor_rollout_ref.model.use_remove_padding=true" in (run_dir / "overrides.txt").read_text()
    # verl's packed path: its patched attention (Qwen2_5_VLForConditionalGeneration, the default tiny model)
    assert re.search(r"Monkey patch Qwen2(_5)?_?VLForConditionalGeneration attention layer", job_log(run_dir))
    differences, counts = compare_runs(str(run_dir), str(tiny_diva_world1["dir"]), 1, 1, exact_first_step=False)
    assert differences == []
    assert counts["steps"] == [0, *DIVA_ALL_STEPS]
    assert counts["values"] > 400 and counts["response_fields"] > 0
