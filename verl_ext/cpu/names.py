"""The rollout name the CPU mode registers with verl. A leaf module: the package's registration
(:func:`verl_ext.cpu.register`) and the rollout it registers (:mod:`verl_ext.cpu.rollout`) both read it."""

ROLLOUT_NAME = "hf_cpu"
