"""Does NC-GRPO's noise branch the rollouts? Both readings side by side, rerun without noise (issue 26).

For each task, the same seeded requests as a training step (prompt uids, sampling seeds, the noisy half and its noise
seeds: :mod:`verl_ext.rollout.seeds`, :mod:`verl_ext.nc_grpo.noise`) go through the ``hf_cpu`` rollout server's
generation code (:class:`verl_ext.cpu.rollout.HFCpuServer`, in process): every response once without noise (the
clean draws, the same for every reading and scale), then the noisy half again with its noise, for each reading
(``layer_input`` at the last decoder layer, ``final_hidden``) and noise scale. Reported per task, reading and scale:

* ``first_token``: share of noisy rollouts whose first token differs from the clean draw of the same seed;
* ``branched``: share that differ anywhere (the whole response is compared); ``first_diff``: the mean position of
  the first difference over those;
* ``acc_noisy`` / ``acc_clean``: accuracy of the noisy half and of the clean half of the groups
  (``acc_noisy_undisplaced``: the noisy half's draws without the noise, what the noise moved it from);
* ``zero_adv``: share of responses in groups whose scores are all equal (GRPO's zero advantage; ``zero_adv_grpo``:
  the same with the noisy half sampled clean, i.e. plain GRPO's rollouts).

Tasks (the warm-started tiny model of ``run_scripts/compare_tiny.sh``, :func:`verl_ext.lab.tasks.prepare_swatch`,
on the swatch validation questions, temperature 0.7 as the comparison's rollouts):

* ``swatch``: the prompt as trained, whose answer starts with the forced ``<think>``;
* ``swatch_free_first``: the same prompts with ``<think>`` already written, so the first sampled token is the
  colour's first letter (a first token the model is free to choose).

    python benchmarks/bench_nc_grpo_branching.py                  # 32 questions x 8 responses, 4 scales
    python benchmarks/bench_nc_grpo_branching.py --quick          # the untrained tiny model, seconds

A configuration where (almost) no noisy rollout branches prints the method's console warning. The last line is one
JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
from record import add_no_record, record

from verl_ext.algos.collapse import in_collapsed_group
from verl_ext.nc_grpo.branching import branch_metrics, branch_warning, first_difference
from verl_ext.nc_grpo.noise import FINAL_HIDDEN, LAYER_INPUT, NOISE_KEY, noise_seed, noisy_responses
from verl_ext.rollout.seeds import prompt_uid, request_seed

SCALES = (0.05, 0.1, 0.2, 0.5)
TARGETS = (LAYER_INPUT, FINAL_HIDDEN)
RUN_SEED, STEP = 0, 1
THINK = "<think>"


def make_server(model: str, response_length: int):
    """The ``hf_cpu`` rollout server's own class, in this process."""
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode

    from verl_ext.cpu.rollout import HFCpuServer

    rollout = RolloutConfig(name="hf_cpu", prompt_length=2048, response_length=response_length)
    return HFCpuServer.__ray_actor_class__(rollout, HFModelConfig(path=model), 0, RolloutMode.HYBRID)


def swatch_prompts(server, val_file: str, questions: int, free_first: bool) -> list[dict]:
    """``{"ids", "image", "answer", "prefix"}`` per validation question: prompt ids as the agent loop builds them
    (chat template, image pads expanded), ``prefix`` the answer text already written (``<think>`` or empty)."""
    import pandas as pd

    from verl_ext.lab.sft_examples import chat_text, validation_examples

    examples = validation_examples(pd.read_parquet(val_file))[:questions]
    extra = server.tokenizer.encode(THINK, add_special_tokens=False) if free_first else []
    out = []
    for example in examples:
        text = chat_text(server.processor, example["text"])
        ids = server.processor(text=[text], images=[example["image"]])["input_ids"][0]
        ids = [int(t) for t in ids] + extra
        out.append({"ids": ids, "image": example["image"], "answer": example["answer"], "prefix": THINK * free_first})
    return out


def generate(server, prompt: dict, seed: int, temperature: float, noise: dict | None) -> list[int]:
    params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": False, "seed": seed}
    if noise is not None:
        params["extra_args"] = {NOISE_KEY: noise}
    images = [prompt["image"]] if prompt["image"] is not None else None
    output = asyncio.run(
        server.generate(prompt_ids=prompt["ids"], sampling_params=params, request_id="bench", image_data=images)
    )
    return list(output.token_ids)


def score(server, prompt: dict, tokens: list[int]) -> tuple[float, float]:
    """(score, acc) of a response by the project's reward, the written prefix included."""
    from verl_ext.lab.warm_start import DATA_SOURCE
    from verl_ext.reward import compute_score

    if prompt["answer"] is None:
        return 0.0, 0.0
    text = prompt["prefix"] + server.tokenizer.decode(tokens, skip_special_tokens=True)
    result = compute_score(DATA_SOURCE, text, prompt["answer"])
    return float(result["score"]), float(result["acc"])


def measure(server, prompts: list[dict], n: int, temperature: float, scales, targets, layer: int = -1) -> dict:
    """The figures of the module docstring for one task (``prompts``), ``n`` responses per prompt."""
    uids = [prompt_uid(RUN_SEED, STEP, 0, q) for q in range(len(prompts))]
    noisy = [noisy_responses(RUN_SEED, STEP, uid, n, 0.5) for uid in uids]
    clean = {}
    for q, (prompt, uid) in enumerate(zip(prompts, uids, strict=True)):
        for i in range(n):
            tokens = generate(server, prompt, request_seed(RUN_SEED, STEP, uid, i), temperature, None)
            clean[q, i] = (tokens, *score(server, prompt, tokens))
    index = np.array([q for q in range(len(prompts)) for _ in range(n)])
    grpo_scores = [clean[q, i][1] for q in range(len(prompts)) for i in range(n)]
    out = {"zero_adv_grpo": float(in_collapsed_group(grpo_scores, index).double().mean()), "configs": {}}
    for target in targets:
        for scale in scales:
            rows, fds, scores, acc_noisy = {}, [], [], []
            for q, (prompt, uid) in enumerate(zip(prompts, uids, strict=True)):
                for i in sorted(noisy[q]):
                    noise = {
                        "seed": noise_seed(RUN_SEED, STEP, uid, i),
                        "scale": scale,
                        "target": target,
                        "layer": layer,
                    }
                    tokens = generate(server, prompt, request_seed(RUN_SEED, STEP, uid, i), temperature, noise)
                    rows[q, i] = (tokens, *score(server, prompt, tokens))
                    fds.append(first_difference(tokens, clean[q, i][0], server.config.response_length))
                    acc_noisy.append(rows[q, i][2])
            for q in range(len(prompts)):
                scores += [rows[q, i][1] if i in noisy[q] else clean[q, i][1] for i in range(n)]
            branches = branch_metrics(fds, [True] * len(fds))
            print(f"[bench] {target} c={scale:g}: {branches['branch/rate']:.3f} branched", file=sys.stderr, flush=True)
            acc_clean = [clean[q, i][2] for q in range(len(prompts)) for i in range(n) if i not in noisy[q]]
            undisplaced = [clean[q, i][2] for q in range(len(prompts)) for i in sorted(noisy[q])]
            out["configs"][f"{target}@{scale:g}"] = {
                "target": target,
                "scale": scale,
                "first_token": branches["branch/first_token"],
                "branched": branches["branch/rate"],
                "first_diff": branches.get("branch/first_difference_mean"),
                "acc_noisy": float(np.mean(acc_noisy)),
                "acc_noisy_undisplaced": float(np.mean(undisplaced)),
                "acc_clean": float(np.mean(acc_clean)),
                "zero_adv": float(in_collapsed_group(scores, index).double().mean()),
                "noisy_rollouts": len(fds),
                "warning": branch_warning(branches, server.config.response_length, f"c={scale:g}", target),
            }
    return out


def _table(task: str, figures: dict) -> list[str]:
    lines = [
        f"{task}: GRPO's zero-advantage fraction {figures['zero_adv_grpo']:.3f}; the noisy half's draws without "
        f"noise are {next(iter(figures['configs'].values()))['acc_noisy_undisplaced']:.3f} accurate",
        f"  {'reading':<13} {'c':>5} {'first_token':>11} {'branched':>8} {'first_diff':>10} {'acc_noisy':>9} "
        f"{'acc_clean':>9} {'zero_adv':>8}",
    ]
    for entry in figures["configs"].values():
        diff = "-" if entry["first_diff"] is None else f"{entry['first_diff']:.1f}"
        lines.append(
            f"  {entry['target']:<13} {entry['scale']:>5g} {entry['first_token']:>11.3f} {entry['branched']:>8.3f} "
            f"{diff:>10} {entry['acc_noisy']:>9.3f} {entry['acc_clean']:>9.3f} {entry['zero_adv']:>8.3f}"
        )
    lines += [entry["warning"] for entry in figures["configs"].values() if entry["warning"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the untrained tiny model, 2 text prompts x 4 (smoke)")
    parser.add_argument("--questions", type=int, default=32, help="swatch validation questions (of 64)")
    parser.add_argument("--n", type=int, default=8, help="responses per question (half noised)")
    parser.add_argument("--scales", type=float, nargs="+", default=None, help=f"default {SCALES} (quick: 0.5)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "diva_bench_nc_grpo"))
    add_no_record(parser)
    args = parser.parse_args(argv)
    args.scales = args.scales or ([0.5] if args.quick else list(SCALES))
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    started = time.perf_counter()
    if args.quick:
        from verl_ext.cpu.tiny_model import build_tiny_qwen2_vl

        server = make_server(build_tiny_qwen2_vl(os.path.join(args.workdir, "tiny_qwen2_vl")), 8)
        text = server.processor.apply_chat_template(
            [{"role": "user", "content": "Name a colour."}], add_generation_prompt=True, tokenize=False
        )
        prompts = [{"ids": server.tokenizer(text)["input_ids"], "image": None, "answer": None, "prefix": ""}] * 2
        # The random model's near-uniform distributions move little under these scales: 8 shows a branch.
        tasks = {"random_tiny": measure(server, prompts, 4, 1.0, args.scales + [8.0], TARGETS)}
    else:
        from verl_ext.lab.rl_settings import ROLLOUT_TEMPERATURE
        from verl_ext.lab.tasks import SWATCH_RESPONSE_LENGTH, prepare_swatch

        paths = prepare_swatch(args.workdir)
        server = make_server(paths["model"], SWATCH_RESPONSE_LENGTH)
        tasks = {}
        for task, free_first in (("swatch", False), ("swatch_free_first", True)):
            prompts = swatch_prompts(server, paths["val"], args.questions, free_first)
            tasks[task] = measure(server, prompts, args.n, ROLLOUT_TEMPERATURE, args.scales, TARGETS)
            print("\n".join(_table(task, tasks[task])), file=sys.stderr, flush=True)
    for task, figures in tasks.items():
        print("\n".join(_table(task, figures)), flush=True)
    figures = {
        "benchmark": "nc_grpo_branching",
        "quick": args.quick,
        "questions": args.questions,
        "n": args.n,
        "seconds": round(time.perf_counter() - started, 1),
        "tasks": tasks,
    }
    if not args.no_record:
        record("nc_grpo_branching_quick" if args.quick else "nc_grpo_branching", figures, argv)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
