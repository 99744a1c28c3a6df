"""Shared pytest setup: GPU-marked tests skip on machines without CUDA; ``vllm_required`` for the GPU stack's tests."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

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
