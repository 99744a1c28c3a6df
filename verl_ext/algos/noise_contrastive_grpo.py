"""NC-GRPO's trainer-side math: the flags' check and the per-half statistics (the advantage is verl's GRPO over
the whole group, both halves pooled)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from verl_ext.nc_grpo.noise import FINAL_HIDDEN, LAYER_INPUT, TARGETS, noisy_count


def check_group_flags(flags: Any, index: Any, noisy_fraction: float) -> None:
    """Every prompt group (``index``) of ``n`` responses has exactly ``noisy_fraction * n`` flagged ones;
    ``ValueError`` otherwise, naming the first group that does not."""
    counts: dict = defaultdict(lambda: [0, 0])
    for flag, uid in zip(np.asarray(flags).tolist(), list(index), strict=True):
        counts[uid][0] += int(bool(flag))
        counts[uid][1] += 1
    for uid, (noisy, size) in counts.items():
        expected = noisy_count(size, noisy_fraction)
        if noisy != expected:
            raise ValueError(
                f"noise_contrastive_grpo: prompt {uid} has {noisy} noisy responses of {size}, expected {expected} "
                "(noisy_fraction * n): is the rollout's agent loop noise_contrastive_agent?"
            )


def half_metrics(scores: Any, flags: Any, accuracy: Any | None = None) -> dict[str, float]:
    """``noisy_fraction`` and, for each half with responses, its mean score and (when the reward gives ``acc``) its
    accuracy: ``{score,accuracy}/{noisy,clean}``."""
    scores = torch.as_tensor(np.asarray(scores, dtype=np.float64))
    flags = torch.as_tensor(np.asarray(flags, dtype=bool))
    out = {"noisy_fraction": float(flags.double().mean()) if flags.numel() else 0.0}
    acc = torch.as_tensor(np.asarray(accuracy, dtype=np.float64)) if accuracy is not None else None
    for name, part in (("noisy", flags), ("clean", ~flags)):
        if not bool(part.any()):
            continue
        out[f"score/{name}"] = float(scores[part].mean())
        if acc is not None:
            out[f"accuracy/{name}"] = float(acc[part].mean())
    return out


def displaced_tokens(response_mask: torch.Tensor, flags: Any, target: str) -> torch.Tensor:
    """``(R, T)`` bool: the response tokens sampled off the clean policy. ``final_hidden``: the first token of each
    noisy response (only its distribution was displaced); ``layer_input``: every token of each noisy response (all of
    them attend to the displaced keys and values)."""
    mask = response_mask.bool()
    flagged = torch.as_tensor(np.asarray(flags, dtype=bool)).reshape(-1, 1)
    if target == FINAL_HIDDEN:
        first = torch.zeros_like(mask)
        first[:, :1] = True
        return mask & first & flagged
    if target == LAYER_INPUT:
        return mask & flagged
    raise ValueError(f"noise_contrastive_grpo.target={target!r}: not one of {TARGETS}")


def rollout_gaps(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor, displaced: torch.Tensor
) -> dict[str, float]:
    """Mean ``|rollout - actor|`` log-prob gap of the ``displaced`` tokens (:func:`displaced_tokens`: sampled from
    the displaced policy, scored by the unperturbed actor: how far off-policy the noisy responses are;
    ``displaced_tokens``) and of every other response token (``other_tokens``: the same distribution on both sides,
    so weight-sync and rounding error only). A set without tokens is left out."""
    gap = (rollout_log_probs.double() - old_log_probs.double()).abs()
    mask = response_mask.bool()
    out = {}
    for name, part in (("displaced_tokens", mask & displaced), ("other_tokens", mask & ~displaced)):
        if bool(part.any()):
            out[name] = float(gap[part].mean())
    return out


def is_weight_metrics(weights: torch.Tensor, response_mask: torch.Tensor, displaced: torch.Tensor) -> dict[str, float]:
    """verl's rollout-correction weights (``rollout_is_weights``, ``(R, T)``: truncated ``pi_old / pi_rollout`` per
    token or per sequence, as the actor's loss multiplies them in) over the ``displaced`` tokens
    (:func:`displaced_tokens`) and over every other response token: ``{mean,min}/{displaced,other}_tokens``, and the
    share of the displaced tokens whose weight is under 0.5 (``below_half/displaced_tokens``). The other tokens were
    sampled by the clean policy itself, so their weights are 1 up to weight-sync rounding. A set without tokens is
    left out."""
    w = weights.double()
    mask = response_mask.bool()
    out = {}
    for name, part in (("displaced_tokens", mask & displaced), ("other_tokens", mask & ~displaced)):
        if bool(part.any()):
            out[f"mean/{name}"] = float(w[part].mean())
            out[f"min/{name}"] = float(w[part].min())
    if bool((mask & displaced).any()):
        out["below_half/displaced_tokens"] = float((w[mask & displaced] < 0.5).double().mean())
    return out
