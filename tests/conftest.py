"""Shared pytest setup: GPU-marked tests skip on machines without CUDA; ``vllm_required`` for the GPU stack's tests
(and the ``vllm_rollout`` mark on the tests that use it); the DRY_RUN launch the preflight's tests share."""

import os

import pytest


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    import torch

    for item in items:
        # CI's vLLM stream (.ci/run) selects these: a test that asks for vLLM by the fixture is marked for it (a
        # launch that asks for it only by its parameter is marked where it is parametrized).
        if "vllm_required" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm_rollout)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_required():
    """Skip (or, with ``DIVA_REQUIRE_VLLM=1`` as CI sets it in the GPU stack's environment, fail) where vLLM does not
    import."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        if os.environ.get("DIVA_REQUIRE_VLLM") == "1":
            pytest.fail(f"DIVA_REQUIRE_VLLM=1 but vLLM does not import here ({err}): run_scripts/setup_vllm_cpu.sh")
        pytest.skip("needs the GPU stack's environment (bash run_scripts/setup_vllm_cpu.sh DIR)")


@pytest.fixture(scope="session")
def diva_dry_run(tmp_path_factory):
    """``DRY_RUN=1 bash run_scripts/qwen25vl7b_diva.sh`` on this CPU machine (a local Ray head, ``ray job submit``, the
    preflight), once for the tests that read it (``tests/recipe/test_launchers_on_cpu.py``: the launch itself;
    ``tests/report/test_report_preflight_on_cpu.py``: its console and the report of its run): the preflight's folder
    (``DIVA_PREFLIGHT_DIR``), the console (stdout, then stderr) and the exit status."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    parent = tmp_path_factory.mktemp("diva_dry_run")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TRAIN_FILES", "VAL_FILES")}
    env.update(DRY_RUN="1", DIVA_PREFLIGHT_DIR=str(parent))
    out = subprocess.run(
        ["bash", "run_scripts/qwen25vl7b_diva.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=900
    )
    return {"dir": parent, "console": out.stdout + out.stderr, "returncode": out.returncode}
