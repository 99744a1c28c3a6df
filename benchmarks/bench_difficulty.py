"""Difficulty bookkeeping per step: the DIVA difficulty service versus the released ``dataset.map`` rewrite.

Both sides do the same job in one process, on the same sizes (default: the paper's 18,000 training questions,
512 questions updated per step):

1. service: one step's batched update through the real named Ray actor (with its restart journal on disk),
   then the snapshot refresh of the changed entries into a :class:`SharedDifficultyTable` of every question;
   round trip timed over many steps. For reference, a refresh that pulls the whole ``{qid: D}`` snapshot
   each step is timed too.
2. released: the authors keep D as a column of the HF ``datasets.Dataset`` (rows carry ~50 KB image bytes)
   and rewrite it with ``dataset.map`` once per step. Timed a few times (each run rewrites the whole table).
   The map function is batched and reads only the id and difficulty columns, which is the fast way to do it.

Run: ``python benchmarks/bench_difficulty.py`` (about a minute, ~2 GB of temp disk) or ``--quick`` (seconds).
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, REPO_ROOT)

from record import add_no_record, record  # noqa: E402

TARGET_SPEEDUP = 100.0  # dataset.map over the service, p50
TARGET_P50_MS = 20.0  # the service's update and refresh, p50


def percentile_ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds) * 1000.0, q))


def step_batches(num_questions: int, batch: int, steps: int, seed: int):
    rng = np.random.default_rng(seed)
    for step in range(steps):
        rows = rng.choice(num_questions, size=batch, replace=False)
        # alpha = fraction correct over 10 responses (original + variant, 5 rollouts each).
        yield step, rows, rng.integers(0, 11, size=batch) / 10.0


def bench_service(question_ids: list[str], batch: int, steps: int, snapshot_steps: int, workdir: str) -> dict:
    import ray

    from verl_ext.difficulty.service import DifficultyService
    from verl_ext.difficulty.shared_table import SharedDifficultyTable

    ray.init(num_cpus=16, include_dashboard=False, namespace=f"bench_difficulty_{os.getpid()}", log_to_driver=False)
    try:
        service = DifficultyService.get_or_create("bench", live_dir=os.path.join(workdir, "live"))
        table = SharedDifficultyTable(question_ids, initial=5.0)
        # Warm up: every question seen once, so the table and the actor hold the full size.
        for start in range(0, len(question_ids), batch):
            chunk = question_ids[start : start + batch]
            service.update(chunk, np.full(len(chunk), 0.5), step=0)
        service.attach_table(table)

        round_trip = []
        for step, rows, alphas in step_batches(len(question_ids), batch, steps, seed=1):
            ids = [question_ids[r] for r in rows]
            version_before = service.table_version
            t0 = time.perf_counter()
            pending = service.update_async(ids, alphas, step + 1)
            service.finish(pending)  # the update and the refresh of the changed rows, one round trip
            round_trip.append(time.perf_counter() - t0)
            assert service.table_version == version_before + 1
        # The table now equals the service's state.
        assert np.array_equal(table.values.numpy(), service.difficulties(question_ids))

        full_refresh = []
        for _ in range(snapshot_steps):
            t0 = time.perf_counter()
            table.write_snapshot(service.snapshot())
            full_refresh.append(time.perf_counter() - t0)
        return {
            "service_p50_ms": percentile_ms(round_trip, 50),
            "service_p95_ms": percentile_ms(round_trip, 95),
            "full_snapshot_refresh_p50_ms": percentile_ms(full_refresh, 50),
            "service_steps": steps,
        }
    finally:
        ray.shutdown()


def bench_dataset_map(question_ids: list[str], batch: int, image_bytes: int, runs: int, workdir: str) -> dict:
    import datasets

    datasets.disable_progress_bars()
    cache = os.path.join(workdir, "hf_cache")
    features = datasets.Features(
        {
            "question_id": datasets.Value("string"),
            "image": datasets.Value("binary"),
            "difficulty": datasets.Value("float64"),
        }
    )

    def rows():
        rng = np.random.default_rng(0)
        for qid in question_ids:
            yield {"question_id": qid, "image": rng.bytes(image_bytes), "difficulty": 5.0}

    t0 = time.perf_counter()
    dataset = datasets.Dataset.from_generator(rows, features=features, cache_dir=cache)
    build_s = time.perf_counter() - t0

    times = []
    for step, rows_updated, alphas in step_batches(len(question_ids), batch, runs, seed=1):
        new_d = {
            question_ids[r]: float(np.clip(5.0 + 4.0 * (0.5 - a), 1, 9))
            for r, a in zip(rows_updated, alphas, strict=True)
        }

        def rewrite(qids, difficulty, new_d=new_d):
            return {"difficulty": [new_d.get(q, d) for q, d in zip(qids, difficulty, strict=True)]}

        t0 = time.perf_counter()
        updated = dataset.map(
            rewrite,
            batched=True,
            batch_size=1000,
            input_columns=["question_id", "difficulty"],
            load_from_cache_file=False,
            cache_file_name=os.path.join(cache, f"step_{step}.arrow"),
        )
        times.append(time.perf_counter() - t0)
        assert updated.num_rows == len(question_ids)
        if step > 0:  # keep one rewritten copy on disk at a time
            os.unlink(os.path.join(cache, f"step_{step - 1}.arrow"))
        dataset = updated
    return {
        "dataset_map_p50_ms": percentile_ms(times, 50),
        "dataset_map_min_ms": float(min(times) * 1000.0),
        "dataset_map_runs": runs,
        "dataset_build_s": build_s,
        "dataset_mb": len(question_ids) * image_bytes / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=18000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--image-kb", type=int, default=50)
    parser.add_argument("--service-steps", type=int, default=200)
    parser.add_argument("--map-runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke check in seconds")
    add_no_record(parser)
    args = parser.parse_args()
    if args.quick:
        args.questions, args.service_steps, args.map_runs = 2000, 30, 2

    question_ids = [f"q{i:06d}" for i in range(args.questions)]
    workdir = tempfile.mkdtemp(prefix="bench_difficulty_")
    try:
        service = bench_service(question_ids, args.batch, args.service_steps, 10, workdir)
        released = bench_dataset_map(question_ids, args.batch, args.image_kb * 1024, args.map_runs, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    speedup = released["dataset_map_p50_ms"] / service["service_p50_ms"]
    print(f"questions={args.questions} batch={args.batch} image={args.image_kb} KB/row quick={args.quick}")
    print(
        f"service  update+refresh  p50 {service['service_p50_ms']:.2f} ms  p95 {service['service_p95_ms']:.2f} ms "
        f"(a full-snapshot refresh alone instead: "
        f"{service['full_snapshot_refresh_p50_ms']:.2f} ms)"
    )
    print(
        f"released dataset.map     p50 {released['dataset_map_p50_ms']:.0f} ms "
        f"over {released['dataset_map_runs']} runs "
        f"({released['dataset_mb']:.0f} MB of image bytes)"
    )
    print(
        f"ratio dataset.map / service = {speedup:.0f}x (target >= {TARGET_SPEEDUP:.0f}x); "
        f"service p50 target < {TARGET_P50_MS:.0f} ms"
    )
    figures = {
        "questions": args.questions,
        "batch": args.batch,
        "image_kb": args.image_kb,
        "quick": args.quick,
        **{k: round(v, 3) if isinstance(v, float) else v for k, v in {**service, **released}.items()},
        "speedup_p50": round(speedup, 1),
        "target_speedup": TARGET_SPEEDUP,
        "target_p50_ms": TARGET_P50_MS,
        "meets_speedup_target": speedup >= TARGET_SPEEDUP,
        "meets_p50_target": service["service_p50_ms"] < TARGET_P50_MS,
    }
    if not args.no_record:
        record("difficulty_quick" if args.quick else "difficulty", figures)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
