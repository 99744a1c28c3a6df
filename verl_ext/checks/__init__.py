"""The checks that prove a run right: what the actor consumed (:mod:`.probe`), the rollout's log-probs recomputed
(:mod:`.logprob_check`), DIVA-GRPO with its additions removed being verl's GRPO (:mod:`.grpo_identity`), a recorded
run repeating value for value (:mod:`.same_run`), every config difference from the GPU job listed with why
(:mod:`.ledger`, its data in :mod:`.cpu_changes`), and the tiny run's train-resume-summary session (:mod:`.session`).

They read what the CPU backend (:mod:`verl_ext.cpu`) writes and import it; the backend never imports them, and they
never import the lab (:mod:`verl_ext.lab`): a test (``tests/lint/test_package_layers_on_cpu.py``) says so.
"""
