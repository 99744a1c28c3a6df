"""An ``adv_estimator`` name that another package registered before the plugin (a later verl registering ``codapo``,
as a pull request to verl's main does) is refused when a trainer starts, instead of running that package's estimator
under the toolkit's name. In a fresh process: verl's own registry, with external plugins off until the stand-in
estimator is registered, then the plugin imported as verl would import it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Starts Ray, a process group or a fresh interpreter that imports verl: the launch tier (pytest -m launch; CI runs it).
pytestmark = pytest.mark.launch

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    def verls_codapo(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        raise AssertionError("a foreign estimator must never run")

    verls_codapo.__module__ = "verl.trainer.ppo.codapo_upstream"
    register_adv_est("codapo")(verls_codapo)

    import verl_ext.plugin as plugin

    assert ADV_ESTIMATOR_REGISTRY["codapo"] is verls_codapo  # not overwritten: verl would refuse it
    assert ADV_ESTIMATOR_REGISTRY["avspo"].__module__ == "verl_ext.plugin"
    try:
        plugin.check_registered()
    except RuntimeError as error:
        print("REFUSED", error)
    else:
        print("ACCEPTED")
    """
)


def _run(script: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_name_verl_registered_first_is_refused_naming_it_and_its_owner():
    out = _run(SCRIPT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REFUSED" in out.stdout, out.stdout
    assert "'codapo': 'verl.trainer.ppo.codapo_upstream.verls_codapo'" in out.stdout
    assert "verl==0.9.1" in out.stdout


def test_without_a_clash_the_plugins_own_names_pass():
    out = _run("import verl_ext.plugin as plugin\nplugin.check_registered()\nprint('ACCEPTED')")
    assert out.returncode == 0 and "ACCEPTED" in out.stdout, out.stderr[-3000:]
