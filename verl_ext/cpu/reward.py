"""A test reward that separates a random model's responses, for CPU runs of a tiny untrained model.

A randomly initialised model never writes ``\\boxed{}``, so the paper's reward scores every response 0 and every
advantage is 0: nothing would be trained or checked. This reward depends on the text alone and splits a random
byte-level model's responses roughly in half:

    acc    = 1 if more than half of the response's characters are ASCII, else 0
    format = fraction of the response's characters that are ASCII letters or spaces
    score  = acc_weight * acc + format_weight * format          (0.9 / 0.1, as the paper's reward)

It returns ``{"score", "acc", "format"}`` like :func:`verl_ext.reward.compute_score`, so the DIVA trainer's
difficulty service (``alpha_source=accuracy``) reads ``acc`` as usual. Use it with
``reward.custom_reward_function.path=pkg://verl_ext.cpu.reward reward.custom_reward_function.name=separating_score``.
"""

from __future__ import annotations


def separating_score(
    data_source, solution_str, ground_truth, extra_info=None, acc_weight: float = 0.9, format_weight: float = 0.1, **_
) -> dict:
    """Score one decoded response (see the module docstring); ``ground_truth`` is ignored on purpose."""
    text = solution_str if isinstance(solution_str, str) else str(solution_str)
    n = max(len(text), 1)
    ascii_fraction = sum(ch.isascii() for ch in text) / n
    letters = sum(ch.isascii() and (ch.isalpha() or ch == " ") for ch in text) / n
    acc = 1.0 if text and ascii_fraction > 0.5 else 0.0
    return {"score": acc_weight * acc + format_weight * letters, "acc": acc, "format": letters}
