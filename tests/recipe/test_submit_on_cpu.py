"""The submitter's console and full log: where the job's whole output goes, and what a failed job leaves on the
console (its error, the last lines of its stream, the full log's path)."""

from __future__ import annotations

import pytest

from recipe.diva_grpo import submit
from recipe.diva_grpo.console import TAIL_LINES

LOGGER_PATH = "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"


@pytest.mark.parametrize(
    ("command", "environ", "expected"),
    [
        # tiny_cpu.sh names it
        (["x", "trainer.default_local_dir=/ck"], {"DIVA_JOB_LOG": "/run/job.log"}, "/run/job.log"),
        # beside the launchers' metrics log, one file for every attempt of the launch
        ([f"{LOGGER_PATH}=/ck/logs/metrics_20261202T101010Z_42.jsonl"], {}, "/ck/logs/job_20261202T101010Z_42.log"),
        ([f"{LOGGER_PATH}=/elsewhere/mine.jsonl"], {}, "/elsewhere/mine_job.log"),
        # the last override wins, as in Hydra
        (["trainer.default_local_dir=/a", "trainer.default_local_dir=/b"], {}, "/b/logs/job_STAMP.log"),
        # a preflight's log goes where the README sends every job's log (the tests keep theirs in DIVA_PREFLIGHT_DIR)
        ([f"{LOGGER_PATH}=/ck/logs/metrics_1.jsonl", "diva.dry_run=true"], {}, "/ck/logs/job_1.log"),
        (
            [f"{LOGGER_PATH}=/ck/logs/metrics_1.jsonl", "diva.dry_run=true"],
            {"DIVA_PREFLIGHT_DIR": "/pre"},
            "/pre/diva_job_STAMP.log",
        ),
    ],
)
def test_where_the_jobs_full_output_goes(command, environ, expected):
    assert submit.job_log_path(command, environ, stamp="STAMP") == expected


def test_without_a_run_folder_the_log_goes_to_the_temp_folder(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    assert submit.job_log_path(["python", "-m", "x"], {}, stamp="S") == str(tmp_path / "diva_job_S.log")
    assert submit.job_log_path(["diva.dry_run=true"], {}, stamp="S") == str(tmp_path / "diva_job_S.log")


def test_an_unwritable_log_folder_falls_back_to_the_temp_folder(monkeypatch, tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    console = submit.open_console(str(blocked / "logs" / "job.log"), verbose=False)
    console.close()
    assert console.log_path == str(tmp_path / "tmp" / "job.log")
    assert f"cannot write the job's log at {blocked / 'logs' / 'job.log'}" in capsys.readouterr().out


class _FailingClient:
    """Ray's JobSubmissionClient for a job that fails: a traceback in the middle of its output, noise after it."""

    def __init__(self, address):
        pass

    def submit_job(self, entrypoint, runtime_env):
        return "raysubmit_failed"

    async def tail_job_logs(self, job_id):
        yield "(TaskRunner pid=1) {'config': 'dump'}\n(TaskRunner pid=1) Traceback (most recent call last):\n"
        yield '(TaskRunner pid=1)   File "trainer.py", line 3, in fit\n'
        yield "(TaskRunner pid=1) RolloutDiedError: waiting for the train rollouts, found dead: rollout server 0\n"
        for i in range(50):
            yield f"(SimpleStorageUnit pid=2) WARNING:target_num_threads {i}\n"

    def get_job_info(self, job_id):
        from ray.job_submission import JobStatus

        message = "Job entrypoint command failed with exit code 1, last available logs:\n" + "x\n" * 300
        return type("Info", (), {"status": JobStatus.FAILED, "message": message})()


def test_a_failed_job_shows_its_error_tail_and_full_log(tmp_path, monkeypatch, capsys):
    import ray.job_submission

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _FailingClient)
    monkeypatch.delenv("VERBOSE", raising=False)
    full_log = tmp_path / "run" / "job.log"
    monkeypatch.setenv("DIVA_JOB_LOG", str(full_log))
    env_file = tmp_path / "runtime_env.yaml"
    env_file.write_text("working_dir: ./\n")
    assert submit.main(["--address", "http://127.0.0.1:1", "--runtime-env", str(env_file), "--", "python"]) == 1
    out = capsys.readouterr()
    # the traceback as it came, whole; the config dump not
    assert (
        "(TaskRunner pid=1) RolloutDiedError: waiting for the train rollouts, found dead: rollout server 0" in out.out
    )
    assert "'config': 'dump'" not in out.out
    # then the stream's last lines, Ray's one-line reason (not its 300-line copy of the logs) and the full log
    assert f"[diva] the job's last {TAIL_LINES} lines:" in out.err
    assert "  (SimpleStorageUnit pid=2) WARNING:target_num_threads 49" in out.err
    assert "error: job raysubmit_failed failed: Job entrypoint command failed with exit code 1" in out.err
    # the error that failed it, after the tail (here out of it: 50 lines of noise came after)
    failure = "[diva] the job failed with: RolloutDiedError: waiting for the train rollouts, found dead: rollout server"
    assert out.err.index(failure) > out.err.index("target_num_threads 49")
    assert out.err.index(failure) < out.err.index("error: job raysubmit_failed")
    assert out.err.count("\nx\n") == 0
    assert out.err.rstrip().endswith(f"[diva] the job's full output: {full_log}")
    logged = full_log.read_text()
    assert "{'config': 'dump'}" in logged and "target_num_threads 49" in logged and logged.count("\nx\n") > 100


def test_verbose_shows_the_whole_stream_and_no_second_tail(tmp_path, monkeypatch, capsys):
    import ray.job_submission

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _FailingClient)
    monkeypatch.setenv("VERBOSE", "1")
    monkeypatch.setenv("DIVA_JOB_LOG", str(tmp_path / "job.log"))
    env_file = tmp_path / "runtime_env.yaml"
    env_file.write_text("working_dir: ./\n")
    assert submit.main(["--address", "http://127.0.0.1:1", "--runtime-env", str(env_file), "--", "python"]) == 1
    out = capsys.readouterr()
    assert "{'config': 'dump'}" in out.out and "target_num_threads 49" in out.out
    assert "the job's last" not in out.err


def test_rays_own_failure_reason_is_shown_whole_and_its_copy_of_the_logs_not():
    copied = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\nx\ny"
    # Ray's line announces logs it repeats; the console shows the job's last lines itself, so the line says so
    expected = "Job entrypoint command failed with exit code 1 (its output is above and in the full log)"
    assert submit.reason(copied) == expected
    setup = "runtime_env setup failed:\nFailed to set up runtime environment.\nRuntimeEnvSetupError: pip failed"
    assert submit.reason(setup) == setup
    assert submit.reason("\n".join(f"line {i}" for i in range(50)), max_lines=3) == (
        "line 0\nline 1\nline 2\n... (47 more lines in the full log)"
    )
    assert submit.reason("") == ""


def test_the_launcher_asks_where_the_log_goes(capsys, monkeypatch):
    monkeypatch.delenv("DIVA_JOB_LOG", raising=False)
    assert submit.main(["--print-log-path", "--", "python", f"{LOGGER_PATH}=/ck/logs/metrics_7.jsonl"]) == 0
    assert capsys.readouterr().out == "/ck/logs/job_7.log\n"
