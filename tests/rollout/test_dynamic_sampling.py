"""DAPO dynamic sampling: informative groups, refill, and the batch size kept."""

import torch

from grpo_plugin.rollout.dynamic_sampling import informative_groups, refill
from grpo_plugin.rollout.types import Rollout, RolloutBatch


def rollout(rewards: list[list[float]], prompt_len: int, tag: int) -> Rollout:
    p, g = len(rewards), len(rewards[0])
    n = p * g
    batch = RolloutBatch(
        prompt_ids=torch.full((n, prompt_len), tag),
        prompt_mask=torch.ones(n, prompt_len, dtype=torch.long),
        completion_ids=torch.full((n, 3), tag),
        completion_mask=torch.ones(n, 3, dtype=torch.long),
        is_truncated=torch.zeros(n, dtype=torch.bool),
        num_prefill_tokens=0,
        num_generated_tokens=3 * n,
    )
    flat = torch.tensor(rewards, dtype=torch.float32).reshape(-1)
    rows = [{"prompt": f"{tag}-{i}", "answer": str(i)} for i in range(p)]
    prompts = [r["prompt"] for r in rows for _ in range(g)]
    columns = {"answer": [r["answer"] for r in rows for _ in range(g)]}
    return Rollout(rows, batch, prompts, [str(tag)] * n, [[tag]] * n, columns, flat[:, None], flat)


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
    # every per-row field follows the kept groups: prompts, columns, completions
    assert out.prompts == ["1-1", "1-1", "2-0", "2-0", "1-0", "1-0"]
    assert out.columns["answer"] == ["1", "1", "0", "0", "0", "0"]
    assert out.completions == ["1", "1", "2", "2", "1", "1"]
    assert out.batch.num_generated_tokens == int(out.batch.completion_mask.sum()) == 18


def test_refill_gives_up_after_max_rounds():
    calls = []

    def sample(k):
        calls.append(k)
        return rollout([[0, 0]] * k, prompt_len=2, tag=3)

    out, filtered = refill(rollout([[1, 1], [0, 0]], 2, 1), 2, sample, 2, 0)
    assert calls == [2, 2] and filtered == 6 and len(out.rows) == 2


def test_multi_turn_rows_keep_their_masks_and_counts_through_a_refill():
    from dataclasses import replace

    from grpo_plugin.rollout.dynamic_sampling import concat_rollouts

    single = rollout([[1, 0]], prompt_len=2, tag=1)
    tools = rollout([[0, 1]], prompt_len=2, tag=2)
    tools.batch = replace(
        tools.batch,
        completion_ids=torch.full((2, 5), 2),
        completion_mask=torch.ones(2, 5, dtype=torch.long),
        sampled_mask=torch.tensor([[1, 0, 0, 1, 1], [1, 1, 0, 1, 1]]),
        tool_calls=torch.tensor([1, 2]),
        tool_failures=torch.tensor([0, 1]),
        turns=torch.tensor([2, 3]),
        num_reused_tokens=7,
    )
    out = concat_rollouts(single, tools, pad_token_id=0).batch
    assert out.sampled_mask.tolist() == [[1, 1, 1, 0, 0]] * 2 + [[1, 0, 0, 1, 1], [1, 1, 0, 1, 1]]
    assert out.tool_calls.tolist() == [0, 0, 1, 2] and out.turns.tolist() == [1, 1, 2, 3]
    assert out.num_reused_tokens == 7
    picked = out.select(torch.tensor([3, 0]))
    assert picked.tool_failures.tolist() == [1, 0] and picked.num_generated_tokens == 4 + 3
