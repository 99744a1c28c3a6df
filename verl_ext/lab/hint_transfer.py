"""Whether a hint teaches what its original needs: a few steps of a plain on-policy GRPO update on the hinted
prompts alone, and the unhinted originals' right answer measured before and after (the sparse task's third
property, :mod:`verl_ext.lab.sparse_task`).

Why a plain loop and not verl: it is a measurement of the warm start (does a gradient step on the hinted prompt move
the original?), made in a few seconds with the model loaded as verl's workers load it; the runs themselves train
through verl.
"""

from __future__ import annotations

import math

from verl_ext.lab.sampling import response_log_probs, right_log_prob, sample_answers, sampled_accuracy


def hint_transfer(
    model,
    processor,
    hinted,
    originals,
    *,
    steps: int,
    seed: int,
    lr: float,
    temperature: float,
    group: int,
    samples: int,
    horizon: int = 0,
) -> dict:
    """``steps`` on-policy GRPO updates on ``hinted`` alone (``group`` responses each, advantage
    ``(r - mean) / (std + 1e-6)`` per group, token-mean loss, AdamW at ``lr``); the originals' right-answer
    log-probability and sampled accuracy before and after. The updates go on to ``horizon`` steps (when larger),
    measured every ``steps`` (``trajectory``): how far the transfer goes once the hints are learned. Accuracies:
    ``samples`` sampled answers per prompt."""
    import torch

    tokenizer = processor.tokenizer

    def measure(step: int) -> dict:
        return {
            "step": step,
            "log_prob": right_log_prob(model, processor, originals),
            "accuracy": sampled_accuracy(model, processor, originals, samples, seed + 3),
            "hint_accuracy": sampled_accuracy(model, processor, hinted, samples, seed + 2),
        }

    trajectory = [measure(0)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(max(steps, horizon)):
        batch, responses, rewards = sample_answers(model, processor, hinted, group, temperature, seed + 100 + step)
        r = torch.tensor(rewards).view(len(hinted), group)
        advantage = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).flatten()
        model.train()
        total, mask, _ = response_log_probs(model, batch, responses, tokenizer.pad_token_id, tokenizer.eos_token_id)
        # sum over a response's tokens of A * log p, averaged over all response tokens (verl's token-mean)
        loss = -(advantage * total).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        model.eval()
        if (step + 1) % steps == 0:
            trajectory.append(measure(step + 1))
    start, at = trajectory[0], trajectory[1]
    return {
        "held": at["log_prob"] > start["log_prob"] + math.log(2),
        "steps": steps,
        "lr": lr,
        "log_prob_before": start["log_prob"],
        "log_prob_after": at["log_prob"],
        "accuracy_before": start["accuracy"],
        "accuracy_after": at["accuracy"],
        "hint_accuracy_after": at["hint_accuracy"],
        "trajectory": trajectory,
    }
