"""The names of the toolkit's advantage methods besides ``diva_grpo``, one module each in ``verl_ext/methods/``.

A leaf module (it imports nothing): :mod:`verl_ext.plugin` registers these names with verl without importing the
methods' modules, and :mod:`verl_ext.methods` imports one module per name, so neither imports the other.
"""

TOOLKIT_METHODS = ("avspo", "codapo", "durian", "pgpo", "mupo", "noise_contrastive_grpo")
