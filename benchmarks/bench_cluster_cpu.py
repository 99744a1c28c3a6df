"""World size 2 against world size 1 at equal settings, on the CPU cluster: step time, weight sync, memory per node.

Launches ``run_scripts/tiny_cpu.sh`` (DIVA, the tiny Qwen2-VL, ``--steps`` steps, no resume) twice per rollout: on one
Ray node (one training rank, one rollout replica) and on ``NODES=2`` (two ranks, a replica per node), the same seed and
responses per step. While each runs, every node's processes (the descendants of its ``ray start``: raylet, workers,
rollout servers; the head's also the GCS and dashboard) are sampled each second for their summed PSS (a page shared
by k processes counts 1/k in each). Reported per rollout and world size: verl's ``timing_s/step`` (median of the steps
after the first), ``timing_s/update_weights`` (the sync of the trained weights to every replica) and ``timing_s/gen``,
the peak memory of each node; and the ratios world size 2 / world size 1 side by side. On 2 cores, two ranks share
the cores one rank had: the ratio shows what the extra rank, replica and collectives cost, not a GPU cluster's speed-up.

``--rollouts hf_cpu vllm`` (vLLM needs the GPU stack's environment first on PATH). The last line printed is one JSON
object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from record import add_no_record, record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _node_roots(launcher: int) -> dict[str, int]:
    """``{node name: pid}`` of the processes that run each Ray node the ``launcher`` process started (``ray start
    --head``, the head; the ``verl_ext.cluster.local_node`` launcher of each further node)."""
    import psutil

    roots = {}
    try:
        procs = psutil.Process(launcher).children(recursive=True)
    except psutil.Error:
        return roots
    for proc in procs:
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "ray start --head" in cmd:
            roots["head"] = proc.pid
        elif "verl_ext.cluster.local_node" in cmd:
            match = re.search(r"--node-name=(\S+)", cmd)
            roots[match.group(1) if match else f"node-{proc.pid}"] = proc.pid
    return roots


def _tree_pss(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except psutil.Error:
            pass
    return total


class NodeMemory:
    """Peak summed PSS of each Ray node's process tree that ``launcher`` started, sampled every ``interval_s``."""

    def __init__(self, launcher: int, interval_s: float = 1.0):
        self.launcher = launcher
        self.interval_s = interval_s
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for name, pid in _node_roots(self.launcher).items():
                self.peak[name] = max(self.peak.get(name, 0), _tree_pss(pid))
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def step_timings(run_dir: Path) -> dict[str, float]:
    """Medians over the steps after the first of verl's step, weight-sync and generation times (seconds)."""
    steps: dict[int, dict] = {}
    for path in sorted(run_dir.glob("metrics/*/*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            if "timing_s/step" in entry["data"]:
                steps[entry["step"]] = entry["data"]
    later = [steps[s] for s in sorted(steps)[1:]] or list(steps.values())
    if not later:
        raise RuntimeError(f"no step timings in {run_dir}/metrics")
    return {
        key: statistics.median(d[f"timing_s/{key}"] for d in later)
        for key in ("step", "update_weights", "gen")
        if all(f"timing_s/{key}" in d for d in later)
    }


def launch(workdir: Path, rollout: str, nodes: int, steps: int) -> dict:
    run_dir = workdir / f"run_{rollout}_{nodes}n"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "NODES", "GPUS_PER_NODE", "TP")}
    env.update(
        WORKDIR=str(workdir), RUN_DIR=str(run_dir), METHOD="diva", ROLLOUT=rollout, NODES=str(nodes),
        STEPS=str(steps), RESUME_STEPS="0",
    )  # fmt: skip
    started = time.perf_counter()
    log = run_dir.parent / f"{run_dir.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "run_scripts/tiny_cpu.sh"], cwd=ROOT, env=env, stdout=out, stderr=out)
        with NodeMemory(proc.pid) as memory:
            returncode = proc.wait(timeout=3600)
    if returncode != 0:
        raise RuntimeError(f"{rollout} at {nodes} node(s) failed: see {log}")
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        **{f"{k}_s": round(v, 3) for k, v in step_timings(run_dir).items()},
        "peak_memory_gb": {name: round(pss / 2**30, 2) for name, pss in sorted(memory.peak.items())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", nargs="+", default=["hf_cpu"], choices=["hf_cpu", "vllm"])
    parser.add_argument("--steps", type=int, default=4, help="training steps per launch (the first is not timed)")
    parser.add_argument("--workdir", default=None, help="folder for the tiny model, data and runs (default: a temp)")
    add_no_record(parser)
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_cluster_"))
    workdir.mkdir(parents=True, exist_ok=True)  # a --workdir that does not exist yet
    figures: dict = {}
    for rollout in args.rollouts:
        one, two = launch(workdir, rollout, 1, args.steps), launch(workdir, rollout, 2, args.steps)
        ratios = {
            f"{key}_ratio": round(two[key] / one[key], 2)
            for key in ("step_s", "update_weights_s", "gen_s")
            if key in one and key in two and one[key] > 0
        }
        figures[rollout] = {"world_1": one, "world_2": two, **ratios}
        print(f"{rollout}: median step {one.get('step_s')} s at world size 1, {two.get('step_s')} s at 2 "
              f"({ratios.get('step_s_ratio')}x); weight sync {one.get('update_weights_s')} s to 1 replica, "
              f"{two.get('update_weights_s')} s to 2 ({ratios.get('update_weights_s_ratio')}x); generation "
              f"{ratios.get('gen_s_ratio')}x")  # fmt: skip
        print(f"{rollout}: peak memory per node (GB): world size 1 {one['peak_memory_gb']}, "
              f"world size 2 {two['peak_memory_gb']}")  # fmt: skip
    if not args.no_record:
        record("cluster_cpu", figures, argv)
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
