"""Did the noise branch the rollouts? NC-GRPO's health metrics, pure functions of token lists.

A noisy response branches when it differs from the response the same draw gives without the noise: the same prompt,
the same sampling seed, the same sampler, no displacement. The agent loop gets that clean response for each noisy
request from a companion request (:mod:`verl_ext.nc_grpo.agent_loop`: the noise entry removed, at most
``branch_probe_tokens`` tokens) and records :func:`first_difference` in the trajectory's ``extra_fields``;
:func:`branch_metrics` turns a step's records into rates, and :func:`branch_warning` into a console line when
(almost) nothing branched: NC-GRPO then trains as GRPO.

Why a companion request and not the logits in the hook: the sampled token is the sampler's draw (vLLM: an
exponential race on its per-request generator after top-k/top-p; transformers: ``torch.multinomial``), made after
the hook, so which token the clean logits would have given under the same draw is only known by drawing it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verl_ext.nc_grpo.noise import FINAL_HIDDEN

# extra_fields key of a trajectory: first_difference() with its probe, or NOT_PROBED (a clean response, or probes off).
FIRST_DIFFERENCE_FIELD = "nc_grpo_first_difference"
NOT_PROBED = -2
NO_DIFFERENCE = -1
# Below this share of branched noisy responses a step's console says the noise changed (almost) nothing.
WARN_BELOW = 0.01


def first_difference(response: Sequence[int], clean: Sequence[int], limit: int) -> int:
    """The first position where ``response[:limit]`` and ``clean[:limit]`` differ (a token, or one of them ending
    there), or :data:`NO_DIFFERENCE` when they are equal; ``limit <= 0`` compares nothing (:data:`NOT_PROBED`)."""
    if limit <= 0:
        return NOT_PROBED
    a, b = list(response[:limit]), list(clean[:limit])
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if int(x) != int(y):
            return position
    return min(len(a), len(b)) if len(a) != len(b) else NO_DIFFERENCE


def branch_metrics(first_differences: Sequence[int], flags: Sequence[bool]) -> dict[str, float]:
    """A step's branching, over its noisy responses that were probed (``first_differences[i] != NOT_PROBED``):

    * ``branch/first_token``: share whose first token differs from the clean draw's;
    * ``branch/rate``: share that differ anywhere within the probe's tokens;
    * ``branch/first_difference_mean``: mean position of the first difference, over those that differ;
    * ``branch/probed``: how many noisy responses were probed.

    Empty when none was probed."""
    fd = np.asarray(first_differences, dtype=np.int64)
    probed = np.asarray(flags, dtype=bool) & (fd != NOT_PROBED)
    if not probed.any():
        return {}
    values = fd[probed]
    branched = values >= 0
    out = {
        "branch/probed": float(probed.sum()),
        "branch/first_token": float((values == 0).mean()),
        "branch/rate": float(branched.mean()),
    }
    if branched.any():
        out["branch/first_difference_mean"] = float(values[branched].mean())
    return out


def branch_warning(metrics: dict[str, float], probe_tokens: int, where: str, target: str) -> str | None:
    """The console line of a step (``where``: e.g. ``step 3``) whose noisy responses (almost) never branched, or
    ``None``. ``metrics``: :func:`branch_metrics`'s; ``target``: the reading (what to change is said by it)."""
    if not metrics or metrics["branch/rate"] >= WARN_BELOW:
        return None
    probed = int(metrics["branch/probed"])
    branched = round(metrics["branch/rate"] * probed)
    fix = (
        "use noise_contrastive_grpo.target=layer_input (its displacement persists past the first token) or raise "
        "noise_contrastive_grpo.noise_scale"
        if target == FINAL_HIDDEN
        else "raise noise_contrastive_grpo.noise_scale"
    )
    return (
        f"[nc_grpo] warning: {where}: {branched} of {probed} noisy rollouts differ from the clean rollout of their own "
        f"seed within {probe_tokens} tokens (first token: {round(metrics['branch/first_token'] * probed)}): the "
        f"{target} noise changes (almost) no rollout, so NC-GRPO trains as GRPO here; {fix}"
    )
