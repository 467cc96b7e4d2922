"""The prompt sampler and group-preserving shuffles."""

import torch

from grpo_plugin.core.batching import (
    PromptBatchSampler,
    RepeatEach,
    group_permutation,
    shared_group_size,
)


def test_sampler_repeats_whole_blocks_and_is_reproducible():
    sampler = PromptBatchSampler(num_rows=10, prompts_per_batch=3, repeats=2, seed=7)
    order = list(sampler)
    assert len(order) == len(sampler) == 18
    blocks = [order[i : i + 3] for i in range(0, 18, 3)]
    assert blocks[0] == blocks[1] and blocks[2] == blocks[3] and blocks[0] != blocks[2]
    assert list(PromptBatchSampler(10, 3, 2, seed=7)) == order
    sampler.set_epoch(1)
    assert list(sampler) != order


def test_group_shuffle_keeps_groups_contiguous():
    rows = group_permutation(12, 4, torch.Generator().manual_seed(0))
    out = torch.arange(12)[rows].view(3, 4)
    assert all((row - row[0]).tolist() == [0, 1, 2, 3] and row[0] % 4 == 0 for row in out)
    assert sorted(rows.tolist()) == list(range(12))
    assert (
        shared_group_size(8, 16) == 8
        and shared_group_size(8, 4) == 4
        and shared_group_size(6, 4) == 2
    )


def test_repeat_each_gives_each_index_g_times_in_a_row_as_trls_repeat_sampler():
    plain = list(PromptBatchSampler(10, 3, 2, seed=7))
    repeated = RepeatEach(PromptBatchSampler(10, 3, 2, seed=7), 4)
    assert list(repeated) == [i for i in plain for _ in range(4)]
    assert len(repeated) == 4 * len(plain)
    repeated.set_epoch(1)  # reaches the shuffle
    sampler = PromptBatchSampler(10, 3, 2, seed=7)
    sampler.set_epoch(1)
    assert list(repeated)[::4] == list(sampler) != plain
