"""How long each test tier takes alone on this machine: ``python benchmarks/bench_test_tiers.py [--tiers ...]``.

The README's development command must stay a matter of minutes; what is slower lives in tiers that CI runs
(``.ci/run``). This script runs each tier's pytest command on this Python, one after the other (nothing else should
run meanwhile: these machines are noisy), prints each tier's minutes and its share of the whole side by side, writes
``benchmarks/results/test_tiers/test_tiers.json`` (``record.py``: the figures the README quotes, each tier with the
command, the machine and the date that measured it) and, as its last line, one JSON object with the figures.

- ``development``: the README's command 1 (``-m "not gpu_stack and not launch"``);
- ``launch``: ``-m "launch and not gpu_stack and not extended"`` (a Ray cluster, each method's preflight, the
  launchers);
- ``gpu_stack``: ``-m "gpu_stack and not extended"``, on the main job's stack (``--gpu-stack-python``, the venv of
  ``run_scripts/setup_vllm_cpu.sh``); left out without it.

``--from-log TIER LOG`` records a tier from the output of a run of its command made alone (pytest's closing line,
``131 passed ... in 2730.81s``; the log is copied beside the figures) instead of running it again: the ``gpu_stack``
tier takes the better part of an hour. ``--from-ci-log LOG`` records CI's whole run (``bash .ci/run`` alone on this
machine, which its budget is about) from its output: the table of parts it prints at its end and every
pytest closing line (kept beside the figures as ``ci_run.log``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from record import RESULTS, add_no_record, machine, record

ROOT = Path(__file__).resolve().parents[1]
OUT = RESULTS / "test_tiers" / "test_tiers.json"
STAMP = ("command", "machine", "date")  # the record's own keys, beside the tiers
TIERS = {
    "development": "not gpu_stack and not launch",
    "launch": "launch and not gpu_stack and not extended",
    "gpu_stack": "gpu_stack and not extended",
}
# pytest's closing line: "1364 passed, 1 skipped, 259 deselected, 13 warnings in 262.32s (0:04:22)"
SUMMARY = re.compile(r"^=*\s*(?P<text>\d+ passed[^=]*?) in (?P<seconds>[\d.]+)s")


def run_tier(python: str, marks: str) -> dict:
    command = [python, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-m", marks]
    env = {**os.environ, "DIVA_REQUIRE_VLLM": "1"} if "gpu_stack and" in marks else dict(os.environ)
    started = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    found = closing_line(out.stdout)
    if out.returncode != 0 or found is None:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-2000:])
        raise SystemExit(f"tier -m {marks!r} failed (exit {out.returncode}): fix it before timing it")
    return tier_figures(marks, seconds, found.group("text"))


def closing_line(output: str):
    """pytest's closing line in ``output`` (its last one), as a :data:`SUMMARY` match; ``None`` without one."""
    return next((m for line in reversed(output.splitlines()) if (m := SUMMARY.search(line))), None)


def tier_figures(marks: str, seconds: float, result: str) -> dict:
    return {
        "command": f'python -m pytest tests -q -m "{marks}"',
        "seconds": round(seconds, 1),
        "minutes": round(seconds / 60, 2),
        "result": result,
    }


def tier_from_log(tier: str, log: Path, keep: bool) -> dict:
    """A tier's figures from pytest's closing line in ``log`` (a run of the tier's command alone)."""
    found = closing_line(log.read_text())
    if tier not in TIERS or found is None or " failed" in found.group("text"):
        raise SystemExit(f"{log}: no passing pytest closing line of a tier in {sorted(TIERS)} ({tier!r} given)")
    if keep:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        (OUT.parent / f"{tier}_pytest.log").write_text(log.read_text())
    figures = tier_figures(TIERS[tier], float(found.group("seconds")), found.group("text"))
    return {**figures, "from_log": f"benchmarks/results/test_tiers/{tier}_pytest.log"}


# pytest's closing line of a run with a failure: "= 1 failed, 20 passed in 9.10s =", "= 2 errors in 1.00s ="
FAILED = re.compile(r"^=+ .*\b\d+ (failed|errors?)\b.* in [\d.]+s")
# .ci/run's closing table: "  gpu_stack tier, vLLM      1234 s (from 250 s)" and "  whole      2400 s".
CI_PART = re.compile(r"^  (?P<name>\S.*?)\s+(?P<seconds>\d+) s(?: \(from (?P<start>\d+) s\))?$")


def ci_from_log(log: Path, keep: bool) -> dict:
    """CI's whole run from its output: its parts (seconds, and when each started) and pytest's closing lines."""
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("CI: time of each part")]
    if any(line.startswith("CI: failed") for line in lines) or not starts:
        raise SystemExit(f"{log}: not the output of a passing .ci/run")
    table = lines[starts[-1] :]
    parts = {m["name"]: int(m["seconds"]) for line in table if (m := CI_PART.match(line))}
    closing = [m.group(0).strip("= ") for line in lines if (m := SUMMARY.search(line))]
    failed = [line for line in lines if FAILED.search(line)]
    if "whole" not in parts or not closing or failed:
        raise SystemExit(f"{log}: no whole time or a failed pytest closing line")
    if keep:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        (OUT.parent / "ci_run.log").write_text("\n".join([*closing, *table]) + "\n")
    return {
        "command": "bash .ci/run",
        "seconds": parts["whole"],
        "minutes": round(parts["whole"] / 60, 2),
        "result": "; ".join(closing),
        "parts_s": {name: seconds for name, seconds in parts.items() if name != "whole"},
        "from_log": "benchmarks/results/test_tiers/ci_run.log",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", nargs="+", default=["development", "launch"], choices=sorted(TIERS))
    parser.add_argument("--gpu-stack-python", default=None, help="the main job's stack's python, for gpu_stack")
    add_no_record(parser)
    parser.add_argument("--from-log", nargs=2, metavar=("TIER", "LOG"), help="record TIER from a log of its run")
    parser.add_argument("--from-ci-log", metavar="LOG", help="record CI's whole run from the output of .ci/run")
    args = parser.parse_args(argv)
    tiers = list(args.tiers) + (["gpu_stack"] if args.gpu_stack_python and "gpu_stack" not in args.tiers else [])
    figures: dict = {}
    if args.from_log:
        tier, log = args.from_log
        figures[tier] = tier_from_log(tier, Path(log), keep=not args.no_record)
        tiers = []
    if args.from_ci_log:
        figures["ci"] = ci_from_log(Path(args.from_ci_log), keep=not args.no_record)
        tiers = []
    for tier in tiers:
        python = args.gpu_stack_python if tier == "gpu_stack" else sys.executable
        if tier == "gpu_stack" and not python:
            raise SystemExit("--tiers gpu_stack needs --gpu-stack-python (the venv of run_scripts/setup_vllm_cpu.sh)")
        print(f"tier {tier}: -m {TIERS[tier]!r} ...", flush=True)
        figures[tier] = run_tier(python, TIERS[tier])
    total = sum(f["seconds"] for f in figures.values())
    print(f"{'tier':<12} {'minutes':>8} {'share':>7}  result")
    for tier, f in figures.items():
        print(f"{tier:<12} {f['minutes']:>8.2f} {f['seconds'] / total:>7.0%}  {f['result']}")
    # Each tier's figures with how, where and when they were measured (tiers are recorded by separate runs).
    how = {
        "machine": machine(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "recorded_by": "python benchmarks/bench_test_tiers.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    measured = {tier: {**f, **how} for tier, f in figures.items()}
    if not args.no_record:  # the tiers recorded before stay, each with its own command, machine and date
        recorded = json.loads(OUT.read_text()) if OUT.exists() else {}
        kept = {tier: f for tier, f in recorded.items() if tier not in STAMP}
        record("test_tiers", {**kept, **measured}, argv)
    print(json.dumps(measured))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
