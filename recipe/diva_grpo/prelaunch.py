"""What the launcher checks on this machine before any Ray process starts: ``python -m recipe.diva_grpo.prelaunch``.

``run_scripts/_submit.sh`` runs it with the job's Hydra overrides, before ``ray start``. In about a second it
refuses the data files the job would refuse a minute later (same checks, same messages:
:mod:`verl_ext.data.file_checks`): a file that is missing or not readable parquet, a training file without the DIVA
columns, the same file as training and validation data; and a batch that verl would assert on once the model has
loaded (:mod:`verl_ext.cluster.batch_arithmetic`), printing the rows each rank gets in every pass. It also creates
the folder of verl's metrics log (``VERL_FILE_LOGGER_PATH``, set by the launcher), which verl's file logger does not
create itself.

Only the recipe yaml and the overrides are composed (verl's defaults are not loaded: that imports verl and torch,
tens of seconds); the job composes the full config and checks again.

- ``DRY_RUN=1`` (``diva.dry_run=true``): the recipe's default data files may be missing (the preflight then writes
  a synthetic set); files the user named must exist.
- ``RAY_ADDRESS`` set (a remote cluster): files absent from this machine are left to the job, which runs where
  the cluster's storage is.

Exit status 0 when the files pass, 2 with ``error: <message>`` on stderr otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

CONFIG_PATH = Path(__file__).resolve().parent / "config" / "diva_grpo.yaml"
LOGGER_PATH_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"
DIVA_DATASET = "DivaDataset"
# The recipe's data files when the user names none (launcher and yaml defaults). Only these may be missing in a
# preflight, which then uses a synthetic set; a file the user named must exist.
DEFAULT_DATA_FILES = ("data/diva_train.parquet", "data/diva_val.parquet")


def _log(msg: str) -> None:
    print(f"[diva] {msg}", flush=True)


def launch_config(overrides: list[str]):
    """The recipe yaml with the Hydra ``overrides`` applied (``key=v``, ``+key=v``, ``++key=v``, ``~key``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(CONFIG_PATH)
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if override.is_delete():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if node is not None and leaf in node:
                del node[leaf]
            continue
        OmegaConf.update(cfg, key, override.value(), merge=False, force_add=True)
    return cfg


def _as_list(files) -> list[str]:
    if files is None:
        return []
    if isinstance(files, str):
        return [files]
    return [str(f) for f in files]


def check_launch(overrides: list[str], remote: bool | None = None) -> dict:
    """Run the checks for a launch with ``overrides``; returns what was checked. Raises ``ValueError``."""
    from omegaconf import OmegaConf

    from verl_ext.cluster.batch_arithmetic import check_batch_arithmetic
    from verl_ext.data.file_checks import check_data_files

    if remote is None:
        remote = bool(os.environ.get("RAY_ADDRESS"))
    cfg = launch_config(overrides)
    train = _as_list(OmegaConf.select(cfg, "data.train_files"))
    val = _as_list(OmegaConf.select(cfg, "data.val_files"))
    diva = OmegaConf.select(cfg, "data.custom_cls.name") == DIVA_DATASET
    dry_run = bool(OmegaConf.select(cfg, "diva.dry_run", default=False))
    skip: list[str] = []
    for path in train + val:
        if "://" in path or os.path.exists(path):
            continue
        if dry_run and path.endswith(DEFAULT_DATA_FILES):
            skip.append(os.path.abspath(path))  # the preflight writes a synthetic set instead
        elif remote:
            skip.append(os.path.abspath(path))  # on the cluster's storage, not this machine's: the job checks it
    report = check_data_files(train, val, diva=diva, skip=skip)
    # The rows each training rank gets in every pass, refused here when verl would assert on them after the model
    # loaded (verl_ext/cluster/batch_arithmetic.py).
    report["batch"] = check_batch_arithmetic(cfg).lines()
    # The preflight writes its own logs into its work folder: no run folder to create for it.
    report["metrics_log"] = None if dry_run else OmegaConf.select(cfg, LOGGER_PATH_KEY)
    return report


def prepare_metrics_log(path: str | None) -> None:
    """Create the folder of verl's metrics log (its file logger opens the file without creating the folder)."""
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as err:
        _log(f"note: cannot create the metrics log folder here ({err}); it must exist where the job runs")


def main(argv: list[str] | None = None) -> int:
    overrides = sys.argv[1:] if argv is None else argv
    started = time.perf_counter()
    try:
        report = check_launch(overrides)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    prepare_metrics_log(report["metrics_log"])
    checked = ", ".join(report["checked"]) or "none"
    line = f"data files OK in {time.perf_counter() - started:.1f} s: {checked}"
    if report["skipped"]:
        line += f" (left to the job: {', '.join(report['skipped'])})"
    _log(line)
    for line in report["batch"]:
        _log(f"batch: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
