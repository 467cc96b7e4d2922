"""Held-out evaluation: greedy accuracy and unbiased pass@k under a verifiable reward.

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

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from datasets import Dataset

RewardFn = Callable[..., list[float | None]]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k draws (without replacement) from n samples, c of
    them correct, is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _is_chat(prompt: Any) -> bool:
    return isinstance(prompt, list)


def _prompt_texts(tokenizer, prompts: Sequence[Any]) -> list[str]:
    return [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        if _is_chat(p)
        else p
        for p in prompts
    ]


def _eos_ids(model, tokenizer) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _trim(row: list[int], eos_ids: set[int]) -> list[int]:
    """Cut a generated row just after its first eos (what follows is padding)."""
    for i, token in enumerate(row):
        if token in eos_ids:
            return row[: i + 1]
    return row


def _generation_config(
    model, tokenizer, *, sample: bool, max_new_tokens: int, temperature: float, num_return: int
):
    config = copy.deepcopy(model.generation_config)
    config.update(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        num_return_sequences=num_return,
        temperature=temperature if sample else None,
        top_k=0 if sample else None,  # pure temperature sampling, as TRL's GRPO default
        top_p=1.0 if sample else None,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    return config


@torch.inference_mode()
def generate_completions(
    model,
    tokenizer,
    prompts: Sequence[Any],
    *,
    num_return: int = 1,
    sample: bool = False,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
) -> list[list[int]]:
    """Token ids of `num_return` completions per prompt (prompt-major order), each trimmed after
    its first eos. Pads on the left for the duration of the call."""
    padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        batch = tokenizer(
            _prompt_texts(tokenizer, prompts),
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,  # chat templates already add their special tokens (as TRL)
        ).to(model.device)
    finally:
        tokenizer.padding_side = padding_side
    config = _generation_config(
        model,
        tokenizer,
        sample=sample,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        num_return=num_return,
    )
    out = model.generate(**batch, generation_config=config)  # (B * num_return, P + T)
    completions = out[:, batch["input_ids"].shape[1] :].tolist()  # (B * num_return, T)
    eos_ids = _eos_ids(model, tokenizer)
    return [_trim(row, eos_ids) for row in completions]


def _rewards(
    reward_fn: RewardFn, tokenizer, rows: list[dict[str, Any]], completion_ids: list[list[int]]
) -> list[float | None]:
    """Score completions with a TRL-style reward fn; `rows[i]` is the dataset row of completion i."""
    prompts = [row["prompt"] for row in rows]
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    completions = [
        [{"role": "assistant", "content": text}] if _is_chat(p) else text
        for p, text in zip(prompts, texts)
    ]
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    rewards = reward_fn(
        prompts=prompts, completions=completions, completion_ids=completion_ids, **columns
    )
    if len(rewards) != len(completions):
        raise ValueError(
            f"reward function returned {len(rewards)} rewards for {len(completions)} completions"
        )
    return list(rewards)


def _is_correct(reward: float | None, threshold: float) -> bool:
    return reward is not None and not math.isnan(reward) and reward >= threshold


def _score_batches(
    model,
    tokenizer,
    dataset: Dataset,
    reward_fn: RewardFn,
    *,
    num_return: int,
    prompts_per_batch: int,
    **generate_kwargs,
) -> list[list[float | None]]:
    """Per prompt, the rewards of its `num_return` completions."""
    per_prompt: list[list[float | None]] = []
    for start in range(0, len(dataset), prompts_per_batch):
        rows = [dataset[i] for i in range(start, min(start + prompts_per_batch, len(dataset)))]
        ids = generate_completions(
            model, tokenizer, [r["prompt"] for r in rows], num_return=num_return, **generate_kwargs
        )
        repeated = [row for row in rows for _ in range(num_return)]
        rewards = _rewards(reward_fn, tokenizer, repeated, ids)
        per_prompt += [rewards[i : i + num_return] for i in range(0, len(rewards), num_return)]
    return per_prompt


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
) -> dict[str, float | int]:
    """Greedy accuracy and pass@k of `model` on `dataset` (needs a `prompt` column).

    Returns `{"n", "accuracy", "mean_reward", "pass@k", "k", "num_samples"}` (the last three only
    when k is a positive int). pass@k uses `num_samples` (default k, must be >= k) samples per
    prompt at `temperature`; `batch_size` bounds the number of sequences per `generate` call.
    The global RNG state and the model's train/eval mode are left as they were.
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
    was_training = model.training
    model.eval()
    try:
        greedy = _score_batches(
            model,
            tokenizer,
            dataset,
            reward_fn,
            num_return=1,
            prompts_per_batch=batch_size,
            sample=False,
            max_new_tokens=max_new_tokens,
        )
        rewards = [r[0] for r in greedy]
        result: dict[str, float | int] = {
            "n": len(dataset),
            "accuracy": sum(_is_correct(r, success_threshold) for r in rewards) / len(rewards),
            "mean_reward": sum(r for r in rewards if r is not None and not math.isnan(r))
            / len(rewards),
        }
        if k:
            result.update(
                _pass_at_k_metrics(
                    model,
                    tokenizer,
                    dataset,
                    reward_fn,
                    k,
                    num_samples,
                    seed,
                    success_threshold,
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    batch_size=batch_size,
                )
            )
        return result
    finally:
        model.train(was_training)


def _pass_at_k_metrics(
    model,
    tokenizer,
    dataset,
    reward_fn,
    k: int,
    num_samples: int,
    seed: int,
    success_threshold: float,
    *,
    max_new_tokens: int,
    temperature: float,
    batch_size: int,
) -> dict[str, float | int]:
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        sampled = _score_batches(
            model,
            tokenizer,
            dataset,
            reward_fn,
            num_return=num_samples,
            prompts_per_batch=max(1, batch_size // num_samples),
            sample=True,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        )
    estimates = [
        pass_at_k(num_samples, sum(_is_correct(r, success_threshold) for r in rs), k)
        for rs in sampled
    ]
    return {f"pass@{k}": sum(estimates) / len(estimates), "k": k, "num_samples": num_samples}
