"""The tiny CPU comparison's cost per method, side by side in one run (``verl_ext.lab.compare``).

Runs the comparison (warm start, then each method for ``--steps`` steps from it, validated every ``--test-freq``
steps, each its own Ray job) and reports per method: the job's wall time (Ray start, worker start-up, validation
and training), the training time (sum of verl's ``timing_s/step``) and steps per minute of training, plus the
warm start's time. The last line printed is one JSON object with the figures. ``--quick``: GRPO and DIVA-GRPO,
2 steps each, validation at the end only. ``--from DIR``: the figures of a comparison already run into ``DIR``
(``OUT`` of ``compare_tiny.sh``), without running it again.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from record import add_no_record, record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def figures(out: Path, comparison: dict) -> dict:
    """Per method: wall minutes, training seconds (verl's timing_s/step summed) and steps per training minute."""
    from verl_ext.report.run import load_run
    from verl_ext.report.series import series

    methods = {}
    for method, entry in comparison["methods"].items():
        _, step_seconds = series(load_run(out / method).log, "timing_s/step")
        train_s = float(step_seconds.sum())
        methods[method] = {
            "wall_minutes": entry["minutes"],
            "steps": entry["steps"],
            "train_seconds": round(train_s, 1),
            "steps_per_minute": round(entry["steps"] / (train_s / 60), 2) if train_s else None,
            "wall_steps_per_minute": round(entry["steps"] / entry["minutes"], 2) if entry["minutes"] else None,
        }
    return methods


def main(argv: list[str] | None = None) -> dict:
    from verl_ext.lab.compare import ALL_METHODS, QUICK_METHODS, compare

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="GRPO and DIVA-GRPO, 2 steps each")
    parser.add_argument("--methods", default=None, help="adv_estimator names (default: all, or the quick pair)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--test-freq", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary folder)")
    parser.add_argument("--from", dest="done", type=Path, default=None, help="read a finished comparison's folder")
    add_no_record(parser)
    args = parser.parse_args(argv)
    name = None if args.no_record else ("compare_tiny_quick" if args.quick else "compare_tiny")
    if args.done is not None:
        return _report(args.done, json.loads((args.done / "comparison.json").read_text()), name, argv)
    methods = args.methods.split() if args.methods else list(QUICK_METHODS if args.quick else ALL_METHODS)
    steps, test_freq = (2, 2) if args.quick else (args.steps, args.test_freq)
    with tempfile.TemporaryDirectory(prefix="bench_compare_") as tmp:
        out = args.out or Path(tmp)
        return _report(out, compare(out, methods, steps=steps, test_freq=test_freq), name, argv)


def _report(out: Path, comparison: dict, name: str | None = None, argv: list[str] | None = None) -> dict:
    """Print the per-method lines and, last, the JSON figures of the comparison in ``out``; returns the figures,
    recorded as ``benchmarks/results/<name>/`` unless ``name`` is None."""
    settings = comparison["settings"]
    result = {
        "benchmark": "compare_tiny",
        "steps": settings["steps"],
        "test_freq": settings["test_freq"],
        "total_minutes": comparison["minutes"],
        "warm_start_val_accuracy": comparison["warm_start"]["val_accuracy"],
        "methods": figures(out, comparison),
    }
    for method, row in result["methods"].items():
        print(
            f"{method:10s} wall {row['wall_minutes']:6.2f} min  train {row['train_seconds']:7.1f} s  "
            f"{row['steps_per_minute']} steps/min"
        )
    if name is not None:
        record(name, result, argv)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
