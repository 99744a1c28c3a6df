"""The CPU mode's parts, fast: registration without side effects, the hf_cpu server's log-probs and weight sync,
and the overrides of a tiny run for every method (the real training run is test_tiny_cpu_training_on_cpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack

ROOT = Path(__file__).resolve().parents[2]


def _require_torchvision() -> None:
    """Qwen2-VL's processor (transformers 5) and verl's qwen_vl_utils import torchvision: say how to get it."""
    try:
        import torchvision  # noqa: F401
    except ImportError as err:
        pytest.fail(f"the CPU end-to-end tests need torchvision ({err}): pip install torch==2.14.1 torchvision==0.29.1")


CONFIG_DIR = ROOT / "recipe" / "diva_grpo" / "config"


def test_cpu_platform_and_patches_only_when_asked_for():
    """Without VERL_PLATFORM=cpu: names registered, never auto-detected, nothing patched. With it (a fresh
    process, as in a CPU job): verl's platform answers cpu/gloo and the process group default is single gloo."""
    import verl  # noqa: F401  (loads the plugin)
    from verl.plugin.platform import PlatformRegistry
    from verl.utils import distributed
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    assert os.environ.get("VERL_PLATFORM", "") != "cpu"
    cpu = PlatformRegistry.get("cpu")
    assert cpu is not None and not cpu().is_platform_available(use_smi_check=True)
    assert ("hf_cpu", "async") in _ROLLOUT_REGISTRY
    assert not getattr(distributed.initialize_global_process_group_ray, "_verl_ext_cpu", False)

    probe = (
        "import verl\n"
        "from verl.plugin.platform import get_platform\n"
        "from verl.utils import distributed\n"
        "from verl.workers.rollout.replica import get_rollout_replica_class\n"
        "p = get_platform()\n"
        "print(p.device_name, p.communication_backend_name(), p.ray_resource_name(), p.current_device(),"
        " distributed.initialize_global_process_group_ray._verl_ext_cpu,"
        " get_rollout_replica_class('hf_cpu').__name__)\n"
    )
    env = {**os.environ, "VERL_PLATFORM": "cpu"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-6:] == ["cpu", "gloo", "GPU", "cpu", "True", "HFCpuReplica"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    _require_torchvision()
    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl

    return build_tiny_qwen2_vl(str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def server(tiny_model):
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode

    from verl_ext.cpu.rollout import HFCpuServer

    rollout = RolloutConfig(name="hf_cpu", prompt_length=512, response_length=12, calculate_log_probs=True)
    model = HFModelConfig(path=tiny_model)
    # The class behind the Ray actor: the same code, in this process.
    return HFCpuServer.__ray_actor_class__(rollout, model, 0, RolloutMode.HYBRID)


def _prompt(server, text: str):
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    prompt = server.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = Image.new("RGB", (84, 56), (200, 40, 90))
    inputs = server.processor(text=[prompt], images=[image], return_tensors="pt")
    return inputs, image


def _actor_log_probs(server, inputs, new_ids: list[int]) -> torch.Tensor:
    """What the actor computes: one full forward over prompt + response with M-RoPE positions."""
    prompt_len = inputs["input_ids"].shape[1]
    ids = torch.cat([inputs["input_ids"], torch.tensor([new_ids])], dim=1)
    types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(new_ids), dtype=torch.int32)], dim=1)
    with torch.no_grad():
        logits = server.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=inputs["pixel_values"],
            image_grid_thw=inputs["image_grid_thw"],
            mm_token_type_ids=types,
        ).logits[0, prompt_len - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(new_ids)[:, None]).squeeze(-1)


def _generate(server, inputs, image, temperature=1.0):
    import asyncio

    params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True}
    prompt_ids = inputs["input_ids"][0].tolist()
    request = server.generate(prompt_ids=prompt_ids, sampling_params=params, request_id="t", image_data=[image])
    return asyncio.run(request)


def test_server_log_probs_are_the_actors_and_follow_a_weight_sync(server):
    inputs, image = _prompt(server, "What is the area of the rectangle?")
    torch.manual_seed(0)
    out = _generate(server, inputs, image)
    assert 0 < len(out.token_ids) <= 12 and len(out.log_probs) == len(out.token_ids)
    assert isinstance(out.extra_fields["global_steps"], int)
    vision = set(server.suppressed.tolist())
    assert vision and not vision & set(out.token_ids)  # a random model is kept off the vision special tokens
    served = torch.tensor(out.log_probs)
    assert torch.allclose(served, _actor_log_probs(server, inputs, out.token_ids), atol=1e-5)

    # A weight sync replaces every parameter: the served log-probs move to the new weights' values.
    state = {name: p.detach().clone() for name, p in server.model.named_parameters()}
    torch.manual_seed(1)
    state["lm_head.weight"] += 0.05 * torch.randn_like(state["lm_head.weight"])
    assert server.update_weights(state) == len(state)
    server.set_global_steps(3)
    after = _actor_log_probs(server, inputs, out.token_ids)
    assert (after - served).abs().max() > 1e-3
    torch.manual_seed(0)
    again = _generate(server, inputs, image)
    assert again.extra_fields["global_steps"] == 3
    n = min(len(again.token_ids), len(out.token_ids))
    if again.token_ids[:n] == out.token_ids[:n]:
        assert torch.allclose(torch.tensor(again.log_probs[:n]), after[:n], atol=1e-5)


def test_server_refuses_a_partial_or_foreign_weight_sync(server):
    state = {name: p.detach().clone() for name, p in server.model.named_parameters()}
    del state["lm_head.weight"]
    with pytest.raises(ValueError, match="sent no weights"):
        server.update_weights(state)
    with pytest.raises(ValueError, match="not in the served model"):
        server.update_weights({**state, "lm_head.weight": torch.zeros(1), "no.such.weight": torch.zeros(1)})


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("diva_grpo", overrides=overrides)


@pytest.mark.parametrize("method", ["diva", "grpo", "avspo"])
def test_tiny_run_overrides_compose_at_the_same_response_budget(method, tmp_path):
    from verl_ext.cpu.overrides import cpu_overrides

    paths = {"model": "/m", "train": "/t.parquet", "val": "/v.parquet"}
    cfg = _compose(cpu_overrides(paths, str(tmp_path), method=method, questions=2, rollout_n=4))
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.rollout.name == "hf_cpu"
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM == "cpu"
    questions = cfg.data.train_batch_size // (1 + cfg.diva.variants.variants_per_question)
    assert questions == 2
    assert cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n == 16  # responses per step, every method
    expected_mode = {"diva": "diva_grpo", "grpo": "toolkit", "avspo": "toolkit"}[method]
    assert cfg.trainer.v1.trainer_mode == expected_mode
    dataset = "DivaDataset" if method == "diva" else "PixelLimitedDataset"  # every method's images limited alike
    assert cfg.data.custom_cls.name == dataset


def test_unknown_method_is_refused_with_the_known_ones():
    from verl_ext.cpu.overrides import method_overrides

    with pytest.raises(ValueError, match="toolkit method"):
        method_overrides("no_such_method", 2, 4)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"METHOD": "foo"}, "error: METHOD=foo (--method): expected diva, grpo or a toolkit method: avspo, codapo"),
        ({"METHOD": "avspo", "WITHOUT": "rrb"}, "error: WITHOUT=rrb (--without): only DIVA-GRPO's additions"),
        ({"STEPS": "three"}, "error: STEPS=three: expected a whole number"),
    ],
)
def test_a_refused_setting_names_the_variable_and_leaves_no_run_folder(tmp_path, env, message):
    run_env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "METHOD", "RUN_DIR", "WITHOUT")}
    run_env.update(WORKDIR=str(tmp_path / "work"), **env)
    out = subprocess.run(
        ["bash", "run_scripts/tiny_cpu.sh"], cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "usage:" not in out.stderr
    assert list((tmp_path / "work").glob("run_*")) == []
