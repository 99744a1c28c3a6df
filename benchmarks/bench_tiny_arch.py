"""Step time of the tiny Qwen2.5-VL (the 7B job's model class, the CPU runs' default) against the tiny Qwen2-VL.

DIVA-GRPO trains each architecture for ``--steps`` steps with verl's trainer and FSDP2 worker in one Ray session
(one logical GPU), on each rollout of ``--rollouts`` (``hf_cpu``; verl's vLLM rollout where vLLM imports, the
environment of ``run_scripts/setup_vllm_cpu.sh``), with the settings of ``run_scripts/tiny_cpu.sh``
(``verl_ext.cpu.overrides.cpu_overrides``: 2 questions x (original + variant) x 4 responses, 24 new tokens, 84 x 84
images). The two architectures have the same text model (hidden 64, 2 layers) and vision patch and merge sizes;
Qwen2.5-VL's vision tower adds window attention (full attention in its last block), RMSNorm and a gated MLP.

Reported per rollout and architecture: wall time per step (median of the steps after the first, verl's
``timing_s/step``) and its generation, old-log-prob and actor-update parts, and the ratio Qwen2.5-VL / Qwen2-VL.
The two architectures run in turn on each rollout (Qwen2-VL first); the machine's noise is that of one run.

The poll interval: the tiny Qwen2.5-VL runs once more on each rollout with verl's replay-buffer poll interval (2.0 s,
``trainer.v1.sampler.sampler_kwargs.poll_interval_s``) instead of the CPU runs' 0.1 s
(:data:`verl_ext.cpu.overrides.POLL_INTERVAL_S`): the step time before and after, and their ratio.

The figures are saved to ``benchmarks/results/tiny_arch/tiny_arch.json`` (``--no-record``: printed only).

    python benchmarks/bench_tiny_arch.py            # 5 steps per run
    python benchmarks/bench_tiny_arch.py --quick    # 2 steps per run (one timed)

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

ARCHS = ("qwen2_vl", "qwen2_5_vl")
VERL_POLL = "qwen2_5_vl_verl_poll"
VERL_POLL_OVERRIDE = "trainer.v1.sampler.sampler_kwargs.poll_interval_s=2.0"


def main(argv: list[str] | None = None) -> dict:
    from bench_e2e_cpu import _has_vllm, run_method
    from record import add_no_record, record

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 steps per run")
    parser.add_argument("--steps", type=int, default=5, help="steps per run (the first is not timed)")
    parser.add_argument("--workdir", default=None, help="folder for models, data and runs (default: a temp folder)")
    parser.add_argument("--rollouts", nargs="+", choices=("hf_cpu", "vllm"), default=None)
    add_no_record(parser)
    args = parser.parse_args(argv)
    steps = 2 if args.quick else args.steps
    rollouts = args.rollouts or ["hf_cpu", *(["vllm"] if _has_vllm() else [])]

    from verl_ext.cpu import CPU_ENV
    from verl_ext.cpu.launch import prepare
    from verl_ext.cpu.overrides import POLL_INTERVAL_S
    from verl_ext.cpu.vllm_launcher import VLLM_CPU_ENV

    os.environ.update({**CPU_ENV, **VLLM_CPU_ENV})
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_tiny_arch_")
    os.environ["VERL_FILE_LOGGER_ROOT"] = os.path.join(workdir, f"metrics_{os.getpid()}")
    results: dict = {}
    for rollout in rollouts:
        for arch in ARCHS:
            paths = prepare(workdir, arch)
            arch_dir = os.path.join(workdir, arch)
            os.makedirs(arch_dir, exist_ok=True)
            results[rollout, arch] = run_method("diva", paths, arch_dir, steps, rollout, experiment_tag=arch)
            print(f"[bench] {rollout} {arch}: {json.dumps(results[rollout, arch])}", flush=True)
        # The step before the CPU runs' poll interval: the 7B job's model class with verl's own interval.
        results[rollout, VERL_POLL] = run_method(
            "diva", paths, arch_dir, steps, rollout, experiment_tag=VERL_POLL, extra_overrides=(VERL_POLL_OVERRIDE,)
        )
        print(f"[bench] {rollout} qwen2_5_vl, verl's poll: {json.dumps(results[rollout, VERL_POLL])}", flush=True)

    import ray

    # Ray's driver flushes its deduplicated worker lines at shutdown: before the table, so the JSON stays last.
    ray.shutdown()
    figures: dict = {"steps_per_run": steps, "rollouts": rollouts, "method": "diva"}
    figures["cpu_poll_interval_s"] = POLL_INTERVAL_S
    print("[bench] rollout  step Qwen2-VL | Qwen2.5-VL (ratio)   gen   old log-prob   actor update (Qwen2.5-VL)")
    for rollout in rollouts:
        old, new = results[rollout, "qwen2_vl"], results[rollout, "qwen2_5_vl"]
        figures[rollout] = {
            "qwen2_vl_step_s": round(old["step_s"], 3),
            "qwen2_5_vl_step_s": round(new["step_s"], 3),
            "step_ratio_qwen2_5_vl_over_qwen2_vl": round(new["step_s"] / old["step_s"], 3),
            **{f"{arch}_{part}": round(results[rollout, arch][part], 3) for arch in ARCHS for part in _PARTS},
            "verl_poll_step_s": round(results[rollout, VERL_POLL]["step_s"], 3),
            "step_ratio_cpu_poll_over_verl_poll": round(new["step_s"] / results[rollout, VERL_POLL]["step_s"], 3),
        }
        f = figures[rollout]
        print(
            f"[bench] {rollout:7s}  {f['qwen2_vl_step_s']:.2f} s | {f['qwen2_5_vl_step_s']:.2f} s "
            f"({f['step_ratio_qwen2_5_vl_over_qwen2_vl']:.2f}x)   "
            f"{f['qwen2_vl_gen_s']:.2f} | {f['qwen2_5_vl_gen_s']:.2f} s   "
            f"{f['qwen2_vl_old_log_prob_s']:.2f} | {f['qwen2_5_vl_old_log_prob_s']:.2f} s   "
            f"{f['qwen2_vl_update_actor_s']:.2f} | {f['qwen2_5_vl_update_actor_s']:.2f} s",
            flush=True,
        )
    print(f"[bench] rollout  Qwen2.5-VL step: verl's poll 2.0 s | the CPU runs' {POLL_INTERVAL_S} s (ratio)")
    for rollout in rollouts:
        f = figures[rollout]
        print(
            f"[bench] {rollout:7s}  {f['verl_poll_step_s']:.2f} s | {f['qwen2_5_vl_step_s']:.2f} s "
            f"({f['step_ratio_cpu_poll_over_verl_poll']:.2f}x)",
            flush=True,
        )
    if not args.no_record:
        record("tiny_arch", figures, argv)
    print(json.dumps(figures), flush=True)
    return figures


_PARTS = ("gen_s", "old_log_prob_s", "update_actor_s")


if __name__ == "__main__":
    main()
