"""NC-GRPO (``noise_contrastive_grpo``): latent noise at the branch point for a seeded part of each group.

The method changes only the rollouts (METHODS.md section 6; README, NC-GRPO). For a flagged request, the final
hidden state at the prompt's last position (after the last decoder layer and its norm, the LM head's input) is
displaced once, in the prefill pass: ``h~ = h + c * (||h|| / sqrt(d)) * xi``, ``xi ~ N(0, I)`` from a seed of
(run seed, step, prompt uid, response index). Only the first generated token's distribution moves; the KV cache
and every later decoding step are the unperturbed model's.

Modules: :mod:`.noise` (flags, seeds, the noise vector and the displacement: the same code in both backends),
:mod:`.agent_loop` (the registered agent loop that flags requests and carries the flag to the trainer),
:mod:`.hf_hook` (the ``hf_cpu`` server's prefill hook), :mod:`.vllm_noise` (vLLM's worker extension) and
:mod:`.runner_hook` (what it installs on vLLM's model runner). The
advantage is verl's GRPO over the whole group (:mod:`verl_ext.methods.noise_contrastive_grpo`).
"""
