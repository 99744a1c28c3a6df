"""What the launcher checks on this machine before any Ray process starts: ``python -m recipe.diva_grpo.prelaunch``.

``run_scripts/_submit.sh`` runs it with the job's Hydra overrides, before ``ray start``. In about a second it
refuses what the job would refuse a minute later, naming the argument or the file:

1. the job's final config (:mod:`recipe.diva_grpo.job_config`: verl's and the recipe's schema, every method block,
   the overrides given): a malformed override, an unknown key, a value of the wrong type;
2. the data files (same checks, same messages as the job's dataset: :mod:`verl_ext.data.file_checks`): every file
   the user named exists, is parquet, has the columns its role needs, and training and validation differ;
3. a batch that verl would assert on once the model has loaded (:mod:`verl_ext.cluster.batch_arithmetic`),
   printing the rows each rank gets in every pass.

It also creates the folder of verl's metrics log (``VERL_FILE_LOGGER_PATH``, set by the launcher), which verl's
file logger does not create itself.

- ``DRY_RUN=1`` (``diva.dry_run=true``) with no data named at all (the recipe's default files, absent): the
  preflight runs on a synthetic set, and the first line says so (``--closing-note FILE``: the launcher's last line
  too). A file the user named is always the one checked: a named training file beside an absent default
  validation file is refused, never replaced.
- ``RAY_ADDRESS`` set (a remote cluster): files absent from this machine are left to the job, which runs where
  the cluster's storage is; the line says which.

Neither verl, torch nor Ray is imported. Exit status 0 when the checks pass, 2 with ``error: <message>`` on stderr
otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

LOGGER_PATH_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"
DIVA_DATASET = "DivaDataset"
# The recipe's data files when the user names none (launcher and yaml defaults). Only these may be missing in a
# preflight, which then uses a synthetic set; a file the user named must exist.
DEFAULT_DATA_FILES = ("data/diva_train.parquet", "data/diva_val.parquet")
SYNTHETIC_NOTE = (
    "no data named (TRAIN_FILES and VAL_FILES unset, {defaults} absent): this preflight runs on a synthetic set, "
    "not on your data; name TRAIN_FILES and VAL_FILES to check yours"
)


def _log(msg: str) -> None:
    print(f"[diva] {msg}", flush=True)


def launch_config(overrides: list[str]):
    """The job's final config with the Hydra ``overrides`` applied
    (:func:`~recipe.diva_grpo.job_config.compose_job_config`: a ``ValueError`` names the argument of a malformed
    override, an unknown key or a wrong type)."""
    from recipe.diva_grpo.job_config import compose_job_config

    return compose_job_config(overrides)


def _as_list(files) -> list[str]:
    if files is None:
        return []
    if isinstance(files, str):
        return [files]
    return [str(f) for f in files]


def _is_default(path: str) -> bool:
    return path.endswith(DEFAULT_DATA_FILES)


def uses_synthetic_data(train_files, val_files) -> bool:
    """Whether a preflight runs on the synthetic set: only when no data was named at all (every file is one of the
    recipe's defaults, and none exists). A named file beside an absent default is refused (``ValueError``), never
    replaced: the preflight checks the user's data or says it does not."""
    files = _as_list(train_files) + _as_list(val_files)
    absent = [path for path in files if _is_default(path) and not os.path.exists(path)]
    if not absent:
        return False
    if len(absent) == len(files):
        return True
    named = [path for path in files if path not in absent]
    raise ValueError(
        f"the data file(s) {named} are named but {absent} (the recipe's default) does not exist: name the "
        "training and the validation files both (TRAIN_FILES and VAL_FILES, two different parquet files), or "
        "neither for a preflight on a synthetic set"
    )


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
    synthetic = dry_run and uses_synthetic_data(train, val)
    skip: list[str] = []
    if synthetic:
        skip = [os.path.abspath(path) for path in train + val]  # the preflight writes a synthetic set instead
    elif remote:
        # on the cluster's storage, not this machine's: the job checks it
        skip = [os.path.abspath(path) for path in train + val if "://" not in path and not os.path.exists(path)]
    prompt_key = OmegaConf.select(cfg, "data.prompt_key", default="prompt") or "prompt"
    report = check_data_files(train, val, diva=diva, skip=skip, prompt_key=prompt_key)
    report["synthetic"] = synthetic
    report["files"] = train + val
    # The rows each training rank gets in every pass, refused here when verl would assert on them after the model
    # loaded (verl_ext/cluster/batch_arithmetic.py).
    report["batch"] = check_batch_arithmetic(cfg).lines()
    # The preflight writes its own logs into its work folder: no run folder to create for it.
    report["metrics_log"] = None if dry_run else OmegaConf.select(cfg, LOGGER_PATH_KEY)
    return report


def data_lines(report: dict) -> list[str]:
    """What the data check says, one line per file (its role and rows), or that no data was named."""
    if report.get("synthetic"):
        return [SYNTHETIC_NOTE.format(defaults=" and ".join(report["files"]))]
    lines = [f"{report['split'][path]} data {path}: {report['rows'][path]} rows, OK" for path in report["checked"]]
    lines += [f"data {path}: not on this machine, left to the job (which checks it)" for path in report["skipped"]]
    return lines


def prepare_metrics_log(path: str | None) -> None:
    """Create the folder of verl's metrics log (its file logger opens the file without creating the folder)."""
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as err:
        _log(f"note: cannot create the metrics log folder here ({err}); it must exist where the job runs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipe.diva_grpo.prelaunch", description=__doc__.splitlines()[0])
    parser.add_argument("--closing-note", default=None, help="write what the launcher's last line must repeat here")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, help="the job's Hydra overrides")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    overrides = args.overrides[1:] if args.overrides[:1] == ["--"] else args.overrides
    started = time.perf_counter()
    try:
        report = check_launch(overrides)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        elapsed = time.perf_counter() - started
        print(f"[diva] refused in {elapsed:.1f} s, before any Ray process started", file=sys.stderr)
        return 2
    prepare_metrics_log(report["metrics_log"])
    said = data_lines(report)
    for line in said:
        _log(line)
    if report["synthetic"] and args.closing_note:
        with open(args.closing_note, "w") as f:
            f.write(said[0] + "\n")
    for line in report["batch"]:
        _log(f"batch: {line}")
    _log(f"config and data checked in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
