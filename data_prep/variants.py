"""``diva-prep variants``: paraphrases and reasoning hints for every question, from an OpenAI-compatible endpoint.

Per row, two tasks run concurrently: ``paraphrases`` (skipped when the row already has enough) and ``hint``
(skipped when the row already has hint steps). Each task asks up to ``attempts`` times until it has what it needs
(see :mod:`data_prep.generation` for what is accepted); its result, rejects included, goes to the cache as soon as
it finishes. A rerun of the same command therefore sends no request for finished tasks. Requests that still fail
after the client's retries leave the task unfinished (not cached): the output keeps the row without that variant,
the command exits non-zero, and rerunning retries exactly those tasks.

Rows are streamed from the input through a bounded queue to ``concurrency`` row workers; at most ``concurrency``
requests are in flight. The output is the input (first ``limit`` rows) with ``paraphrases`` and ``hint_steps``
filled, written in input order; every rejected generation goes to the rejects JSONL with its reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from data_prep.cache import ResultCache, content_hash
from data_prep.errors import PrepError
from data_prep.generation import (
    HINT_PROMPT_VERSION,
    PARAPHRASE_PROMPT_VERSION,
    accept_hint,
    accept_paraphrases,
    hint_messages,
    paraphrase_messages,
)
from data_prep.llm_client import ChatClient, RequestFailed, RetryPolicy
from data_prep.parquet_io import DivaParquetWriter, iter_parquet_rows, num_rows, open_parquet
from verl_ext.data.schema import missing_columns

TASK_PARAPHRASES, TASK_HINT = "paraphrases", "hint"
# Cells every request (question, answer) and the cache key (question id) need; checked before the first request.
REQUIRED_CELLS = (("question",), ("reward_model", "ground_truth"), ("extra_info", "question_id"))


@dataclass
class VariantsOptions:
    model: str
    base_url: str | None = None
    concurrency: int = 32
    paraphrases: int = 2  # paraphrases wanted per question
    limit: int | None = None  # only the first N rows (a trial run); the output then holds those rows
    cache_dir: Path | None = None  # default: <output>.cache/
    rejects_path: Path | None = None  # default: <output stem>.rejects.jsonl
    attempts: int = 2  # generations per task before giving up on it (each one is a paid request)
    temperature: float = 0.7
    max_tokens: int = 1024
    request_timeout: float = 120.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    text_only: bool = False  # never send images (for text-only models)
    progress: bool = True


@dataclass
class VariantsSummary:
    output: Path
    rejects_path: Path
    cache_paths: dict[str, Path] = field(default_factory=dict)  # task -> its cache file
    rows: int = 0
    tasks_from_cache: int = 0
    tasks_generated: int = 0
    failed_tasks: list[dict] = field(default_factory=list)
    rows_with_paraphrases: int = 0
    rows_with_hints: int = 0
    rejects: int = 0
    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0

    def format(self) -> str:
        lines = [
            f"rows: {self.rows}; tasks generated: {self.tasks_generated}, from cache: {self.tasks_from_cache}, "
            f"failed: {len(self.failed_tasks)}",
            f"rows with paraphrases: {self.rows_with_paraphrases}, with hint steps: {self.rows_with_hints}",
            f"requests: {self.requests} ({self.retries} retries), tokens: {self.prompt_tokens} prompt + "
            f"{self.completion_tokens} completion, {self.elapsed_s:.1f} s",
            f"rejected generations: {self.rejects} (reasons in {self.rejects_path})",
            "cache: " + ", ".join(f"{task} {path}" for task, path in self.cache_paths.items()),
        ]
        for failure in self.failed_tasks[:5]:
            lines.append(f"  failed: {failure['question_id']} {failure['task']}: {failure['error']}")
        if self.failed_tasks:
            lines.append(
                f"FAILED: {len(self.failed_tasks)} task(s) did not finish; {self.output} was written without them. "
                "Rerun the same command: finished tasks come from the cache and are not requested again."
            )
        else:
            lines.append(f"wrote {self.output}")
        return "\n".join(lines)


class _Generator:
    """Runs the tasks of one row against the client and the cache."""

    def __init__(
        self, client: ChatClient, caches: dict[str, ResultCache], options: VariantsOptions, summary: VariantsSummary
    ):
        self.client, self.caches, self.options, self.summary = client, caches, options, summary

    async def _paraphrases(self, question: str, answer: str, existing: list[str], wanted: int) -> dict:
        accepted, rejects = [], []
        for attempt in range(self.options.attempts):
            reply = await self.client.complete(
                paraphrase_messages(question, wanted - len(accepted)), self.options.temperature, self.options.max_tokens
            )
            if reply.finish_reason == "length":
                rejects.append({"reason": "malformed output: cut off at max_tokens", "output": reply.text})
                continue
            got, refused = accept_paraphrases(
                reply.text, question, answer, wanted - len(accepted), existing=[*existing, *accepted]
            )
            accepted += got
            rejects += [{**item, "attempt": attempt} for item in refused]
            if len(accepted) >= wanted:
                break
        return {"paraphrases": accepted, "rejects": rejects}

    async def _hint(self, question: str, answer: str, images: list[bytes]) -> dict:
        rejects = []
        messages = hint_messages(question, images, self.options.text_only)
        for attempt in range(self.options.attempts):
            reply = await self.client.complete(messages, self.options.temperature, self.options.max_tokens)
            if reply.finish_reason == "length":
                rejects.append({"reason": "malformed output: cut off at max_tokens", "output": reply.text})
                continue
            steps, refused = accept_hint(reply.text, question, answer)
            rejects += [{**item, "attempt": attempt} for item in refused]
            if steps is not None:
                return {"hint_steps": steps, "rejects": rejects}
        return {"hint_steps": [], "rejects": rejects}

    async def _task(self, question_id: str, task: str, hash_: str, make) -> dict | None:
        cache = self.caches[task]
        cached = cache.get(question_id, task, hash_)
        if cached is not None:
            self.summary.tasks_from_cache += 1
            return cached
        try:
            result = await make()
        except RequestFailed as exc:
            self.summary.failed_tasks.append({"question_id": question_id, "task": task, "error": str(exc)})
            return None
        cache.put(question_id, task, hash_, result)
        self.summary.tasks_generated += 1
        return result

    async def row(self, row: dict) -> dict:
        """``{"paraphrases": [...] | None, "hint_steps": [...] | None, "rejects": {task: [...]}}`` for one row."""
        question_id = row["extra_info"]["question_id"]
        question, answer = row["question"], row["reward_model"]["ground_truth"]
        existing = row.get("paraphrases") or []
        wanted = self.options.paraphrases - len(existing)
        jobs = {}
        if wanted > 0:
            hash_ = content_hash(question, answer, str(wanted))
            jobs[TASK_PARAPHRASES] = self._task(
                question_id, TASK_PARAPHRASES, hash_, lambda: self._paraphrases(question, answer, existing, wanted)
            )
        if not row.get("hint_steps"):
            images = [image["bytes"] for image in row.get("images") or [] if image and image.get("bytes")]
            hash_ = content_hash(question, answer, *(hashlib.sha256(data).hexdigest() for data in images))
            jobs[TASK_HINT] = self._task(question_id, TASK_HINT, hash_, lambda: self._hint(question, answer, images))
        results = dict(zip(jobs, await asyncio.gather(*jobs.values()), strict=True))
        out = {"paraphrases": None, "hint_steps": None, "rejects": {}}
        if results.get(TASK_PARAPHRASES) is not None:
            out["paraphrases"] = existing + results[TASK_PARAPHRASES]["paraphrases"]
            out["rejects"][TASK_PARAPHRASES] = results[TASK_PARAPHRASES]["rejects"]
        if results.get(TASK_HINT) is not None:
            out["hint_steps"] = results[TASK_HINT]["hint_steps"]
            out["rejects"][TASK_HINT] = results[TASK_HINT]["rejects"]
        return out


async def _generate_all(input_path: Path, total: int, options: VariantsOptions, summary: VariantsSummary) -> dict:
    client = ChatClient(options.model, options.base_url, options.concurrency, options.request_timeout, options.retry)
    # One cache per task kind, keyed only by what changes that task's requests: a new --paraphrases must not
    # re-request the hints (the expensive, image-bearing requests), nor a new --text-only the paraphrases.
    task_settings = {
        TASK_HINT: {
            "task": TASK_HINT,
            "model": options.model,
            "prompt_version": HINT_PROMPT_VERSION,
            "text_only": options.text_only,
        },
        TASK_PARAPHRASES: {
            "task": TASK_PARAPHRASES,
            "model": options.model,
            "prompt_version": PARAPHRASE_PROMPT_VERSION,
            "paraphrases": options.paraphrases,
        },
    }
    caches = {task: ResultCache(options.cache_dir, settings) for task, settings in task_settings.items()}
    summary.cache_paths = {task: cache.path for task, cache in caches.items()}
    generator = _Generator(client, caches, options, summary)
    columns = ["question", "reward_model", "extra_info", "paraphrases", "hint_steps"]
    if not options.text_only:
        columns.append("images")
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * options.concurrency)
    results: dict[int, dict] = {}
    bar = tqdm(total=total, desc="variants", unit="row", disable=not options.progress)

    def show_progress() -> None:
        stats = client.stats
        bar.set_postfix(
            tok_in=stats["prompt_tokens"],
            tok_out=stats["completion_tokens"],
            req=stats["requests"],
            retries=stats["retries"],
            failed=len(summary.failed_tasks),
            refresh=False,
        )

    async def produce() -> None:
        for index, row in enumerate(iter_parquet_rows(input_path, columns=columns)):
            if index >= total:
                break
            await queue.put((index, row))
        for _ in range(options.concurrency):
            await queue.put(None)

    async def work() -> None:
        while (item := await queue.get()) is not None:
            index, row = item
            results[index] = await generator.row(row)
            show_progress()
            bar.update(1)

    tasks = [asyncio.ensure_future(produce())] + [asyncio.ensure_future(work()) for _ in range(options.concurrency)]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:  # only after a failure (e.g. the endpoint refuses the key): stop the rest
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in done:
            task.result()  # re-raise the first failure, if any
    finally:
        bar.close()
        for cache in caches.values():
            cache.close()
        await client.close()
        for key in ("requests", "retries", "prompt_tokens", "completion_tokens"):
            setattr(summary, key, client.stats[key])
    return results


def _null_cell(row: dict) -> str | None:
    """Dotted name of the first :data:`REQUIRED_CELLS` entry that is null in ``row`` (a null struct names itself)."""
    for path in REQUIRED_CELLS:
        value = row
        for depth, key in enumerate(path):
            value = value[key]
            if value is None:
                return ".".join(path[: depth + 1])
    return None


def _check_required_cells(input_path: Path, total: int) -> None:
    """Fail before paying for any request when one of the first ``total`` rows has a null required cell."""
    columns = sorted({path[0] for path in REQUIRED_CELLS})
    for index, row in enumerate(iter_parquet_rows(input_path, columns=columns)):
        if index >= total:
            return
        column = _null_cell(row)
        if column is not None:
            raise PrepError(
                f"--input {str(input_path)!r}: row {index} has a null {column!r}; every row needs question, "
                "reward_model.ground_truth and extra_info.question_id. Fix or drop the row (diva-prep validate "
                "lists such rows) and rerun."
            )


def run_variants(input_path: str | Path, output: str | Path, options: VariantsOptions) -> VariantsSummary:
    """Generate variants for ``input_path`` (a DIVA parquet) and write ``output``; returns the summary."""
    input_path, output = Path(input_path), Path(output)
    if not input_path.is_file():
        raise PrepError(f"--input {str(input_path)!r} is not a file")
    missing = missing_columns(open_parquet(input_path).schema_arrow.names)
    if missing:
        raise PrepError(f"--input {str(input_path)!r} is not a DIVA parquet: missing columns {missing} (run convert)")
    if options.paraphrases < 0 or options.attempts < 1:
        raise PrepError("--paraphrases must be >= 0 and --attempts >= 1")
    if options.limit is not None and options.limit < 1:
        raise PrepError(f"--limit must be at least 1, got {options.limit}")
    options.cache_dir = Path(options.cache_dir or output.with_name(output.name + ".cache"))
    rejects_path = Path(options.rejects_path or output.with_name(output.stem + ".rejects.jsonl"))
    summary = VariantsSummary(output=output, rejects_path=rejects_path)
    total = num_rows(input_path)
    if options.limit is not None:
        total = min(total, options.limit)
    _check_required_cells(input_path, total)
    started = time.perf_counter()
    results = asyncio.run(_generate_all(input_path, total, options, summary))
    summary.rows = total
    with DivaParquetWriter(output) as writer, open(rejects_path, "w", encoding="utf-8") as rejects_file:
        for index, row in enumerate(iter_parquet_rows(input_path)):
            if index >= total:
                break
            result = results[index]
            if result["paraphrases"] is not None:
                row["paraphrases"] = result["paraphrases"]
            if result["hint_steps"] is not None:
                row["hint_steps"] = result["hint_steps"]
            summary.rows_with_paraphrases += bool(row["paraphrases"])
            summary.rows_with_hints += bool(row["hint_steps"])
            for task, rejects in result["rejects"].items():
                for reject in rejects:
                    record = {"row": index, "question_id": row["extra_info"]["question_id"], "task": task, **reject}
                    rejects_file.write(json.dumps(record, ensure_ascii=False) + "\n")
                    summary.rejects += 1
            writer.write(row)
        writer.commit()
    summary.elapsed_s = time.perf_counter() - started
    return summary
