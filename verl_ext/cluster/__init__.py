"""What a run needs from the Ray cluster it runs on, whatever its size.

Modules: :mod:`.local_node` (a further node of the launcher's local cluster, on loopback), :mod:`.placement` (where
the job's processes landed, read from Ray), :mod:`.batch_arithmetic` (the rows each rank gets in every pass, checked
before a model loads), :mod:`.job_env` (the variables a job reads from the submitting shell, forwarded by name).
Nothing here imports the plugin or a trainer.
"""
