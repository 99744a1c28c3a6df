"""NC-GRPO's trainer-side math: the flags' check and the per-half statistics (the advantage is verl's GRPO over
the whole group, both halves pooled)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from verl_ext.nc_grpo.noise import noisy_count


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


def rollout_gaps(
    rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor, response_mask: torch.Tensor, flags: Any
) -> dict[str, float]:
    """Mean ``|rollout - actor|`` log-prob gap of the noisy responses' first tokens (``noisy_first_token``: sampled
    from the displaced distribution, scored by the unperturbed actor) and of every other response token
    (``other_tokens``: the same distribution on both sides, so weight-sync and rounding error only)."""
    gap = (rollout_log_probs.double() - old_log_probs.double()).abs()
    mask = response_mask.bool().clone()
    first = torch.zeros_like(mask)
    flagged = torch.as_tensor(np.asarray(flags, dtype=bool))
    has_token = mask[:, 0] if mask.shape[1] else torch.zeros(len(mask), dtype=torch.bool)
    first[:, 0] = flagged & has_token
    mask &= ~first
    out = {}
    if bool(first.any()):
        out["noisy_first_token"] = float(gap[first].mean())
    if bool(mask.any()):
        out["other_tokens"] = float(gap[mask].mean())
    return out
