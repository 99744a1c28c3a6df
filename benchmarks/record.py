"""The benchmarks' record: each script saves its final figures with ``record(name, figures)``.

``record`` writes ``benchmarks/results/<name>/<name>.json``: the figures the script printed, plus the ``command``
that measured them, the ``machine`` it ran on and the ``date`` (UTC). The pages quote these files only through the
docs' generator (``python -m verl_ext.report.doc_numbers --write``), so a figure in a page names the run that
measured it. Each script takes ``--no-record`` (:func:`add_no_record`) to measure without overwriting the record.

Imported by the scripts as ``from record import record``: ``python benchmarks/<script>.py`` puts ``benchmarks/``
first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def machine() -> str:
    """The machine in words: architecture, CPU model where Linux names it, cores, Python."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpu = f"{platform.machine()} {model}".strip()
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def command(argv: list[str] | None = None) -> str:
    """The command line that ran the script, its path relative to the repository: ``python benchmarks/x.py ...``."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = sys.argv[0]
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", shown, *args])


def add_no_record(parser: argparse.ArgumentParser) -> None:
    """``--no-record``: print the figures without writing ``benchmarks/results/<name>/``."""
    parser.add_argument(
        "--no-record", action="store_true", help="print the figures without saving them under benchmarks/results/"
    )


def record(name: str, figures: dict[str, Any], argv: list[str] | None = None) -> Path:
    """Save ``figures`` as ``benchmarks/results/<name>/<name>.json`` with the command, machine and date; its path.

    ``argv`` is the script's arguments (default ``sys.argv[1:]``), recorded in the command line. Keys of ``figures``
    named ``command``, ``machine`` or ``date`` are replaced by the record's own.
    """
    out = RESULTS / name / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    stamped = {
        **figures,
        "command": command(argv),
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }
    out.write_text(json.dumps(stamped, indent=1, sort_keys=False) + "\n")
    return out
