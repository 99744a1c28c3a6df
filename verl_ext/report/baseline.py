"""Which run is the report's baseline: GRPO when one of the runs is GRPO by its name, else the first run.

A run is GRPO by its name when ``grpo`` is one of the name's words (split at anything but letters and digits,
case ignored) and no other method's word is: ``GRPO``, ``grpo_2x``, ``qwen25vl7b_grpo_n10`` are GRPO;
``DIVA-GRPO``, ``NC-GRPO``, ``noise_contrastive_grpo`` are not. Among several GRPO runs the one named exactly
``grpo`` wins, else the first.
"""

from __future__ import annotations

import re

from verl_ext.method_names import TOOLKIT_METHODS

GRPO = "grpo"
# Words that make a name another method's: the toolkit's method names, DIVA-GRPO's, and the short names in use.
OTHER_METHOD_WORDS = frozenset(
    {word for name in (*TOOLKIT_METHODS, "diva_grpo") for word in name.split("_") if word != GRPO} | {"nc", "diva"}
)


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^0-9a-z]+", name.lower()) if w]


def is_grpo(name: str) -> bool:
    words = _words(name)
    return GRPO in words and not OTHER_METHOD_WORDS.intersection(words)


def baseline_index(names: list[str]) -> int:
    """Index of the baseline among the runs' ``names`` (module docstring); 0 when none is GRPO."""
    for index, name in enumerate(names):
        if _words(name) == [GRPO]:
            return index
    return next((index for index, name in enumerate(names) if is_grpo(name)), 0)
