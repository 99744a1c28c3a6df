"""A named patch of verl (every process, every device): its FSDP engine builds the reshardable checkpoint manager.

Assumption lifted: "a checkpoint is loaded at the world size that saved it". ``FSDPEngine.initialize``
(``verl/workers/engine/fsdp/transformer_impl.py``) builds ``FSDPCheckpointManager`` by that module-level name at
call time; :func:`apply` binds the name there to
:class:`~verl_ext.checkpoint.reshardable.ReshardableCheckpointManager`, which saves verl's files plus a copy that
loads at any world size (:mod:`verl_ext.checkpoint.reshardable`).

The binding waits for verl to import that module: ``verl_ext.plugin`` runs inside ``import verl``, and importing the
engine there would import every engine package in every process that imports verl (a CLI, a reward worker), with
verl's warnings about the absent ones and its accelerator probe on the console, and ahead of the plugin's other
patches. So :func:`apply` binds the name at once when the module is already imported, and otherwise puts a finder on
``sys.meta_path`` that binds it right after the module's own code has run (before any engine is built) and then
removes itself.

What this covers, on verl 0.9.1: every FSDP engine, which all inherit ``initialize`` from ``FSDPEngine``
(``FSDPEngineWithLMHead``, ``FSDPEngineWithValueHead``, ``FSDPTurboEngineWithLMHead``), hence the actor and
reference of ``verl.workers.engine_workers.ActorRolloutRefWorker`` (and its subclasses: PGPO's worker, verl's
``DetachActorWorker``) and the critic of ``TrainingWorker``. The V1 trainer has no other path: verl 0.9.1 no longer
ships the legacy ``verl/workers/fsdp_workers.py`` nor a ``use_legacy_worker_impl`` switch, and its
``trainer_base.py`` maps every role to those two engine workers. The reshardable copy is written for FSDP2 models
(``strategy: fsdp2``, the recipe's setting); with ``strategy: fsdp`` (FSDP1) the manager behaves as verl's. Not
covered (the project runs none of them): the VeOmni engine (it imports ``FSDPCheckpointManager`` into its own
module), Megatron's and torchtitan's checkpoint managers.
"""

from __future__ import annotations

import importlib.abc
import sys

from verl_ext.checkpoint import BIND_PENDING, ENGINE_MODULE, RESHARDABLE_MODULE

PATCH_NAME = "reshardable_checkpoint"


def apply() -> bool:
    """Make verl's FSDP engine build the reshardable manager (idempotent): bound now when the engine module is
    imported, else when it is. Returns True when this call did it (bound the name or set up the binding)."""
    engine = sys.modules.get(ENGINE_MODULE)
    if engine is not None:
        return _bind(engine)
    if any(isinstance(finder, _BindOnImport) for finder in sys.meta_path):
        return False
    sys.meta_path.insert(0, _BindOnImport())
    return True


def _bind(engine) -> bool:
    """Bind the name in the engine module (:func:`~verl_ext.checkpoint.reshardable.bind_manager`); True when this
    call changed it or left it to :mod:`~verl_ext.checkpoint.reshardable` to change.

    The engine module is imported by verl's checkpoint package, which :mod:`~verl_ext.checkpoint.reshardable`
    imports for the class it subclasses: when that import is the first of the engine, the finder runs while
    reshardable is half-imported and its class does not exist yet. The engine is then marked, and reshardable binds
    the name as its last statement.
    """
    reshardable = sys.modules.get(RESHARDABLE_MODULE)
    if reshardable is not None and not hasattr(reshardable, "bind_manager"):
        setattr(engine, BIND_PENDING, True)
        return True
    from verl_ext.checkpoint.reshardable import bind_manager

    return bind_manager(engine)


class _BindOnImport(importlib.abc.MetaPathFinder):
    """Finds verl's FSDP engine module with the finders after it and wraps its loader in :class:`_BindAfterExec`."""

    def find_spec(self, fullname, path, target=None):
        if fullname != ENGINE_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                spec.loader = _BindAfterExec(spec.loader, self)
                return spec
        return None


class _BindAfterExec(importlib.abc.Loader):
    """verl's loader of the engine module, then :func:`_bind`; everything else is the wrapped loader's."""

    def __init__(self, loader, finder: _BindOnImport):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _bind(module)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)

    def __getattr__(self, name):  # get_source, get_filename, is_package, ... for inspect, linecache, importlib
        return getattr(self._loader, name)
