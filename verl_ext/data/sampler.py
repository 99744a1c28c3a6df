"""Question-block sampler: a question's original and variants always travel in the same batch.

How verl 0.9.1's V1 sync trainer forms a step (``verl/trainer/ppo/v1/trainer_base.py``): the train
``StatefulDataLoader`` uses ``batch_size = data.gen_batch_size or data.train_batch_size``,
``drop_last=True`` and verl's ``collate_fn``; ``_next_train_batch`` concatenates
``train_batch_size / gen_batch_size`` such fetches, submits them for rollout, and in sync mode (no
DAPO ``filter_groups``, no ``sync_refill_failed_groups``) the ReplayBuffer hands back exactly the
prompts submitted that step. verl's own sampler (``create_rl_sampler``: a ``RandomSampler``) would
scatter a question's prompts over different steps; the DIVA trainer replaces it with
:class:`QuestionBlockSampler`, which shuffles *questions* and yields each question's ``1 + m``
dataset indices contiguously. With every batch size a multiple of ``1 + m``
(:func:`check_batch_size`), each batch holds whole question blocks, so the original and all variants
of a question reach the same advantage computation.

``data.train_batch_size`` therefore counts **prompts** (originals plus variants), not questions: the
paper's 128 prompts per step are 64 questions x (1 original + 1 variant).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler


def check_batch_size(train_batch_size: int, variants_per_question: int, gen_batch_size: int | None = None) -> None:
    """Raise ``ValueError`` unless the batch sizes keep question blocks whole.

    ``data.train_batch_size`` (and ``data.gen_batch_size`` when set, the dataloader's fetch size)
    count prompts, originals plus variants, so each must be a multiple of ``1 + variants_per_question``.
    """
    block = 1 + variants_per_question
    for name, size in (("data.train_batch_size", train_batch_size), ("data.gen_batch_size", gen_batch_size)):
        if size is None:
            continue
        if size <= 0 or size % block:
            raise ValueError(
                f"{name}={size} must be a positive multiple of 1 + diva.variants.variants_per_question = {block}: "
                f"it counts prompts (each question's original plus its {variants_per_question} variant(s)), and a "
                f"question's prompts must land in the same batch. E.g. {name}={max(1, size // block) * block} "
                f"= {max(1, size // block)} questions per step."
            )


class _QuestionBlockIterator(Iterator[int]):
    """One epoch of :class:`QuestionBlockSampler`; its state is (epoch, indices yielded)."""

    def __init__(self, sampler: QuestionBlockSampler, epoch: int, yielded: int = 0):
        self.sampler = sampler
        self.epoch = epoch
        self.order = sampler.question_order(epoch)
        self.yielded = yielded

    def __iter__(self):
        return self

    def __next__(self) -> int:
        block = self.sampler.block_size
        if self.yielded >= len(self.order) * block:
            self.sampler.epoch = max(self.sampler.epoch, self.epoch + 1)
            raise StopIteration
        question, slot = divmod(self.yielded, block)
        self.yielded += 1
        return self.epoch * self.sampler.dataset_length + self.order[question] * block + slot

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.order = self.sampler.question_order(self.epoch)
        self.yielded = int(state["yielded"])
        self.sampler.epoch = self.epoch


class QuestionBlockSampler(Sampler[int]):
    """Yield whole question blocks of a :class:`~verl_ext.data.dataset.DivaDataset`, questions shuffled.

    Epoch ``e`` permutes the ``N`` question rows with ``torch.randperm(N, generator)`` where the
    generator is seeded with ``seed + e`` (identity order when ``shuffle=False``), then yields, for each
    question ``q`` in that order, ``e * len(dataset) + q * (1 + m) + s`` for ``s = 0..m``. The epoch
    offset lets forked workers derive the epoch (``DivaDataset.locate``). ``len(sampler) = len(dataset)``.

    Resumable with torchdata's ``StatefulDataLoader``: the sampler (``{"epoch"}``) and its iterator
    (``{"epoch", "yielded"}``) have ``state_dict``/``load_state_dict``, as in torchdata's
    ``RandomSampler``; a restored loader continues mid-epoch with exactly the indices an uninterrupted
    run would have produced.
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0

    @property
    def block_size(self) -> int:
        return int(self.dataset.block_size)

    @property
    def dataset_length(self) -> int:
        return len(self.dataset)

    def question_order(self, epoch: int) -> list[int]:
        num_questions = self.dataset_length // self.block_size
        if not self.shuffle:
            return list(range(num_questions))
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.randperm(num_questions, generator=generator).tolist()

    def __iter__(self) -> _QuestionBlockIterator:
        return _QuestionBlockIterator(self, self.epoch)

    def __len__(self) -> int:
        return self.dataset_length

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
