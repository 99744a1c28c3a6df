"""The rows each training rank gets in every pass of a step, from the config alone, checked before a model loads.

verl 0.9.1 checks that each rank's rows divide by a micro-batch size only inside the first pass that uses it: after
the model loaded on every GPU and the first rollout finished (``verl/workers/engine/utils.py``,
``prepare_micro_batches``; ``engine_workers.py``, ``train_mini_batch``). :func:`batch_plan` does verl's arithmetic
(``trainer/ppo/v1/trainer_base.py``: ``_get_required_batch_multiple``, ``_balance_batch``, ``_update_actor``)
for a config; :func:`check_batch_arithmetic` refuses what verl would assert on, naming the setting and the nearest
values that pass.

For a step (FSDP, ``world = trainer.nnodes x trainer.n_gpus_per_node``, ``dp = world / ulysses_sp``)::

    R  = data.train_batch_size x rollout.n                       responses (prompts x responses per prompt);
                                                                 a multiple of world (verl's validate_config)
    Ma = actor.ppo_mini_batch_size x rollout.n                   responses per optimizer step, all ranks
    B' = ceil(R / lcm(dp, Ma)) x lcm(dp, Ma)                     after verl pads with no-op rows (_balance_batch)
    rows per rank = B' / dp, in every forward pass: old log-probs (and PGPO's blind pass over some of them, padded
                    to a multiple of dp x its micro-batch), reference log-probs, and the update, in mini-batches of
                    Ma / dp rows
    each pass without dynamic batch size: its rows per rank divide by its micro-batch size per GPU

CoDaPO's resampled pass rolls out ``data.train_batch_size`` prompts too (the kept questions, repeated), so its rows
are those of every step; DIVA's prompts count originals and variants. Pure: reads an OmegaConf config (the recipe's
yaml with overrides suffices: verl's defaults for the keys it may lack are :data:`VERL_DEFAULTS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from omegaconf import OmegaConf

_AR = "actor_rollout_ref"
# verl 0.9.1's defaults (verl/trainer/config/ppo_trainer.yaml and its actor/rollout/ref blocks) of the keys the
# recipe's yaml may not set: read when the launcher composes the recipe alone, before verl is imported.
VERL_DEFAULTS = {
    f"{_AR}.actor.use_dynamic_bsz": False,
    f"{_AR}.actor.ulysses_sequence_parallel_size": 1,
    f"{_AR}.actor.ppo_micro_batch_size_per_gpu": None,
    f"{_AR}.actor.use_kl_loss": False,
    f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu": None,
    f"{_AR}.rollout.log_prob_use_dynamic_bsz": None,  # None: the actor's use_dynamic_bsz (verl's interpolation)
    f"{_AR}.rollout.tensor_model_parallel_size": 1,
    f"{_AR}.rollout.data_parallel_size": 1,
    f"{_AR}.rollout.pipeline_model_parallel_size": 1,
    f"{_AR}.ref.log_prob_micro_batch_size_per_gpu": None,
    f"{_AR}.ref.log_prob_use_dynamic_bsz": None,
    "algorithm.use_kl_in_reward": False,
    "algorithm.adv_estimator": "grpo",
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
}


class BatchArithmeticError(ValueError):
    """A configuration verl would assert on once the model has loaded; the message names the setting to change."""


@dataclass(frozen=True)
class PassRows:
    """One pass of a step on one training rank: ``rows`` per rank, cut into micro-batches of ``micro_batch``
    (``None``: dynamic batch size, by tokens) set by ``setting``."""

    name: str
    rows: int
    micro_batch: int | None
    setting: str | None
    note: str = ""

    @property
    def divides(self) -> bool:
        return self.micro_batch is None or (self.micro_batch > 0 and self.rows % self.micro_batch == 0)


@dataclass(frozen=True)
class BatchPlan:
    """What :func:`batch_plan` computed for one config (see the module docstring for the formulas)."""

    world: int
    dp: int
    replicas: int
    prompts: int
    responses: int
    padded: int
    rows_per_rank: int
    passes: tuple[PassRows, ...] = field(default_factory=tuple)

    def lines(self) -> list[str]:
        """One line per pass, as the launcher and the job print them."""
        head = (
            f"{self.prompts} prompts x {self.responses // self.prompts} responses = {self.responses} rows"
            f"{f' (+{self.padded - self.responses} no-op rows)' if self.padded != self.responses else ''} over "
            f"{self.dp} ranks ({self.world} GPUs) and {self.replicas} rollout replica(s): {self.rows_per_rank} rows "
            "per rank"
        )
        out = [head]
        for p in self.passes:
            micro = "dynamic batch size" if p.micro_batch is None else f"micro-batches of {p.micro_batch}"
            out.append(f"  {p.name}: {p.rows} rows per rank, {micro}{f' ({p.note})' if p.note else ''}")
        return out


def _get(cfg, key: str):
    value = OmegaConf.select(cfg, key, default=VERL_DEFAULTS.get(key))
    return VERL_DEFAULTS.get(key) if value is None and key in VERL_DEFAULTS else value


def _int(cfg, key: str) -> int:
    value = _get(cfg, key)
    if value is None:
        raise BatchArithmeticError(f"{key} is not set")
    try:
        return int(value)
    except (TypeError, ValueError) as err:
        raise BatchArithmeticError(f"{key}={value!r}: expected an integer") from err


def _dynamic(cfg, section: str) -> bool:
    own = _get(cfg, f"{_AR}.{section}.log_prob_use_dynamic_bsz")
    return bool(_get(cfg, f"{_AR}.actor.use_dynamic_bsz") if own is None else own)


def _micro(cfg, key: str, dynamic: bool) -> int | None:
    if dynamic:
        return None
    value = _get(cfg, key)
    if value is None:
        raise BatchArithmeticError(f"{key} is not set (and dynamic batch size is off): set it, e.g. to 1")
    return int(value)


def batch_plan(cfg) -> BatchPlan:
    """The rows per rank of every pass of ``cfg``'s step; raises :class:`BatchArithmeticError` only for settings
    that leave no plan (a world size the sequence or rollout parallelism does not divide, a mini-batch that does
    not split over the ranks)."""
    world = _int(cfg, "trainer.nnodes") * _int(cfg, "trainer.n_gpus_per_node")
    sp = _int(cfg, f"{_AR}.actor.ulysses_sequence_parallel_size")
    if world <= 0 or sp <= 0 or world % sp:
        raise BatchArithmeticError(
            f"trainer.nnodes x trainer.n_gpus_per_node = {world} GPUs: must be a positive multiple of "
            f"{_AR}.actor.ulysses_sequence_parallel_size={sp}"
        )
    dp = world // sp
    infer = math.prod(_int(cfg, f"{_AR}.rollout.{k}_parallel_size") for k in ("tensor_model", "data", "pipeline_model"))
    if infer <= 0 or world % infer:
        raise BatchArithmeticError(
            f"{world} GPUs do not split into rollout replicas of {_AR}.rollout.tensor_model_parallel_size x "
            f"data_parallel_size x pipeline_model_parallel_size = {infer} GPUs (verl's engine_workers asserts it); "
            f"nearest tensor_model_parallel_size: {_divisors_near(world, infer)}"
        )
    prompts = _int(cfg, "data.train_batch_size")
    n = _int(cfg, f"{_AR}.rollout.n")
    responses = prompts * n
    if responses % world and not bool(_get(cfg, f"{_AR}.actor.use_dynamic_bsz")):
        step = world // math.gcd(world, n)
        raise BatchArithmeticError(
            f"data.train_batch_size x rollout.n = {prompts} x {n} = {responses} responses do not split over {world} "
            f"GPUs (verl's validate_config asserts it); nearest data.train_batch_size: {_multiples_near(prompts, step)}"
        )
    prompts_per_update = _int(cfg, f"{_AR}.actor.ppo_mini_batch_size")
    mini = prompts_per_update * n
    if mini % dp:
        raise BatchArithmeticError(
            f"{_AR}.actor.ppo_mini_batch_size x rollout.n = {mini} responses per optimizer step do not split over "
            f"{dp} training ranks (verl's train_mini_batch asserts it); nearest {_AR}.actor.ppo_mini_batch_size: "
            f"{_multiples_near(prompts_per_update, dp // math.gcd(dp, n))}"
        )
    multiple = math.lcm(dp, mini)
    padded = -(-responses // multiple) * multiple
    rows = padded // dp
    estimator = str(_get(cfg, "algorithm.adv_estimator"))
    old_dynamic = _dynamic(cfg, "rollout")
    old_micro = _micro(cfg, f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu", old_dynamic)
    old_key = f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu"
    passes = [PassRows("old log-probs", rows, old_micro, None if old_dynamic else old_key)]
    if estimator == "pgpo":
        passes.append(
            PassRows(
                "PGPO blind pass",
                rows,
                old_micro,
                None if old_dynamic else old_key,
                "the visual trajectories, padded to a multiple of the ranks x this micro-batch",
            )
        )
    if bool(_get(cfg, f"{_AR}.actor.use_kl_loss")) or bool(_get(cfg, "algorithm.use_kl_in_reward")):
        ref_dynamic = _dynamic(cfg, "ref")
        ref_key = f"{_AR}.ref.log_prob_micro_batch_size_per_gpu"
        passes.append(
            PassRows("reference log-probs", rows, _micro(cfg, ref_key, ref_dynamic), None if ref_dynamic else ref_key)
        )
    update_dynamic = bool(_get(cfg, f"{_AR}.actor.use_dynamic_bsz"))
    update_key = f"{_AR}.actor.ppo_micro_batch_size_per_gpu"
    passes.append(
        PassRows(
            "actor update",
            mini // dp,
            _micro(cfg, update_key, update_dynamic),
            None if update_dynamic else update_key,
            f"{padded // mini} mini-batch(es) of {mini // dp} rows per rank",
        )
    )
    if estimator == "codapo":
        passes.append(
            PassRows("CoDaPO resampled pass", rows, old_micro, None, "the kept questions, same prompts per step")
        )
    return BatchPlan(world, dp, world // infer, prompts, responses, padded, rows, tuple(passes))


def _divisors_near(n: int, target: int) -> str:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    below = max((d for d in divisors if d <= target), default=None)
    above = min((d for d in divisors if d >= target), default=None)
    return " or ".join(str(v) for v in sorted({below, above} - {None}))


def _multiples_near(value: int, step: int) -> str:
    below = (value // step) * step
    above = below if below == value else below + step
    return " or ".join(str(v) for v in sorted({below, above} - {0}))


def check_batch_arithmetic(cfg) -> BatchPlan:
    """:func:`batch_plan`, refused (:class:`BatchArithmeticError`) when a pass's rows per rank do not divide by its
    micro-batch size: the message names the setting, the rows per rank and the nearest valid micro-batch sizes."""
    plan = batch_plan(cfg)
    for p in plan.passes:
        if p.divides:
            continue
        raise BatchArithmeticError(
            f"{p.setting}={p.micro_batch} does not divide the {p.rows} rows each of the {plan.dp} training ranks gets "
            f"in the {p.name} pass ({plan.prompts} prompts x {plan.responses // plan.prompts} responses on "
            f"{plan.world} GPUs); verl would assert on it after the model loads and the first rollout ends. Set "
            f"{p.setting} to {_divisors_near(p.rows, p.micro_batch)} (divisors of {p.rows}), trainer.nnodes to "
            f"{_nodes_near(cfg)} (node counts that pass), or turn on dynamic batch size "
            f"({_AR}.actor.use_dynamic_bsz=true)"
        )
    return plan


def _passes(cfg) -> bool:
    try:
        plan = batch_plan(cfg)
    except BatchArithmeticError:
        return False
    return all(p.divides for p in plan.passes)


# Every key batch_plan reads (the settings of a step's arithmetic).
READ_KEYS = (*VERL_DEFAULTS, "data.train_batch_size", f"{_AR}.rollout.n", f"{_AR}.actor.ppo_mini_batch_size")


def _nodes_near(cfg, search: int = 64) -> str:
    """The nearest ``trainer.nnodes`` below and above the configured one whose whole plan passes."""
    nodes = _int(cfg, "trainer.nnodes")
    # The step's settings alone: copying a whole composed config per trial costs ~0.1 s.
    trial = OmegaConf.create({})
    for key in READ_KEYS:
        OmegaConf.update(trial, key, _get(cfg, key), force_add=True)

    def passing(value: int) -> bool:
        trial.trainer.nnodes = value
        return _passes(trial)

    below = next((v for v in range(nodes - 1, 0, -1) if passing(v)), None)
    above = next((v for v in range(nodes + 1, nodes + search) if passing(v)), None)
    found = [str(v) for v in (below, above) if v is not None]
    return " or ".join(found) if found else "none within reach"
