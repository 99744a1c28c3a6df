"""The toolkit's one advantage path: what a method declares, what it receives, what it returns.

Every GRPO variant of the toolkit (DIVA-GRPO, AVSPO, CoDaPO, Durian, PGPO, MUPO), and verl's GRPO as their
baseline, is an :class:`AdvantageMethod`: a name (``algorithm.adv_estimator=<name>``), a typed config block (a
top-level key of the recipe yaml, unknown keys refused), the TransferQueue fields it needs beyond verl's own, and
a ``compute`` function that maps :class:`AdvantageInputs` to :class:`AdvantageResult` by calling the method's
pure math in ``verl_ext/algos/<method>.py`` (GRPO's is verl's own). The trainer step that fetches the fields,
applies verl's KL penalty and rollout correction, calls ``compute`` and writes the advantages back is shared by
all of them (``recipe/diva_grpo/toolkit_trainer.py``); adding a method adds one file under ``verl_ext/methods/``
and copies no trainer code.

Nothing here imports Ray or touches files: a method's ``compute`` is testable on plain tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl_ext.config import config_block

# What a method may ask for beyond the rewards, the mask and ``uid`` (always given):
#   old_log_probs      (R, T) log-probs of the sampled tokens under the policy that scored them (verl's old_log_probs)
#   responses          (R, T) sampled token ids (to decode the response text)
#   blind_log_probs    (R, T) old-policy log-probs with the visual tokens hidden (written by a pre-advantage pass)
#   extra_info         the dataset row's extra_info per response (question ids, difficulties, visual entropy)
#   reward_extra_info  the reward function's extra keys per response (e.g. ``acc``)
#   rollout_fields     the agent loop's ``extra_fields`` per response (NC-GRPO's noise flag)
#   rollout_log_probs  (R, T) the rollout server's log-probs of the sampled tokens (rollout.calculate_log_probs)
KNOWN_NEEDS = frozenset(
    {
        "old_log_probs",
        "responses",
        "blind_log_probs",
        "extra_info",
        "reward_extra_info",
        "rollout_fields",
        "rollout_log_probs",
    }
)
TENSOR_NEEDS = frozenset({"old_log_probs", "responses", "blind_log_probs", "rollout_log_probs"})


@dataclass
class AdvantageInputs:
    """The ``R`` real responses of one training step (verl's synthetic padding rows removed), ``T`` tokens wide.

    Attributes:
        token_level_rewards: ``(R, T)`` rewards the advantage is computed from (verl's in-reward KL penalty
            applied when ``algorithm.use_kl_in_reward``; otherwise equal to ``token_level_scores``).
        token_level_scores: ``(R, T)`` reward-function scores, before any KL penalty.
        response_mask: ``(R, T)`` 0/1 int64 mask of the response tokens.
        index: ``(R,)`` object array of verl's ``uid``: one prompt group per id, fresh every step.
        tensors: the ``(R, T)`` fields of :data:`TENSOR_NEEDS` the method declared.
        extra_info: per response, the dataset row's ``extra_info`` dict (when declared).
        reward_extra_info: per response, the reward function's extra keys (when declared).
        rollout_fields: per response, the agent loop's ``extra_fields`` dict (when declared).
        global_step: the step being trained (verl's ``global_steps``, 1-based).
        total_steps: the run's ``total_training_steps``.
        tokenizer: the trainer's tokenizer (to decode ``responses``).
    """

    token_level_rewards: torch.Tensor
    token_level_scores: torch.Tensor
    response_mask: torch.Tensor
    index: np.ndarray
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    extra_info: list[dict] | None = None
    reward_extra_info: list[dict] | None = None
    rollout_fields: list[dict] | None = None
    global_step: int = 0
    total_steps: int = 0
    tokenizer: Any = None

    def __len__(self) -> int:
        return int(self.token_level_rewards.shape[0])

    @property
    def scores(self) -> torch.Tensor:
        """``(R,)`` sequence scores before any KL penalty (what accuracy and collapse diagnostics measure)."""
        return self.token_level_scores.sum(dim=-1)

    def tensor(self, name: str) -> torch.Tensor:
        """A declared ``(R, T)`` field; a ``KeyError`` says which field is missing and why."""
        if name not in self.tensors:
            raise KeyError(
                f"advantage input {name!r} is missing: the method must declare it in AdvantageMethod.needs "
                f"(got {sorted(self.tensors)})"
            )
        return self.tensors[name]

    def info_values(self, key: str, method: str) -> list:
        """``extra_info[key]`` of every response; a ``KeyError`` names the key, the first row without it and the fix."""
        if self.extra_info is None:
            raise KeyError(f"{method} needs extra_info, which its AdvantageMethod does not declare")
        for row, info in enumerate(self.extra_info):
            if not isinstance(info, dict) or key not in info:
                raise KeyError(
                    f"{method} needs extra_info[{key!r}] for every prompt, but response {row} has none "
                    f"(its extra_info keys: {sorted(info) if isinstance(info, dict) else type(info).__name__}). "
                    "Add the column to the training parquet (see docs/data.md)."
                )
        return [info[key] for info in self.extra_info]

    def reward_values(self, key: str) -> list | None:
        """The reward function's extra ``key`` for every response, or ``None`` when no response has it."""
        if self.reward_extra_info is None:
            return None
        values = [info.get(key) if isinstance(info, dict) else None for info in self.reward_extra_info]
        missing = [row for row, value in enumerate(values) if value is None]
        if len(missing) == len(values):
            return None
        if missing:
            raise KeyError(
                f"the reward function returned {key!r} for some responses but not for response {missing[0]}: "
                "it must return the same keys for every response"
            )
        return values


@dataclass
class AdvantageResult:
    """What a method's ``compute`` returns for the ``R`` real responses.

    Attributes:
        advantages: ``(R, T)``, zero on masked tokens.
        returns: ``(R, T)``; verl's GRPO-style estimators return the advantages.
        metrics: scalar metrics for the step's log line, keyed ``<method>/...``.
        per_response: ``(R,)`` values other parts of the trainer use (e.g. CoDaPO's weights for its sampler).
    """

    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    per_response: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.returns is None:
            self.returns = self.advantages


@dataclass(frozen=True)
class AdvantageMethod:
    """One GRPO variant, as the shared trainer step sees it.

    Attributes:
        name: ``algorithm.adv_estimator`` value.
        compute: ``(inputs, config) -> AdvantageResult``; ``config`` is an instance of ``config_cls``.
        config_cls: dataclass of the method's knobs (paper defaults), read from the top-level ``config_key``.
        config_key: top-level config key of the knobs (default: ``name``).
        needs: fields of :data:`KNOWN_NEEDS` the method reads.
        metric_prefix: prefix of the method's metrics (default: ``name``).
        check_config: ``(full_config, method_config) -> None``, start-up checks; raise ``ValueError``.
        batch_planner: ``(method_config) -> planner``, for methods that change which prompts are rolled out
            (CoDaPO's resampling). The planner has ``observe(inputs, result)``, ``plan(batch_size)``
            (``None``: take the dataloader's next batch; else the question ids to roll out), ``state_dict()``,
            ``load_state_dict(state)`` and ``metrics()``.
        pre_advantage: ``(trainer, batch, metrics, method_config) -> batch``, run after verl's old log-probs
            (PGPO's blind pass); writes the fields it produces to TransferQueue.
        actor_workers: ``(role_worker_mapping) -> None``, run after verl builds the trainer's worker mapping, to
            substitute a subclass of verl's actor worker that serves the ``pre_advantage`` pass.
        plain_estimator: a function with verl's estimator signature, registered as ``adv_estimator=<name>``
            for verl's plain trainers. ``None``: the method needs more than ``uid`` and its registration
            refuses with a message naming the toolkit trainer.
        trainer_mode: the ``trainer.v1.trainer_mode`` that runs the method.
    """

    name: str
    compute: Callable[[AdvantageInputs, Any], AdvantageResult]
    config_cls: type | None = None
    config_key: str | None = None
    needs: frozenset[str] = frozenset()
    metric_prefix: str | None = None
    check_config: Callable[[Any, Any], None] | None = None
    batch_planner: Callable[[Any], Any] | None = None
    pre_advantage: Callable[..., Any] | None = None
    actor_workers: Callable[[dict], None] | None = None
    plain_estimator: Callable | None = None
    trainer_mode: str = "toolkit"

    def __post_init__(self):
        unknown = set(self.needs) - KNOWN_NEEDS
        if unknown:
            raise ValueError(
                f"method {self.name!r} declares unknown needs {sorted(unknown)}; known: {sorted(KNOWN_NEEDS)}"
            )

    @property
    def key(self) -> str:
        return self.config_key or self.name

    @property
    def prefix(self) -> str:
        return self.metric_prefix or self.name

    def config_from(self, full_config: Any) -> Any:
        """The typed knobs from the full trainer config (``None`` or a missing block: paper defaults)."""
        if self.config_cls is None:
            return None
        values = full_config.get(self.key) if full_config is not None else None
        return config_block(self.config_cls, values, self.key)


METHODS: dict[str, AdvantageMethod] = {}


def knobs_of(config: Any) -> dict[str, Any]:
    """A method config dataclass as keyword arguments for its math function (verl's private fields left out)."""
    return {key: value for key, value in config.items() if not key.startswith("_")}


def register_method(method: AdvantageMethod) -> AdvantageMethod:
    """Add ``method`` to the toolkit and to verl's estimator registry (idempotent for the same method)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    from verl_ext.deferral import deferring

    known = METHODS.get(method.name)
    if known is not None and known is not method:
        raise ValueError(f"advantage method {method.name!r} is already registered")
    METHODS[method.name] = method
    # verl_ext.plugin registers the toolkit's own methods by name; a method added elsewhere registers here.
    if ADV_ESTIMATOR_REGISTRY.get(method.name) is None:
        register_adv_est(method.name)(deferring(method.name, verl_estimator(method)))
    return method


def verl_estimator(method: AdvantageMethod) -> Callable:
    """What ``algorithm.adv_estimator=<name>`` runs in verl's plain dispatcher: the method's verl estimator when
    it needs only ``uid`` (AVSPO), otherwise a refusal naming the trainer that feeds it."""
    return method.plain_estimator or _refusal(method)


def get_method(name: str) -> AdvantageMethod:
    """The toolkit method registered as ``name``; ``ValueError`` lists the known ones."""
    if name not in METHODS:
        raise ValueError(
            f"algorithm.adv_estimator={name!r} is not a method of this toolkit; known: {sorted(METHODS)} "
            "(verl's other estimators, such as rloo, run with trainer.v1.trainer_mode=sync)"
        )
    return METHODS[name]


def _refusal(method: AdvantageMethod) -> Callable:
    def needs_the_toolkit_trainer(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        raise RuntimeError(
            f"algorithm.adv_estimator={method.name} needs {', '.join(sorted(method.needs)) or 'more than uid'}, "
            f"which verl's plain advantage dispatcher does not pass (it only gives `uid`). Run the toolkit trainer: "
            f"set trainer.v1.trainer_mode={method.trainer_mode} (run_scripts/qwen25vl7b_{method.name}.sh does), "
            f"or call verl_ext.algos directly."
        )

    needs_the_toolkit_trainer.__name__ = f"{method.name}_needs_the_{method.trainer_mode}_trainer"
    return needs_the_toolkit_trainer
