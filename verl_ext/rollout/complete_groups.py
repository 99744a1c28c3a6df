"""No advantage over a group with missing responses: every prompt's ``rollout.n`` responses (and, for DIVA, every
question's original and variants) must reach the advantage step together.

verl counts a group whose requests failed as finished and never refills it when
``trainer.v1.sampler.sync_refill_failed_groups`` is off (``verl/trainer/ppo/v1/replay_buffer.py``); a group can also
be split by a sampler or a batch size that does not respect it. Either way every method's group statistics (and
DIVA's difficulty update) would be computed over fewer responses than the method assumes, silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


class IncompleteGroupError(RuntimeError):
    """A prompt or question group reached the advantage step with another number of responses than expected."""


def check_complete_groups(group_ids: Iterable, expected: int, what: str, hint: str) -> None:
    """Every id of ``group_ids`` (one per response) occurs exactly ``expected`` times; otherwise
    :class:`IncompleteGroupError` naming the first groups that do not, ``what`` they are and ``hint`` (what to do)."""
    counts = Counter(str(g) for g in group_ids)
    wrong = sorted((group, count) for group, count in counts.items() if count != expected)
    if wrong:
        shown = ", ".join(f"{group} ({count})" for group, count in wrong[:5])
        raise IncompleteGroupError(
            f"{len(wrong)} {what} of this step have another number of responses than {expected}: {shown}"
            f"{' ...' if len(wrong) > 5 else ''}. No advantage is computed over an incomplete group; {hint}"
        )
