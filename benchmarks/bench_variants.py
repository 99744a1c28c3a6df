"""Speed of the GRPO variants' advantages next to verl's ``grpo`` and ``grpo_vectorized`` (issue 10).

One batch shaped like a DIVA paper step: 256 questions x (original + 1 variant) x 5 rollouts = 2,560 responses
of 4,096 tokens (groups: the 512 prompts' ``uid``), right-padded int64 masks as verl's V1 trainer builds them,
float32 rewards with the score (0/1, each prompt with its own success rate, so about a third of the groups
collapse) on the last response token, float32 old log-probs. One thread, all timings in this process,
interleaved round by round, median over the rounds.

    python benchmarks/bench_variants.py            # full size
    python benchmarks/bench_variants.py --quick    # seconds-long smoke run

Adding a method: append a :class:`Case` to ``CASES`` (its ``run`` takes the :class:`Batch`; add a lazily built
field to ``Batch`` if the method needs an input it lacks). Prints each case's time and its ratios to both verl
estimators side by side; the last line is one JSON object with the figures. Target: every case at most 1.0x
verl's ``grpo`` unless its ``Case`` says otherwise (PGPO: 2.0x, issue 11).
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from record import add_no_record, record
from timing import time_round_robin
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from verl_ext.algos import avspo_collapse_rates, compute_avspo_advantage, compute_codapo_advantage
from verl_ext.algos.durian import compute_durian_advantage
from verl_ext.algos.mupo import compute_mupo_advantage, mupo_diversity, mupo_partition
from verl_ext.algos.pgpo import compute_pgpo_advantage

TARGET_OVER_GRPO = 1.0
# MUPO's partition + diversity of 64 prompts x 15 rollouts: under 1% of the paper's 8-minute step (issue 12).
MUPO_PARTITION_TARGET_S = 4.8


class Batch:
    """One step's inputs. The always-needed tensors are built up front; the others on first use."""

    def __init__(self, questions: int, prompts_per_question: int, rollouts: int, tokens: int, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.num_prompts = questions * prompts_per_question
        self.rollouts = rollouts
        self.size = self.num_prompts * rollouts
        self.tokens = tokens
        prompt_uids = [str(uuid.UUID(int=int(self.rng.integers(2**63)))) for _ in range(self.num_prompts)]
        self.uid = np.repeat(np.array(prompt_uids, dtype=object), rollouts)
        self.question_id = np.repeat(
            np.array([f"q{i // prompts_per_question}" for i in range(self.num_prompts)], dtype=object), rollouts
        )
        self.lengths = torch.from_numpy(self.rng.integers(1, tokens + 1, size=self.size))
        self.mask = (torch.arange(tokens).unsqueeze(0) < self.lengths.unsqueeze(1)).to(torch.int64)
        success = np.repeat(self.rng.uniform(size=self.num_prompts), rollouts)
        self.correct = torch.from_numpy((self.rng.random(self.size) < success).astype(np.float32))
        self.rewards = torch.zeros(self.size, tokens, dtype=torch.float32)
        self.rewards[torch.arange(self.size), self.lengths - 1] = self.correct

    @cached_property
    def old_log_probs(self) -> torch.Tensor:
        """``(B, T)`` float32 in [-3, 0] on response tokens, 0 on padding."""
        return (-3.0 * torch.from_numpy(self.rng.random((self.size, self.tokens), dtype=np.float32))) * self.mask

    @cached_property
    def blind_log_probs(self) -> torch.Tensor:
        """``(B, T)`` float32: the old log-probs minus a visual dependency, small on most tokens and large on one in
        ten (PGPO's blind view), 0 on padding."""
        drop = np.abs(self.rng.normal(0.0, 0.05, size=(self.size, self.tokens))).astype(np.float32)
        visual = self.rng.random((self.size, self.tokens), dtype=np.float32) < 0.1
        drop[visual] *= 40.0
        return (self.old_log_probs - torch.from_numpy(drop)) * self.mask

    @cached_property
    def visual_entropy(self) -> np.ndarray:
        """``(B,)`` one value per prompt, repeated on its responses."""
        return np.repeat(self.rng.uniform(2.0, 6.0, size=self.num_prompts), self.rollouts)

    @cached_property
    def mupo_partition(self) -> np.ndarray:
        """``(B,)`` MUPO group ids local to each prompt: two groups per prompt (rollouts alternate). The advantage's
        cost does not depend on how the groups were found (:func:`time_mupo_partition` times that)."""
        return np.tile(np.arange(self.rollouts) % 2, self.num_prompts)


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[Batch], Any]
    target_over_grpo: float = TARGET_OVER_GRPO


CASES: list[Case] = [
    Case("avspo", lambda b: compute_avspo_advantage(b.rewards, b.mask, b.uid)),
    Case("avspo_released", lambda b: compute_avspo_advantage(b.rewards, b.mask, b.uid, mode="released")),
    Case("codapo", lambda b: compute_codapo_advantage(b.rewards, b.mask, b.old_log_probs, b.uid, b.correct)),
    Case("mupo", lambda b: compute_mupo_advantage(b.rewards, b.mask, b.uid, b.mupo_partition)),
    Case("durian", lambda b: compute_durian_advantage(b.rewards, b.mask, b.old_log_probs, b.uid, b.visual_entropy)),
    # Reads two more (B, T) tensors than GRPO and runs ~20 elementwise passes: issue 11's target is 2x.
    Case(
        "pgpo",
        lambda b: compute_pgpo_advantage(b.rewards, b.mask, b.uid, b.old_log_probs, b.blind_log_probs),
        target_over_grpo=2.0,
    ),
]

BASELINES = ("grpo", "grpo_vectorized")


def time_mupo_partition(quick: bool, rounds: int) -> dict[str, Any]:
    """MUPO's partition (per-prompt size-constrained k-means, k 3, min_size 3) plus diversity for 64 prompts x 15
    rollouts (8 prompts with ``quick``) of 1,024-dimension embeddings, three reasoning modes per prompt plus noise;
    median seconds over ``rounds`` (after a warm-up that imports the k-means library)."""
    prompts, rollouts, dim = (8 if quick else 64), 15, 1024
    rng = np.random.default_rng(1)
    modes = rng.normal(size=(prompts, 3, dim))
    which = rng.integers(0, 3, size=(prompts, rollouts))
    embeddings = modes[np.arange(prompts)[:, None], which] + 0.7 * rng.normal(size=(prompts, rollouts, dim))
    embeddings = embeddings.reshape(prompts * rollouts, dim).astype(np.float32)
    uid = np.repeat(np.array([f"p{i}" for i in range(prompts)], dtype=object), rollouts)

    def step():
        mupo_diversity(embeddings, uid, mupo_partition(embeddings, uid, k=3, min_size=3))

    seconds = time_round_robin({"step": step}, rounds)["step"] / 1e3
    return {
        "prompts": prompts,
        "rollouts": rollouts,
        "dim": dim,
        "seconds": round(seconds, 4),
        "target_s": MUPO_PARTITION_TARGET_S,
        "target_met": None if quick else seconds < MUPO_PARTITION_TARGET_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batch, few rounds (smoke check)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7, quick 3)")
    add_no_record(parser)
    args = parser.parse_args()
    questions, tokens = (16, 512) if args.quick else (256, 4096)
    rounds = args.rounds or (3 if args.quick else 7)
    torch.set_num_threads(1)

    batch = Batch(questions, 2, 5, tokens)
    rates = avspo_collapse_rates(batch.rewards, batch.uid)
    print(
        f"batch: {batch.size} responses x {tokens} tokens, {batch.num_prompts} groups of {batch.rollouts} "
        f"(collapse rate {rates['acr_before']:.2f}), float32 rewards, int64 mask, 1 thread, median of {rounds} rounds"
    )

    candidates = {
        name: (
            lambda fn=get_adv_estimator_fn(name): fn(
                token_level_rewards=batch.rewards, response_mask=batch.mask, index=batch.uid
            )
        )
        for name in BASELINES
    }
    candidates |= {case.name: (lambda case=case: case.run(batch)) for case in CASES}
    ms = time_round_robin(candidates, rounds)

    width = max(len(name) for name in ms)
    print(f"{'':{width}}  {'ms':>8}  {'/ grpo':>7}  {'/ grpo_vectorized':>17}")
    for name, value in ms.items():
        print(f"{name:{width}}  {value:8.1f}  {value / ms['grpo']:6.3f}x  {value / ms['grpo_vectorized']:16.3f}x")

    mupo_partition_figures = time_mupo_partition(args.quick, 1 if args.quick else 3)
    print(
        f"mupo partition + diversity, {mupo_partition_figures['prompts']} prompts x 15 x 1024-d: "
        f"{mupo_partition_figures['seconds']:.3f} s (target < {MUPO_PARTITION_TARGET_S} s)"
    )

    over_grpo = {case.name: round(ms[case.name] / ms["grpo"], 3) for case in CASES}
    over_vectorized = {case.name: round(ms[case.name] / ms["grpo_vectorized"], 3) for case in CASES}
    result = {
        "benchmark": "variants",
        "quick": args.quick,
        "responses": batch.size,
        "tokens": tokens,
        "groups": batch.num_prompts,
        "collapse_rate": round(rates["acr_before"], 4),
        "threads": 1,
        "rounds": rounds,
        "mask_dtype": "int64",
        "ms": {name: round(value, 3) for name, value in ms.items()},
        "over_grpo": over_grpo,
        "over_grpo_vectorized": over_vectorized,
        "target_over_grpo": TARGET_OVER_GRPO,
        "case_targets_over_grpo": {c.name: c.target_over_grpo for c in CASES if c.target_over_grpo != TARGET_OVER_GRPO},
        "mupo_partition_diversity": mupo_partition_figures,
        # Meaningless at --quick sizes, where per-call overheads dominate the memory-bound pass.
        "targets_met": None if args.quick else all(over_grpo[case.name] <= case.target_over_grpo for case in CASES),
    }
    if not args.no_record:
        record("variants_quick" if args.quick else "variants", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
