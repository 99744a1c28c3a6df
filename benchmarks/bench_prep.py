"""Benchmark ``diva-prep``: convert throughput on 512x512 images, and variants throughput against a slow endpoint.

* convert: rows/s on a geometry3k-layout parquet of 512x512 PNGs, with 1 decoding thread and with the default pool
  (side by side, ratio printed).
* variants: a loopback chat-completions server in a separate process answers every call after ``--latency`` seconds
  (200 ms); at ``--concurrency`` 32 the ideal is concurrency / latency = 160 requests/s. Reported: measured
  requests/s over the whole ``run_variants`` call (reading, generation, checks, cache, writing) as a fraction of
  ideal. Target >= 0.8.

``python benchmarks/bench_prep.py [--quick]``; the last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from record import add_no_record, record  # noqa: E402

from data_prep.convert import convert  # noqa: E402
from data_prep.llm_client import RetryPolicy  # noqa: E402
from data_prep.synth import synth_rows  # noqa: E402
from data_prep.variants import VariantsOptions, run_variants  # noqa: E402
from verl_ext.data.schema import SCHEMA, build_prompt  # noqa: E402


def photo_like_png(seed: int, size: int = 512) -> bytes:
    """A smooth gradient with shapes and mild noise: compresses like a real figure/photo mix, not like pure noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack([x * 200, y * 200, (x + y) * 100], axis=-1)
    base += rng.normal(0, 6, base.shape)
    for _ in range(6):
        cx, cy, r = rng.integers(0, size, 2).tolist() + [int(rng.integers(20, 120))]
        mask = (np.mgrid[0:size, 0:size][0] - cy) ** 2 + (np.mgrid[0:size, 0:size][1] - cx) ** 2 < r * r
        base[mask] = rng.integers(0, 255, 3)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def bench_convert(folder: Path, rows: int) -> dict:
    images = [photo_like_png(seed) for seed in range(8)]
    source = folder / "g3k.parquet"
    pq.write_table(
        pa.table(
            {
                "images": [[{"bytes": images[i % len(images)], "path": f"{i}.png"}] for i in range(rows)],
                "problem": [f"<image>Find x in figure {i}." for i in range(rows)],
                "answer": [str(i) for i in range(rows)],
            }
        ),
        source,
    )
    figures = {"image_kb": round(sum(map(len, images)) / len(images) / 1024, 1)}
    default_workers = min(8, os.cpu_count() or 1)
    for label, workers in (("1_thread", 1), (f"{default_workers}_threads", default_workers)):
        started = time.perf_counter()
        summary = convert(source, "geometry3k", folder / f"out_{workers}.parquet", workers=workers, progress=False)
        elapsed = time.perf_counter() - started
        assert summary.rows_written == rows and not summary.failed
        figures[f"convert_rows_per_s_{label}"] = round(rows / elapsed, 1)
    figures["convert_threads"] = default_workers
    return figures


def _serve(sock: socket.socket, answers: dict, latency: float) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        if isinstance(user, list):
            user = next(part["text"] for part in user if part["type"] == "text")
        await asyncio.sleep(latency)
        if '"paraphrases"' in system:
            question = user.split("Question: ", 1)[1]
            content = {"paraphrases": [f"Version {c}: {question}" for c in "AB"]}
        else:
            question = user.split("Problem: ", 1)[1]
            content = {"steps": ["Read the figure.", "Pick a formula.", "Compute."], "final_answer": answers[question]}
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": json.dumps(content)},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 50, "completion_tokens": 30, "total_tokens": 80},
            }
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", handle)
    web.run_app(app, sock=sock, print=None, access_log=None, handle_signals=True)


def bench_variants(folder: Path, rows: int, latency: float, concurrency: int) -> dict:
    table_rows = []
    for index, row in enumerate(synth_rows(rows, seed=1)):
        question = f"Item {index}: {row['question']}"
        row.update(question=question, prompt=build_prompt(question, 1), paraphrases=[], hint_steps=[])
        table_rows.append(row)
    source = folder / "variants_in.parquet"
    pq.write_table(pa.Table.from_pylist(table_rows, schema=SCHEMA), source)
    answers = {row["question"]: row["reward_model"]["ground_truth"] for row in table_rows}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    server = multiprocessing.get_context("fork").Process(target=_serve, args=(sock, answers, latency), daemon=True)
    server.start()
    try:
        options = VariantsOptions(
            model="bench",
            base_url=f"http://127.0.0.1:{port}/v1",
            concurrency=concurrency,
            cache_dir=folder / "cache",
            retry=RetryPolicy(max_retries=2, base_delay=0.05),
            progress=False,
        )
        started, cpu_started = time.perf_counter(), time.process_time()
        summary = run_variants(source, folder / "variants_out.parquet", options)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    finally:
        server.terminate()
        server.join(10)
    assert not summary.failed_tasks and summary.rows_with_hints == rows and summary.retries == 0, summary.format()
    ideal = concurrency / latency
    measured = summary.requests / elapsed
    return {
        "variants_requests": summary.requests,
        "variants_requests_per_s": round(measured, 1),
        "variants_ideal_requests_per_s": round(ideal, 1),
        "variants_fraction_of_ideal": round(measured / ideal, 3),
        "variants_rows_per_s": round(rows / elapsed, 1),
        # CPU of this (client) process per request, setup and parquet I/O included: insensitive to other load on
        # the machine, and 1000 / this is the request rate one free core could sustain.
        "variants_client_cpu_ms_per_request": round(1000 * cpu / summary.requests, 2),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke check in seconds")
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=32)
    add_no_record(parser)
    args = parser.parse_args()
    convert_rows, variant_rows = (32, 64) if args.quick else (512, 480)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        figures = {"quick": args.quick, "convert_rows": convert_rows, "variant_rows": variant_rows}
        figures.update(bench_convert(folder, convert_rows))
        figures.update(bench_variants(folder, variant_rows, args.latency, args.concurrency))
    threads = figures["convert_threads"]
    figures["convert_thread_speedup"] = round(
        figures[f"convert_rows_per_s_{threads}_threads"] / figures["convert_rows_per_s_1_thread"], 2
    )
    figures["variants_target_fraction"] = 0.8
    figures["variants_meets_target"] = figures["variants_fraction_of_ideal"] >= 0.8
    print(
        f"convert 512x512 ({figures['image_kb']} KB PNG): {figures['convert_rows_per_s_1_thread']} rows/s on 1 thread, "
        f"{figures[f'convert_rows_per_s_{threads}_threads']} rows/s on {threads} ({figures['convert_thread_speedup']}x)"
    )
    print(
        f"variants at concurrency {args.concurrency}, {args.latency * 1000:.0f} ms/call: "
        f"{figures['variants_requests_per_s']} req/s of ideal {figures['variants_ideal_requests_per_s']} "
        f"= {figures['variants_fraction_of_ideal']:.3f} (target >= 0.8); client CPU "
        f"{figures['variants_client_cpu_ms_per_request']} ms/request; load average {figures['load_average_1min']} "
        f"on {os.cpu_count()} cores"
    )
    if not args.no_record:
        record("prep_quick" if args.quick else "prep", figures)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
