"""The record of CI's whole run (``benchmarks/bench_test_tiers.py --from-ci-log``): what the README quotes of
``.ci/run`` is read from the table ``.ci/run`` prints at its end, and only from a passing run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

PASSING = """\
...
======= 1416 passed, 1 skipped, 268 deselected, 13 warnings in 301.50s (0:05:01) =======
======= 21 passed, 1662 deselected in 1300.00s (0:21:40) =======
CI: time of each part (this machine; the two streams overlap):
  install (development stack)                                       101 s (from 0 s)
  the main job's stack (setup_vllm_cpu.sh)                          250 s (from 0 s)
  gpu_stack tier, vLLM                                             1300 s (from 251 s)
  whole                                                            2400 s
"""


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_test_tiers

    yield bench_test_tiers
    sys.modules.pop("bench_test_tiers", None)


def test_the_whole_and_each_part_come_from_cis_closing_table(bench, tmp_path):
    log = tmp_path / "ci.log"
    log.write_text(PASSING)
    ci = bench.ci_from_log(log, keep=False)
    assert (ci["seconds"], ci["minutes"]) == (2400, 40.0)
    assert ci["parts_s"] == {
        "install (development stack)": 101,
        "the main job's stack (setup_vllm_cpu.sh)": 250,
        "gpu_stack tier, vLLM": 1300,
    }
    assert ci["result"].startswith("1416 passed") and "21 passed" in ci["result"]


@pytest.mark.parametrize(
    "log",
    [
        PASSING.replace("21 passed,", "1 failed, 20 passed,"),
        PASSING + "CI: failed: the main job's stream exit 1, the development stack's stream exit 0\n",
        PASSING.replace("  whole                                                            2400 s\n", ""),
        "pip install ...\n",
    ],
)
def test_a_failed_or_unfinished_run_is_not_recorded(bench, tmp_path, log):
    path = tmp_path / "ci.log"
    path.write_text(log)
    with pytest.raises(SystemExit, match="ci.log"):
        bench.ci_from_log(path, keep=False)
