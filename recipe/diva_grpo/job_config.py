"""The job's final config, composed and checked in the launcher's own process, before any Ray process starts.

``python -m recipe.diva_grpo.main_diva OVERRIDES`` composes ``config/diva_grpo.yaml`` (verl's ``ppo_trainer`` and
the recipe's blocks) with Hydra inside the Ray job, a minute after the launcher started. :func:`compose_job_config`
composes the same config with the same overrides here, in under a second, and refuses what the job would refuse
(or, worse, accept and misuse), with a message that names the argument, the key and what is valid:

- a malformed override (``trainer.total_epochs=[3``): Hydra's parser error, naming the argument;
- an unknown key, with or without ``+``: ``diva.advantage.kk=0.2`` (Hydra's struct error, which wrongly advises
  ``+``), ``+diva.advantage.kk=0.2`` under one of the recipe's own blocks (``diva``, each method's, ...: typed
  dataclasses that refuse unknown keys when the trainer starts); the valid keys of that level are listed. ``+`` keys
  under verl's own blocks pass, as in the job (verl's ``ray_kwargs``, ``override_config`` and the like are open);
- a value whose type does not fit the key's default (``trainer.total_epochs=abc``: an integer is expected).

Neither verl nor torch is imported (about 7 s on two cores): verl's config folder is found by its path
(:func:`verl_config_dir`) and given to Hydra as a ``file://`` search path in place of the recipe's
``pkg://verl.trainer.config``, which would import verl. ``tests/recipe/test_job_config_on_cpu.py`` checks that
both compose the same config.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "config"
CONFIG_NAME = "diva_grpo"
VERL_CONFIG_NAME = "ppo_trainer"
# Top-level keys of the job's config that are neither verl's nor a typed block of the recipe: set by the launchers
# (run_scripts/tiny_cpu.sh's ``+cpu_run``) and read before verl sees the config.
OPEN_TOP_LEVEL = frozenset({"cpu_run"})


class ConfigError(ValueError):
    """A launch's overrides do not compose into a config the job can run; the message says which and what to do."""


def verl_config_dir() -> str:
    """Folder of verl's trainer configs (``verl/trainer/config``), found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.origin:
        raise ConfigError("verl is not installed in this Python; install the project first: pip install -e .")
    return os.path.join(os.path.dirname(spec.origin), "trainer", "config")


def _describe(value) -> str:
    if isinstance(value, bool):
        return f"the boolean {value}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if value is None:
        return "null"
    return f"a {type(value).__name__} {value!r}"


def _kind(default) -> str | None:
    """What a default's type admits: the expected kind, or ``None`` when any value may replace it."""
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, dict):
        return "dict"
    if isinstance(default, list):
        return "list"
    return None  # strings (a file may be a list of files), null, interpolations: any value


KIND_TEXT = {
    "bool": "true or false",
    "int": "a whole number",
    "float": "a number",
    "dict": "a mapping ({key: value, ...})",
    "list": "a list ([a, b, ...])",
}


def _fits(kind: str | None, value) -> bool:
    if kind is None or value is None:
        return True
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict)
    return isinstance(value, list)


def _closest(name: str, options: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _unknown_key(base, key: str, argument: str, index: int, plus: bool) -> ConfigError:
    """The error for ``key``, absent from ``base``: names the deepest level that exists and its keys."""
    from omegaconf import DictConfig

    parts = key.split(".")
    found, node = 0, base  # the levels of ``key`` that exist, and the deepest one's node
    while isinstance(node, DictConfig) and parts[found] in node:
        node = node[parts[found]]
        found += 1
    level, missing = ".".join(parts[:found]), parts[found]
    named = f"argument {index} {argument!r}"
    if not isinstance(node, DictConfig):
        return ConfigError(f"{named}: '{level}' is the value {node!r}, not a mapping: it has no key {missing!r}")
    valid = sorted(node.keys())
    where = f"under '{level}'" if level else "at the top level"
    if plus:
        how = f"'{level}' is a typed block of the recipe, whose keys are fixed"
    else:
        how = "check the spelling; a key the config does not have cannot be set"
    closest = _closest(missing, valid)
    return ConfigError(f"{named}: unknown key {missing!r} {where}{closest}; valid keys: {valid} ({how})")


def _parse(overrides: list[str]):
    """Hydra's parse of each override; a malformed one is refused naming it and its position."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for index, argument in enumerate(overrides, start=1):
        try:
            parsed.append(parser.parse_override(argument))
        except HydraException as err:
            reason = str(err).splitlines()[0]
            raise ConfigError(
                f"argument {index} {argument!r} is not a valid Hydra override ({reason}); expected key=value, "
                "e.g. trainer.total_epochs=3 (Hydra's grammar: https://hydra.cc/docs/advanced/override_grammar/basic/)"
            ) from None
    return parsed


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    search = f"hydra.searchpath=[file://{verl_config_dir()}]"
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(CONFIG_NAME, overrides=[search, *overrides])


def recipe_blocks(base) -> frozenset[str]:
    """Top-level keys of the job's config that the recipe adds to verl's (``diva``, each method's block,
    ``rollout_requests``, ``launch``): typed dataclasses in the job, so their keys are fixed."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        verl = compose(VERL_CONFIG_NAME)
    return frozenset(str(k) for k in base.keys()) - frozenset(str(k) for k in verl.keys()) - OPEN_TOP_LEVEL


def check_overrides(base, overrides: list[str]) -> None:
    """Refuse an override of ``base`` (the config before any override) with an unknown key or a value of the wrong
    type; :class:`ConfigError` names the argument."""
    from omegaconf import OmegaConf

    closed = None
    for index, (argument, override) in enumerate(zip(overrides, _parse(overrides), strict=True), start=1):
        key = override.key_or_group
        if key.startswith("hydra.") or key == "hydra":
            continue
        exists = OmegaConf.select(base, key, default="__absent__", throw_on_missing=False) != "__absent__"
        if not exists and not override.is_delete():
            plus = override.is_add() or override.is_force_add()
            if not plus:
                raise _unknown_key(base, key, argument, index, plus=False)
            closed = closed if closed is not None else recipe_blocks(base)
            if key.split(".")[0] in closed:
                raise _unknown_key(base, key, argument, index, plus=True)
            continue
        if exists and override.is_add():
            raise ConfigError(f"argument {index} {argument!r}: {key} is already in the config; set it without the '+'")
        if override.is_delete() and not exists:
            raise ConfigError(f"argument {index} {argument!r}: there is no key {key} to delete")
        if override.is_delete() or not exists:
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent) if parent else base
        if OmegaConf.is_interpolation(node, leaf):
            continue
        default = OmegaConf.to_container(node, resolve=False)[leaf] if hasattr(node, "keys") else None
        kind = _kind(default)
        value = override.value()
        if not _fits(kind, value):
            raise ConfigError(
                f"argument {index} {argument!r}: {key} expects {KIND_TEXT[kind]} (its default is {default!r}), got "
                f"{_describe(value)}"
            )


def compose_job_config(overrides: list[str]):
    """The config ``python -m recipe.diva_grpo.main_diva *overrides`` composes in the job, checked: raises
    :class:`ConfigError` naming the argument for a malformed override, an unknown key or a value of the wrong type.
    Imports neither verl nor torch."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    base = _compose([])
    check_overrides(base, list(overrides))
    try:
        return _compose(list(overrides))
    except (HydraException, OmegaConfBaseException) as err:  # what the checks above do not foresee: the first line
        raise ConfigError(f"the overrides do not compose: {str(err).splitlines()[0]}") from None


__all__ = ["ConfigError", "check_overrides", "compose_job_config", "recipe_blocks", "verl_config_dir"]
