import pytest
import torch
from torch.utils.data import DataLoader

from tune.training.checkpointing import StatefulDistributedSampler


def test_mid_epoch_resume_continues_the_same_order():
    data = list(range(23))
    full = StatefulDistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=5)
    full.set_epoch(3)
    order = list(full)
    first = StatefulDistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=5)
    first.set_epoch(3)
    iterator = iter(first)
    head = [next(iterator) for _ in range(9)]
    state = first.state_dict()
    assert state["epoch"] == 3 and state["num_consumed"] == 9
    resumed = StatefulDistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=5)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)
    assert len(resumed) == 14
    assert head + list(resumed) == order
    resumed.set_epoch(4)  # the next epoch is whole again, and differently shuffled
    assert len(list(resumed)) == 23 and list(resumed) != order


def test_with_a_dataloader_counts_consumed_batches():
    data = list(range(20))
    sampler = StatefulDistributedSampler(data, num_replicas=1, rank=0, seed=1)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    batches = iter(loader)
    seen = [next(batches) for _ in range(2)]
    assert sampler.state_dict()["num_consumed"] == 8
    resumed = StatefulDistributedSampler(data, num_replicas=1, rank=0, seed=1)
    resumed.load_state_dict(sampler.state_dict())
    rest = list(DataLoader(data, batch_size=4, sampler=resumed))
    assert sorted(torch.cat(seen + rest).tolist()) == data


def test_ranks_partition_the_epoch_like_distributed_sampler():
    data = list(range(10))
    ours = []
    for rank in range(3):
        sampler = StatefulDistributedSampler(data, num_replicas=3, rank=rank, seed=7)
        reference = torch.utils.data.DistributedSampler(data, num_replicas=3, rank=rank, seed=7)
        sampler.set_epoch(2), reference.set_epoch(2)
        assert list(sampler) == list(reference)
        ours += list(sampler)
    assert set(ours) == set(data) and len(ours) == 12  # padded to a multiple of 3


def test_changed_setup_is_refused():
    sampler = StatefulDistributedSampler(list(range(10)), num_replicas=1, rank=0, seed=1)
    other = StatefulDistributedSampler(list(range(11)), num_replicas=1, rank=0, seed=2)
    with pytest.raises(ValueError, match="seed: saved 1, now 2.*dataset_size: saved 10, now 11"):
        other.load_state_dict(sampler.state_dict())
