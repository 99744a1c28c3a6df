"""The environment variables a job reads from the shell that submits it, forwarded to the job by name.

``ray job submit`` runs the entry point on the cluster's head with the cluster's environment, not the submitting
shell's: a variable the job reads (MUPO's embedding key, a Hugging Face token for the model download on each node)
is silently missing on a remote cluster, while a local head, started from the same shell, happens to inherit it. The
launcher's submitter (:mod:`recipe.diva_grpo.submit`) puts every variable of :func:`forwarded_env` into the job's
runtime env (``env_vars``, which every process of the job gets, and which Ray's dashboard shows redacted); the values
never touch a file, a command line or a log: only the names are printed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# MUPO: the embedding endpoint's key, under the name mupo.embedding.api_key_env gives (this is its default), and the
# endpoint when mupo.embedding.base_url is null (verl_ext/mupo).
MUPO_KEY_DEFAULT = "OPENAI_API_KEY"
MUPO_KEY_OVERRIDE = "mupo.embedding.api_key_env="
# What the job's processes read, besides what the runtime env and the launcher set themselves. Libraries: Hugging
# Face Hub (the model and processor download on every node), Weights & Biases and SwanLab (verl's trackers, when
# trainer.logger names them). The project: MUPO's endpoint, verl's log level, the crash tests' armed faults.
JOB_ENV_NAMES = (
    MUPO_KEY_DEFAULT,
    "MUPO_EMBEDDING_BASE_URL",
    "HF_TOKEN",
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "WANDB_API_KEY",
    "WANDB_BASE_URL",
    "WANDB_ENTITY",
    "WANDB_MODE",
    "SWANLAB_API_KEY",
    "VERL_LOGGING_LEVEL",
    "DIVA_FAULTS",
    "DIVA_FAULT_DIR",
)


def forwarded_names(overrides: Iterable[str]) -> tuple[str, ...]:
    """:data:`JOB_ENV_NAMES` plus the variable a ``mupo.embedding.api_key_env=NAME`` override names."""
    extra = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith(MUPO_KEY_OVERRIDE)]
    return tuple(dict.fromkeys([*JOB_ENV_NAMES, *(name for name in extra if name)]))


def forwarded_env(overrides: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of :func:`forwarded_names` that ``environ`` (the submitting shell) sets, by name."""
    return {name: environ[name] for name in forwarded_names(overrides) if environ.get(name)}
