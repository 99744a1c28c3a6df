"""``diva-report RUN [RUN ...] --output DIR``: figures and ``report.md`` for one run, or several side by side.

Writes into ``DIR``: ``report.md`` (figures embedded, summary table, and with two or more runs the steps each run
needs to reach the baseline's best validation accuracy and the runs whose series coincide), the PNG figures
(``collapse_rate``, ``difficulty``, ``variants``, ``training``, ``validation``; a figure without data is skipped and
the report says why; with several runs, one panel or row per run), ``summary.json`` (with ``baseline`` and
``coincident``) and ``figures.json`` (every series drawn). The baseline is the GRPO run when there is one (by its
name: :mod:`.baseline`), else the first run.

Exit status: 0 written; 2 bad input (no metrics log, a malformed log line: the message names the file and line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verl_ext.report.logs import ReportError
from verl_ext.report.run import Run, group_resumed, load_run, unique_names
from verl_ext.version import version_line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diva-report",
        description="Plots and a report.md from runs' verl metrics logs (file logger JSONL) and checkpoint "
        "difficulty states. The baseline of the comparison is the run named GRPO (e.g. grpo, GRPO, "
        "qwen25vl7b_grpo_n10) when there is one, else the first run.",
        epilog="example: diva-report checkpoints/diva_grpo/qwen25vl7b_grpo_n10 "
        "checkpoints/diva_grpo/qwen25vl7b_diva_v1 --output reports/diva_vs_grpo",
    )
    parser.add_argument("--version", action="version", version=version_line("diva-report"))
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (CKPT_DIR of a launch) or metrics .jsonl")
    parser.add_argument("--output", "-o", required=True, type=Path, help="folder to write report.md and figures")
    parser.add_argument("--names", default=None, help="comma-separated names of the runs (default: folder names)")
    return parser


def render_report(runs: list[Run], output: Path) -> dict:
    """Write figures, ``report.md``, ``summary.json`` and ``figures.json`` into ``output``; returns the summary."""
    from verl_ext.report import figures as F
    from verl_ext.report.markdown import summary_json, write_report
    from verl_ext.report.series import ACCURACY_PATTERNS, accuracy_key

    output.mkdir(parents=True, exist_ok=True)
    done: dict[str, tuple[str, str | None]] = {}
    drawn: dict[str, list] = {}
    coincident: list[dict] = []
    for file, (title, build) in F.FIGURES.items():
        fig, plotted = build(runs)
        if fig is None:
            done[file] = (title, plotted)
            (output / file).unlink(missing_ok=True)  # never leave an older report's figure behind
            continue
        F.save(fig, output / file)
        done[file], drawn[file] = (title, None), plotted
        coincident += F.coincident(file, plotted)
    notes = [f"{run.name}: {note}" for run in runs for note in run.notes]
    if not any(accuracy_key(run.log.keys()) for run in runs):
        notes.append(
            f"training accuracy is not in the logs (no {' or '.join(ACCURACY_PATTERNS)} metric): the reward "
            "(0.9 x accuracy + 0.1 x format) is the closest training curve"
        )
    (output / "report.md").write_text(write_report(runs, done, notes, coincident), encoding="utf-8")
    summary = summary_json(runs, done, coincident)
    (output / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    (output / "figures.json").write_text(json.dumps(drawn), encoding="utf-8")
    return summary


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A metrics file and its resumed part (x.jsonl, x_resumed.jsonl) are one run.
    groups = group_resumed(args.runs)
    names = [n.strip() for n in args.names.split(",")] if args.names else [None] * len(groups)
    try:
        if len(names) != len(groups):
            raise ReportError(f"--names gives {len(names)} names for {len(groups)} runs")
        runs = [
            load_run(group if len(group) > 1 else group[0], name) for group, name in zip(groups, names, strict=True)
        ]
    except ReportError as err:
        print(f"diva-report: error: {err}", file=sys.stderr)
        return 2
    unique_names(runs)
    summary = render_report(runs, args.output)
    skipped = [f for f, info in summary["figures"].items() if info["skipped"]]
    print(f"wrote {args.output / 'report.md'} ({len(summary['figures']) - len(skipped)} figures)")
    for file in skipped:
        print(f"  skipped {file}: {summary['figures'][file]['skipped']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
