"""Registration of DIVA-GRPO with verl's registries.

verl imports this module in every process through the ``verl.plugins`` entry point declared in
``setup.py`` (``import verl`` loads all entry points). verl swallows plugin import errors at debug
level, so :func:`check_registered` exists to turn a silent miss into a clear error; the DIVA trainer
and the tests call it.
"""

from __future__ import annotations

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from verl_ext.deferral import deferring

ADV_ESTIMATOR_NAME = "diva_grpo"


def _diva_grpo_needs_the_diva_trainer(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """verl's plain dispatcher passes only ``uid`` (one prompt group), never the question groups or
    difficulties DIVA needs, so computing anything here would silently be GRPO. Refuse instead."""
    raise RuntimeError(
        "algorithm.adv_estimator=diva_grpo needs question groups and difficulties, which verl's plain advantage "
        "dispatcher does not pass (it only gives `uid`). Run the DIVA trainer: set trainer.v1.trainer_mode=diva_grpo "
        "(the recipe config recipe/diva_grpo/config/diva_grpo.yaml does), or call "
        "verl_ext.algos.compute_diva_advantage directly with prompt_index, question_index and difficulty."
    )


def _register(name: str, fn) -> None:
    """Register ``name`` unless it is registered already. A name another package registered first (a later verl:
    its main has a CoDaPO pull request under `codapo`) is not overwritten here (verl refuses a second registration,
    and hides a plugin's import error) but refused by check_registered(), which every trainer of the recipe calls,
    so that the other package's estimator never runs in the place of this toolkit's under the same name."""
    if ADV_ESTIMATOR_REGISTRY.get(name) is None:
        # Deferring: the toolkit trainer computes the method after verl's own advantage step (verl_ext/deferral.py).
        register_adv_est(name)(deferring(name, fn))


_register(ADV_ESTIMATOR_NAME, _diva_grpo_needs_the_diva_trainer)


def _register_cpu_training() -> None:
    """verl_ext/cpu: the "cpu" platform (never auto-detected) and the "hf_cpu" rollout are only names in verl's
    registries; the CPU patches apply only when this process runs with VERL_PLATFORM=cpu. Done before the methods'
    import below, so that nothing there can keep the CPU patches from applying (verl swallows plugin errors)."""
    from verl_ext import cpu

    cpu.register()
    cpu.activate()


_register_cpu_training()

# A verl bug on any device (verl_ext/position_ids_patch.py): batches whose sequences all have one length corrupt the
# nested M-RoPE position ids. Applied here, in every process, before verl's worker modules bind the function.
from verl_ext import position_ids_patch  # noqa: E402

position_ids_patch.apply()

# A verl assumption broken by transformers 5 (verl_ext/no_pixels_patch.py): verl's Qwen2-VL forward fails on every
# micro-batch without pixels (text-only rows, padding rows, PGPO's blind pass). Every process, every device: each
# actor and reference forward runs in a process that loaded this plugin.
from verl_ext import no_pixels_patch  # noqa: E402

no_pixels_patch.apply()

# A verl assumption lifted on every device (verl_ext/checkpoint/patch.py): "a checkpoint is loaded at the world size
# that saved it". verl's FSDP engine builds the reshardable checkpoint manager, whose copy of the actor's state loads
# at any world size (a job resumed on the nodes it has left: verl_ext/cluster/resize.py).
from verl_ext.checkpoint import patch as checkpoint_patch  # noqa: E402

checkpoint_patch.apply()

# The toolkit's other methods (verl_ext/methods/<name>.py), registered with verl here by name, without importing
# their modules: verl loads this plugin while it is itself being imported, which may happen midway through the
# import of one of our modules (verl_ext.config subclasses verl's BaseConfig); importing the methods from here then
# would find that module half-built, and verl would hide the failure. The registered function imports the method
# on its first call and runs its verl estimator (AVSPO) or its refusal naming the toolkit trainer.
from verl_ext.method_names import TOOLKIT_METHODS  # noqa: E402


def _by_name(name: str):
    def estimator(*args, **kwargs):
        from verl_ext.methods import get_method
        from verl_ext.methods.base import verl_estimator

        return verl_estimator(get_method(name))(*args, **kwargs)

    estimator.__name__ = f"{name}_estimator"
    return estimator


for _name in TOOLKIT_METHODS:
    _register(_name, _by_name(_name))


def check_registered() -> None:
    """Raise ``RuntimeError`` if ``diva_grpo`` or another toolkit method is missing from verl's registry, or if one
    of their names is registered by another package (verl's own estimator would run under the toolkit's name)."""
    from verl_ext.methods import METHODS

    taken = {name: _owner(name) for name in (ADV_ESTIMATOR_NAME, *TOOLKIT_METHODS)}
    taken = {name: owner for name, owner in taken.items() if owner}
    if taken:
        raise RuntimeError(
            "advantage estimator name(s) already registered by another package, whose estimator would run in the "
            f"place of this toolkit's: {taken}. This toolkit is built for verl 0.9.1 (`pip install verl==0.9.1`), "
            "which registers none of them; with a verl that does, choose which to run: this toolkit's method "
            "(uninstall or pin the other) or the other package's (algorithm.adv_estimator=<its name> without this "
            "recipe's trainer)"
        )
    names = {ADV_ESTIMATOR_NAME, *TOOLKIT_METHODS, *METHODS}
    missing = sorted(name for name in names if name not in ADV_ESTIMATOR_REGISTRY)
    if missing:
        raise RuntimeError(
            f"advantage estimator(s) {missing} are not registered with verl. Is this package installed "
            "(`pip install -e .`) so that its `verl.plugins` entry point is visible, and is "
            "VERL_USE_EXTERNAL_PLUGINS not set to 'none'?"
        )


def _owner(name: str) -> str | None:
    """Who registered ``name`` when it is not this plugin (``None``: this plugin, or nobody yet)."""
    registered = ADV_ESTIMATOR_REGISTRY.get(name)
    if registered is None or getattr(registered, "__module__", None) == __name__:
        return None
    return f"{getattr(registered, '__module__', '?')}.{getattr(registered, '__qualname__', registered)}"
