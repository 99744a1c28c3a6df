"""Shared fixtures of the recipe tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_and_tq(request):
    """A local Ray (logical CPUs for TransferQueue's actors) and TransferQueue, one per test module."""
    import ray
    import transfer_queue as tq

    namespace = request.module.__name__.rsplit(".", 1)[-1]
    ray.init(num_cpus=16, include_dashboard=False, namespace=namespace, log_to_driver=False)
    tq.init()
    yield
    tq.close()
    ray.shutdown()
