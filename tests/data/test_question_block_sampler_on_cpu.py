"""QuestionBlockSampler: whole question blocks per batch, per-epoch shuffles, exact resume; check_batch_size."""

import pytest
import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from verl_ext.data.sampler import QuestionBlockSampler, check_batch_size


class IndexDataset(Dataset):
    """Returns the index it is asked for, with the DivaDataset layout (block_size, len = N * block)."""

    def __init__(self, num_questions: int, variants: int):
        self.num_questions, self.block_size = num_questions, 1 + variants

    def __len__(self):
        return self.num_questions * self.block_size

    def __getitem__(self, index):
        return torch.tensor(index)


def decode(index, dataset):
    epoch, position = divmod(index, len(dataset))
    question, slot = divmod(position, dataset.block_size)
    return epoch, question, slot


@pytest.mark.parametrize("variants", [1, 3])
def test_each_epoch_is_a_permutation_of_whole_contiguous_blocks(variants):
    dataset = IndexDataset(10, variants)
    sampler = QuestionBlockSampler(dataset, shuffle=True, seed=5)
    assert len(sampler) == len(dataset)
    orders = []
    for epoch in range(3):
        indices = list(sampler)
        assert len(indices) == len(dataset)
        decoded = [decode(i, dataset) for i in indices]
        assert {e for e, _, _ in decoded} == {epoch}
        blocks = [decoded[k : k + dataset.block_size] for k in range(0, len(decoded), dataset.block_size)]
        for block in blocks:
            assert len({q for _, q, _ in block}) == 1
            assert [s for _, _, s in block] == list(range(dataset.block_size))
        order = [block[0][1] for block in blocks]
        assert sorted(order) == list(range(10))
        expected = torch.randperm(10, generator=torch.Generator().manual_seed(5 + epoch)).tolist()
        assert order == expected
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]


def test_no_shuffle_keeps_question_order():
    dataset = IndexDataset(4, 1)
    assert list(QuestionBlockSampler(dataset, shuffle=False)) == list(range(8))
    sampler = QuestionBlockSampler(dataset, shuffle=False)
    list(sampler)
    assert list(sampler) == list(range(8, 16))  # second epoch: offset by len(dataset)


def batches(loader, count):
    out, it = [], iter(loader)
    while len(out) < count:
        try:
            out.append(next(it).tolist())
        except StopIteration:
            it = iter(loader)  # the trainer's epoch rollover (_fetch_one_gen_batch)
    return out, it


def make_loader(dataset, num_workers):
    sampler = QuestionBlockSampler(dataset, shuffle=True, seed=1)
    return StatefulDataLoader(dataset, batch_size=4, sampler=sampler, drop_last=True, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop_after", [2, 4, 6])  # mid-epoch, at the epoch boundary, inside the next epoch
def test_dataloader_batches_hold_whole_blocks_and_resume_exactly(num_workers, stop_after):
    dataset = IndexDataset(9, 1)  # 18 prompts, batch 4 -> 4 batches per epoch, the last 2 prompts dropped
    reference, _ = batches(make_loader(dataset, num_workers), 10)
    for batch in reference:
        decoded = [decode(i, dataset) for i in batch]
        assert [q for _, q, _ in decoded[0::2]] == [q for _, q, _ in decoded[1::2]]
        assert [s for _, _, s in decoded] == [0, 1, 0, 1]

    loader = make_loader(dataset, num_workers)
    head, it = [], iter(loader)
    for _ in range(stop_after):
        try:
            head.append(next(it).tolist())
        except StopIteration:
            it = iter(loader)
            head.append(next(it).tolist())
    state = loader.state_dict()
    resumed = make_loader(dataset, num_workers)
    resumed.load_state_dict(state)
    tail, _ = batches(resumed, 10 - stop_after)
    assert head + tail == reference


def test_check_batch_size():
    check_batch_size(128, 1)
    check_batch_size(128, 3, gen_batch_size=32)
    with pytest.raises(ValueError, match=r"data.train_batch_size=10 must be a positive multiple of .* = 4"):
        check_batch_size(10, 3)
    with pytest.raises(ValueError, match="counts prompts"):
        check_batch_size(7, 1)
    with pytest.raises(ValueError, match="data.gen_batch_size=3"):
        check_batch_size(128, 1, gen_batch_size=3)
    with pytest.raises(ValueError):
        check_batch_size(0, 1)
