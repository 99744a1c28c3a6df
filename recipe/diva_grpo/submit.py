"""Submit a job to a Ray cluster and follow it: ``python -m recipe.diva_grpo.submit --address URL --runtime-env FILE
-- python -m recipe.diva_grpo.main_diva OVERRIDES``.

What ``ray job submit --runtime-env FILE -- CMD`` does (the SDK's ``JobSubmissionClient``: upload the working
directory, submit, follow the job's logs, report its final status), plus the variables the job reads from this
shell, forwarded by name (:mod:`verl_ext.cluster.job_env`): they join the runtime env in memory, so no value is
written to a file, put on a command line or printed. Exit status 0 when the job succeeded, 1 otherwise (stopped
included: a run that did not finish is not a success). Interrupted (Ctrl-C, SIGTERM), it stops the job.

The job's log stream goes whole to a full log file (:func:`job_log_path`, named on the console at the start and on
failure); the console shows what :class:`recipe.diva_grpo.console.JobConsole` selects: the project's own lines, one
line per training step, errors. A job that fails ends with the last lines of its stream. ``VERBOSE=1`` shows the
whole stream on the console instead, as ``ray job submit`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shlex
import signal
import sys
import tempfile

import yaml

from recipe.diva_grpo.console import JobConsole, end_quiet_console, quiet_console
from recipe.diva_grpo.prelaunch import LOGGER_PATH_KEY
from verl_ext.cluster.job_env import forwarded_env

# Where the job's full log goes, when set (run_scripts/tiny_cpu.sh: its run folder's job.log).
JOB_LOG_ENV = "DIVA_JOB_LOG"
# 1: the whole stream on the console too.
VERBOSE_ENV = "VERBOSE"
PREFLIGHT_DIR_ENV = "DIVA_PREFLIGHT_DIR"
# How Ray's failure message starts when it goes on with the job's last logs (ray/dashboard/modules/job).
RAY_LOGS_REPEATED = "Job entrypoint command failed with exit code"


def _say(msg: str, console: JobConsole | None = None, file=None) -> None:
    if console is not None:
        console.say(f"[diva] {msg}")
    else:
        print(f"[diva] {msg}", file=file or sys.stdout, flush=True)


def job_runtime_env(path: str, overrides: list[str], environ) -> tuple[dict, list[str]]:
    """The runtime env of ``path`` with the forwarded variables added; returns it and the names forwarded."""
    with open(path) as f:
        env = yaml.safe_load(f) or {}
    forwarded = forwarded_env(overrides, environ)
    env_vars = dict(env.get("env_vars") or {})
    for name, value in forwarded.items():
        env_vars.setdefault(name, value)  # the runtime env's own value (set by the launcher) wins
    env["env_vars"] = env_vars
    return env, sorted(forwarded)


def _override(command: list[str], key: str) -> str | None:
    """The value the job's Hydra overrides give ``key`` (the last one wins, as in Hydra); ``None`` if none does."""
    found = None
    for token in command:
        name, sep, value = token.lstrip("+~").partition("=")
        if sep and name == key:
            found = value.strip("'\"")
    return found


def job_log_path(command: list[str], environ, stamp: str | None = None) -> str:
    """Where the job's full log goes:

    1. ``$DIVA_JOB_LOG`` (``run_scripts/tiny_cpu.sh``: ``RUN_DIR/job.log``; ``run_scripts/_submit.sh`` sets it from
       this function once per launch, so that every attempt writes one file);
    2. a preflight (``diva.dry_run=true``) with ``$DIVA_PREFLIGHT_DIR`` set (the tests): there;
    3. next to verl's metrics log (the launchers' ``METRICS_LOG``, ``CKPT_DIR/logs/metrics_<time>_<pid>.jsonl``):
       ``job_<time>_<pid>.log`` (a preflight's too: ``CKPT_DIR/logs`` is where the README sends every job's log);
    4. ``<trainer.default_local_dir>/logs/``;
    5. the temp folder.
    """
    if environ.get(JOB_LOG_ENV):
        return os.path.abspath(environ[JOB_LOG_ENV])
    stamp = stamp or f"{dt.datetime.now(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}_{os.getpid()}"
    if (_override(command, "diva.dry_run") or "").lower() == "true" and environ.get(PREFLIGHT_DIR_ENV):
        return os.path.join(environ[PREFLIGHT_DIR_ENV], f"diva_job_{stamp}.log")
    metrics_log = _override(command, LOGGER_PATH_KEY)
    if metrics_log:
        stem = os.path.splitext(os.path.basename(metrics_log))[0]
        name = "job" + stem[len("metrics") :] if stem.startswith("metrics") else f"{stem}_job"
        return os.path.join(os.path.dirname(os.path.abspath(metrics_log)), f"{name}.log")
    checkpoints = _override(command, "trainer.default_local_dir")
    if checkpoints:
        return os.path.join(os.path.abspath(checkpoints), "logs", f"job_{stamp}.log")
    return os.path.join(tempfile.gettempdir(), f"diva_job_{stamp}.log")


def open_console(path: str, verbose: bool) -> JobConsole:
    """The job's console writing to ``path``, or to the temp folder when ``path`` cannot be written here (a cluster's
    storage that this machine does not see)."""
    try:
        return JobConsole(path, verbose=verbose)
    except OSError as err:
        fallback = os.path.join(tempfile.gettempdir(), os.path.basename(path))
        _say(f"note: cannot write the job's log at {path} ({err.strerror}); writing it to {fallback}")
        return JobConsole(fallback, verbose=verbose)


def reason(message: str, max_lines: int = 40) -> str:
    """Ray's reason for a job's failure, for the console: the first line when the rest repeats the job's last logs
    (up to 20,000 characters, already in the console's tail and the full log); otherwise Ray's own message (a
    runtime env that failed to set up, the supervisor's traceback), at most ``max_lines`` lines."""
    lines = message.strip().splitlines()
    if not lines:
        return ""
    if lines[0].startswith(RAY_LOGS_REPEATED):
        # Ray's line ends "..., last available logs (truncated to 20,000 chars):" before the logs it repeats.
        first = lines[0].split(", last available logs", 1)[0].rstrip(":, ")
        return f"{first} (its output is above and in the full log)"
    kept = lines[:max_lines]
    if len(lines) > max_lines:
        kept.append(f"... ({len(lines) - max_lines} more lines in the full log)")
    return "\n".join(kept)


async def _follow(client, job_id: str, console: JobConsole) -> None:
    async for lines in client.tail_job_logs(job_id):
        console.write(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="the cluster's dashboard address, e.g. http://head:8265")
    parser.add_argument("--runtime-env", help="the job's runtime env (yaml)")
    parser.add_argument("--print-log-path", action="store_true", help="print where the job's log goes, and stop")
    parser.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- the command the job runs")
    args = parser.parse_args(argv)
    command = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    if args.print_log_path:
        print(job_log_path(command, os.environ))
        return 0
    if not args.address or not args.runtime_env:
        parser.error("--address and --runtime-env are required to submit")
    if not command:
        parser.error("no command after --")
    from ray.job_submission import JobStatus, JobSubmissionClient

    verbose = os.environ.get(VERBOSE_ENV, "0") not in ("", "0")
    console = open_console(job_log_path(command, os.environ), verbose)
    # Ray's client logs its packaging notes here (the checkout's upload): to the full log, not the console.
    quiet = None if verbose else quiet_console(console.log_path)
    succeeded = False
    try:
        how = "shown here too" if verbose else "VERBOSE=1 shows it here"
        _say(f"the job's full output: {console.log_path} ({how})", console)
        runtime_env, names = job_runtime_env(args.runtime_env, command, os.environ)
        if names:
            _say(f"forwarding to the job by name (values not shown): {', '.join(names)}", console)
        try:
            client = JobSubmissionClient(args.address)
        except ConnectionError as err:
            print(
                f"error: cannot reach a Ray cluster at {args.address} ({str(err).splitlines()[0]}); set RAY_ADDRESS to "
                "the cluster's dashboard address (e.g. http://head:8265), or unset it to run on this machine",
                file=sys.stderr,
            )
            return 2
        job_id = client.submit_job(entrypoint=shlex.join(command), runtime_env=runtime_env)
        _say(f"job {job_id} submitted to {args.address} (ray job logs / status / stop {job_id})", console)

        def stop(signum, _frame):
            _say(f"interrupted ({signal.Signals(signum).name}): stopping job {job_id}", console)
            client.stop_job(job_id)
            raise SystemExit(130)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        asyncio.run(_follow(client, job_id, console))
        info = client.get_job_info(job_id)
        if info.status == JobStatus.SUCCEEDED:
            _say(f"job {job_id} succeeded", console)
            succeeded = True
            return 0
        status, message = str(info.status).lower(), (info.message or "").strip()
        console.note(f"[diva] job {job_id} {status}: {message}")
        tail = [] if verbose else console.tail()  # verbose: every line is on the console already
        if tail:
            print(f"[diva] the job's last {len(tail)} lines:", file=sys.stderr)
            for line in tail:
                print(f"  {line}", file=sys.stderr)
        failure = console.failure()
        if failure:
            print(f"[diva] the job failed with: {failure}", file=sys.stderr)
        print(f"error: job {job_id} {status}: {reason(message)}".rstrip(), file=sys.stderr)
        return 1
    finally:
        console.close()
        if quiet is not None:
            end_quiet_console(quiet)
        if not succeeded:
            _say(f"the job's full output: {console.log_path}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
