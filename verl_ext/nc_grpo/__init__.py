"""NC-GRPO (``noise_contrastive_grpo``): latent noise on the prompt for a seeded part of each group.

The method changes only the rollouts (docs/algo/noise_contrastive_grpo.md). For a flagged
request the prompt is displaced once, in the prefill pass: ``h~_p = h_p + c * (||h_p|| / sqrt(d)) * xi_p``, ``xi_p ~
N(0, I)`` from a seed of (run seed, step, prompt uid, response index). By default (``target=layer_input``) ``h_p`` is
the residual stream entering the last decoder layer at every prompt position: that layer's keys and values of the
prompt are displaced, and every decoding step attends to them. ``target=final_hidden`` displaces the final hidden
state at the prompt's last position only, which moves only the first generated token's distribution.

Modules: :mod:`.noise` (flags, seeds, the noise draws and the displacement: the same code in both backends),
:mod:`.agent_loop` (the registered agent loop that flags requests, sends each noisy one with its clean twin and carries
the flag and the first difference to the trainer), :mod:`.branching` (the branch metrics), :mod:`.hf_hook` (the
``hf_cpu`` server's and the exact log-prob check's prefill hook), :mod:`.vllm_noise` (vLLM's worker extension) and
:mod:`.runner_hook` (what it installs on vLLM's model runner). The advantage is verl's GRPO over the whole group
(:mod:`verl_ext.methods.noise_contrastive_grpo`).
"""
