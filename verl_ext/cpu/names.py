"""Names the CPU mode shares with verl and the checks. A leaf module: the package's registration
(:func:`verl_ext.cpu.register`) and the rollout it registers (:mod:`verl_ext.cpu.rollout`) read ``ROLLOUT_NAME``;
the job's runtime env (:mod:`verl_ext.cpu.runtime_env`) sets ``PROBE_ENV`` for the actor-input probe of
:mod:`verl_ext.checks.probe`."""

ROLLOUT_NAME = "hf_cpu"
# The folder where the actor-input probe writes (unset: no probe). Named here, in the backend, so that the runtime
# env can set it without importing the checks.
PROBE_ENV = "DIVA_CPU_PROBE_DIR"
