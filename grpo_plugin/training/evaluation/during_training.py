"""Evaluation during training: what `GRPOTrainer.evaluate()` computes and logs.

Each held-out set is read in chunks of `per_device_eval_batch_size` completions, and per chunk:

1. greedy decoding, one completion per prompt: `accuracy` is the share whose first reward function
   gives >= 1.0; every greedy completion, with its prompt and dataset columns, also goes to the
   `eval_metrics` hook (called once per set, after the last chunk);
2. with `num_generations_eval` = k > 1, k completions per prompt sampled with the training
   settings: unbiased `pass@k` (Chen et al. 2021, https://arxiv.org/abs/2107.03374);
3. on those k completions (on the greedy ones when k == 1), TRL's evaluation metrics: the reward
   means (`reward`, `rewards/<fn>/mean`), completion lengths, and the GRPO loss with its entropy,
   KL (beta > 0) and clip ratios, computed without grad. With k == 1 and beta == 0 the loss is 0
   by construction (advantage 0), and the forward pass that would only add the entropy (it costs
   about as much as the greedy decoding) is skipped: no `entropy` then.

What the reward functions pass to `log_metric` while evaluating is averaged into the set's
metrics (our own keys win a name clash); their `log_extra` columns are dropped (no table).

Keys get the `eval_` prefix (`eval_<name>_` for each set of a dict of eval sets) and go to
`metrics.jsonl` and the `report_to` trackers in one log line per evaluation.

Randomness: samples are keyed on (`seed`, the prompt's index in the eval set) (`rollout/noise.py`),
the same at every evaluation, so two evaluations differ by the model only, not by the draw, and
the result does not depend on the batch size or on how the set is sharded over processes.
Nothing draws from the global RNG or from training's draws, so evaluating does not change the
training run. With several processes each evaluates a contiguous share of a map-style set and
the totals are gathered: every metric is that of one process evaluating the whole set.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core.logprobs import completion_logprobs
from ...core.objectives import policy_loss
from ...rollout.dynamic_sampling import informative_groups
from ...rollout.noise import KeyedNoise
from ...rollout.prompts import sample_groups
from ...rollout.types import GroupSampling, Rollout, SamplingParams
from ..distributed import contiguous_share, failures_shared, full_parameters, gather_objects
from ..metrics import nanstd
from ..objective import rollout_advantages
from ..policy import eval_mode, reference_mode
from ..rewards.scoring import score_rollout
from .engine import pass_at_k
from .setup import best_metric_key, check_eval_datasets, check_metrics_result, prefixed

SUCCESS_THRESHOLD = 1.0  # a greedy completion is correct when the first reward is >= this
LOSS_STATS = ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region")


@dataclass
class _Totals:
    """One eval set's results, accumulated over its chunks."""

    correct: list[bool] = field(default_factory=list)  # (P,) greedy verdicts
    pass_at_k: list[float] = field(default_factory=list)  # (P,) when k > 1
    rewards: list[torch.Tensor] = field(default_factory=list)  # chunks of (n,)
    per_func: list[torch.Tensor] = field(default_factory=list)  # chunks of (n, F)
    lengths: list[torch.Tensor] = field(default_factory=list)  # chunks of (n,)
    truncated: list[torch.Tensor] = field(default_factory=list)  # chunks of (n,) bool
    tool_calls: list[torch.Tensor] = field(default_factory=list)  # chunks of (n,), with tools
    loss_stats: dict[str, list[float]] = field(default_factory=dict)  # per chunk
    logged: dict[str, list[float]] = field(default_factory=dict)  # rewards' log_metric values
    hook_inputs: dict[str, list] = field(default_factory=dict)  # greedy prompts, completions, ...
    chunks: int = 0
    rows_seen: int = 0
    num_tokens: int = 0  # prompt + completion tokens of every completion generated

    def count_tokens(self, rollout: Rollout) -> None:
        b = rollout.batch
        self.num_tokens += int(b.prompt_mask.sum()) + int(b.completion_mask.sum())

    def add_greedy(self, rollout: Rollout) -> None:
        first = rollout.per_func[:, 0]  # (P,)
        self.correct += (~first.isnan() & (first >= SUCCESS_THRESHOLD)).tolist()
        inputs = {
            "prompts": rollout.prompts,
            "completions": rollout.completions,
            "completion_ids": rollout.completion_ids,
            **rollout.columns,
        }
        for key, values in inputs.items():
            self.hook_inputs.setdefault(key, []).extend(values)

    def add_scored(self, rollout: Rollout, k: int) -> None:
        self.rewards.append(rollout.rewards)
        self.per_func.append(rollout.per_func)
        self.lengths.append(rollout.batch.model_mask.sum(dim=1).float().cpu())
        if rollout.batch.tool_calls is not None:
            self.tool_calls.append(rollout.batch.tool_calls.cpu())
        self.truncated.append(rollout.batch.is_truncated.cpu())
        if k > 1:
            first = rollout.per_func[:, 0].view(-1, k)  # (P, k)
            correct = (~first.isnan() & (first >= SUCCESS_THRESHOLD)).sum(dim=1)  # (P,)
            self.pass_at_k += [pass_at_k(k, int(c), k) for c in correct]

    def merge(self, other: _Totals) -> None:
        """Append another process's totals (called in process order)."""
        self.correct += other.correct
        self.pass_at_k += other.pass_at_k
        for name in ("rewards", "per_func", "lengths", "truncated", "tool_calls"):
            getattr(self, name).extend(getattr(other, name))
        for key, values in other.loss_stats.items():
            self.loss_stats.setdefault(key, []).extend(values)
        for key, values in other.logged.items():
            self.logged.setdefault(key, []).extend(values)
        for key, values in other.hook_inputs.items():
            self.hook_inputs.setdefault(key, []).extend(values)
        self.chunks += other.chunks
        self.rows_seen += other.rows_seen
        self.num_tokens += other.num_tokens

    def add_loss(self, stats: dict[str, float]) -> None:
        for key, value in stats.items():
            self.loss_stats.setdefault(key, []).append(value)

    def metrics(self, reward_names: list[str], k: int) -> dict[str, float]:
        out: dict[str, float] = {"accuracy": sum(self.correct) / len(self.correct)}
        out["n"] = len(self.correct)
        if k > 1:
            out[f"pass@{k}"] = sum(self.pass_at_k) / len(self.pass_at_k)
        out.update(_reward_metrics(self, reward_names, k))
        out.update({key: sum(v) / len(v) for key, v in self.loss_stats.items()})
        logged = {key: sum(v) / len(v) for key, v in self.logged.items() if v}  # as TRL's
        out.update({key: v for key, v in logged.items() if key not in out})  # ours win a clash
        if (
            "clip_ratio/low_mean" in self.loss_stats
        ):  # clipped loss types: TRL's extremes (over processes there; over chunks here)
            out["clip_ratio/low_min"] = min(self.loss_stats["clip_ratio/low_mean"])
            out["clip_ratio/high_max"] = max(self.loss_stats["clip_ratio/high_mean"])
        out["num_tokens"] = float(self.num_tokens)
        if self.tool_calls:  # with tools: calls per completion and share that call one
            calls = torch.cat(self.tool_calls).float()
            out["tools/call_frequency"] = calls.mean().item()
            out["tools/call_rate"] = (calls > 0).float().mean().item()
        return out


def _reward_metrics(totals: _Totals, reward_names: list[str], k: int) -> dict[str, float]:
    """TRL's names, as training logs them (metrics.reward_metrics), over every chunk."""
    rewards, per_func = torch.cat(totals.rewards), torch.cat(totals.per_func)  # (N,), (N, F)
    lengths, truncated = torch.cat(totals.lengths), torch.cat(totals.truncated)  # (N,), (N,)
    terminated = lengths[~truncated] if (~truncated).any() else torch.zeros(1)
    out = {
        "reward": torch.nanmean(rewards).item(),
        "reward_std": torch.nanmean(nanstd(rewards.view(-1, k), dim=1)).item(),
        "frac_reward_zero_std": 1.0 - informative_groups(rewards, k).float().mean().item(),
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        "completions/mean_terminated_length": terminated.mean().item(),
        "completions/min_terminated_length": terminated.min().item(),
        "completions/max_terminated_length": terminated.max().item(),
    }
    for j, name in enumerate(reward_names):
        out[f"rewards/{name}/mean"] = torch.nanmean(per_func[:, j]).item()
        out[f"rewards/{name}/std"] = nanstd(per_func[:, j], dim=0).item()
    return out


def _call_hook(fn: Any, inputs: dict[str, list]) -> dict[str, float]:
    try:
        result = fn(**inputs)
    except Exception as err:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise RuntimeError(
            f"eval_metrics function {name!r} raised {type(err).__name__}: {err}"
        ) from err
    return check_metrics_result(result, fn)


def _chunks(dataset: Any, size: int) -> Iterator[list[dict[str, Any]]]:
    """Rows in lists of `size` (works for Dataset and IterableDataset alike)."""
    rows: list[dict[str, Any]] = []
    for row in dataset:
        if "prompt" not in row:
            raise ValueError(f"an eval_dataset row has no 'prompt' (keys: {sorted(row)})")
        rows.append(row)
        if len(rows) == size:
            yield rows
            rows = []
    if rows:
        yield rows


class SetEvaluator:
    """Evaluates the trainer's policy on one held-out set (see the module docstring)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer, self.args = trainer, trainer.args
        self.k = self.args.num_generations_eval or self.args.num_generations
        self.model = trainer.accelerator.unwrap_model(trainer.model)

    def _sample(self, rows, sampling: SamplingParams, k: int, first_index: int = 0) -> Rollout:
        a = self.args
        noise = None
        if not sampling.greedy:
            indices = range(first_index, first_index + len(rows))
            noise = KeyedNoise.for_evaluation(a.seed, indices, k, sampling.max_new_tokens)
        settings = GroupSampling(
            sampling,
            k,
            a.max_prompt_length,
            a.chat_template_kwargs,
            a.share_prompt_prefix,
            self.trainer.tool_setup,
        )
        return sample_groups(self.model, self.trainer.processing_class, rows, settings, noise=noise)

    def run(self, dataset: Any) -> dict[str, float]:
        """Several processes: each evaluates its contiguous shard of a map-style set, and the
        totals are gathered in process order, so every metric equals one process evaluating the whole
        set (greedy decoding does not depend on the shard; samples are keyed on the prompt)."""
        t = self.trainer
        start = time.perf_counter()
        accelerator = t.accelerator
        sharded = accelerator.num_processes > 1 and hasattr(dataset, "select")
        offset = 0
        if sharded:
            world, rank = accelerator.num_processes, accelerator.process_index
            offset, stop = contiguous_share(len(dataset), world, rank)
            dataset = dataset.select(range(offset, stop))
        with full_parameters(accelerator, self.model), failures_shared(accelerator):
            totals = self._run_chunks(dataset, offset)  # a reward raising stops every process
        if sharded:
            parts = gather_objects(accelerator, totals)
            totals = _Totals()
            for part in parts:
                totals.merge(part)
        if totals.chunks == 0:
            raise ValueError("the eval_dataset yielded no rows; give it at least one prompt")
        metrics = totals.metrics(t.reward_names, self.k)
        if t.eval_metrics is not None:
            metrics.update(_call_hook(t.eval_metrics, totals.hook_inputs))
        runtime = time.perf_counter() - start
        metrics["runtime"] = round(runtime, 4)
        metrics["samples_per_second"] = round(metrics["n"] / runtime, 3)
        metrics["steps_per_second"] = round(totals.chunks / runtime, 3)
        return metrics

    def _run_chunks(self, dataset: Any, offset: int) -> _Totals:
        """`offset`: the index of `dataset`'s first row in the whole eval set."""
        a, t = self.args, self.trainer
        greedy_params = SamplingParams(max_new_tokens=a.max_completion_length, temperature=0.0)
        totals = _Totals()
        with eval_mode(self.model), torch.no_grad():
            for rows in _chunks(dataset, max(1, a.per_device_eval_batch_size // self.k)):
                greedy = self._sample(rows, greedy_params, 1)
                if self.k == 1:
                    scored = score_rollout(
                        greedy, t.reward_funcs, t.reward_weights, t.rewards.checks
                    )
                else:
                    score_rollout(greedy, t.reward_funcs[:1], torch.ones(1), t.rewards.checks)
                    first = offset + totals.rows_seen
                    scored = self._sample(rows, a.sampling_params(), self.k, first)
                    score_rollout(scored, t.reward_funcs, t.reward_weights, t.rewards.checks)
                totals.add_greedy(greedy)
                totals.add_scored(scored, self.k)
                totals.count_tokens(greedy)
                if scored is not greedy:
                    totals.count_tokens(scored)
                totals.add_loss(self._loss_stats(scored))
                totals.chunks += 1
                totals.rows_seen += len(rows)
        t.rewards.context.pop_extra_columns()  # log_extra while evaluating: no table to add to
        totals.logged = t.rewards.context.pop_metric_values()  # log_metric: eval_<name>
        return totals

    def _loss_stats(self, rollout: Rollout) -> dict[str, float]:
        """The GRPO loss on the scored completions (advantages within each group of k)."""
        a, b, k = self.args, rollout.batch, self.k
        if k == 1 and a.beta == 0:
            # One completion per prompt: no group to compare with, so every advantage is 0 (as in
            # TRL) and so is the loss, exactly; on-policy nothing is clipped. The forward pass
            # would cost about as much as the greedy decoding, for the entropy alone: skipped.
            return {"loss": 0.0, **{f"{key}_mean": 0.0 for key in LOSS_STATS}}
        if k > 1:
            advantages = rollout_advantages(rollout, a, self.trainer.reward_weights, group_size=k)
        else:
            advantages = torch.zeros(len(rollout.completions), 1)
        loss_mask = b.loss_mask(a.mask_truncated_completions)  # (N, Tc)
        tensors = (b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
        options = dict(
            temperature=a.temperature,
            chunk_size=a.logprob_chunk_size,
            group_size=k,
            share_prompt_prefix=a.share_prompt_prefix and k > 1,
            score_mask=b.sampled_mask,
        )
        out = completion_logprobs(self.model, *tensors, return_entropy=True, **options)
        logps, entropy = out.logps, out.entropy
        ref_logps = None
        if a.beta > 0:
            with reference_mode(self.model, self.trainer.ref_model) as reference:
                ref_logps = completion_logprobs(reference, *tensors, **options).logps
        loss, stats = policy_loss(
            logps,
            None,
            ref_logps,
            advantages.reshape(-1).float().to(logps.device),
            loss_mask,
            a.loss_params(),  # the training loss type and its options (on-policy: ratio 1)
        )
        valid = b.model_mask.bool()
        out = {"loss": loss.item(), "entropy": entropy[valid].mean().item() if valid.any() else 0.0}
        out.update({f"{key}_mean": stats[key] for key in LOSS_STATS if key in stats})
        if "kl" in stats:
            out["kl"] = stats["kl"]
        return out


def _eval_sets(trainer: Any, eval_dataset: Any) -> dict[str, Any]:
    """`{set name: dataset}`; the name is "" for a single set."""
    if isinstance(eval_dataset, str):  # the Trainer passes a dict's key
        sets = trainer.eval_dataset if isinstance(trainer.eval_dataset, dict) else {}
        if eval_dataset not in sets:
            raise ValueError(f"evaluate({eval_dataset!r}): no eval set of that name")
        return {eval_dataset: sets[eval_dataset]}
    dataset = check_eval_datasets(eval_dataset) if eval_dataset is not None else None
    dataset = dataset if dataset is not None else trainer.eval_dataset
    if dataset is None:
        raise ValueError("evaluate() needs an eval_dataset with a 'prompt' column.")
    return dataset if isinstance(dataset, dict) else {"": dataset}


def evaluate_trainer(
    trainer: Any, eval_dataset: Any = None, metric_key_prefix: str = "eval"
) -> dict[str, float]:
    """Evaluate every held-out set, log one line, run the callbacks; returns the logged metrics."""
    metrics: dict[str, float] = {}
    for name, dataset in _eval_sets(trainer, eval_dataset).items():
        result = SetEvaluator(trainer).run(dataset)
        metrics.update({prefixed(key, name, metric_key_prefix): v for key, v in result.items()})
    best = trainer.args.metric_for_best_model
    if best is not None and metric_key_prefix == "eval" and best_metric_key(best) not in metrics:
        raise ValueError(
            f"metric_for_best_model={best!r} is not among the evaluation's metrics "
            f"({', '.join(sorted(metrics))}); pick one of them"
        )
    trainer.log(metrics)  # as the Trainer does, this also adds `epoch` to the returned dict
    trainer.control = trainer.callback_handler.on_evaluate(
        trainer.args, trainer.state, trainer.control, metrics
    )
    return metrics
