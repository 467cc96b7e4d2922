"""DAPO dynamic sampling and the prompt sampler."""

from dataclasses import dataclass

import torch

from grpo_plugin.batching import PromptBatchSampler, shared_group_size, shuffle_groups
from grpo_plugin.dynamic_sampling import ScoredRollout, informative_groups, refill


@dataclass
class FakeBatch:
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    is_truncated: torch.Tensor
    num_prefill_tokens: int = 0
    num_generated_tokens: int = 0


def rollout(rewards: list[list[float]], prompt_len: int, tag: int) -> ScoredRollout:
    p, g = len(rewards), len(rewards[0])
    n = p * g
    batch = FakeBatch(
        prompt_ids=torch.full((n, prompt_len), tag),
        prompt_mask=torch.ones(n, prompt_len, dtype=torch.long),
        completion_ids=torch.full((n, 3), tag),
        completion_mask=torch.ones(n, 3, dtype=torch.long),
        is_truncated=torch.zeros(n, dtype=torch.bool),
    )
    flat = torch.tensor(rewards).reshape(-1)
    rows = [{"prompt": f"{tag}-{i}"} for i in range(p)]
    return ScoredRollout(rows, batch, [str(tag)] * n, flat[:, None], flat)


def test_informative_groups_ignore_unscored():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, float("nan"), 1.0, 0.0, float("nan")])
    assert informative_groups(r, 2).tolist() == [False, False, False, False]
    assert informative_groups(r, 4).tolist() == [True, True]


def test_refill_drops_zero_variance_groups_and_keeps_batch_size():
    first = rollout([[1, 1], [0, 1], [0, 0]], prompt_len=2, tag=1)
    fresh = iter([rollout([[1, 0], [1, 1]], prompt_len=4, tag=2)])
    out, filtered = refill(first, 2, lambda k: next(fresh), max_rounds=1, pad_token_id=0)
    assert len(out.rows) == 3 and out.rewards.shape == (6,)
    assert filtered == 3  # two in the first rollout, one in the fresh one
    assert informative_groups(out.rewards, 2).tolist() == [True, True, False]
    assert out.batch.prompt_ids.shape == (6, 4)  # left-padded to the widest prompt
    assert out.batch.prompt_mask[:2, :2].sum() == 0 and out.batch.prompt_ids[0, 0] == 0


def test_refill_gives_up_after_max_rounds():
    calls = []

    def sample(k):
        calls.append(k)
        return rollout([[0, 0]] * k, prompt_len=2, tag=3)

    out, filtered = refill(rollout([[1, 1], [0, 0]], 2, 1), 2, sample, 2, 0)
    assert calls == [2, 2] and filtered == 6 and len(out.rows) == 2


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
    buf = {"x": torch.arange(12)}
    out = shuffle_groups(buf, 4, torch.Generator().manual_seed(0))["x"].view(3, 4)
    assert all((row - row[0]).tolist() == [0, 1, 2, 3] and row[0] % 4 == 0 for row in out)
    assert (
        shared_group_size(8, 16) == 8
        and shared_group_size(8, 4) == 4
        and shared_group_size(6, 4) == 2
    )
