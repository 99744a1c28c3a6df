"""The ledger of every config difference between a method's GPU job and its CPU run on the main job's stack.

The CPU run on verl's vLLM rollout is the method's GPU launcher (``run_scripts/qwen25vl7b_<method>.sh``) with the
launcher variables and Hydra overrides of :mod:`verl_ext.cpu.vllm_launcher`. :func:`config_differences` composes both
final configs with Hydra, as the job does, and returns every leaf that differs, with its value on each side. Each must
be an entry of :data:`verl_ext.checks.cpu_changes.VLLM_CPU_CHANGES` (the ledger's data: the setting, the keys, why), and
each entry must still differ for some method: :func:`ledger_problems` says which is not so (the CI test runs it for
every method). :func:`ledger_markdown` is the table of docs/stack.md (``python -m verl_ext.checks.ledger`` prints it;
``python -m verl_ext.report.doc_numbers --write`` writes it there).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
METHODS = ("diva", "grpo", "avspo", "codapo", "durian", "pgpo", "mupo", "noise_contrastive_grpo")
UNSET = "<unset>"
# Placeholders of a CPU run's folders: the ledger shows what differs, not where one run put its files.
PLACEHOLDER_PATHS = {k: f"/cpu_run/{k}" for k in ("model", "train", "val")}
PLACEHOLDER_RUN = "/cpu_run/run"


def launcher_overrides(script: str, env: dict) -> list[str]:
    """The Hydra overrides the launcher ``script`` submits with ``env`` (its ``DIVA_PRINT_ONLY`` mode)."""
    run_env = {**os.environ, **env, "DIVA_PRINT_ONLY": "1"}
    out = subprocess.run(
        ["bash", f"run_scripts/{script}"], cwd=REPO_ROOT, env=run_env, capture_output=True, text=True, check=True
    )
    return [line for line in out.stdout.splitlines() if line]


def compose_leaves(overrides: list[str]) -> dict[str, object]:
    """The recipe's config composed with ``overrides`` (Hydra, unresolved), as ``{dotted leaf key: value}``."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO_ROOT / "recipe" / "diva_grpo" / "config"), version_base=None):
        config = OmegaConf.to_container(compose("diva_grpo", overrides=overrides), resolve=False)
    return _leaves(config)


def _leaves(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_leaves(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def cpu_run_overrides(method: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The CPU run of ``method`` on verl's vLLM rollout: its GPU launcher with the CPU's variables, then the
    overrides the launcher has no variable for (``run_scripts/tiny_cpu.sh ROLLOUT=vllm``), then ``extra``."""
    from verl_ext.cpu.vllm_launcher import launcher_for, vllm_cpu_overrides, vllm_launcher_env

    env = vllm_launcher_env(PLACEHOLDER_PATHS, PLACEHOLDER_RUN, method=method)
    return launcher_overrides(launcher_for(method), env) + vllm_cpu_overrides(method=method, steps=3) + list(extra)


@cache
def gpu_job_leaves(method: str) -> dict[str, object]:
    from verl_ext.cpu.vllm_launcher import launcher_for

    return compose_leaves(launcher_overrides(launcher_for(method), {}))


def config_differences(method: str, extra: tuple[str, ...] = ()) -> dict[str, tuple[object, object]]:
    """``{key: (GPU job's value, CPU run's value)}`` for every leaf that differs (``<unset>`` where one side has no
    such key); ``extra``: overrides added to the CPU run (a test's)."""
    gpu, cpu = gpu_job_leaves(method), compose_leaves(cpu_run_overrides(method, extra))
    return {
        key: (gpu.get(key, UNSET), cpu.get(key, UNSET))
        for key in sorted(set(gpu) | set(cpu))
        if gpu.get(key, UNSET) != cpu.get(key, UNSET)
    }


def _listed(key: str, listed: list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in listed)


def ledger_problems(differences: dict[str, dict[str, tuple]], changes=None) -> list[str]:
    """What the ledger (``changes``, default :data:`VLLM_CPU_CHANGES`) does not account for, given
    ``{method: config_differences(method)}``: a difference no entry lists, and an entry key that differs for no
    method (a stale entry: the CPU run now runs the GPU's value)."""
    from verl_ext.checks.cpu_changes import VLLM_CPU_CHANGES

    changes = VLLM_CPU_CHANGES if changes is None else changes
    listed = [key for change in changes for key in change.keys]
    problems = []
    for method, diff in differences.items():
        for key, (gpu, cpu) in diff.items():
            if not _listed(key, listed):
                problems.append(
                    f"{method}: {key} is {gpu!r} in the GPU job and {cpu!r} in the CPU run, and no entry of "
                    "VLLM_CPU_CHANGES (verl_ext/checks/cpu_changes.py) says why: add one, or run the GPU's value"
                )
    for change in changes:
        for key in change.keys:
            if not any(_listed(k, [key]) for diff in differences.values() for k in diff):
                problems.append(
                    f"VLLM_CPU_CHANGES entry {change.setting!r}: {key} no longer differs for any method: remove it"
                )
    return problems


def _shown(values: set[str]) -> str:
    if len(values) == 1:
        return next(iter(values))
    if len(values) > 3:
        return "one per method"
    return " / ".join(sorted(values)) + " (by method)"


def _short(value) -> str:
    text = str(value)
    for placeholder in (PLACEHOLDER_RUN, *PLACEHOLDER_PATHS.values()):
        text = text.replace(placeholder, "<cpu run>")
    text = text.replace(str(REPO_ROOT), "<repo>")
    return text if len(text) <= 60 else text[:57] + "..."


def ledger_markdown(differences: dict[str, dict[str, tuple]] | None = None) -> str:
    """docs/stack.md's table: one row per ledger entry, each key it changes with its GPU and CPU values (over every
    method; several values: the methods differ), and why."""
    from verl_ext.checks.cpu_changes import VLLM_CPU_CHANGES

    differences = differences if differences is not None else {m: config_differences(m) for m in METHODS}
    lines = [
        "| setting (the CPU run) | key | GPU job | CPU run | why |",
        "|---|---|---|---|---|",
    ]
    for change in VLLM_CPU_CHANGES:
        first = True
        for prefix in change.keys:
            keys = sorted({k for diff in differences.values() for k in diff if _listed(k, [prefix])})
            for key in keys:
                gpu = {_short(diff[key][0]) for diff in differences.values() if key in diff}
                cpu = {_short(diff[key][1]) for diff in differences.values() if key in diff}
                setting, why = (f"`{change.setting}`", change.why) if first else ("", "")
                lines.append(f"| {setting} | `{key}` | `{_shown(gpu)}` | `{_shown(cpu)}` | {why} |")
                first = False
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=" ".join(METHODS), help="methods to compose (launchers' names)")
    args = parser.parse_args(argv)
    differences = {m: config_differences(m) for m in args.methods.split()}
    print(ledger_markdown(differences))
    problems = ledger_problems(differences)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
