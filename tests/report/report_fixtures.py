"""Run folders written the way a training run leaves them: verl file-logger JSONL files and checkpoint states."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from verl_ext.difficulty import DifficultyTracker, checkpoint_state_path, save_state


def write_log(path: Path, records: list[tuple[int, dict]], newline_at_end: bool = True) -> Path:
    """One verl ``FileLogger`` file: ``{"step": s, "data": {...}}`` per line (NaN written as null, as orjson)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": step, "data": data}) for step, data in records]
    path.write_text("\n".join(lines) + ("\n" if newline_at_end else ""), encoding="utf-8")
    return path


def validation_curve(steps, accs: dict[str, list[float]]) -> dict[int, dict]:
    """``{step: {"val-core/<source>/acc/mean@1": acc, ...}}``."""
    out: dict[int, dict] = {}
    for source, values in accs.items():
        for step, value in zip(steps, values, strict=True):
            out.setdefault(step, {})[f"val-core/{source}/acc/mean@1"] = value
            out[step][f"val-aux/{source}/reward/mean@1"] = 0.9 * value + 0.1
    return out


def training_run(
    folder: Path,
    steps: int,
    val_every: int,
    accs: dict[str, list[float]],
    seed: int = 0,
    diva: bool = True,
    save_every: int | None = None,
    files: int = 1,
) -> Path:
    """A run folder: ``logs/metrics_*.jsonl`` (``files`` launches, each resuming the last) and, for a DIVA run with
    ``save_every``, ``global_step_N/diva_difficulty.json``. ``accs[source]`` holds one value per validation step
    (0, val_every, 2 * val_every, ...)."""
    rng = np.random.default_rng(seed)
    val_steps = list(range(0, steps + 1, val_every))
    validation = validation_curve(val_steps, accs)
    tracker = DifficultyTracker()
    records = []
    for step in range(0, steps + 1):
        data = dict(validation.get(step, {}))
        if step > 0:
            data["critic/score/mean"] = float(rng.uniform(0.2, 0.8))
            data["response_length/mean"] = float(rng.uniform(300, 900))
            data["critic/values/mean"] = None  # verl writes NaN as null
            if diva:
                data["diva/collapse_rate/local"] = float(rng.uniform(0, 0.6))
                data["diva/collapse_rate/global"] = float(rng.uniform(0, 0.4))
                data["diva/variant_mix/original"] = 0.5
                data["diva/variant_mix/paraphrase"] = 0.25
                data["diva/variant_mix/image_perturb"] = 0.25
                data["diva/variant_fallbacks"] = float(rng.integers(0, 3))
                tracker.update([f"q{i}" for i in rng.choice(40, 8, replace=False)], rng.uniform(0, 1, 8), step)
                data["diva/difficulty/mean"] = tracker.metrics()["diva/difficulty/mean"]
            else:
                data["grpo/collapse_rate"] = float(rng.uniform(0, 0.7))
        if data:
            records.append((step, data))
        if diva and save_every and step > 0 and step % save_every == 0:
            save_state(tracker.state_dict(), checkpoint_state_path(str(folder / f"global_step_{step}")))
    chunk = -(-len(records) // files)
    for launch in range(files):
        path = write_log(folder / "logs" / f"metrics_{launch}.jsonl", records[launch * chunk : (launch + 1) * chunk])
        stamp = time.time() - 1000 + launch  # write order = launch order
        os.utime(path, (stamp, stamp))
    return folder


# The collapse-rate keys each method logs (verl_ext/methods/*, verl_ext/algos/mupo.py).
METHOD_COLLAPSE_KEYS = {
    "GRPO": ("grpo/collapse_rate",),
    "DIVA-GRPO": ("diva/collapse_rate/local", "diva/collapse_rate/global"),
    "AVSPO": ("avspo/collapse_rate/before", "avspo/collapse_rate/after"),
    "CoDaPO": ("codapo/collapse_rate",),
    "Durian": ("durian/collapse_rate",),
    "PGPO": ("pgpo/collapse_rate",),
    "MUPO": ("mupo/collapse_rate/partition", "mupo/collapse_rate/prompt"),
    "NC-GRPO": ("noise_contrastive_grpo/collapse_rate",),
}


def method_runs(folder: Path, steps: int = 30, val_every: int = 5, same_as: dict[str, str] | None = None) -> dict:
    """One run folder per method of :data:`METHOD_COLLAPSE_KEYS` (``folder/<name>``), each with its own collapse
    keys, reward, response length and validation on two benchmarks; ``same_as``: ``{run: other}`` runs whose
    series are the other's, value for value (their collapse key renamed to their own). Returns ``{name: path}``."""
    same_as = same_as or {}
    val_steps = list(range(0, steps + 1, val_every))
    records_of: dict[str, list] = {}
    for index, (name, keys) in enumerate(METHOD_COLLAPSE_KEYS.items()):
        rng = np.random.default_rng(100 + index)
        gain = 0.15 + 0.03 * index
        validation = validation_curve(
            val_steps,
            {
                source: [float(0.3 + offset + gain * (1 - np.exp(-s / 12)) + rng.normal(0, 0.01)) for s in val_steps]
                for source, offset in (("mathvista", 0.05), ("wemath", 0.0))
            },
        )
        records = []
        for step in range(0, steps + 1):
            data = dict(validation.get(step, {}))
            if step > 0:
                data["critic/score/mean"] = float(0.3 + gain * (1 - np.exp(-step / 10)) + rng.normal(0, 0.02))
                data["response_length/mean"] = float(600 - 4 * index * step / 3 + rng.normal(0, 15))
                for k, key in enumerate(keys):
                    data[key] = float(np.clip(0.6 - 0.01 * step * (1 + index / 4) * (1 - 0.35 * k), 0, 1))
            records.append((step, data))
        records_of[name] = records
    paths = {}
    for name, keys in METHOD_COLLAPSE_KEYS.items():
        records = records_of[name]
        if name in same_as:
            other_key = METHOD_COLLAPSE_KEYS[same_as[name]][0]
            records = [
                (step, {(keys[0] if key == other_key else key): value for key, value in data.items()})
                for step, data in records_of[same_as[name]]
            ]
        paths[name] = folder / name
        write_log(paths[name] / "logs" / "metrics_0.jsonl", records)
    return paths
