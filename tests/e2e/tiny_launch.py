"""One launch of ``run_scripts/tiny_cpu.sh`` for the end-to-end tests: a clean environment, the output, the summary."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The shared DIVA run (tests/e2e/conftest.py, tiny_diva_run): trains STEPS steps, then resumes for RESUME_STEPS more.
DIVA_STEPS, DIVA_RESUME_STEPS = 3, 1
DIVA_ALL_STEPS = list(range(1, DIVA_STEPS + DIVA_RESUME_STEPS + 1))
# Settings of the calling process that would point the launch at another cluster, platform or folder.
CLEARED = ("RAY_ADDRESS", "VERL_PLATFORM", "DIVA_CPU_PROBE_DIR", "VERL_FILE_LOGGER_ROOT", "DIVA_FAULTS", "MAX_RESTARTS")


def run_tiny_cpu(workdir: Path, run_dir: Path, timeout: int, **settings: str) -> tuple[int, str]:
    """Run the launcher with ``WORKDIR``, ``RUN_DIR`` and ``settings`` (``METHOD``, ``ROLLOUT``, ``STEPS``, ...);
    returns its exit status and output (stdout, then stderr)."""
    env = {**os.environ, "WORKDIR": str(workdir), "RUN_DIR": str(run_dir), **settings}
    for name in CLEARED:
        env.pop(name, None)
    proc = subprocess.run(
        ["bash", "run_scripts/tiny_cpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr


def launch_tiny_cpu(workdir: Path, run_dir: Path, timeout: int, **settings: str) -> tuple[str, dict]:
    """:func:`run_tiny_cpu`; asserts it passed and returns its output and its ``[cpu] summary``."""
    returncode, output = run_tiny_cpu(workdir, run_dir, timeout, **settings)
    assert returncode == 0, output[-8000:]
    assert "[cpu] PASSED" in output, output[-8000:]
    summary_line = [line for line in output.splitlines() if "[cpu] summary " in line][-1]
    return output, json.loads(summary_line.split("[cpu] summary ", 1)[1])
