"""The patch qwen2_vl_dummy_vision_output (verl_ext/no_pixels_patch.py): verl's Qwen2-VL forward fails under
transformers 5 on every micro-batch without pixels; the plugin applies the patch in every process, so each actor and
reference forward (log-probs) and each training forward gets through such a micro-batch.

The micro-batch is built as a short batch makes one: image rows first, then text-only rows, cut into micro-batches of
two, so the second micro-batch has no pixels. It runs through verl's own steps on the tiny Qwen2-VL of the CPU runs
(its real tokenizer and processor): verl's model patch (``apply_monkey_patch``, as the FSDP engine applies it), the
engine's micro-batching and input packing (``prepare_micro_batches``, ``FSDPEngineWithLMHead.prepare_model_inputs``
/ ``prepare_model_outputs``). The actor's log-prob pass and the reference's are this same engine code;
``tests/pgpo/test_blind_worker_on_cpu.py`` runs such a micro-batch through verl's actor worker process itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the plugin, which applies the patch)
from agent_loop_rows import trajectory
from tensordict import NonTensorStack, TensorDict
from verl.models.transformers import qwen2_vl
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import response_from_nested

from verl_ext import no_pixels_patch

# The main job's stack: CI runs these in the GPU stack's environment (pytest -m gpu_stack).
pytestmark = pytest.mark.gpu_stack

MICRO_BATCH = 2
# (image, prompt, response): two image rows, then two text-only rows (the second micro-batch has no pixels).
ROWS = [
    (True, "what is 2+2?", "4, it is"),
    (True, "count the dots", "three"),
    (False, "say hi", "hi there"),
    (False, "no image here, and a longer prompt", "ok"),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl

    folder = build_tiny_qwen2_vl(str(tmp_path_factory.mktemp("no_pixels") / "tiny_qwen2_vl"))
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    return model, AutoProcessor.from_pretrained(folder)


def batch(rows: list[dict]) -> TensorDict:
    """The rows in verl's no-padding layout (jagged nested tensors, ``(B, 4, j)`` positions)."""

    def nested(tensors):
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)

    positions = [r["position_ids"] for r in rows]
    offsets = torch.tensor([0] + [p.shape[-1] for p in positions]).cumsum(0)
    responses = [r["responses"] for r in rows]
    return TensorDict(
        {
            "input_ids": nested(r["input_ids"] for r in rows),
            "position_ids": torch.nested.nested_tensor_from_jagged(torch.cat(positions, -1), offsets, jagged_dim=2),
            "attention_mask": nested(torch.ones_like(r["input_ids"]) for r in rows),
            "prompts": nested(r["input_ids"][: -len(r["responses"])] for r in rows),
            "responses": nested(responses),
            "response_mask": nested(torch.ones_like(x) for x in responses),
            "loss_mask": nested(torch.ones_like(x) for x in responses),
            "multi_modal_inputs": NonTensorStack(*[r["multi_modal_inputs"] for r in rows]),
        },
        batch_size=[len(rows)],
    )


def by_hand(model, r: dict) -> torch.Tensor:
    """Response log-probs of one row from the model's own (unpatched) forward."""
    ids = r["input_ids"]
    with torch.no_grad():
        logits = model(
            input_ids=ids.unsqueeze(0),
            position_ids=r["position_ids"].unsqueeze(1),
            use_cache=False,
            **r["multi_modal_inputs"],
        ).logits[0]
    log_probs = torch.log_softmax(logits.float(), -1).gather(-1, torch.roll(ids, -1).unsqueeze(-1)).squeeze(-1)
    return log_probs[-len(r["responses"]) - 1 : -1]


def micro_batches(data: TensorDict, use_remove_padding: bool):
    """verl's engine steps: (micro-batch, model inputs, output args), micro-batches of MICRO_BATCH in order."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.engine.utils import prepare_micro_batches

    engine = FSDPEngineWithLMHead.__new__(FSDPEngineWithLMHead)  # its model-facing steps need only these two
    engine.pad_to_length = False
    engine.use_ulysses_sp = False
    tu.assign_non_tensor(
        data,
        use_remove_padding=use_remove_padding,
        use_dynamic_bsz=False,
        use_fused_kernels=False,
        temperature=1.0,
        micro_batch_size_per_gpu=MICRO_BATCH,
    )
    parts, _ = prepare_micro_batches(data, dp_group=None, same_micro_num_in_dp=False)
    for part in parts:
        inputs, output_args = engine.prepare_model_inputs(part)
        yield engine, part, inputs, output_args


@pytest.fixture
def verl_patched(tiny, monkeypatch):
    """The model with verl's monkey patch (what verl's FSDP engine applies), undone afterwards."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf25
    from transformers.models.qwen2_vl import modeling_qwen2_vl as hf2
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    model, processor = tiny
    rng = np.random.default_rng(0)
    rows = [trajectory(processor, model, rng, *spec) for spec in ROWS]
    expected = [by_hand(model, r) for r in rows]  # before verl patches the classes
    for module in (hf2, hf25):
        for name in ("Model", "ForConditionalGeneration", "Attention"):
            cls = getattr(module, ("Qwen2VL" if module is hf2 else "Qwen2_5_VL") + name)
            monkeypatch.setattr(cls, "forward", cls.forward)
    monkeypatch.setattr(qwen2_vl, "_get_input_embeds", qwen2_vl._get_input_embeds)
    # Without remove-padding: verl's padding-free attention needs flash-attention (CUDA), and the CPU runs set
    # use_remove_padding=false. The embedding step this patch changes is the same with either.
    apply_monkey_patch(model, use_remove_padding=False)
    return model, rows, expected


def test_the_plugin_applied_the_patch_in_this_process():
    assert qwen2_vl._get_input_embeds._verl_ext_patch == no_pixels_patch.NAME
    verls = no_pixels_patch.VERLS_FUNCTION
    assert verls.__module__ == "verl.models.transformers.qwen2_vl" and not hasattr(verls, "_verl_ext_patch")
    assert no_pixels_patch.apply() and qwen2_vl._get_input_embeds._verl_ext_patch == no_pixels_patch.NAME


@pytest.mark.parametrize("use_remove_padding", [False, True], ids=["padded", "packed"])
def test_log_probs_of_a_micro_batch_without_pixels(verl_patched, use_remove_padding):
    """The log-prob pass (actor and reference): verl's own function fails on the micro-batch without pixels; with the
    patch every row's log-probs are the unpatched model's. ``packed``: the engine's padding-free inputs (one
    ``(1, tokens)`` row, as on GPUs), through transformers' attention."""
    model, rows, expected = verl_patched
    data = batch(rows)
    steps = list(micro_batches(data, use_remove_padding))
    assert [("pixel_values" in inputs) for _, _, inputs, _ in steps] == [True, False]  # the second has none

    patched = qwen2_vl._get_input_embeds
    qwen2_vl._get_input_embeds = no_pixels_patch.VERLS_FUNCTION  # verl's own function
    try:
        with pytest.raises(AttributeError, match="mean"), torch.no_grad():
            model(**steps[1][2], use_cache=False)
    finally:
        qwen2_vl._get_input_embeds = patched

    got = []
    for engine, part, inputs, output_args in steps:
        with torch.no_grad():
            out = engine.prepare_model_outputs(model(**inputs, use_cache=False), output_args, part, None)
        got += list(response_from_nested(out["log_probs"], part["response_mask"]).unbind(0))
    for i, (ours, reference) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(ours[: len(reference)], reference, rtol=1e-5, atol=1e-5, msg=f"row {i}")


def test_training_forward_of_a_micro_batch_without_pixels(verl_patched):
    """The actor's update: the micro-batch without pixels gives finite gradients, and the vision tower runs (its
    weights get a gradient, zero), as on every FSDP rank: the dummy forward keeps ranks in step."""
    model, rows, _ = verl_patched
    engine, part, inputs, output_args = list(micro_batches(batch(rows), False))[1]
    assert "pixel_values" not in inputs
    model.train()
    model.zero_grad(set_to_none=True)
    try:
        out = engine.prepare_model_outputs(model(**inputs, use_cache=False), output_args, part, None)
        loss = -response_from_nested(out["log_probs"], part["response_mask"]).sum()
        loss.backward()
    finally:
        model.eval()
    vision = [p.grad for p in model.model.visual.parameters()]
    text = [p.grad for name, p in model.named_parameters() if "visual" not in name]
    assert vision and all(g is not None and torch.equal(g, torch.zeros_like(g)) for g in vision)
    assert all(g is None or torch.isfinite(g).all() for g in text)
    assert any(g is not None and g.abs().sum() > 0 for g in text)
    model.zero_grad(set_to_none=True)
