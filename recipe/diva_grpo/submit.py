"""Submit a job to a Ray cluster and follow it: ``python -m recipe.diva_grpo.submit --address URL --runtime-env FILE
-- python -m recipe.diva_grpo.main_diva OVERRIDES``.

What ``ray job submit --runtime-env FILE -- CMD`` does (the SDK's ``JobSubmissionClient``: upload the working
directory, submit, print the job's logs as they come, report its final status), plus the variables the job reads
from this shell, forwarded by name (:mod:`verl_ext.cluster.job_env`): they join the runtime env in memory, so no
value is written to a file, put on a command line or printed. Exit status 0 when the job succeeded, 1 otherwise
(stopped included: a run that did not finish is not a success). Interrupted (Ctrl-C, SIGTERM), it stops the job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import sys

import yaml

from verl_ext.cluster.job_env import forwarded_env


def _say(msg: str) -> None:
    print(f"[diva] {msg}", flush=True)


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


async def _follow(client, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="the cluster's dashboard address, e.g. http://head:8265")
    parser.add_argument("--runtime-env", required=True, help="the job's runtime env (yaml)")
    parser.add_argument("entrypoint", nargs=argparse.REMAINDER, help="-- the command the job runs")
    args = parser.parse_args(argv)
    command = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    if not command:
        parser.error("no command after --")
    from ray.job_submission import JobStatus, JobSubmissionClient

    runtime_env, names = job_runtime_env(args.runtime_env, command, os.environ)
    if names:
        _say(f"forwarding to the job by name (values not shown): {', '.join(names)}")
    client = JobSubmissionClient(args.address)
    job_id = client.submit_job(entrypoint=shlex.join(command), runtime_env=runtime_env)
    _say(f"job {job_id} submitted to {args.address} (ray job logs / status / stop {job_id})")

    def stop(signum, _frame):
        _say(f"interrupted ({signal.Signals(signum).name}): stopping job {job_id}")
        client.stop_job(job_id)
        raise SystemExit(130)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    asyncio.run(_follow(client, job_id))
    info = client.get_job_info(job_id)
    if info.status == JobStatus.SUCCEEDED:
        _say(f"job {job_id} succeeded")
        return 0
    print(f"error: job {job_id} {str(info.status).lower()}: {info.message or ''}".rstrip(), file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
