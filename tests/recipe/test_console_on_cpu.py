"""The quiet consoles: the preflight's and the job's. Third-party chatter goes to the full log only, errors still reach
the console, and a job's console shows one line per training step."""

from __future__ import annotations

import io
import logging
import re
import warnings
from pathlib import Path

import pytest

from recipe.diva_grpo.console import (
    KEY_METRICS,
    PROJECT_TAGS,
    JobConsole,
    ThirdPartyFilter,
    key_metric,
    quiet_console,
    stdout_to,
    step_summary,
    strip_ansi,
    validation_summary,
)


@pytest.fixture
def console():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.stream = stream
    root = logging.getLogger()
    root.addHandler(handler)
    noisy = logging.getLogger("transfer_queue.utils.common")
    own = logging.StreamHandler()  # TransferQueue gives its loggers a stderr handler of their own
    noisy.addHandler(own)
    yield stream, handler, noisy, own
    root.removeHandler(handler)
    noisy.removeHandler(own)
    for h in [h for h in root.handlers if getattr(h, "_diva_full_log", False)]:
        root.removeHandler(h)
        h.close()
    logging.captureWarnings(False)


def test_third_party_warnings_go_to_the_full_log_only(console, tmp_path, monkeypatch):
    stream, handler, noisy, own = console
    monkeypatch.setattr("recipe.diva_grpo.console._console_handlers", lambda: [handler, own])
    full_log = tmp_path / "preflight.log"
    quiet_console(str(full_log))
    noisy.warning("target_num_threads 8 should not exceed total physical CPU cores 2")
    noisy.error("storage unit failed")
    logging.getLogger("recipe.diva_grpo").warning("a warning of our own")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("engine is not available", UserWarning, stacklevel=1)
    shown = stream.getvalue()
    assert "target_num_threads" not in shown and "engine is not available" not in shown
    assert "storage unit failed" in shown and "a warning of our own" in shown
    logged = full_log.read_text()
    for text in ("target_num_threads", "storage unit failed", "a warning of our own", "engine is not available"):
        assert text in logged
    assert any(isinstance(f, ThirdPartyFilter) for f in own.filters)
    # a second preflight in the same process writes its own full log, not both
    quiet_console(str(tmp_path / "second.log"))
    noisy.warning("second run")
    assert "second run" not in full_log.read_text() and "second run" in (tmp_path / "second.log").read_text()


def test_print_output_goes_to_the_full_log_inside_the_block(tmp_path, capsys):
    full_log = tmp_path / "preflight.log"
    with stdout_to(str(full_log)):
        print("Initial validation metrics: {...}")
    print("[preflight] PASSED")
    assert capsys.readouterr().out == "[preflight] PASSED\n"
    assert "Initial validation metrics" in full_log.read_text()


def test_console_handlers_are_found_on_every_logger():
    import sys

    from recipe.diva_grpo.console import _console_handlers

    logger = logging.getLogger("some_library.deep.module")
    to_stderr, to_file = logging.StreamHandler(sys.stderr), logging.StreamHandler(io.StringIO())
    logger.addHandler(to_stderr)
    logger.addHandler(to_file)
    try:
        found = _console_handlers()
        assert to_stderr in found and to_file not in found
    finally:
        logger.removeHandler(to_stderr)
        logger.removeHandler(to_file)


# ---- the job's console (recipe/diva_grpo/submit.py follows a job through it) ----------------------------------

ROOT = Path(__file__).resolve().parents[2]
# A job's stream as Ray forwards it (shortened from a 2-step tiny_cpu.sh run): colour codes around the actors'
# prefixes, verl's config dump, TransferQueue's warnings, tqdm bars, verl's metric lines, the project's lines.
STREAM = (
    "2026-12-02 12:36:28,077\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
    "[diva] batch: 4 prompts x 4 responses = 16 rows over 1 ranks (1 GPUs) and 1 rollout replica(s): 16 rows per rank\n"
    "2026-12-02 12:36:51,069\tINFO worker.py:1691 -- Using address 127.0.0.1:52629 set in the environment variable "
    "RAY_ADDRESS\n"
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m {'actor_rollout_ref': {'actor': {'_target_': 'FSDPActorConfig',\n"
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m           'truncation': 'error',\n"
    "\x1b[36m(AgentLoopWorkerTQ pid=30763)\x1b[0m WARNING:2026-12-02 12:38:56,895:target_num_threads 8 should not "
    "exceed total physical CPU cores 2. Setting to 2.\n"
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m \n"
    "Training Progress:   0%|          | 0/2 [00:00<?, ?it/s]\n"
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m (\"Initial validation metrics: {'val-core/diva_synth/acc/mean@1': \"\n"
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m step:0 - val-aux/diva_synth/reward/mean@1:np.float64(0.25) - "
    "val-core/diva_synth/acc/mean@1:np.float64(0.125) - val-aux/num_turns/min:np.int64(2)\n"
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m [cluster] training ranks: 0 head\n"
    '\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m [cluster] placement {"nodes": {"88c0": {"name": "head"}}}\n'
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m \n"
    "Training Progress:  50%|█████     | 1/2 [00:11<00:11, 11.44s/it]\n"
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m step:1 - actor/pg_loss:0.053 - diva/collapse_rate/local:0.25 - "
    "diva/collapse_rate/global:0.0 - diva/advantage/mean:-0.01 - diva/accuracy/mean:0.5 - training/global_step:1 - "
    "critic/score/mean:0.4687 - critic/advantages/mean:-0.02 - timing_s/step:11.23\n"
    "\x1b[36m(WorkerDict pid=30399)\x1b[0m INFO:2026-12-02 12:39:19,313:[Rank 0] Saved model to /x/model.pt\n"
    "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m step:2 - diva/collapse_rate/local:0.5 - diva/advantage/mean:0.0 - "
    "diva/accuracy/mean:0.5625 - critic/score/mean:0.5273 - timing_s/step:9.7 - "
    "val-core/diva_synth/acc/mean@1:np.float64(0.375)\n"
    "[cpu] PASSED: real rollouts, rewards, actor updates, weight sync, checkpoint and resume\n"
)
CONSOLE = [
    "[diva] batch: 4 prompts x 4 responses = 16 rows over 1 ranks (1 GPUs) and 1 rollout replica(s): 16 rows per rank",
    "validation before training: acc 0.125 (diva_synth)",
    "[cluster] training ranks: 0 head",
    "step 1/2 [##########..........]  score 0.469 | acc 0.500 | diva/collapse_rate/local 0.250 | 11.2 s",
    "step 2/2 [####################]  score 0.527 | acc 0.562 | diva/collapse_rate/local 0.500 | 9.7 s | "
    "val acc 0.375 (diva_synth)",
    "[cpu] PASSED: real rollouts, rewards, actor updates, weight sync, checkpoint and resume",
]


def _follow(stream: str, tmp_path, chunk: int = 37, **kwargs) -> tuple[list[str], JobConsole]:
    out = io.StringIO()
    console = JobConsole(str(tmp_path / "job.log"), out=out, **kwargs)
    for start in range(0, len(stream), chunk):  # Ray's chunks split lines anywhere
        console.write(stream[start : start + chunk])
    console.close()
    return out.getvalue().splitlines(), console


def test_the_job_console_shows_the_runs_lines_and_one_line_per_step(tmp_path):
    shown, console = _follow(STREAM, tmp_path)
    assert shown == CONSOLE
    logged = (tmp_path / "job.log").read_text()
    assert logged == strip_ansi(STREAM)  # every line, in order, colour codes removed
    assert console.lines == STREAM.count("\n")


def test_verbose_shows_the_whole_stream(tmp_path):
    shown, _ = _follow(STREAM, tmp_path, verbose=True)
    assert shown == STREAM.splitlines()


def test_errors_reach_the_console_with_their_whole_traceback(tmp_path):
    runner = "\x1b[36m(DivaTaskRunner pid=29904)\x1b[0m "
    traceback = [
        "Traceback (most recent call last):",
        '  File "/x/main_diva.py", line 100, in main',
        "    train(config)",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/x/replay_buffer.py", line 80, in wait',
        "verl_ext.rollout.liveness.RolloutDiedError: waiting for the train rollouts, found dead: rollout server 0",
    ]
    ray_task = [
        "ray.exceptions.RayTaskError(ValueError): ray::TaskRunner.run() (pid=12, ip=127.0.0.1)",
        '  File "/x/trainer.py", line 3, in fit',
        "ValueError: the batch holds 5 prompts",
        "Traceback (most recent call last):",
        '  File "/x/main_diva.py", line 95, in main',
        "SystemExit: cpu_run needs the CPU mode",  # the traceback's last line, whatever it names
    ]
    stream = (
        "".join(f"{runner}{line}\n" for line in traceback)
        + f"{runner}WARNING:2026:target_num_threads 8 should not exceed total physical CPU cores 2.\n"
        + "".join(f"{line}\n" for line in ray_task)
        + "(raylet) A worker died or was killed while executing a task by an unexpected system error.\n"
        + "2026-12-02 12:41:42,483\tERROR worker.py:421 -- Unhandled error (suppress with RAY_IGNORE_UNHANDLED)\n"
        + "a line of nothing\n"
    )
    shown, console = _follow(stream, tmp_path, tail_lines=3)
    assert shown == (
        [strip_ansi(runner) + line for line in traceback]
        + ray_task
        + [
            "(raylet) A worker died or was killed while executing a task by an unexpected system error.",
            "2026-12-02 12:41:42,483\tERROR worker.py:421 -- Unhandled error (suppress with RAY_IGNORE_UNHANDLED)",
        ]
    )
    assert console.tail() == shown[-2:] + ["a line of nothing"]


# A lost node's failure as the driver printed it (attempt 2 of the lost-node run, shortened): Ray's header names
# NodeLostError, its cause's rendering comes first (a header of its own, the gloo error), then NodeLostError's line,
# then the cause's traceback again (no header) and Hydra's hint. The 40-line tail held only the cause's part.
LOST_NODE_FAILURE = [
    "(raylet) Raylet is terminated. Termination is unexpected. Last 20 lines of the Raylet logs:",
    "    [state-dump] \tNodeManagerService.grpc_server.CommitBundleResources - 1 total (0 active)",
    "Error executing job with overrides: ['trainer.total_training_steps=3']",
    "Traceback (most recent call last):",
    '  File "/x/main_diva.py", line 120, in main',
    "ray.exceptions.RayTaskError(NodeLostError): ray::DivaTaskRunner.run() (pid=10373, ip=127.0.0.1)",
    "ray.exceptions.RayTaskError(RuntimeError): ray::WorkerDict.actor_rollout_save_checkpoint() (pid=10802)",
    "RuntimeError: [gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:27056: Connection reset by peer",
    '  File "/x/toolkit_trainer.py", line 133, in fit',
    "    watch.name_lost(err)",
    "verl_ext.cluster.node_watch.NodeLostError: lost node node-1 (127.0.0.1): it ran training rank 0",
    '  File "/x/fsdp_checkpoint_manager.py", line 300, in save_checkpoint',
    "    torch.distributed.barrier()",
    "RuntimeError: [gloo/transport/tcp/pair.cc:538] Read error [127.0.0.1]:27056: Connection reset by peer",
    "",
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
]


def test_a_failure_is_the_error_rays_header_names_not_its_cause_after_it(tmp_path):
    _, console = _follow("".join(f"{line}\n" for line in LOST_NODE_FAILURE), tmp_path, tail_lines=3)
    assert console.failure() == LOST_NODE_FAILURE[10]
    assert "NodeLostError" not in "".join(console.tail())  # why the tail alone is not enough


def test_a_failure_is_the_last_of_pythons_chained_tracebacks_and_none_without_one(tmp_path):
    chained = [
        "(TaskRunner pid=1) Traceback (most recent call last):",
        '(TaskRunner pid=1)   File "/x/a.py", line 1, in f',
        "(TaskRunner pid=1) KeyError: 'uid'",
        "(TaskRunner pid=1) ",
        "(TaskRunner pid=1) During handling of the above exception, another exception occurred:",
        "(TaskRunner pid=1) Traceback (most recent call last):",
        "(TaskRunner pid=1) ValueError: row 3 of /data/train.parquet has no uid",
        "(TaskRunner pid=1) WARNING:2026:an ordinary line, then a line that only mentions an Error: not raised",
        "ERROR worker.py:421 -- Unhandled error (suppress with RAY_IGNORE_UNHANDLED)",
    ]
    _, console = _follow("".join(f"{line}\n" for line in chained), tmp_path)
    assert console.failure() == "ValueError: row 3 of /data/train.parquet has no uid"
    no_traceback = "step:1 - a:1\nERROR worker.py:421 -- Unhandled error\nValueError: not in a traceback\n"
    _, quiet = _follow(no_traceback, tmp_path)
    assert quiet.failure() is None


def test_a_terminal_gets_a_status_line_that_printed_lines_clear(tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    clock = iter(range(0, 1000, 10))  # ten seconds a call: every chunk redraws the status line
    monkeypatch.setattr("recipe.diva_grpo.console.time.monotonic", lambda: next(clock))
    out = Terminal()
    console = JobConsole(str(tmp_path / "job.log"), out=out)
    console.write("Training Progress:  50%|#    | 1/2 [00:11<00:11, 11.44s/it]\n")
    console.write("[diva] own line\n")
    console.close()
    text = out.getvalue()
    assert text.startswith("\r\x1b[K  ... 0:10  step 1/2 [##########..........]\r\x1b[K[diva] own line\n")
    assert text.endswith("\r\x1b[K")  # nothing of the status line left behind
    assert "\r" not in "\n".join(_follow(STREAM, tmp_path)[0])  # a file or a pipe gets none


def test_step_summary_without_a_method_or_a_bar():
    line = step_summary(7, {"critic/score/mean": 0.25, "timing_s/step": 3.0})
    assert line == "step 7  score 0.250 | 3.0 s"
    assert step_summary(4, {"val-core/geo/acc/mean@1": 0.2, "val-core/math/acc/mean@4": 0.5}) == (
        "validation at step 4: acc geo 0.200, math 0.500"
    )
    # the most samples' mean of each source: mean@4 over mean@1
    assert validation_summary({"val-core/s/acc/mean@1": 0.1, "val-core/s/acc/mean@4": 0.4}) == "acc 0.400 (s)"


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({"noise_contrastive_grpo/advantage/mean": 0.0, "noise_contrastive_grpo/collapse_rate": 0.5}, 0.5),
        (
            {
                "noise_contrastive_grpo/advantage/mean": 0.0,
                "noise_contrastive_grpo/collapse_rate": 0.5,
                "noise_contrastive_grpo/branch/rate": 0.7,
            },
            0.7,
        ),
        ({"newmethod/advantage/mean": 0.0, "newmethod/advantage/zero_fraction": 0.3}, 0.3),
        ({"critic/advantages/mean": 0.0}, None),
    ],
)
def test_key_metric_falls_back_in_order(metrics, expected):
    found = key_metric(metrics)
    assert (found[1] if found else None) == expected


def test_every_method_has_a_key_metric_that_it_logs_and_documents():
    """Each of the toolkit's methods (and verl's GRPO on the toolkit trainer) names its key metric; the metric is in
    the method's code and on its page."""
    from verl_ext.method_names import TOOLKIT_METHODS
    from verl_ext.methods import get_method

    pages = {"diva_grpo": "docs/algo/diva_grpo.md", "grpo": "docs/toolkit.md"}
    code = "\n".join(p.read_text() for p in (ROOT / "verl_ext").rglob("*.py"))
    for name in ("diva_grpo", "grpo", *TOOLKIT_METHODS):
        prefix = get_method(name).prefix
        assert prefix in KEY_METRICS, f"no KEY_METRICS entry for {name} (metric prefix {prefix})"
        page = (ROOT / pages.get(name, f"docs/algo/{name}.md")).read_text()
        for metric in KEY_METRICS[prefix]:
            # a key of its own ("diva/collapse_rate/local"), built from a constant (f"{NAME}/collapse_rate"), or
            # a name the method's prefix is put in front of ("branch/rate")
            logged = (f"{prefix}/{metric}", f'/{metric}"', f'"{metric}"')
            assert any(form in code for form in logged), f"{name}: {metric} is not logged"
            # on the page as written there: `collapse_rate/partition`, or `collapse_rate/{partition,prompt}`
            written = r"/(?:\{[\w,]*?)?".join(metric.split("/"))
            assert re.search(written, page), f"{name}: {metric} is not on its page"


def test_every_tag_the_project_prints_reaches_the_console():
    """A line ``[tag] ...`` of a tag missing from PROJECT_TAGS would reach the full log only."""
    printed = set()
    for folder in ("recipe", "verl_ext", "data_prep", "run_scripts", "benchmarks"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh"):
                printed.update(re.findall(r"[\"']\[([a-z_]+)\] ", path.read_text()))
    assert {"diva", "cpu", "cluster", "preflight", "nc_grpo"} <= printed  # the scan sees them
    assert sorted(printed - set(PROJECT_TAGS)) == []
