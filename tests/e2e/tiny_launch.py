"""One launch of ``run_scripts/tiny_cpu.sh`` for the end-to-end tests: a clean environment, the output, the summary."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Settings of the calling process that would point the launch at another cluster, platform or folder.
CLEARED = ("RAY_ADDRESS", "VERL_PLATFORM", "DIVA_CPU_PROBE_DIR", "VERL_FILE_LOGGER_ROOT")


def launch_tiny_cpu(workdir: Path, run_dir: Path, timeout: int, **settings: str) -> tuple[str, dict]:
    """Run the launcher with ``WORKDIR``, ``RUN_DIR`` and ``settings`` (``METHOD``, ``ROLLOUT``, ``STEPS``, ...);
    asserts it passed and returns its output and its ``[cpu] summary``."""
    env = {**os.environ, "WORKDIR": str(workdir), "RUN_DIR": str(run_dir), **settings}
    for name in CLEARED:
        env.pop(name, None)
    proc = subprocess.run(
        ["bash", "run_scripts/tiny_cpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    assert "[cpu] PASSED" in output, output[-8000:]
    summary_line = [line for line in output.splitlines() if "[cpu] summary " in line][-1]
    return output, json.loads(summary_line.split("[cpu] summary ", 1)[1])
