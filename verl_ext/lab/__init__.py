"""The experiment lab on the CPU: the tasks (the swatch task's warm start, :mod:`.warm_start`; the sparse task,
hard questions with solvable hints, :mod:`.sparse_task`), the methods compared on one task (:mod:`.compare`), the
seed sweep and its ablations (:mod:`.sweep`), the learning signal read from the actor's inputs
(:mod:`.learning_signal`) and the RL settings every experiment shares (:mod:`.rl_settings`).

It trains through the CPU backend (:mod:`verl_ext.cpu`) and reads runs with the checks (:mod:`verl_ext.checks`);
neither imports it (``tests/lint/test_package_layers_on_cpu.py``).
"""
