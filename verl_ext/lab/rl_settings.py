"""The RL settings every tiny CPU run shares (the comparison, the sweep and the sparse task's property measures):
a leaf module, so that :mod:`verl_ext.lab.compare` and :mod:`verl_ext.lab.sparse_task` both read them without
importing each other."""

# Sampling temperature of the training rollouts, every method alike. At 1.0 the tiny warm policy also samples the
# wrong colour word for a plainly visible square (measured on the validation set, 4 samples per question: red
# answered right 86% of the time at 1.0, 95% at 0.7; well-formed 91% and 99%), so that even questions it solves
# greedily score low; at 0.7 it still samples blue's and yellow's right numbers (3-17%) for RL to find.
ROLLOUT_TEMPERATURE = 0.7
# Learning rate of every method (AdamW, verl's actor optimiser, one update per step). Adam moves every weight by about
# the learning rate in its first steps whatever the gradient's size, and this policy has few weights: at 5e-4 and
# 1e-3 GRPO collapsed it to one answer within 3-5 steps in 3 of 6 seeded runs (a plain GRPO loop on the warm start,
# 20 steps); at 1e-4 all 3 seeds rose from 0.31 to 0.73.
RL_LR = 1e-4
