"""The text MUPO embeds: a response's reasoning, its ``<think>...</think>`` span."""

from __future__ import annotations

import re

# The first complete span, tags included (as the released rollout extracts it); non-greedy, across lines.
THINK_SPAN = re.compile(r"<think>.*?</think>", re.DOTALL)


def extract_think_span(response: str) -> str:
    """The first ``<think>...</think>`` span of ``response`` (tags included), else the whole response.

    A response cut off before ``</think>`` has no complete span and is embedded whole. (The released rollout
    falls back to the text before ``\\boxed`` instead; docs/algo/mupo.md, "The method", says what is embedded here.)
    """
    if not isinstance(response, str):
        raise ValueError(f"response must be a str, got {type(response).__name__}")
    match = THINK_SPAN.search(response)
    return match.group(0) if match else response
