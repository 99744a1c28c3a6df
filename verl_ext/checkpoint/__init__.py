"""Checkpoints of verl's FSDP2 actor that resume at another world size (a run saved on two nodes continues on one).

verl 0.9.1 names each rank's checkpoint files by the world size that wrote them and loads the same names, so a
checkpoint loads only at the world size that saved it (verl issues #2265, #1535). Modules:
:mod:`.reshardable` (the checkpoint manager that adds a reshardable copy to verl's files, and the helpers that read a
checkpoint folder), :mod:`.patch` (makes verl's FSDP engine build that manager; applied by ``verl_ext.plugin``).
"""

# Shared by .patch and .reshardable, neither of which may import the other at module level (see .patch).
ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
RESHARDABLE_MODULE = "verl_ext.checkpoint.reshardable"
# Set on the engine module when its binding must wait for .reshardable to finish importing.
BIND_PENDING = "_verl_ext_reshardable_manager_pending"
