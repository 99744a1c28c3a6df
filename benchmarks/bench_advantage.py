"""Speed of ``compute_diva_advantage`` next to the memory-bound floor and verl's GRPO estimators.

One batch shaped like a paper step: 256 questions x (original + 1 variant) x 5 rollouts = 2,560
responses of 4,096 tokens, rewards 0.9 x correct + 0.1 x format on the last response token,
right-padded masks as verl's V1 trainer builds them (int64; float32 measured too). One thread, all
timings in this process, interleaved round by round, median over the rounds.

    python benchmarks/bench_advantage.py            # full size
    python benchmarks/bench_advantage.py --quick    # seconds-long smoke run

Prints ratios; the last line is one JSON object with the figures. Targets (issue 2): DIVA at most
1.5x the floor ``scores[:, None] * mask`` and at most 0.5x verl's ``grpo``, judged on the int64 mask
verl's trainers pass. With a float32 mask the floor is cheaper (no int64 conversion) while DIVA's exact
0/1 check of a float mask costs two more reads of it, so that ratio is higher; it is reported as well.
"""

from __future__ import annotations

import argparse
import json
import uuid

import numpy as np
import torch
from record import add_no_record, record
from timing import time_round_robin
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from verl_ext.algos import compute_diva_advantage

TARGET_OVER_FLOOR = 1.5
TARGET_OVER_GRPO = 0.5


def make_batch(questions: int, prompts_per_question: int, rollouts: int, tokens: int, seed: int = 0):
    """Rewards, int64 mask, uid / question-id object arrays and difficulties for one step."""
    rng = np.random.default_rng(seed)
    num_prompts = questions * prompts_per_question
    batch = num_prompts * rollouts
    prompt_uids = np.array([str(uuid.UUID(int=int(rng.integers(2**63)))) for _ in range(num_prompts)], dtype=object)
    question_ids = np.array([f"q{i // prompts_per_question}" for i in range(num_prompts)], dtype=object)
    uid = np.repeat(prompt_uids, rollouts)
    question_id = np.repeat(question_ids, rollouts)
    prompt_difficulty = rng.uniform(1.0, 9.0, size=num_prompts)
    difficulty = torch.from_numpy(np.repeat(prompt_difficulty, rollouts))

    lengths = torch.from_numpy(rng.integers(1, tokens + 1, size=batch))
    mask = (torch.arange(tokens).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    correct = torch.from_numpy(rng.random(batch) < 0.5).float()
    formatted = torch.from_numpy(rng.random(batch) < 0.8).float()
    rewards = torch.zeros(batch, tokens, dtype=torch.float32)
    rewards[torch.arange(batch), lengths - 1] = 0.9 * correct + 0.1 * formatted
    return rewards, mask, uid, question_id, difficulty


def measure(rewards, mask, uid, question_id, difficulty, rounds: int) -> dict[str, float]:
    scores = rewards.sum(dim=-1)
    grpo = get_adv_estimator_fn("grpo")
    grpo_vectorized = get_adv_estimator_fn("grpo_vectorized")
    candidates = {
        "floor": lambda: scores[:, None] * mask,
        "diva": lambda: compute_diva_advantage(rewards, mask, uid, question_id, difficulty),
        "grpo": lambda: grpo(token_level_rewards=rewards, response_mask=mask, index=uid),
        "grpo_vectorized": lambda: grpo_vectorized(token_level_rewards=rewards, response_mask=mask, index=uid),
    }
    return time_round_robin(candidates, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batch, few rounds (smoke check)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 9, quick 3)")
    add_no_record(parser)
    args = parser.parse_args()
    questions, tokens = (16, 512) if args.quick else (256, 4096)
    rounds = args.rounds or (3 if args.quick else 9)
    torch.set_num_threads(1)

    rewards, mask, uid, question_id, difficulty = make_batch(questions, 2, 5, tokens)
    batch = rewards.shape[0]
    print(f"batch: {batch} responses x {tokens} tokens, float32 rewards, 1 thread, median of {rounds} rounds")

    figures = {}
    for mask_dtype, batch_mask in (("int64", mask), ("float32", mask.float())):
        ms = measure(rewards, batch_mask, uid, question_id, difficulty, rounds)
        ratios = {
            "diva_over_floor": ms["diva"] / ms["floor"],
            "diva_over_grpo": ms["diva"] / ms["grpo"],
            "diva_over_grpo_vectorized": ms["diva"] / ms["grpo_vectorized"],
        }
        figures[mask_dtype] = {"ms": {name: round(value, 3) for name, value in ms.items()}} | {
            name: round(value, 3) for name, value in ratios.items()
        }
        print(f"{mask_dtype} mask: " + ", ".join(f"{name} {value:.1f} ms" for name, value in ms.items()))
        print(
            f"  diva / floor {ratios['diva_over_floor']:.2f}x (target <= {TARGET_OVER_FLOOR}), "
            f"diva / grpo {ratios['diva_over_grpo']:.3f}x (target <= {TARGET_OVER_GRPO}), "
            f"diva / grpo_vectorized {ratios['diva_over_grpo_vectorized']:.2f}x"
        )

    primary = figures["int64"]
    result = {
        "benchmark": "advantage",
        "quick": args.quick,
        "responses": batch,
        "tokens": tokens,
        "threads": 1,
        "rounds": rounds,
        "primary_mask_dtype": "int64",
        "targets": {"diva_over_floor": TARGET_OVER_FLOOR, "diva_over_grpo": TARGET_OVER_GRPO},
        # Meaningless at --quick sizes, where per-call overheads dominate the memory-bound pass.
        "targets_met": None
        if args.quick
        else primary["diva_over_floor"] <= TARGET_OVER_FLOOR and primary["diva_over_grpo"] <= TARGET_OVER_GRPO,
        **figures,
    }
    if not args.no_record:
        record("advantage_quick" if args.quick else "advantage", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
