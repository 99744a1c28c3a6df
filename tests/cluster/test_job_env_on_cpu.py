"""What a remote cluster needs from the submitting shell: every variable the job reads, forwarded by name, never
written to a file or printed."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import yaml

from recipe.diva_grpo import submit
from verl_ext.cluster.job_env import JOB_ENV_NAMES, forwarded_env, forwarded_names

ROOT = Path(__file__).resolve().parents[2]
# Read by the project's code but not from the submitting shell: set for the job by the launcher, its runtime env,
# Ray or torch (or read on the submitting machine only).
SET_FOR_THE_JOB = {
    "VERL_PLATFORM": "the CPU runs' runtime env (verl_ext.cpu.CPU_ENV)",
    "VERL_FILE_LOGGER_PATH": "the launcher's METRICS_LOG, through ray_kwargs.ray_init.runtime_env",
    "VERL_FILE_LOGGER_ROOT": "the CPU runs' runtime env (verl_ext.cpu.runtime_env.runtime_env)",
    "DIVA_CPU_PROBE_DIR": "the CPU runs' runtime env",
    "DIVA_PREFLIGHT_DIR": "the preflight's work folder, read where the preflight runs",
    "DIVA_JOB_LOG": "where the submitter writes the job's full output, read on the submitting machine only",
    "VERBOSE": "the submitter's console shows the job's whole output, read on the submitting machine only",
    "RAY_ADDRESS": "set by Ray in every process of a job",
    "RANK": "set by verl for each training rank",
}


def _env_reads(path: Path) -> set[str]:
    """Names read through ``os.environ.get(X)``, ``os.getenv(X)`` or ``os.environ[X]`` in ``path``; ``X`` a string
    literal or a string constant, of the module or imported by it anywhere (resolved by importing)."""
    tree = ast.parse(path.read_text())
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    imported = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    names: set[str] = set()

    def resolve(node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            source, attr = imported.get(node.id, (module, node.id))
            value = getattr(importlib.import_module(source), attr, None)
            return value if isinstance(value, str) else None
        return None

    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            if func in ("os.environ.get", "os.getenv", "environ.get"):
                target = node.args[0]
        elif (
            isinstance(node, ast.Subscript)
            and ast.unparse(node.value) == "os.environ"
            and isinstance(node.ctx, ast.Load)
        ):
            target = node.slice
        if target is not None and (name := resolve(target)):
            names.add(name)
    return names


def test_every_variable_the_job_reads_is_forwarded_or_set_for_it():
    files = [p for folder in ("verl_ext", "recipe", "data_prep") for p in (ROOT / folder).rglob("*.py")]
    read = {name: str(path.relative_to(ROOT)) for path in files for name in _env_reads(path)}
    assert {"OPENAI_API_KEY", "MUPO_EMBEDDING_BASE_URL", "DIVA_FAULTS"} <= set(read)  # the scan sees them
    unlisted = {
        name: where for name, where in read.items() if name not in JOB_ENV_NAMES and name not in SET_FOR_THE_JOB
    }
    assert unlisted == {}, f"read by the job but neither forwarded (JOB_ENV_NAMES) nor set for it: {unlisted}"


def test_forwarded_by_name_with_the_key_mupo_is_told_to_read():
    assert "OPENAI_API_KEY" in forwarded_names([])
    names = forwarded_names(["algorithm.adv_estimator=mupo", "mupo.embedding.api_key_env=MY_EMBED_KEY"])
    assert names[-1] == "MY_EMBED_KEY" and len(names) == len(set(names))
    env = {"MY_EMBED_KEY": "k1", "HF_TOKEN": "t", "PATH": "/bin", "WANDB_API_KEY": ""}
    assert forwarded_env(["+mupo.embedding.api_key_env=MY_EMBED_KEY"], env) == {"MY_EMBED_KEY": "k1", "HF_TOKEN": "t"}


def test_the_runtime_env_gets_the_values_and_keeps_the_launchers_own(tmp_path):
    path = tmp_path / "runtime_env.yaml"
    path.write_text(yaml.safe_dump({"working_dir": "./", "env_vars": {"DIVA_FAULTS": "from_launcher"}}))
    env, names = submit.job_runtime_env(str(path), [], {"OPENAI_API_KEY": "sk-secret", "DIVA_FAULTS": "from_shell"})
    assert env["env_vars"] == {"DIVA_FAULTS": "from_launcher", "OPENAI_API_KEY": "sk-secret"}
    assert names == ["DIVA_FAULTS", "OPENAI_API_KEY"]
    assert "sk-secret" not in path.read_text()


class _Client:
    """Stands in for Ray's JobSubmissionClient: records the submission, says the job succeeded."""

    submitted: dict = {}

    def __init__(self, address):
        self.address = address

    def submit_job(self, entrypoint, runtime_env):
        _Client.submitted = {"entrypoint": entrypoint, "runtime_env": runtime_env}
        return "raysubmit_test"

    async def tail_job_logs(self, job_id):
        yield "the job's log line\n(TaskRunner pid=7) [diva] a line of the "
        yield "job's own\n"

    def get_job_info(self, job_id):
        from ray.job_submission import JobStatus

        return type("Info", (), {"status": JobStatus.SUCCEEDED, "message": None})()


def test_the_submitter_prints_names_never_values(tmp_path, monkeypatch, capsys):
    import ray.job_submission

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", _Client)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-do-not-print")
    monkeypatch.delenv("VERBOSE", raising=False)
    full_log = tmp_path / "job.log"
    monkeypatch.setenv("DIVA_JOB_LOG", str(full_log))
    path = tmp_path / "runtime_env.yaml"
    path.write_text("working_dir: ./\n")
    argv = ["--address", "http://127.0.0.1:1", "--runtime-env", str(path), "--", "python", "-m", "x", "a=b c"]
    assert submit.main(argv) == 0
    out = capsys.readouterr()
    logged = full_log.read_text()
    assert "sk-do-not-print" not in out.out + out.err + logged
    assert "forwarding to the job by name (values not shown): OPENAI_API_KEY" in out.out
    # The job's own line on the console, a third-party line in the full log only, which has both.
    assert "[diva] a line of the job's own" in out.out and "the job's log line" not in out.out
    assert "the job's log line\n(TaskRunner pid=7) [diva] a line of the job's own\n" in logged
    assert "job raysubmit_test succeeded" in out.out and "job raysubmit_test succeeded" in logged
    assert f"the job's full output: {full_log}" in out.out
    assert _Client.submitted["runtime_env"]["env_vars"]["OPENAI_API_KEY"] == "sk-do-not-print"
    assert _Client.submitted["entrypoint"] == "python -m x 'a=b c'"


def test_the_launcher_submits_through_the_submitter():
    script = (ROOT / "run_scripts" / "_submit.sh").read_text()
    assert "python -m recipe.diva_grpo.submit --address" in script
    assert "ray job submit" not in script.replace("`ray job submit`", "")


@pytest.mark.parametrize("name", JOB_ENV_NAMES)
def test_no_forwarded_value_is_written_by_the_cpu_runs_runtime_env(name, tmp_path, monkeypatch):
    """The CPU runs write their runtime env to the run folder: only the crash tests' fault settings may be in it."""
    from verl_ext.cpu.runtime_env import runtime_env

    monkeypatch.setenv(name, f"value-of-{name}")
    written = yaml.safe_dump(runtime_env(str(tmp_path), str(ROOT)))
    assert (f"value-of-{name}" in written) == (name in ("DIVA_FAULTS", "DIVA_FAULT_DIR"))
