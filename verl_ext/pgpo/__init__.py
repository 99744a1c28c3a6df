"""PGPO's blind view in verl's actor workers (issue 11; the math is :mod:`verl_ext.algos.pgpo`).

* :mod:`.blind_view`: the blind inputs of a batch (visual tokens dropped, rotary positions kept), pure tensor code;
* :mod:`.worker`: :class:`PgpoActorRolloutRefWorker`, verl's actor worker plus ``compute_blind_log_prob``, and
  :func:`use_blind_pass_worker` for a trainer's ``role_worker_mapping``;
* :mod:`.hook`: :func:`compute_blind_log_probs`, the trainer-side pre-advantage hook (its contract is at the top
  of the module).
"""

from verl_ext.pgpo.blind_view import blind_inputs, visual_token_counts
from verl_ext.pgpo.hook import BLIND_PASS_FIELDS, TIMING_KEY, compute_blind_log_probs, plan_blind_rows
from verl_ext.pgpo.worker import BLIND_LOG_PROBS, PgpoActorRolloutRefWorker, blind_log_prob_pass, use_blind_pass_worker

__all__ = [
    "BLIND_LOG_PROBS",
    "BLIND_PASS_FIELDS",
    "PgpoActorRolloutRefWorker",
    "TIMING_KEY",
    "blind_inputs",
    "blind_log_prob_pass",
    "compute_blind_log_probs",
    "plan_blind_rows",
    "use_blind_pass_worker",
    "visual_token_counts",
]
