"""One run as ``diva-report`` sees it: its merged metrics log and its checkpoints' difficulty states.

A run is given as a folder or as one metrics log file:

- metrics logs: the verl file-logger JSONL files directly in the folder, in its ``logs/`` subfolder (the
  launcher writes ``<CKPT_DIR>/logs/metrics_<time>.jsonl``; the CPU preflight writes them in its work folder) or
  in ``metrics/<project>/`` (verl's ``VERL_FILE_LOGGER_ROOT`` layout, which the CPU runs use:
  ``<experiment>.jsonl`` and, after a resume, ``<experiment>_resumed.jsonl``). All of them are one run, merged.
  Other ``.jsonl`` files (quarantines, rollout dumps) are recognised by their first line and ignored.
- metrics files given one by one: a file and its resumed part (``x.jsonl`` and ``x_resumed.jsonl``, as
  :mod:`verl_ext.checks.session` names them) given together are one run (:func:`group_resumed`).
- difficulty states: ``global_step_N/diva_difficulty.json`` in the folder or in its ``checkpoints/`` subfolder.
  A log file given alone reads the states of its folder the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from verl_ext.report.logs import MetricLog, ReportError, is_metric_log, merge_logs
from verl_ext.report.states import DifficultyStates, read_states

LOG_SUBDIRS = ("", "logs", "metrics/*")
RESUMED_SUFFIX = "_resumed"  # verl_ext.checks.session.RESUMED_SUFFIX (kept free of that module's imports)


@dataclass
class Run:
    name: str
    path: Path
    log: MetricLog
    states: DifficultyStates
    notes: list[str] = field(default_factory=list)


def metric_log_files(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """``(logs, other_jsonl)`` found in ``run_dir`` and ``run_dir/logs``."""
    logs, others = [], []
    for sub in LOG_SUBDIRS:
        for base in sorted(run_dir.glob(sub)) if sub else [run_dir]:
            if base.is_dir():
                for path in sorted(base.glob("*.jsonl")):
                    (logs if is_metric_log(path) else others).append(path)
    return logs, others


def group_resumed(paths: list[Path]) -> list[list[Path]]:
    """The runs among ``paths``: a ``.jsonl`` file joined by its ``<stem>_resumed*.jsonl`` parts given with it (in
    the same folder), every other path alone; order of first appearance."""
    groups: list[list[Path]] = []
    by_base: dict[Path, list[Path]] = {}
    files = {p.resolve() for p in paths if p.suffix == ".jsonl"}
    for path in paths:
        base = None
        if path.suffix == ".jsonl" and RESUMED_SUFFIX in path.stem:
            candidate = path.with_name(path.stem.split(RESUMED_SUFFIX, 1)[0] + ".jsonl")
            base = candidate.resolve() if candidate.resolve() in files else None
        if base is not None:
            if base not in by_base:
                by_base[base] = []
                groups.append(by_base[base])
            by_base[base].append(path)
        elif path.suffix == ".jsonl" and path.resolve() in by_base:
            by_base[path.resolve()].insert(0, path)
        else:
            group = [path]
            if path.suffix == ".jsonl":
                by_base[path.resolve()] = group
            groups.append(group)
    return groups


def load_run(path: str | Path | list, name: str | None = None) -> Run:
    """Read one run (a folder, a log file, or a log file with its resumed parts as a list). Raises
    :class:`ReportError` when there is no metrics log or a log line is malformed."""
    parts = [Path(p) for p in path] if isinstance(path, list) else [Path(path)]
    path = parts[0]
    for part in parts:
        if not part.exists():
            raise ReportError(f"run {part} does not exist (give a run folder or a metrics .jsonl file)")
    notes: list[str] = []
    if path.is_file():
        logs, folder = parts, path.parent
    else:
        folder = path
        logs, others = metric_log_files(folder)
        if others:
            notes.append(f"ignored {len(others)} .jsonl file(s) that are not metrics logs: {[p.name for p in others]}")
        if not logs:
            raise ReportError(
                f"run {path}: no metrics log found (verl's file logger JSONL in {path} or {path / 'logs'}); "
                "train with trainer.logger=[console,file] and VERL_FILE_LOGGER_PATH set (the launchers do)"
            )
    log = merge_logs(logs)
    states = read_states(folder)
    notes += log.notes + states.notes
    if not states.difficulties:
        notes.append(
            f"no difficulty states in {folder} (global_step_N/diva_difficulty.json): difficulty figures skipped"
        )
    return Run(name=name or _default_name(path), path=path, log=log, states=states, notes=notes)


def _default_name(path: Path) -> str:
    return path.stem if path.is_file() else path.resolve().name


def unique_names(runs: list[Run]) -> None:
    """Give runs with the same name their parent folder as a prefix (``a/checkpoints``, ``b/checkpoints``)."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.name] = seen.get(run.name, 0) + 1
    for run in runs:
        if seen[run.name] > 1:
            run.name = f"{run.path.resolve().parent.name}/{run.name}"
