"""``diva-prep variants`` against a real HTTP server on loopback with scripted failures, and a killed run resuming."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from loopback_chat_server import LoopbackChatServer, Reply
from prep_fixtures import corrupt_data_pages, diva_rows_without_variants, write_diva

from data_prep.cli import main
from data_prep.llm_client import EndpointUnusable, RetryPolicy
from data_prep.validate import validate_file
from data_prep.variants import VariantsOptions, run_variants

REPO = Path(__file__).resolve().parents[2]
FAST_RETRY = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.05)


@pytest.fixture
def dataset(tmp_path):
    rows = diva_rows_without_variants(6)
    path = write_diva(tmp_path / "in.parquet", rows)
    answers = {row["question"]: row["reward_model"]["ground_truth"] for row in rows}
    return path, rows, answers


def options(server, tmp_path, **overrides) -> VariantsOptions:
    settings = dict(
        model="loopback-model",
        base_url=server.url,
        concurrency=4,
        cache_dir=tmp_path / "cache",
        request_timeout=0.5,
        retry=FAST_RETRY,
        progress=False,
    )
    settings.update(overrides)
    return VariantsOptions(**settings)


def read_rejects(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_scripted_errors_retries_and_rejects(tmp_path, dataset):
    path, rows, answers = dataset
    q = [row["question"] for row in rows]
    leaky = json.dumps({"steps": ["Read it.", "Think.", f"So the result is {answers[q[0]]}."], "final_answer": "0"})
    leaky = leaky.replace('"final_answer": "0"', f'"final_answer": "{answers[q[0]]}"')
    wrong = json.dumps({"steps": ["a", "b", "c"], "final_answer": "-12345"})
    scripts = {
        (q[0], "paraphrases"): [Reply(status=429, headers={"Retry-After": "0"}), Reply(status=500)],
        (q[0], "hint"): [Reply(content=leaky)],
        (q[1], "hint"): [Reply(delay=2.0)],  # longer than the 0.5 s client timeout
        (q[2], "hint"): [Reply(content="Sure! Here are your steps: step one, step two")],
        (q[3], "hint"): [Reply(content=wrong), Reply(content=wrong)],  # both attempts wrong: no hint for q3
        (q[4], "paraphrases"): [Reply(content='{"paraphrases": ["Item 999: a different question entirely?"]}')],
        (q[5], "hint"): [Reply(content=json.dumps({"steps": ["only one"], "final_answer": answers[q[5]]}))],
    }
    out = tmp_path / "out.parquet"
    with LoopbackChatServer(answers, scripts) as server:
        summary = run_variants(path, out, options(server, tmp_path))
        answered = Counter(server.answered())
        statuses = Counter(outcome for _, _, outcome in server.records)
    assert summary.failed_tasks == []
    assert summary.retries == 3 and statuses["429"] == 1 and statuses["500"] == 1
    assert summary.prompt_tokens == 100 * sum(answered.values())
    # One successful request per task, plus the second attempt where the first reply was rejected.
    assert answered[(q[0], "hint")] == 2 and answered[(q[2], "hint")] == 2 and answered[(q[3], "hint")] == 2
    assert answered[(q[4], "paraphrases")] == 2 and answered[(q[1], "hint")] == 1

    result = pq.read_table(out).to_pylist()
    assert [row["extra_info"]["question_id"] for row in result] == [row["extra_info"]["question_id"] for row in rows]
    assert all(len(row["paraphrases"]) == 2 for row in result)
    assert [bool(row["hint_steps"]) for row in result] == [True, True, True, False, True, True]
    assert result[0]["images"] == rows[0]["images"]

    reasons = {(r["question_id"].rsplit("/", 1)[1], r["task"]): r["reason"] for r in read_rejects(summary.rejects_path)}
    assert reasons[("0", "hint")].startswith("hint leaks the answer")
    assert reasons[("2", "hint")].startswith("malformed output")
    assert reasons[("3", "hint")].startswith("wrong final answer")
    assert reasons[("4", "paraphrases")].startswith("paraphrase changes the numbers")
    assert reasons[("5", "hint")].startswith("wrong number of steps")
    assert summary.rejects == 6  # q3's two wrong answers count twice
    assert validate_file(out).ok


def test_failed_tasks_exit_nonzero_and_a_rerun_requests_only_them(tmp_path, dataset, capsys):
    path, rows, answers = dataset
    q = [row["question"] for row in rows]
    out = tmp_path / "out.parquet"
    argv = ["variants", "--input", str(path), "--output", str(out), "--model", "m", "--concurrency", "3"]
    argv += ["--cache", str(tmp_path / "cache"), "--max-retries", "2", "--backoff", "0.01", "--no-progress"]
    with LoopbackChatServer(answers, {(q[1], "hint"): [Reply(status=503)] * 3}) as server:
        assert main([*argv, "--base-url", server.url]) == 1
        assert "FAILED: 1 task(s) did not finish" in capsys.readouterr().out
        assert len(server.records) == 2 * 6 + 2  # 12 tasks, the failing one tried 3 times
    assert pq.read_table(out).to_pylist()[1]["hint_steps"] == []

    with LoopbackChatServer(answers) as server:
        assert main([*argv, "--base-url", server.url]) == 0
        assert server.answered() == [(q[1], "hint")]
    assert all(row["hint_steps"] for row in pq.read_table(out).to_pylist())


def test_limit_and_key_from_environment_never_printed(tmp_path, dataset, capsys, monkeypatch):
    path, rows, answers = dataset
    secret = "sk-loopback-secret-value"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    out = tmp_path / "out.parquet"
    argv = ["variants", "--input", str(path), "--output", str(out), "--model", "m", "--limit", "2", "--no-progress"]
    with LoopbackChatServer(answers) as server:
        assert main([*argv, "--base-url", server.url, "--cache", str(tmp_path / "c")]) == 0
        assert set(server.auth_headers) == {f"Bearer {secret}"}
        assert {question for question, _ in server.answered()} == {rows[0]["question"], rows[1]["question"]}
    assert pq.read_table(out).num_rows == 2
    captured = capsys.readouterr()
    assert secret not in captured.out + captured.err
    assert not any(secret in p.read_text() for p in (tmp_path / "c").iterdir())


def test_unusable_endpoint_stops_the_run(tmp_path, dataset, capsys):
    path, rows, answers = dataset
    scripts = {(row["question"], task): [Reply(status=401)] for row in rows for task in ("paraphrases", "hint")}
    with LoopbackChatServer(answers, scripts) as server:
        with pytest.raises(EndpointUnusable, match="OPENAI_API_KEY"):
            run_variants(path, tmp_path / "o.parquet", options(server, tmp_path, concurrency=1))
        assert len(server.records) == 1  # stopped at the first refusal, not once per row
    assert not (tmp_path / "o.parquet").exists()


def test_changing_one_task_setting_does_not_re_request_the_other_task(tmp_path, dataset):
    path, rows, answers = dataset
    out = tmp_path / "out.parquet"
    every = {(row["question"], task) for row in rows for task in ("paraphrases", "hint")}
    with LoopbackChatServer(answers) as server:
        first = run_variants(path, out, options(server, tmp_path, paraphrases=2))
        assert set(server.answered()) == every and first.tasks_generated == 12
    with LoopbackChatServer(answers) as server:  # more paraphrases: only paraphrases are asked for again
        second = run_variants(path, out, options(server, tmp_path, paraphrases=3))
        assert sorted(server.answered()) == sorted((row["question"], "paraphrases") for row in rows)
    assert second.tasks_from_cache == 6 and all(len(row["paraphrases"]) == 3 for row in pq.read_table(out).to_pylist())
    with LoopbackChatServer(answers) as server:  # text-only hints: only hints are asked for again
        run_variants(path, out, options(server, tmp_path, paraphrases=3, text_only=True))
        assert sorted(server.answered()) == sorted((row["question"], "hint") for row in rows)
    with LoopbackChatServer(answers) as server:  # back to the first settings: everything comes from the cache
        third = run_variants(path, out, options(server, tmp_path, paraphrases=2))
        assert server.answered() == [] and third.tasks_from_cache == 12


@pytest.mark.parametrize("how", ["junk", "pages"])
def test_unreadable_input_is_an_error_naming_the_file(tmp_path, dataset, capsys, how):
    path, rows, answers = dataset
    if how == "junk":
        path.write_bytes(b"PAR1 but not really")
    else:
        corrupt_data_pages(path)  # data_source's page: found when the output rows are read, after generation
    out = tmp_path / "out.parquet"
    argv = ["variants", "--input", str(path), "--output", str(out), "--model", "m", "--no-progress"]
    with LoopbackChatServer(answers) as server:
        assert main([*argv, "--base-url", server.url, "--cache", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    expected = "not a parquet file" if how == "junk" else "corrupt parquet file"
    assert f"diva-prep variants: error: {expected}: {path}" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "column", ["question", "reward_model", "reward_model.ground_truth", "extra_info", "extra_info.question_id"]
)
def test_null_required_cell_names_row_and_column_before_any_request(tmp_path, column, capsys):
    rows = diva_rows_without_variants(5)
    struct, _, key = column.partition(".")
    if key:
        rows[3][struct][key] = None
    else:
        rows[3][struct] = None
    path = write_diva(tmp_path / "in.parquet", rows)
    out = tmp_path / "out.parquet"
    argv = ["variants", "--input", str(path), "--output", str(out), "--model", "m", "--no-progress"]
    with LoopbackChatServer({}) as server:
        assert main([*argv, "--base-url", server.url, "--cache", str(tmp_path / "cache")]) == 2
        assert server.records == []  # refused before paying for any request
    err = capsys.readouterr().err
    assert f"row 3 has a null {column!r}" in err and str(path) in err and "Traceback" not in err
    assert not out.exists()
    answers = {row["question"]: row["reward_model"]["ground_truth"] for row in rows[:3]}
    with LoopbackChatServer(answers) as server:  # rows before the bad one are fine: --limit 3 runs
        limited = run_variants(path, out, options(server, tmp_path, limit=3))
    assert limited.rows == 3 and not limited.failed_tasks


def test_killed_run_resumes_without_repeating_finished_tasks(tmp_path):
    rows = diva_rows_without_variants(12)
    path = write_diva(tmp_path / "in.parquet", rows)
    answers = {row["question"]: row["reward_model"]["ground_truth"] for row in rows}
    out, cache = tmp_path / "out.parquet", tmp_path / "cache"
    argv = [sys.executable, "-m", "data_prep", "variants", "--input", str(path), "--output", str(out)]
    argv += ["--model", "m", "--concurrency", "3", "--cache", str(cache), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    finished_before_kill = 9
    with LoopbackChatServer(answers) as server:
        server.hold_after = finished_before_kill  # then the server stops answering: the run is stuck midway
        process = subprocess.Popen([*argv, "--base-url", server.url], cwd=REPO, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(1 for file in cache.glob("results-*.jsonl") for _ in open(file)) >= finished_before_kill:
                break
            assert process.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
        assert not out.exists()
        first_run = Counter(server.answered())
        assert sum(first_run.values()) == finished_before_kill

        server.hold_after = None
        completed = subprocess.run([*argv, "--base-url", server.url], cwd=REPO, env=env, capture_output=True, text=True)
        assert completed.returncode == 0, completed.stderr
        answered = Counter(server.answered())
    tasks = {(row["question"], task) for row in rows for task in ("paraphrases", "hint")}
    assert set(answered) == tasks  # no task lost
    assert all(count == 1 for count in answered.values())  # none paid twice
    assert "from cache: 9" in completed.stdout
    result = pq.read_table(out).to_pylist()
    assert len(result) == 12 and all(len(r["paraphrases"]) == 2 and r["hint_steps"] for r in result)
