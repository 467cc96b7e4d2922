"""Held-out evaluation: greedy accuracy and unbiased pass@k under a verifiable reward.

Generation goes through the same prefix-shared sampler as training (`rollout.generation`):
greedy is temperature 0, and the k samples of pass@k share one prefill per prompt.

`pass_at_k` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", https://arxiv.org/abs/2107.03374, eq. 1), in its numerically stable product form:
    pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)
for n samples of which c are correct.

Reward functions follow TRL's contract, `fn(prompts=, completions=, completion_ids=, **columns)
-> list[float | None]`: completions are strings for string prompts and
`[{"role": "assistant", "content": text}]` for chat prompts; every other dataset column is
passed by name. A `None` reward counts as wrong. A completion is correct when its reward is
`>= success_threshold`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset

from ...rollout.noise import KeyedNoise
from ...rollout.prompts import sample_groups
from ...rollout.types import GroupSampling, SamplingParams
from ..rewards.scoring import score_rollout

RewardFn = Callable[..., list[float | None]]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k draws (without replacement) from n samples, c of
    them correct, is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _is_correct(reward: float, threshold: float) -> bool:
    return not math.isnan(reward) and reward >= threshold


@dataclass(frozen=True)
class _Scorer:
    """What scoring a held-out set needs, fixed for one `evaluate` call."""

    model: Any
    tokenizer: Any
    reward_fn: RewardFn
    max_new_tokens: int
    temperature: float
    num_samples: int | None  # completions sampled per prompt for pass@k; None: greedy only
    batch_size: int  # sequences generated at once
    seed: int = 0
    max_prompt_length: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: Any = None  # a rollout.multiturn.ToolSetup: the completions may call tools

    def batches(self, dataset: Dataset, sampling: SamplingParams, num_return: int, offset: int):
        """Per prompt, the rewards (NaN = not scored) of its `num_return` completions, and each
        completion's tool calls (empty without tools). Samples are keyed on (seed, the prompt's
        index in the whole set = `offset` + its index here)."""
        prompts_per_batch = max(1, self.batch_size // num_return)
        per_prompt: list[list[float]] = []
        calls: list[int] = []
        for start in range(0, len(dataset), prompts_per_batch):
            stop = min(start + prompts_per_batch, len(dataset))
            rows = [dataset[i] for i in range(start, stop)]
            noise = None
            if not sampling.greedy:
                indices = range(offset + start, offset + stop)
                noise = KeyedNoise.for_evaluation(
                    self.seed, indices, num_return, self.max_new_tokens
                )
            settings = GroupSampling(
                sampling,
                num_return,
                self.max_prompt_length,
                self.chat_template_kwargs,
                tools=self.tools,
            )
            rollout = sample_groups(self.model, self.tokenizer, rows, settings, noise=noise)
            rewards = score_rollout(rollout, [self.reward_fn], torch.ones(1)).rewards
            per_prompt += rewards.view(len(rows), num_return).tolist()
            if rollout.batch.tool_calls is not None:
                calls += rollout.batch.tool_calls.tolist()
        return per_prompt, calls

    def score(self, dataset: Dataset, offset: int = 0):
        """Per prompt: the greedy reward, the rewards of the samples (None: greedy only), and the
        greedy completions' tool calls."""
        greedy_params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)
        greedy, calls = self.batches(dataset, greedy_params, 1, offset)
        greedy = [r[0] for r in greedy]
        if not self.num_samples:
            return greedy, None, calls
        sampled = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        return greedy, self.batches(dataset, sampled, self.num_samples, offset)[0], calls


def _summarize(rewards, sampled, *, k, num_samples, success_threshold) -> dict[str, float | int]:
    result: dict[str, float | int] = {
        "n": len(rewards),
        "accuracy": sum(_is_correct(r, success_threshold) for r in rewards) / len(rewards),
        "mean_reward": sum(r for r in rewards if not math.isnan(r)) / len(rewards),
    }
    if sampled is not None:
        correct = [sum(_is_correct(r, success_threshold) for r in row) for row in sampled]
        scores = [pass_at_k(num_samples, c, k) for c in correct]
        result.update({f"pass@{k}": sum(scores) / len(scores), "k": k, "num_samples": num_samples})
    return result


def _score_sharded(accelerator, scorer: _Scorer, dataset: Dataset):
    """Each process scores its contiguous shard of the prompts; the per-prompt results of all
    processes are gathered in dataset order (the same on every process). A reward that raises on
    one process stops every process with its error (no collective inside the local phase)."""
    from ..distributed import contiguous_share, failures_shared, full_parameters, gather_objects

    start, stop = contiguous_share(
        len(dataset), accelerator.num_processes, accelerator.process_index
    )
    shard = dataset.select(range(start, stop))
    local = None
    with full_parameters(accelerator, scorer.model), failures_shared(accelerator):
        if len(shard):
            local = scorer.score(shard, offset=start)
    parts = [part for part in gather_objects(accelerator, local) if part is not None]
    rewards = [r for greedy, _, _ in parts for r in greedy]
    sampled = None if not scorer.num_samples else [row for _, rows, _ in parts for row in rows]
    return rewards, sampled, [c for _, _, calls in parts for c in calls]


def evaluate(
    model,
    tokenizer,
    dataset: Dataset,
    reward_fn: RewardFn,
    *,
    k: int | None = 8,
    num_samples: int | None = None,
    max_new_tokens: int = 64,
    batch_size: int = 32,
    temperature: float = 1.0,
    success_threshold: float = 1.0,
    seed: int = 0,
    accelerator=None,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: Any = None,
) -> dict[str, float | int]:
    """Greedy accuracy and pass@k of `model` on `dataset` (needs a `prompt` column).

    With `tools` (a `rollout.multiturn.ToolSetup`) every completion may call them (greedy and
    sampled alike), and the result adds the greedy completions' `tool_call_rate` (share with at
    least one call) and `tool_calls` (calls per completion).

    Returns `{"n", "accuracy", "mean_reward", "pass@k", "k", "num_samples"}` (the last three only
    when k is a positive int). pass@k uses `num_samples` (default k, must be >= k) samples per
    prompt at `temperature`, drawn from draws keyed on (`seed`, the prompt's index in `dataset`),
    so they do not depend on `batch_size` or on sharding (the global RNG is not touched);
    `batch_size` bounds the number of sequences generated at once. Prompts are encoded as in
    training (`max_prompt_length`, `chat_template_kwargs`). The model's train/eval mode is left as
    it was.

    With an `accelerator` of several processes (every process calls this), each process scores
    a contiguous share of the prompts and the results are gathered: every number equals the
    one-process result (greedy decoding does not depend on the shard; the samples are keyed).
    """
    if "prompt" not in dataset.column_names:
        raise ValueError(
            f"evaluate needs a 'prompt' column; the dataset has {dataset.column_names}"
        )
    if len(dataset) == 0:
        raise ValueError("evaluate got an empty dataset; give it at least one held-out prompt")
    num_samples = num_samples or k
    if k and num_samples < k:
        raise ValueError(f"num_samples={num_samples} must be >= k={k} for pass@k")
    scorer = _Scorer(
        model,
        tokenizer,
        reward_fn,
        max_new_tokens,
        temperature,
        num_samples if k else None,
        batch_size,
        seed,
        max_prompt_length,
        chat_template_kwargs,
        tools,
    )
    was_training = model.training
    model.eval()
    try:
        if accelerator is not None and accelerator.num_processes > 1:
            rewards, sampled, calls = _score_sharded(accelerator, scorer, dataset)
        else:
            rewards, sampled, calls = scorer.score(dataset)
    finally:
        model.train(was_training)
    result = _summarize(
        rewards, sampled, k=k, num_samples=num_samples, success_threshold=success_threshold
    )
    if tools is not None and calls:
        result["tool_call_rate"] = sum(c > 0 for c in calls) / len(calls)
        result["tool_calls"] = sum(calls) / len(calls)
    return result
