"""Cost of PGPO's blind pass next to the sighted log-prob pass it runs beside (issue 11; informative on CPU).

Both passes go through verl's engine steps (``prepare_micro_batches``, ``prepare_model_inputs`` with remove-padding
packing, ``prepare_model_outputs``; :func:`verl_ext.pgpo.tiny.engine_infer`) on the tiny random Qwen2.5-VL of
:mod:`verl_ext.pgpo.tiny`: the sighted pass on the batch with its pixels, the blind pass
(:func:`verl_ext.pgpo.blind_log_prob_pass`: blind view, then the same engine steps) on the same batch. Every
trajectory has one image; the shape of a DIVA step is kept in proportion (prompt text, visual tokens and response
tokens in the ratio of a 7B run: ~100 text, ~400 visual, ~500 response tokens per trajectory, scaled down). One
thread, interleaved rounds, median.

    python benchmarks/bench_blind_pass.py            # 32 trajectories
    python benchmarks/bench_blind_pass.py --quick    # seconds-long smoke run

The last line is one JSON object with the figures. On a GPU the blind pass costs what the text tokens of a forward
cost (no vision tower, no visual tokens); the paper reports +10.6% training time for PGPO.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from record import add_no_record, record
from timing import time_round_robin
from verl.utils import tensordict_utils as tu

from verl_ext.pgpo import blind_inputs, blind_log_prob_pass
from verl_ext.pgpo.blind_view import VISUAL_TOKEN_IDS_KEY
from verl_ext.pgpo.tiny import IMAGE_TOKEN_ID, VIDEO_TOKEN_ID, Trajectory, engine_infer, tiny_qwen25_vl, verl_batch

VISUAL = [IMAGE_TOKEN_ID, VIDEO_TOKEN_ID]


def make_trajectories(count: int, scale: int, seed: int = 0) -> list[Trajectory]:
    """``count`` trajectories: ``scale`` text tokens around one image of ``4 * scale`` visual tokens, and a response
    of ``5 * scale`` tokens (the proportions of a 7B step)."""
    rng = np.random.default_rng(seed)
    side = 2 * int(np.ceil(np.sqrt(4 * scale)))  # grid (1, side, side) patches -> (side / 2)^2 visual tokens
    out = []
    for _ in range(count):
        words = [int(t) for t in rng.integers(2, 58, size=scale)]
        prompt = words[: scale // 2] + [None] + words[scale // 2 :]
        response = [int(t) for t in rng.integers(2, 58, size=5 * scale)]
        out.append(Trajectory(prompt, response, [(1, side, side)]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batch, few rounds (smoke check)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5, quick 2)")
    add_no_record(parser)
    args = parser.parse_args()
    count, scale = (8, 4) if args.quick else (32, 12)
    rounds = args.rounds or (2 if args.quick else 5)
    torch.set_num_threads(1)

    model = tiny_qwen25_vl()
    data, pieces = verl_batch(model, make_trajectories(count, scale))
    infer = engine_infer(model, use_remove_padding=True, micro_batch_size=8)

    def sighted():
        return infer(data.copy())

    def blind():
        view = data.copy()
        tu.assign_non_tensor_data(view, VISUAL_TOKEN_IDS_KEY, VISUAL)
        return blind_log_prob_pass(view, infer, VISUAL)

    def view_only():
        return blind_inputs(data, VISUAL)

    ms = time_round_robin({"sighted": sighted, "blind": blind, "blind_view_only": view_only}, rounds)

    tokens = sum(int(p["input_ids"].numel()) for p in pieces)
    visual = sum(int((p["input_ids"] == IMAGE_TOKEN_ID).sum()) for p in pieces)
    print(
        f"batch: {count} trajectories, {tokens} tokens of which {visual} visual, one image each, tiny Qwen2.5-VL, "
        f"packed, 1 thread, median of {rounds} rounds"
    )
    for name, value in ms.items():
        print(f"{name:16}  {value:9.2f} ms  {value / ms['sighted']:6.3f}x sighted")
    result = {
        "benchmark": "blind_pass",
        "quick": args.quick,
        "trajectories": count,
        "tokens": tokens,
        "visual_tokens": visual,
        "threads": 1,
        "rounds": rounds,
        "ms": {name: round(value, 3) for name, value in ms.items()},
        "blind_over_sighted": round(ms["blind"] / ms["sighted"], 3),
        "view_over_sighted": round(ms["blind_view_only"] / ms["sighted"], 4),
    }
    if not args.no_record:
        record("blind_pass_quick" if args.quick else "blind_pass", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
