"""Did the rollout sample from the weights the actor trained? An exact check for verl's vLLM rollout on the CPU.

verl bans the vision placeholders (``<|image_pad|>``, ``<|video_pad|>``) and the out-of-vocabulary tail inside
vLLM's sampler (``monkey_patch_compute_logits`` in ``verl/workers/rollout/vllm_rollout/utils.py``, on GPUs too), so
vLLM's log-probs are normalised over the *allowed* tokens, while the actor's ``old_log_probs`` are normalised over
the whole vocabulary: with a random tiny model the two differ by ~7.6e-3 per token even with perfectly synced
weights, and verl's ``rollout_corr/log_ppl_abs_diff`` cannot tell a missed sync from that.

This check removes the difference instead of widening a tolerance. For each step ``t`` it loads, with
transformers, the weights the rollout of step ``t`` should have used (the checkpoint of step ``t - 1``; the initial
model for step 1), runs a full forward pass over each recorded sequence (prompt, image, response; positions
computed by transformers' own M-RoPE) and compares

* the actor's ``old_log_probs`` with ``log_softmax(logits / T)`` over the whole vocabulary (the recomputation is
  the actor's), and
* the rollout's log-probs with ``log_softmax`` over the tokens verl's sampler may pick (the same rule verl applies:
  ids below ``len(tokenizer)`` that are not ``get_vision_placeholder_token_ids(processor)``).

Both gaps are float32 rounding (~1e-7 per token) when the weights are synced; a rollout one update behind is
orders of magnitude off (``tests/e2e/test_tiny_cpu_vllm_on_cpu.py`` checks the same run against stale weights).

NC-GRPO's noisy responses (``extra_fields["nc_grpo_noisy"]``) were sampled from a displaced model: every token
under ``target=layer_input`` (they all attend to the displaced keys and values), the first under ``final_hidden``.
Given the method's knobs (``noise``), the check recomputes each noisy response with its own displacement (its noise
seed from ``extra_fields["nc_grpo_noise_seed"]``, the same hook as the ``hf_cpu`` server:
:func:`verl_ext.nc_grpo.hf_hook.prefill_noise`) and holds the rollout's log-probs of *every* token of it to that
recomputation, as exactly as a clean response's to the clean one. The actor's ``old_log_probs`` are the clean
policy's on every token of every response (the objective is untouched) and are compared with the clean
recomputation. The displaced tokens' gap to the clean policy is reported apart (``displaced_tokens``,
``displaced_gap_mean``): how far off-policy the noisy responses are, and that the noise reached the server.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Mean and largest per-token gap accepted, for both comparisons (float32 on both sides: ~1e-7 and ~1e-6).
MEAN_TOLERANCE = 1e-5
MAX_TOLERANCE = 1e-3


class LogprobCheckError(RuntimeError):
    """The rollout's (or the actor's) log-probs are not those of the weights of their step."""


@dataclass(frozen=True)
class StepGap:
    step: int
    weights: str
    tokens: int
    rollout_mean: float
    rollout_max: float
    actor_mean: float
    actor_max: float
    displaced_tokens: int = 0
    displaced_gap_mean: float = 0.0

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def allowed_token_mask(vocab_size: int, tokenizer, processor) -> torch.Tensor:
    """(V,) bool: True for the tokens verl's vLLM sampler may pick (its own rule, see the module docstring)."""
    from verl.workers.rollout.utils import get_vision_placeholder_token_ids

    allowed = torch.zeros(vocab_size, dtype=torch.bool)
    allowed[: min(len(tokenizer), vocab_size)] = True
    banned = get_vision_placeholder_token_ids(processor)
    if banned:
        allowed[torch.tensor(banned, dtype=torch.long)] = False
    return allowed


def weights_by_step(initial_model: str, checkpoint_dirs: list[str]) -> Callable[[int], str]:
    """``step -> HF weights folder`` the rollout of ``step`` sampled from: the initial model for step 1, else the
    ``global_step_<step - 1>/actor/huggingface`` found in one of ``checkpoint_dirs`` (needs ``hf_model`` in
    ``actor.checkpoint.save_contents`` and a save every step)."""

    def folder(step: int) -> str:
        if step <= 1:
            return initial_model
        for root in checkpoint_dirs:
            path = os.path.join(root, f"global_step_{step - 1}", "actor", "huggingface")
            if os.path.exists(os.path.join(path, "config.json")):
                return path
        raise LogprobCheckError(
            f"step {step}: no saved weights of step {step - 1} (global_step_{step - 1}/actor/huggingface) in "
            f"{checkpoint_dirs}; the check needs trainer.save_freq=1 and hf_model in actor.checkpoint.save_contents"
        )

    return folder


def probed_steps(probe_dir: str) -> list[int]:
    found = glob.glob(os.path.join(probe_dir, "actor_inputs_step*.pt"))
    return sorted(int(re.search(r"step(\d+)\.pt$", p).group(1)) for p in found)


def _load(folder: str):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


def _response_logits(
    model, image_token_id: int, input_ids: torch.Tensor, mm: dict, response_len: int, noise: dict | None = None
):
    """(R, V) logits predicting the ``response_len`` last tokens of ``input_ids`` (one sequence, no padding), the
    prompt displaced by ``noise`` (an NC-GRPO entry; ``None``: the clean model)."""
    from verl_ext.nc_grpo.hf_hook import prefill_noise

    ids = input_ids[None].long()
    kwargs = {}
    if mm and "pixel_values" in mm:
        # mm_token_type_ids: without it transformers' Qwen2-VL falls back to 1-D positions for the image.
        kwargs = {
            "pixel_values": mm["pixel_values"],
            "image_grid_thw": mm["image_grid_thw"],
            "mm_token_type_ids": (ids == image_token_id).to(torch.int32),
        }
    with prefill_noise(model, noise, ids.shape[1] - response_len, total_len=ids.shape[1]):
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).logits[0].float()
    start = ids.shape[1] - response_len
    return logits[start - 1 : ids.shape[1] - 1]


@torch.no_grad()
def recomputed_logprobs(
    record: dict, weights: str, processor, tokenizer, temperature: float, noises: dict[int, dict] | None = None
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``sample index -> (full, allowed)``: the log-probs of each recorded response token under the HF weights in
    ``weights``, normalised over the whole vocabulary (the actor's) and over the tokens verl's vLLM sampler allows
    (the rollout's); padding rows and empty responses are left out. With ``noises`` (``sample index -> NC-GRPO noise
    entry``), only those samples, each recomputed with its prompt displaced as the rollout server displaced it."""
    model = _load(weights)
    allowed = allowed_token_mask(model.config.get_text_config().vocab_size, tokenizer, processor)
    image_token_id = model.config.image_token_id
    out = {}
    for i, ids in enumerate(record["input_ids"]):
        if record["is_padding"][i] or (noises is not None and i not in noises):
            continue
        response = record["responses"][i]
        length = int(record["response_mask"][i].sum())
        if length == 0:
            continue
        noise = noises[i] if noises is not None else None
        logits = _response_logits(model, image_token_id, ids, record["multi_modal_inputs"][i], len(response), noise)
        logits = logits[:length] / temperature
        tokens = response[:length].long()[:, None]
        full = torch.log_softmax(logits, dim=-1).gather(-1, tokens).squeeze(-1)
        allowed_lp = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).gather(-1, tokens)
        out[i] = (full, allowed_lp.squeeze(-1))
    return out


def noise_entries(record: dict, noise: dict | None) -> dict[int, dict]:
    """``sample index -> noise entry`` of the record's NC-GRPO noisy samples (``noise``: the method's knobs
    ``{"scale", "target", "layer"}``; the seed is each sample's own). ``LogprobCheckError`` when the record holds
    noisy samples and ``noise`` is ``None``."""
    from verl_ext.nc_grpo.noise import FLAG_FIELD, SEED_FIELD

    extra_fields = record.get("extra_fields") or [{}] * len(record["input_ids"])
    out = {}
    for i, fields in enumerate(extra_fields):
        if isinstance(fields, dict) and fields.get(FLAG_FIELD) and not record["is_padding"][i]:
            if noise is None:
                raise LogprobCheckError(
                    f"step {record['step']}: sample {i} is NC-GRPO-noisy; the check needs the method's noise knobs"
                )
            out[i] = {"seed": int(fields[SEED_FIELD]), **noise}
    return out


def step_gap(
    record: dict, weights: str, processor, tokenizer, temperature: float, noise: dict | None = None
) -> StepGap:
    """Both gaps of one probed step (see the module docstring) against the HF weights in ``weights``; ``noise``:
    NC-GRPO's knobs (:func:`noise_entries`)."""
    from verl_ext.algos.noise_contrastive_grpo import displaced_tokens

    noises = noise_entries(record, noise)
    clean = recomputed_logprobs(record, weights, processor, tokenizer, temperature)
    displaced = recomputed_logprobs(record, weights, processor, tokenizer, temperature, noises) if noises else {}
    rollout_gaps, actor_gaps, off_policy = [], [], []
    for i, (full, allowed_lp) in clean.items():
        length = len(full)
        served = record["rollout_log_probs"][i, :length].float()
        # A noisy sample is held to its own displaced recomputation, a clean one to the clean model.
        rollout_gaps.append((served - displaced[i][1] if i in displaced else served - allowed_lp).abs())
        actor_gaps.append((record["old_log_probs"][i, :length].float() - full).abs())
        if i in displaced:
            moved = displaced_tokens(torch.ones(1, length), [True], noises[i]["target"])[0]
            off_policy.append((served - allowed_lp).abs()[moved])
    if not rollout_gaps:
        raise LogprobCheckError(f"step {record['step']}: no response tokens recorded")
    rollout, actor = torch.cat(rollout_gaps), torch.cat(actor_gaps)
    moved = torch.cat(off_policy) if off_policy else torch.zeros(0)
    return StepGap(
        step=int(record["step"]),
        weights=weights,
        tokens=int(rollout.numel()),
        rollout_mean=float(rollout.mean()),
        rollout_max=float(rollout.max()),
        actor_mean=float(actor.mean()),
        actor_max=float(actor.max()),
        displaced_tokens=int(moved.numel()),
        displaced_gap_mean=float(moved.mean()) if moved.numel() else 0.0,
    )


def check_rollout_logprobs(
    probe_dir: str,
    weights_for_step: Callable[[int], str],
    processor_path: str,
    temperature: float,
    steps: list[int] | None = None,
    noise: dict | None = None,
) -> list[StepGap]:
    """Check every probed step (or ``steps``); raises :class:`LogprobCheckError` naming the first that fails.
    ``noise``: NC-GRPO's knobs ``{"scale", "target", "layer"}`` for a run with noisy samples."""
    from transformers import AutoProcessor, AutoTokenizer

    processor = AutoProcessor.from_pretrained(processor_path)
    tokenizer = AutoTokenizer.from_pretrained(processor_path)
    gaps = []
    for step in steps or probed_steps(probe_dir):
        record = torch.load(os.path.join(probe_dir, f"actor_inputs_step{step}.pt"), weights_only=False)
        gap = step_gap(record, weights_for_step(step), processor, tokenizer, temperature, noise)
        if gap.actor_mean > MEAN_TOLERANCE or gap.actor_max > MAX_TOLERANCE:
            raise LogprobCheckError(
                f"step {step}: the actor's old log-probs differ from a transformers forward of {gap.weights} by "
                f"{gap.actor_mean:.3g} per token (max {gap.actor_max:.3g}): the check does not recompute the actor"
            )
        if gap.rollout_mean > MEAN_TOLERANCE or gap.rollout_max > MAX_TOLERANCE:
            raise LogprobCheckError(
                f"step {step}: the rollout's log-probs differ from the distribution of {gap.weights} (NC-GRPO's noisy "
                f"samples: displaced as their seed says) over the tokens verl's sampler allows by "
                f"{gap.rollout_mean:.3g} per token (max {gap.rollout_max:.3g}; tolerance "
                f"{MEAN_TOLERANCE:g} / {MAX_TOLERANCE:g}): the rollout server did not get the trained weights"
            )
        gaps.append(gap)
    return gaps
