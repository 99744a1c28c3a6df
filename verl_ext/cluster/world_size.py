"""World size is invisible to the math: two runs of one seed and settings at different world sizes, compared.

``python -m verl_ext.cluster.world_size RUN_A RUN_B`` (run folders of ``run_scripts/tiny_cpu.sh``, e.g. ``NODES=1``
and ``NODES=2``) compares

* what each response of the first step was made of, from the actor-input records (:mod:`verl_ext.checks.probe`), in
  key order: prompt and sampled tokens, DIVA's variant and difficulty info, reward, advantage: **exactly**. The
  per-request seeds depend on (seed, step, uid, response), not on the replica that serves a request, and the
  advantage step reads its rows in key order whatever order verl's sequence balancing left them in. Later steps:
  the same, and their log-probs to :data:`RTOL` / :data:`ATOL`;
* every value both runs logged, step by step: exactly, except
  - :data:`FLOAT_ORDER`: values verl reduces in float32 over the batch in its balanced order (per rank first, then
    across ranks: the loss and its gradient norm through FSDP's all-reduce, batch means of scores and advantages):
    equal to ``|a - b| <= ATOL + RTOL |a|``. float32 sums of a few hundred terms added in another order differ by a
    few units of 1e-7 relative (seen: 4e-7 on the loss, 1.5e-7 on the gradient norm); ``RTOL = 1e-5`` leaves a
    margin of 20 and still fails any real difference (one more or one fewer response: 1e-2 and up);
  - :data:`ROUNDING_NOISE`: verl's rollout-vs-actor comparisons (``rollout_corr/*``, ``training/rollout_*``),
    rounding noise around 0 (or 1) in both runs once the weights are synced (each token's two log-probs agree to
    ~1e-6; sequence sums of ~24 tokens to ~1e-5): equal to ``ROUNDING_ATOL = 1e-4``, the CPU run's own sync
    tolerance (:data:`verl_ext.checks.session.LOGPROB_TOLERANCE`), far below a stale sync's 1e-2;
  - :data:`RANK_SPLIT`: verl's sequence-balance statistics, per rank by definition (``global_seqlen/mean`` x ranks,
    the step's total tokens, must agree exactly; min/max/spread describe the split);
  - wall times, throughput and memory (:data:`verl_ext.checks.same_run.TIME_DEPENDENT`).
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from verl_ext.checks.same_run import TIME_DEPENDENT

FLOAT_ORDER = re.compile(r"^(actor|critic)/")
ROUNDING_NOISE = re.compile(r"^rollout_corr/|^training/rollout_")
RANK_SPLIT = re.compile(r"^global_seqlen/")
RTOL, ATOL = 1e-5, 1e-6
ROUNDING_ATOL = 1e-4
# Per-response fields of the actor-input records: compared exactly, or (log-probs after step 1) to the tolerance.
EXACT_FIELDS = ("uid", "input_ids", "responses", "extra_info", "rm_scores", "advantages", "response_mask")
LOG_PROB_FIELDS = ("old_log_probs", "rollout_log_probs")


def close(a: float, b: float, atol: float = ATOL) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= atol + RTOL * abs(a)


def metric_differences(
    a: dict[int, dict[str, float]], b: dict[int, dict[str, float]], ranks_a: int, ranks_b: int
) -> tuple[list[str], int]:
    """Every value of ``a`` (``steps[step][key]``) that ``b`` does not repeat as the module docstring says, and the
    number of values compared. ``ranks_*``: each run's training ranks (for ``global_seqlen/mean``)."""
    differences, compared = [], 0
    for step in sorted(a):
        got = b.get(step, {})
        for key, value in sorted(a[step].items()):
            if TIME_DEPENDENT.search(key):
                continue
            if RANK_SPLIT.search(key):
                if key != "global_seqlen/mean":
                    continue
                value, other = value * ranks_a, got.get(key, math.nan) * ranks_b
                ok = value == other
            elif key not in got:
                differences.append(f"step {step}: {key} = {value!r} in the first run, not logged by the second")
                continue
            else:
                other = got[key]
                if FLOAT_ORDER.search(key):
                    ok = close(value, other)
                elif ROUNDING_NOISE.search(key):
                    ok = close(value, other, ROUNDING_ATOL)
                else:
                    ok = value == other
            compared += 1
            if not ok:
                kind = "exactly" if not (FLOAT_ORDER.search(key) or ROUNDING_NOISE.search(key)) else "within tolerance"
                differences.append(f"step {step}: {key} {value!r} vs {other!r} (expected equal {kind})")
    return differences, compared


def _real_rows_in_key_order(record: dict) -> list[int]:
    from verl_ext.rollout.replay_buffer import key_order

    rows = [i for i, padding in enumerate(record["is_padding"]) if not padding]
    return sorted(rows, key=lambda i: key_order(record["keys"][i]))


def _values(record: dict, field: str, rows: list[int]) -> list:
    return [record[field][i] for i in rows]


def _same(x, y, exact: bool) -> bool:
    import torch

    if isinstance(x, torch.Tensor):
        if exact:
            return torch.equal(x, y)
        return x.shape == y.shape and bool(torch.allclose(x.double(), y.double(), rtol=RTOL, atol=ATOL))
    return x == y


def record_differences(a: dict, b: dict, *, exact_first_step: bool = True) -> tuple[list[str], int]:
    """Per-response differences between two actor-input records of one step (module docstring); and the number of
    response fields compared. ``exact_first_step=False``: step 1's log-probs to the tolerance too (two runs whose
    forwards differ in float order, e.g. packed against padded sequences, not only in their reductions)."""
    rows_a, rows_b = _real_rows_in_key_order(a), _real_rows_in_key_order(b)
    step = a["step"]
    keys_a, keys_b = [a["keys"][i] for i in rows_a], [b["keys"][i] for i in rows_b]
    if keys_a != keys_b:
        return [f"step {step}: the runs trained other responses ({len(keys_a)} vs {len(keys_b)}; first keys differ)"], 0
    differences, compared = [], 0
    for field in EXACT_FIELDS + LOG_PROB_FIELDS:
        if field not in a or field not in b:
            continue
        exact = field in EXACT_FIELDS or (step == 1 and exact_first_step)
        for key, x, y in zip(keys_a, _values(a, field, rows_a), _values(b, field, rows_b), strict=True):
            compared += 1
            if not _same(x, y, exact):
                how = "exactly" if exact else "beyond tolerance"
                differences.append(f"step {step}: {field} of {key} differs ({how})")
    return differences, compared


def compare_runs(
    run_a: str, run_b: str, ranks_a: int, ranks_b: int, *, exact_first_step: bool = True
) -> tuple[list[str], dict]:
    """:func:`metric_differences` over every logged value and :func:`record_differences` over every step both
    recorded (``exact_first_step``: see there); returns the differences and the counts compared."""
    from verl_ext.report.run import load_run

    steps_a, steps_b = load_run(run_a).log.steps, load_run(run_b).log.steps
    shared = {s: v for s, v in steps_a.items() if s in steps_b}
    differences, values = metric_differences(shared, steps_b, ranks_a, ranks_b)
    from verl_ext.checks.probe import read_actor_inputs

    records_a, records_b = read_actor_inputs(run_a), read_actor_inputs(run_b)
    responses = 0
    for step in sorted(set(records_a) & set(records_b)):
        found, count = record_differences(records_a[step], records_b[step], exact_first_step=exact_first_step)
        differences += found
        responses += count
    counts = {"steps": sorted(shared), "values": values, "response_fields": responses}
    return differences, counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", help="run folder of one world size (e.g. NODES=1)")
    parser.add_argument("run_b", help="run folder of the same seed and settings at another world size")
    parser.add_argument("--ranks", type=int, nargs=2, default=(1, 2), metavar=("A", "B"), help="training ranks")
    parser.add_argument(
        "--packed",
        action="store_true",
        help="one run packs its sequences (USE_REMOVE_PADDING=1): step 1's log-probs to the tolerance, not exactly",
    )
    args = parser.parse_args(argv)
    differences, counts = compare_runs(args.run_a, args.run_b, *args.ranks, exact_first_step=not args.packed)
    for line in differences[:50]:
        print(line)
    print(
        f"{counts['values']} logged values over steps {counts['steps']} and {counts['response_fields']} response "
        f"fields compared, {len(differences)} differ"
    )
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
