"""Cost of the DIVA reward per response, side by side in one process.

Measures ``verl_ext.reward.compute_score`` on (a) answers identical to the ground truth (string fast path),
(b) equivalent but differently written answers (checked in the verifier child process), and the same
pairs as (b) checked (c) in-process by mathruler + math-verify without isolation, the unbounded way.
Prints per-call milliseconds, the isolation overhead ratio (b / c), the cost of one adversarial answer
that hits the timeout (kill + restart of the child), and as the last line one JSON object.

    python benchmarks/bench_reward.py [--quick]
"""

import argparse
import json
import logging
import time

from record import add_no_record, record

from verl_ext.reward import compute_score

EQUIVALENT_PAIRS = [  # (ground truth, differently written answer)
    ("\\frac{1}{2}", "0.5"),
    ("0.25", "\\frac{1}{4}"),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
    ("30^\\circ", "30"),
    ("x=2", "2"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("12", "12.0"),
    ("\\pi", "3.14159"),  # unequal
]


def _response(answer: str) -> str:
    return f"<think>Some reasoning about the figure.</think>The answer is \\boxed{{{answer}}}."


def _per_call_ms(calls, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        for call in calls:
            call()
    return 1000 * (time.perf_counter() - start) / (repeats * len(calls))


def _in_process_check(ground_truth: str, answer: str) -> bool:
    from math_verify import parse, verify
    from mathruler.grader import grade_answer

    if grade_answer(answer, ground_truth):
        return True
    return bool(verify(parse("\\boxed{" + ground_truth + "}"), parse("\\boxed{" + answer + "}")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats, runs in seconds (smoke check)")
    add_no_record(parser)
    args = parser.parse_args()
    repeats = 2 if args.quick else 20
    logging.getLogger("verl_ext.reward").setLevel(logging.ERROR)  # the timeout warning is expected below

    compute_score("d", _response("1"), "2")  # start the verifier child outside the timings
    _in_process_check("1", "2")  # import sympy and friends outside the timings

    exact = [lambda gt=gt: compute_score("d", _response(gt), gt) for gt, _ in EQUIVALENT_PAIRS]
    isolated = [lambda gt=gt, a=a: compute_score("d", _response(a), gt) for gt, a in EQUIVALENT_PAIRS]
    in_process = [lambda gt=gt, a=a: _in_process_check(gt, a) for gt, a in EQUIVALENT_PAIRS]

    exact_ms = _per_call_ms(exact, repeats * 10)
    isolated_ms = _per_call_ms(isolated, repeats)
    in_process_ms = _per_call_ms(in_process, repeats)

    timeout_s = 1.0
    start = time.perf_counter()
    compute_score("d", _response("10^{10^{10}}"), "5", verify_timeout_s=timeout_s)
    compute_score("d", _response("0.5"), "\\frac{1}{2}")  # includes restarting the child
    adversarial_s = time.perf_counter() - start

    print(f"exact-match fast path      {exact_ms:8.3f} ms/call")
    print(f"verifier child (isolated)  {isolated_ms:8.3f} ms/call")
    print(f"in-process, unbounded      {in_process_ms:8.3f} ms/call")
    print(f"isolation overhead         {isolated_ms / in_process_ms:8.2f} x")
    print(f"fast path speed-up         {isolated_ms / exact_ms:8.1f} x")
    print(f"one timed-out answer (timeout {timeout_s:.0f} s) + next call incl. restart: {adversarial_s:.2f} s")
    figures = {
        "exact_ms": round(exact_ms, 4),
        "isolated_ms": round(isolated_ms, 3),
        "in_process_ms": round(in_process_ms, 3),
        "isolation_overhead_ratio": round(isolated_ms / in_process_ms, 3),
        "fast_path_speedup": round(isolated_ms / exact_ms, 1),
        "timeout_plus_restart_s": round(adversarial_s, 2),
        "repeats": repeats,
    }
    if not args.no_record:
        record("reward_quick" if args.quick else "reward", figures)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
