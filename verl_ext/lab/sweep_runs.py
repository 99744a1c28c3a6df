"""The seed sweep's runs: where each goes (:func:`run_dir`), the protocol its figures depend on (:func:`run_protocol`,
the warm start's fingerprint and the machine kind beside it) and the run itself, trained once and reused while the
protocol holds (:func:`run_config`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from verl_ext.lab.runs import method_run
from verl_ext.lab.sweep_configs import CONFIGS, VAL_SAMPLES
from verl_ext.lab.tasks import task_overrides

# The sparse task's runs keep their learning-signal means (verl_ext.lab.learning_signal.run_means) here, written when
# the run finishes from its probe records (which the recorded runs do not keep); a swatch run's table reads none.
SIGNAL_FILE = "signal.json"


def run_dir(out: Path, config: str, seed: int) -> Path:
    return out / config / f"seed{seed}"


def warm_start_fingerprint(model_dir: str) -> str:
    """The first 16 hex digits of the warm start's weights' SHA-256: runs are paired only from the same start."""
    digest = hashlib.sha256()
    with open(Path(model_dir) / "model.safetensors", "rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def run_protocol(
    *, steps: int, test_freq: int, questions: int, rollout_n: int, warm_start: str, task: str = "swatch"
) -> dict:
    """What a run's figures depend on beside its configuration and seed; kept in its ``done.json``. (The swatch
    task's protocol has no ``task`` key: its recorded runs were written before there was another task.)"""
    protocol = {
        "steps": steps,
        "test_freq": test_freq,
        "questions_per_step": questions,
        "rollout_n": rollout_n,
        "val_samples": VAL_SAMPLES,
        "warm_start": warm_start,
    }
    return protocol if task == "swatch" else {**protocol, "task": task}


def machine_kind() -> dict:
    """What a run's floats depend on beyond its code and seed: the CPU, the kernels torch picks for it, the threads and
    the libraries. Kept in each run's ``done.json`` (not in its protocol: the warm start's fingerprint is what pairs
    runs, and it changes with these)."""
    import platform

    import torch
    import transformers

    cpu, flags = platform.processor() or platform.machine(), set()
    kernel_relevant = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:  # not Linux: the model name from platform, no flags
        pass
    return {
        "cpu": cpu,
        "cpu_extensions": sorted(flags & kernel_relevant),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _protocol_difference(got: dict | None, want: dict) -> str:
    if got is None:
        return "no protocol recorded (an older sweep's run)"
    return ", ".join(f"{k} {got.get(k)!r} (here {v!r})" for k, v in want.items() if got.get(k) != v)


def _another_protocol(folder: Path, record: dict, protocol: dict) -> ValueError:
    message = (
        f"{folder} finished under another protocol: {_protocol_difference(record.get('protocol'), protocol)}."
        " Its figures cannot be paired with this sweep's: use another OUT, or this run's settings"
    )
    if (record.get("protocol") or {}).get("warm_start") not in (None, protocol["warm_start"]):
        # Same code and seed, other weights: float kernels sum in another order on another CPU or library version,
        # and 300 steps of training carry the difference into every sample (docs/learning.md, "Which runs pair").
        recorded = record.get("machine")
        message += (
            ". The warm start is rebuilt from the same code and seed, so its weights differ with the CPU kind or the"
            f" libraries: recorded on {recorded if recorded else 'a machine its done.json does not name'}, here"
            f" {machine_kind()}. Finish this sweep on the machine kind that recorded it, or start another OUT"
        )
    return ValueError(message)


def _finished(folder: Path, protocol: dict) -> dict | None:
    """The run's ``done.json`` if it finished (under ``protocol``: another one is an error), else ``None``."""
    done = folder / "done.json"
    if not done.exists():
        return None
    record = json.loads(done.read_text())
    if record.get("protocol") != protocol:
        raise _another_protocol(folder, record, protocol)
    return record


def check_protocol(out: Path, configs: list[str], seeds: list[int], protocol: dict) -> None:
    """Refuse, before anything trains, a sweep whose finished runs under ``out`` ran under another protocol."""
    for config in configs:
        for seed in seeds:
            _finished(run_dir(out, config, seed), protocol)


def run_config(out: Path, config: str, seed: int, paths: dict, *, protocol: dict) -> dict:
    """Train ``config`` at ``seed`` under ``protocol`` (:func:`run_protocol`) unless it finished before under the
    same protocol; returns its ``done.json``. A run finished under another protocol is an error, not reused.
    The sparse task's runs also measure, from their final weights, the questions they solve
    (:func:`verl_ext.lab.solved_questions.solved_record`)."""
    task = protocol.get("task", "swatch")
    folder = run_dir(out, config, seed)
    record = _finished(folder, protocol)
    if record is not None:
        return record
    if folder.exists():  # cut short: its metrics would mix two attempts
        shutil.rmtree(folder)
    spec = CONFIGS[config]
    timing = method_run(
        spec.method,
        paths,
        out,
        steps=protocol["steps"],
        test_freq=protocol["test_freq"],
        seed=seed,
        questions=protocol["questions_per_step"],
        rollout_n=protocol["rollout_n"] * spec.budget,
        run_dir=folder,
        without=spec.without,
        extra=(*spec.extra, *task_overrides(task)),
        val_samples=VAL_SAMPLES,
    )
    if task == "sparse":  # before the checkpoints go: which unsolved questions the final policy solves
        from verl_ext.lab.learning_signal import run_means, signal_figures
        from verl_ext.lab.solved_questions import solved_record

        solved_record(folder, paths["model"], paths["questions"], paths["properties"], seed=0)
        (folder / SIGNAL_FILE).write_text(json.dumps(run_means(signal_figures(str(folder)))))
    record = {
        "config": config,
        "seed": seed,
        "minutes": round(timing["seconds"] / 60, 2),
        "responses_per_question": 2 * protocol["rollout_n"] * spec.budget,
        "protocol": protocol,
        "machine": machine_kind(),
    }
    # Checkpoints are not needed once the run finished (a few hundred MB each run, 16 x 3 runs).
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    (folder / "done.json").write_text(json.dumps(record))
    return record
