"""Real CPU training, DIVA-GRPO against verl's GRPO at the same response budget, on both rollouts, in one run.

Both methods train the tiny local Qwen2-VL (``verl_ext.cpu``) for ``--steps`` steps with verl's own trainer and FSDP2
worker, one after the other in one Ray session (one logical GPU), on each rollout of ``--rollouts``: the project's
``hf_cpu`` server and verl's own vLLM rollout on vLLM's CPU build (the main job's stack: run this script in the
environment of ``run_scripts/setup_vllm_cpu.sh``; without vLLM only ``hf_cpu`` is measured). Same settings on
both, but for what vLLM's CPU build needs (``verl_ext.cpu.vllm_launcher.vllm_engine_overrides``):

* DIVA: 2 questions x (original + 1 variant) prompts x n=4 responses (``trainer_mode=diva_grpo``);
* GRPO: 2 questions x 1 prompt x n=8 responses (verl's own trainer, ``trainer_mode=sync``, and ``RLHFDataset``):
  16 responses each.

Reported per rollout and method: wall time per step (median of the steps after the first, verl's
``timing_s/step``), the generation, weight-sync and actor-update parts, and the peak memory (PSS, sampled every
second) summed over every process of the Ray session. DIVA's own CPU work per step, as a fraction of its step on
each rollout: building the step's prompts (original + variant, image perturbation: timed on DivaDataset against
RLHFDataset for the same questions, the difference is DIVA's; easy, middling and hard questions in turn), the
advantage (``diva/timing_s/advantage``, TransferQueue reads included) and the difficulty update (send + finish).
The paper reports DIVA at +4% per step over GRPO on GPUs at equal responses.

The last line printed is one JSON object with the figures. ``--quick``: 2 steps per method (one timed step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from record import add_no_record, record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG_DIR = ROOT / "recipe" / "diva_grpo" / "config"


class PeakMemory:
    """Peak of the summed PSS (proportional set size: a page shared by k processes counts 1/k in each) of this
    process and all its descendants (the Ray session it started); RSS would count torch's shared libraries once
    per process."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil

        me = psutil.Process()
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_full_info().pss
            except psutil.Error:
                pass
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose("diva_grpo", overrides=overrides)


def run_method(
    method: str,
    paths: dict,
    workdir: str,
    steps: int,
    rollout: str = "hf_cpu",
    experiment_tag: str = "",
    extra_overrides: tuple[str, ...] = (),
) -> dict:
    """Train ``method`` for ``steps`` steps in this process; its step timings and peak memory. ``experiment_tag``
    tells apart runs of one method and rollout that share a metrics folder (``bench_tiny_arch.py``);
    ``extra_overrides`` come last (``bench_tiny_arch.py``: verl's own poll interval)."""
    from recipe.diva_grpo.main_diva import train
    from verl_ext.checks.session import release_finished_run
    from verl_ext.cpu.overrides import cpu_overrides
    from verl_ext.cpu.vllm_launcher import vllm_engine_overrides

    run_dir = os.path.join(workdir, f"{rollout}_{method}{'_' + experiment_tag if experiment_tag else ''}")
    experiment = f"bench_{rollout}_{method}{'_' + experiment_tag if experiment_tag else ''}"
    overrides = cpu_overrides(
        paths,
        os.path.join(run_dir, "checkpoints"),
        method=method,
        steps=steps,
        save_freq=-1,
        test_freq=-1,
        experiment=experiment,
    )
    overrides.append("trainer.val_before_train=false")  # training steps only
    if rollout == "vllm":
        overrides += ["actor_rollout_ref.rollout.name=vllm", *vllm_engine_overrides()]
    if method == "grpo":
        overrides.append("trainer.v1.trainer_mode=sync")  # verl's own trainer: the baseline the paper's +4% is over
    config = compose([*overrides, *extra_overrides])
    started = time.perf_counter()
    with PeakMemory() as memory:
        train(config)
    wall = time.perf_counter() - started
    release_finished_run()
    path = os.path.join(os.environ["VERL_FILE_LOGGER_ROOT"], config.trainer.project_name, f"{experiment}.jsonl")
    with open(path) as f:
        entries = [json.loads(line)["data"] for line in f if line.strip()]
    entries = [e for e in entries if "timing_s/step" in e]
    if len(entries) != steps:
        raise RuntimeError(f"{method}: {len(entries)} steps logged, expected {steps}")
    timed = entries[1:] if len(entries) > 1 else entries

    def median(key: str) -> float:
        return statistics.median(float(e.get(key, 0.0)) for e in timed)

    out = {
        "step_s": median("timing_s/step"),
        "first_step_s": float(entries[0]["timing_s/step"]),
        "gen_s": median("timing_s/gen"),
        "update_weights_s": median("timing_s/update_weights"),
        "update_actor_s": median("timing_s/update_actor"),
        "old_log_prob_s": median("timing_s/old_log_prob"),
        "adv_s": median("timing_s/adv"),
        "responses_per_step": int(config.data.train_batch_size * config.actor_rollout_ref.rollout.n),
        "peak_pss_gb": memory.peak / 2**30,
        "run_wall_s": wall,
    }
    if method == "diva":
        out["diva_advantage_s"] = median("diva/timing_s/advantage")
        out["diva_difficulty_s"] = median("diva/timing_s/difficulty_send") + median("diva/timing_s/difficulty_finish")
    return out


def dataset_extra_s(paths: dict, repeats: int) -> dict:
    """Seconds to build one step's prompts with DivaDataset (2 questions x (original + variant); questions at
    D = 1, 5, 9 in turn, so perturbations, paraphrases and hints) and with RLHFDataset (the same 2 questions), in
    this process, mean over ``repeats`` different steps; the difference is DIVA's dataset work."""
    from verl.utils import hf_processor, hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.cpu.overrides import cpu_overrides
    from verl_ext.data.dataset import DivaDataset

    # No long-prompt filter: it is start-up work, not per-step work (the tiny prompts are far below the limit), and
    # its `datasets` worker pool forks this process, which by now holds Ray's and torch's threads (a fork there
    # was seen to hang in the image processor).
    config = compose([*cpu_overrides(paths, "/tmp/unused", method="diva"), "data.filter_overlong_prompts=false"])
    tokenizer = hf_tokenizer(paths["model"])
    processor = hf_processor(paths["model"])
    diva = DivaDataset(data_files=[paths["train"]], tokenizer=tokenizer, config=config.data, processor=processor)
    plain = RLHFDataset(data_files=[paths["train"]], tokenizer=tokenizer, config=config.data, processor=processor)
    block = diva.block_size
    # Easy, middling and hard questions in turn, so that image perturbations, paraphrases and hints are all timed
    # (the tiny run itself starts every question at D = 5: paraphrases only).
    import torch

    table = diva.difficulty_table.values
    spread = torch.tensor([1.0, 5.0, 9.0], dtype=table.dtype)
    table.copy_(spread[torch.arange(len(table)) % 3])

    def time_batches(dataset, indices_of) -> float:
        # Mean over `repeats` different steps: the steps differ in their questions' variant kinds.
        seconds = []
        for r in range(repeats):
            t0 = time.perf_counter()
            for i in indices_of(r):
                dataset[i]
            seconds.append(time.perf_counter() - t0)
        return statistics.mean(seconds)

    # Questions 2r and 2r+1: DIVA prompt rows are question * block + slot.
    diva_s = time_batches(diva, lambda r: [q * block + s for q in (2 * r, 2 * r + 1) for s in range(block)])
    plain_s = time_batches(plain, lambda r: [2 * r, 2 * r + 1])
    return {"diva_dataset_s": diva_s, "rlhf_dataset_s": plain_s, "dataset_extra_s": max(diva_s - plain_s, 0.0)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 steps per method")
    parser.add_argument("--steps", type=int, default=5, help="steps per method (the first is not timed)")
    parser.add_argument("--workdir", default=None, help="folder for model, data and runs (default: a temp folder)")
    parser.add_argument(
        "--rollouts",
        nargs="+",
        choices=("hf_cpu", "vllm"),
        default=None,
        help="rollouts to measure (default: hf_cpu, and vllm where vLLM imports)",
    )
    add_no_record(parser)
    args = parser.parse_args(argv)
    steps = 2 if args.quick else args.steps
    rollouts = args.rollouts or ["hf_cpu", *(["vllm"] if _has_vllm() else [])]

    from verl_ext.cpu import CPU_ENV
    from verl_ext.cpu.vllm_launcher import VLLM_CPU_ENV

    # This driver and every Ray process it starts (they inherit its environment; ray_init's runtime env too).
    os.environ.update({**CPU_ENV, **VLLM_CPU_ENV})
    from verl_ext.cpu.launch import prepare

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_e2e_cpu_")
    # One metrics folder for both runs, set before Ray starts: the Ray processes inherit it (experiment names differ).
    os.environ["VERL_FILE_LOGGER_ROOT"] = os.path.join(workdir, f"metrics_{os.getpid()}")
    paths = prepare(workdir)
    results = {}
    for rollout in rollouts:
        for method in ("diva", "grpo"):
            results[rollout, method] = run_method(method, paths, workdir, steps, rollout)
            print(f"[bench] {rollout} {method}: {json.dumps(results[rollout, method])}", flush=True)
    data = dataset_extra_s(paths, repeats=6)  # questions 0..11: every (easy, middling, hard) pairing twice
    figures = {"steps_per_method": steps, "rollouts": rollouts, "paper_gpu_step_overhead": 0.04}
    for rollout in rollouts:
        diva, grpo = results[rollout, "diva"], results[rollout, "grpo"]
        own = data["dataset_extra_s"] + diva["diva_advantage_s"] + diva["diva_difficulty_s"]
        figures[rollout] = {
            "responses_per_step": diva["responses_per_step"],
            "diva_step_s": round(diva["step_s"], 3),
            "grpo_step_s": round(grpo["step_s"], 3),
            "step_ratio_diva_over_grpo": round(diva["step_s"] / grpo["step_s"], 3),
            "diva_first_step_s": round(diva["first_step_s"], 3),
            "diva_gen_s": round(diva["gen_s"], 3),
            "grpo_gen_s": round(grpo["gen_s"], 3),
            "diva_update_weights_s": round(diva["update_weights_s"], 4),
            "grpo_update_weights_s": round(grpo["update_weights_s"], 4),
            "diva_update_actor_s": round(diva["update_actor_s"], 3),
            "grpo_update_actor_s": round(grpo["update_actor_s"], 3),
            "diva_peak_pss_gb": round(diva["peak_pss_gb"], 2),
            "grpo_peak_pss_gb": round(grpo["peak_pss_gb"], 2),
            "diva_own_s": round(own, 4),
            "diva_own_fraction_of_step": round(own / diva["step_s"], 4),
            "diva_own_parts_s": {
                "dataset_expansion_and_perturbation": round(data["dataset_extra_s"], 4),
                "advantage": round(diva["diva_advantage_s"], 4),
                "difficulty_update": round(diva["diva_difficulty_s"], 4),
            },
        }
    header = "rollout  step DIVA | GRPO (ratio)   gen DIVA   sync DIVA   peak PSS DIVA | GRPO   DIVA's own"
    print(f"[bench] {header}", flush=True)
    for rollout in rollouts:
        f = figures[rollout]
        print(
            f"[bench] {rollout:7s}  {f['diva_step_s']:.2f} s | {f['grpo_step_s']:.2f} s "
            f"({f['step_ratio_diva_over_grpo']:.2f}x)   {f['diva_gen_s']:.2f} s   {f['diva_update_weights_s']:.3f} s   "
            f"{f['diva_peak_pss_gb']:.1f} GB | "
            f"{f['grpo_peak_pss_gb']:.1f} GB   {100 * f['diva_own_fraction_of_step']:.1f}% of its step",
            flush=True,
        )
    if "vllm" in rollouts and "hf_cpu" in rollouts:
        ratio = figures["vllm"]["diva_step_s"] / figures["hf_cpu"]["diva_step_s"]
        figures["vllm_over_hf_cpu_diva_step"] = round(ratio, 3)
    if not args.no_record:
        record("e2e_cpu_quick" if args.quick else "e2e_cpu", figures, argv)
    print(json.dumps(figures), flush=True)
    return figures


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


if __name__ == "__main__":
    main()
