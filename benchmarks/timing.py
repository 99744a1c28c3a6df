"""The benchmarks' shared timer: median time per candidate, the candidates interleaved round by round.

Imported by the scripts as ``from timing import time_round_robin``: ``python benchmarks/<script>.py`` puts
``benchmarks/`` first on ``sys.path``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def time_round_robin(candidates: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median milliseconds per candidate over ``rounds``; one call of each per round so drift hits all alike.

    Each candidate is called once first, untimed (warm-up, and it builds any lazy inputs outside the timings).
    """
    for fn in candidates.values():
        fn()
    samples = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(values) for name, values in samples.items()}
