"""Two runs of one seed compared metric by metric: the check of the determinism and crash tests.

``python -m verl_ext.checks.same_run EXPECTED_RUN ACTUAL_RUN`` reads both run folders as ``diva-report`` does (every
metrics log merged, a restarted job's earlier attempts included) and prints each logged value of EXPECTED that
ACTUAL does not repeat exactly; exit status 1 if there is one. Values that measure the machine, not the run (wall
times, throughput, memory: :data:`TIME_DEPENDENT`) are not compared. ACTUAL may log more (a resumed job validates
before it continues, at steps the other run did not validate).
"""

from __future__ import annotations

import argparse
import re
import sys

# verl's timing_s/* and timing_per_token_ms/*, every method's <prefix>/timing_s/*, perf/throughput, perf/time_per_step,
# perf/mfu/* (time-based), and memory readings.
TIME_DEPENDENT = re.compile(r"(^|/)timing|^perf/(throughput|time_per_step|mfu)|memory")


def metric_differences(expected: dict[int, dict[str, float]], actual: dict[int, dict[str, float]]) -> list[str]:
    """``"step S: KEY expected X, got Y"`` for every value of ``expected`` (``steps[step][key]``) not in ``actual``."""
    differences = []
    for step in sorted(expected):
        got = actual.get(step, {})
        for key in sorted(expected[step]):
            if TIME_DEPENDENT.search(key):
                continue
            if key not in got:
                differences.append(f"step {step}: {key} expected {expected[step][key]!r}, not logged")
            elif got[key] != expected[step][key]:
                differences.append(f"step {step}: {key} expected {expected[step][key]!r}, got {got[key]!r}")
    return differences


def main(argv: list[str] | None = None) -> int:
    from verl_ext.report.run import load_run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("expected", help="run folder (or metrics log) of the reference run")
    parser.add_argument("actual", help="run folder (or metrics log) that must repeat it")
    args = parser.parse_args(argv)
    expected, actual = load_run(args.expected).log.steps, load_run(args.actual).log.steps
    differences = metric_differences(expected, actual)
    compared = sum(1 for values in expected.values() for key in values if not TIME_DEPENDENT.search(key))
    for line in differences[:50]:
        print(line)
    print(f"{compared} values over {len(expected)} steps compared, {len(differences)} differ")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
