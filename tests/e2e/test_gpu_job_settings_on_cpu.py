"""The GPU job's gradient checkpointing and mixed precision on the CPU routes.

* Gradient checkpointing is on in every CPU run, as in the GPU job (the recipe's ``enable_gradient_checkpointing``):
  verl turns it on with ``gradient_checkpointing_enable(use_reentrant=False)``, whose recomputed forward gives the
  same loss and gradients bit for bit on the tiny models (fp32 and bf16 autocast), so recorded runs repeat with it.
* ``PRECISION=bf16`` leaves verl's FSDP mixed precision at its default, the GPU job's (bf16 parameters in compute,
  fp32 gradient reduction and buffers); the default ``fp32`` sets fp32 throughout. The bf16 run itself is
  ``tests/e2e/test_every_method_on_cpu.py`` (``gpu_stack``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from verl_ext.cpu.tiny_model import ARCHS, build_tiny_vlm

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipe" / "diva_grpo" / "config"


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("diva_grpo", overrides=overrides)


PATHS = {"model": "/m", "train": "/t.parquet", "val": "/v.parquet"}


@pytest.mark.parametrize("method", ["diva", "pgpo"])
def test_cpu_runs_keep_the_recipes_gradient_checkpointing(method, tmp_path):
    from verl_ext.cpu.overrides import cpu_overrides

    cfg = _compose(cpu_overrides(PATHS, str(tmp_path), method=method))
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True


def test_precision_bf16_is_verls_default_mixed_precision_and_fp32_sets_fp32(tmp_path):
    from verl_ext.cpu.overrides import accelerator_free_overrides, cpu_overrides

    fp32 = _compose(cpu_overrides(PATHS, str(tmp_path)))
    for role in ("actor", "ref"):
        assert dict(fp32.actor_rollout_ref[role].fsdp_config.mixed_precision) == {
            "param_dtype": "fp32",
            "reduce_dtype": "fp32",
            "buffer_dtype": "fp32",
        }
    bf16 = _compose(cpu_overrides(PATHS, str(tmp_path), precision="bf16"))
    gpu = _compose([])  # the recipe as the GPU launchers compose it
    for role in ("actor", "ref"):
        assert bf16.actor_rollout_ref[role].fsdp_config.get("mixed_precision") is None
        assert gpu.actor_rollout_ref[role].fsdp_config.get("mixed_precision") is None
    with pytest.raises(ValueError, match="PRECISION='fp16'"):
        accelerator_free_overrides(precision="fp16")


def test_verls_mixed_precision_default_is_bf16_compute_with_fp32_reduce():
    """What ``mixed_precision: null`` means in verl 0.9.1's FSDP engine (read from its source, not assumed)."""
    import inspect

    from verl.workers.engine.fsdp import transformer_impl

    source = inspect.getsource(transformer_impl.FSDPEngine._build_fsdp_module)
    assert "param_dtype = torch.bfloat16" in source and "reduce_dtype = torch.float32" in source
    assert "MixedPrecisionPolicy(" in source and "reduce_dtype=reduce_dtype" in source


@pytest.mark.parametrize("arch", ARCHS)
def test_gradient_checkpointing_gives_the_same_gradients_bit_for_bit(arch, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = build_tiny_vlm(str(tmp_path), arch=arch)
    processor = AutoProcessor.from_pretrained(path)
    image = Image.fromarray((np.random.default_rng(0).random((84, 84, 3)) * 255).astype("uint8"))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which colour?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True) + "red, then blue"
    inputs = processor(text=[text], images=[image], return_tensors="pt")

    def gradients(checkpointing: bool, dtype):
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        model.train()
        if checkpointing:  # as verl's FSDP engine turns it on
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = model(**inputs, use_cache=False).logits.float().log_softmax(-1).mean()
        loss.backward()
        assert model.is_gradient_checkpointing == checkpointing
        return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    for dtype in (None, torch.bfloat16):
        loss, grads = gradients(False, dtype)
        loss_ckpt, grads_ckpt = gradients(True, dtype)
        assert torch.equal(loss, loss_ckpt)
        assert grads.keys() == grads_ckpt.keys() and len(grads) > 50
        assert all(torch.equal(grads[name], grads_ckpt[name]) for name in grads), dtype
