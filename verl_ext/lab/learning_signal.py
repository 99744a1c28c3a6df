"""Where a run's learning signal went, step by step, from the actor-input records (:mod:`verl_ext.checks.probe`).

Validation asks the original questions only. A method's update moves the policy on those prompts through the
advantages it gives the responses *to* them (and, less directly, through responses to variants of them). For every
trained step :func:`signal_figures` reads what the actor consumed and reports:

* ``original_responses``: responses to the original prompts (DIVA-GRPO: half of them; GRPO: all);
* ``original_accuracy``: the fraction of those that are right (score >= 0.9: the answer, not only the format);
* ``original_signal``: the fraction of those with an advantage above :data:`NO_SIGNAL` in size (a group whose
  responses all score the same gives none under GRPO);
* ``original_right_advantage`` / ``original_wrong_advantage``: the mean advantage of the right / wrong answers to
  the originals (how hard the update pushes the right answer up and the wrong one down where validation looks);
* ``variant_right_advantage``: the same for the right answers to variants, per variant kind;
* ``advantage_rms``: the root mean square advantage over all responses (the scale of the policy-gradient loss);
* ``grad_norm``: the actor's gradient norm.

``python -m verl_ext.lab.learning_signal RUN [RUN ...]`` prints each run's means over its steps.
"""

from __future__ import annotations

import argparse
import json
import sys

RIGHT = 0.9  # verl_ext.reward: 0.9 for the right answer + 0.1 for the format
# An advantage this small is no signal: verl's float32 GRPO leaves a group of equal scores a constant of a few 1e-3
# (docs/comparison.md, "Zero-advantage fraction"); a real z-score in a group of 8 is at least 0.35.
NO_SIGNAL = 0.02


def _kind(extra_info) -> str:
    if isinstance(extra_info, dict):
        return str(extra_info.get("variant_kind") or "original")
    return "original"


def step_signal(record: dict) -> dict:
    """The figures of one actor-input record (module docstring)."""
    import torch

    mask = record["response_mask"].to(torch.float64)
    scores = (record["rm_scores"].to(torch.float64) * mask).sum(dim=1)
    tokens = mask.sum(dim=1).clamp(min=1)
    # Every token of a response carries its advantage (GRPO-like methods); the token mean is the response's.
    advantage = (record["advantages"].to(torch.float64) * mask).sum(dim=1) / tokens
    padding = record.get("is_padding") or [False] * len(scores)
    extra = record.get("extra_info") or [None] * len(scores)
    rows = [i for i in range(len(scores)) if not padding[i]]
    kinds = [_kind(extra[i]) for i in rows]
    originals = [i for i, k in zip(rows, kinds, strict=True) if k == "original"]

    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else None

    right = [i for i in originals if scores[i] >= RIGHT]
    wrong = [i for i in originals if scores[i] < RIGHT]
    out = {
        "step": int(record["step"]),
        "responses": len(rows),
        "original_responses": len(originals),
        "original_accuracy": mean(1.0 if scores[i] >= RIGHT else 0.0 for i in originals),
        "original_signal": mean(1.0 if abs(float(advantage[i])) > NO_SIGNAL else 0.0 for i in originals),
        "original_right_advantage": mean(float(advantage[i]) for i in right),
        "original_wrong_advantage": mean(float(advantage[i]) for i in wrong),
        "advantage_rms": float((advantage[rows] ** 2).mean().sqrt()),
        "grad_norm": record.get("actor_metrics", {}).get("actor/grad_norm"),
        "variant_right_advantage": {},
    }
    for kind in sorted(set(kinds) - {"original"}):
        chosen = [i for i, k in zip(rows, kinds, strict=True) if k == kind and scores[i] >= RIGHT]
        out["variant_right_advantage"][kind] = mean(float(advantage[i]) for i in chosen)
    return out


def signal_figures(run_dir: str) -> list[dict]:
    """:func:`step_signal` of every step the run recorded, in step order."""
    from verl_ext.checks.probe import read_actor_inputs

    records = read_actor_inputs(run_dir)
    if not records:
        raise ValueError(f"{run_dir}: no probe/actor_inputs_step*.pt (was the run made with DIVA_CPU_PROBE_DIR set?)")
    return [step_signal(records[step]) for step in sorted(records)]


def run_means(steps: list[dict]) -> dict:
    """The mean of each figure over the steps where it is defined."""
    out = {}
    for key in steps[0]:
        if key == "step":
            continue
        if key == "variant_right_advantage":
            kinds = sorted({k for s in steps for k in s[key]})
            out[key] = {k: _mean([s[key].get(k) for s in steps]) for k in kinds}
        else:
            out[key] = _mean([s[key] for s in steps])
    out["steps"] = len(steps)
    return out


def _mean(values):
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run folders with probe/actor_inputs_step*.pt")
    args = parser.parse_args(argv)
    for run in args.runs:
        print(json.dumps({"run": run, **run_means(signal_figures(run))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
