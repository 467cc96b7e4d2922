"""Evaluation during training: what `GRPOTrainer.evaluate()` computes and logs.

Each held-out set is read in chunks of `per_device_eval_batch_size` completions, and per chunk:

1. greedy decoding, one completion per prompt: `accuracy` is the share whose first reward function
   gives >= 1.0; every greedy completion, with its prompt and dataset columns, also goes to the
   `eval_metrics` hook (called once per set, after the last chunk);
2. with `num_generations_eval` = k > 1, k completions per prompt sampled with the training
   settings: unbiased `pass@k` (Chen et al. 2021, https://arxiv.org/abs/2107.03374);
3. on those k completions (on the greedy ones when k == 1), TRL's evaluation metrics: the reward
   means (`reward`, `rewards/<fn>/mean`), completion lengths, and the loss with its entropy, KL
   (beta > 0) and clip ratios, computed without grad by the training objective (`objective.py`:
   one loss for both, its loss type, masks and entropy bonus; on-policy, no token mean shared
   with other processes or chunks). With k == 1 and beta == 0 the loss is 0
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
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch

from ..core.tensors import nanstd
from ..models.policy import reference_mode
from ..rollout.dynamic_sampling import informative_groups
from ..rollout.types import Rollout, TrainingBatch
from ..scoring.rollout_advantages import rollout_advantages
from .evaluator import EvalSettings, EvalTarget, EvalTotals, Evaluator
from .setup import best_metric_key, check_eval_datasets, check_metrics_result, prefixed

LOSS_STATS = ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region")
# the objective's metrics an evaluation logs besides loss and entropy (policy_loss: the term
# before the entropy bonus, with entropy_coef > 0)
EVAL_STATS = tuple(f"{key}_mean" for key in LOSS_STATS) + ("kl", "policy_loss")


def eval_settings(args: Any) -> EvalSettings:
    """A `GRPOConfig`'s evaluation: `num_generations_eval` samples (greedy only when it is 1) with
    the training sampling settings, `per_device_eval_batch_size` sequences at once."""
    k = args.num_generations_eval or args.num_generations
    return EvalSettings(
        args.sampling_params(),
        num_samples=k if k > 1 else 0,
        batch_size=args.per_device_eval_batch_size,
        seed=args.seed,
        max_prompt_length=args.max_prompt_length,
        chat_template_kwargs=args.chat_template_kwargs,
        share_prompt_prefix=args.share_prompt_prefix,
    )


def _trl_metrics(totals: EvalTotals, reward_names: list[str], k: int) -> dict[str, float]:
    out: dict[str, float] = {"accuracy": sum(totals.correct) / len(totals.correct)}
    out["n"] = len(totals.correct)
    if k > 1:
        out[f"pass@{k}"] = sum(totals.pass_at_k) / len(totals.pass_at_k)
    out.update(_reward_metrics(totals, reward_names, k))
    stats = totals.chunk_stats
    out.update({key: sum(v) / len(v) for key, v in stats.items()})
    logged = {key: sum(v) / len(v) for key, v in totals.logged.items() if v}  # as TRL's
    out.update({key: v for key, v in logged.items() if key not in out})  # ours win a clash
    if "clip_ratio/low_mean" in stats:  # clipped loss types: TRL's extremes (over chunks here)
        out["clip_ratio/low_min"] = min(stats["clip_ratio/low_mean"])
        out["clip_ratio/high_max"] = max(stats["clip_ratio/high_mean"])
    out["num_tokens"] = float(totals.num_tokens)
    if totals.tool_calls:  # with tools: calls per completion and share that call one
        calls = torch.cat(totals.tool_calls).float()
        out["tools/call_frequency"] = calls.mean().item()
        out["tools/call_rate"] = (calls > 0).float().mean().item()
    return out


def _reward_metrics(totals: EvalTotals, reward_names: list[str], k: int) -> dict[str, float]:
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


class SetEvaluator(Evaluator):
    """The engine on the trainer's policy, with the GRPO loss per chunk (see the module
    docstring) and the rewards' `log_metric` values."""

    def __init__(self, trainer: Any) -> None:
        self.trainer, self.args = trainer, trainer.args
        model = trainer.accelerator.unwrap_model(trainer.model)
        target = EvalTarget(model, trainer.processing_class, trainer.tool_setup)
        super().__init__(target, eval_settings(trainer.args), trainer.rewards.scorer)
        self.k = self.settings.num_samples or 1

    def run_set(self, dataset: Any) -> dict[str, float]:
        """The set's metrics (TRL's names, without the prefix)."""
        t, start = self.trainer, time.perf_counter()
        totals = self.run(dataset, t.accelerator)
        if totals.chunks == 0:
            raise ValueError("the eval_dataset yielded no rows; give it at least one prompt")
        metrics = _trl_metrics(totals, t.reward_names, self.k)
        if t.eval_metrics is not None:
            metrics.update(_call_hook(t.eval_metrics, totals.greedy_inputs))
        runtime = time.perf_counter() - start
        metrics["runtime"] = round(runtime, 4)
        metrics["samples_per_second"] = round(metrics["n"] / runtime, 3)
        metrics["steps_per_second"] = round(totals.chunks / runtime, 3)
        return metrics

    def finish_local(self, totals: EvalTotals) -> None:
        context = self.trainer.rewards.context
        context.pop_extra_columns()  # log_extra while evaluating: no table to add to
        totals.logged = context.pop_metric_values()  # log_metric: eval_<name>

    def chunk_stats(self, rollout: Rollout) -> dict[str, float]:
        """The training objective's loss on the scored completions (advantages within each
        group of k), and its statistics."""
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
        tokens = (b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask, b.sampled_mask)
        engine = self.trainer.engine
        options = engine.options(
            temperature=a.temperature,
            chunk_size=a.logprob_chunk_size,
            group_size=k,
            share_prompt_prefix=a.share_prompt_prefix and k > 1,
        )
        model = self.target.model
        out = engine.logprobs(model, tokens, replace(options, return_entropy=True))
        logps, entropy = out.logps, out.entropy
        ref_logps = None
        if a.beta > 0:
            with reference_mode(model, self.trainer.ref_model) as reference:
                ref_logps = engine.logprobs(reference, tokens, options).logps
        batch = TrainingBatch(
            *tokens[:4],
            loss_mask=loss_mask,
            advantages=advantages.reshape(-1).float().to(logps.device),
            sampled_mask=b.sampled_mask,
            ref_logps=ref_logps,
        )  # on-policy (ratio 1); the sampling correction is training's alone
        objective = self.trainer.training_objective  # TRL's eval loss: the training loss
        loss, metrics = objective.evaluation_loss(logps, entropy, batch)
        out = {"loss": loss.item(), "entropy": metrics.get("entropy", 0.0)}
        out.update({key: metrics[key] for key in EVAL_STATS if key in metrics})
        return out


def _eval_sets(eval_dataset: Any, configured: Any) -> dict[str, Any]:
    """`{set name: dataset}` of `evaluate(eval_dataset)`, `configured` the trainer's own eval
    set(s); the name is "" for a single set."""
    if isinstance(eval_dataset, str):  # the Trainer passes a dict's key
        sets = configured if isinstance(configured, dict) else {}
        if eval_dataset not in sets:
            raise ValueError(f"evaluate({eval_dataset!r}): no eval set of that name")
        return {eval_dataset: sets[eval_dataset]}
    dataset = check_eval_datasets(eval_dataset) if eval_dataset is not None else None
    dataset = dataset if dataset is not None else configured
    if dataset is None:
        raise ValueError("evaluate() needs an eval_dataset with a 'prompt' column.")
    return dataset if isinstance(dataset, dict) else {"": dataset}


def _size(dataset: Any, accelerator: Any) -> int | None:
    """Prompts this process evaluates, when known (a sharded set: None, the bar just counts)."""
    if not hasattr(dataset, "__len__") or accelerator.num_processes > 1:
        return None
    return len(dataset)


def evaluate_trainer(
    trainer: Any,
    eval_dataset: Any = None,
    metric_key_prefix: str = "eval",
    progress: Callable[[str, int | None], Any] | None = None,
) -> dict[str, float]:
    """Evaluate every held-out set, log one line, run the callbacks; returns the logged metrics.

    `progress(label, total)`: a context yielding `advance(prompts)` for each set (the trainer
    passes its progress board's; none: no progress shown)."""
    metrics: dict[str, float] = {}
    for name, dataset in _eval_sets(eval_dataset, trainer.eval_dataset).items():
        label = f"eval {name} at step {trainer.state.global_step}".replace("  ", " ")
        shown = progress or (lambda label, total: nullcontext(lambda n: None))
        with shown(label, _size(dataset, trainer.accelerator)) as advance:
            evaluator = SetEvaluator(trainer)
            evaluator.progress = advance
            result = evaluator.run_set(dataset)
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
