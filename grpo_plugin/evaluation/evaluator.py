"""The one evaluator: greedy accuracy, unbiased pass@k and the scored completions of a
held-out set. Evaluation during training (`during_training.py`), the recipe's before/after
evaluation and `grpo-plugin eval` (`evaluate` below) all run it.

Per chunk of prompts (`batch_size // num_samples` of them, `batch_size` when greedy only):
1. greedy decoding, one completion per prompt, scored by the first reward function alone when
   there is a sampled pass (by every function otherwise): a prompt is solved when that reward
   is `>= success_threshold`;
2. with `num_samples` > 0, that many completions per prompt sampled with `settings.sampling`,
   scored by every function: pass@k counts the first function's solved samples;
3. `chunk_stats` (a hook; the trainer adds its loss there) on the scored completions.

Every reward call goes through the run's `RewardScorer` (`rewards/scoring.py`), so
`reward_timeout` and the non-finite checks hold here as in training. Generation is the
training sampler (`rollout.prompts.sample_groups`, prefix-shared), in eval mode, without grad.

Randomness: samples are keyed on (`seed`, the prompt's index in the whole set) (`rollout/noise.py`),
so results depend neither on the batch size nor on sharding, and the global RNG is not touched.
With several processes each evaluates a contiguous share of a map-style set and the totals are
gathered in process order: every number equals one process evaluating the whole set.

`pass_at_k` is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", https://arxiv.org/abs/2107.03374, eq. 1), in its numerically stable product form:
    pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)
for n samples of which c are correct.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..distributed import contiguous_share, failures_shared, full_parameters, gather_objects
from ..models.policy import eval_mode
from ..rollout.noise import KeyedNoise
from ..rollout.prompts import sample_groups
from ..rollout.types import GroupSampling, Rollout, SamplingParams
from ..scoring.context import RewardContext
from ..scoring.scorer import RewardChecks, RewardScorer
from .setup import check_eval_options

RewardFn = Callable[..., list[float | None]]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k draws (without replacement) from n samples, c of
    them correct, is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class EvalSettings:
    """How a held-out set is evaluated (the same for every process and every evaluation);
    checked here, once. The defaults are `grpo-plugin eval`'s: greedy accuracy and pass@8 of
    completions of up to 64 tokens at temperature 1."""

    # the sampled pass; its max_new_tokens also bounds greedy decoding
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=64))
    num_samples: int = 8  # completions sampled per prompt (0: greedy only)
    pass_k: int | None = None  # k of pass@k (<= num_samples); None: num_samples
    batch_size: int = 32  # sequences generated at once
    success_threshold: float = 1.0  # a completion is correct when its first reward is >= this
    seed: int = 0  # keys the samples, with each prompt's index in the set
    max_prompt_length: int | None = None  # prompts are encoded as in training
    chat_template_kwargs: dict[str, Any] | None = None  # as in training
    share_prompt_prefix: bool = True  # one prefill per prompt for its samples

    def __post_init__(self) -> None:
        options = {"k": self.pass_k, "num_samples": self.num_samples or None}
        options.update(batch_size=self.batch_size, seed=self.seed)
        options["success_threshold"] = self.success_threshold
        check_eval_options(options, name=lambda key: "pass_k" if key == "k" else key)
        if self.num_samples == 0 and self.pass_k:
            raise ValueError(f"pass_k={self.pass_k} needs num_samples >= {self.pass_k}")

    @classmethod
    def from_options(
        cls, options: dict[str, Any], name: Callable[[str], str] = str
    ) -> EvalSettings:
        """From the flat options of a recipe's `eval` section and `grpo-plugin eval` (`k`,
        `num_samples`, `max_new_tokens`, `temperature`, ...; `k` of 0 or None: greedy only; an
        error names an option as `name` writes it, e.g. "--k")."""
        unknown = set(options) - set(FLAT_OPTIONS)
        if unknown:
            raise ValueError(f"unknown evaluation option(s) {sorted(unknown)}")
        check_eval_options(options, name)
        k = options.get("k", 8)
        sampling = SamplingParams(
            max_new_tokens=options.get("max_new_tokens", 64),
            temperature=options.get("temperature", 1.0),
        )
        rest = {key: options[key] for key in FLAT_OPTIONS[4:] if key in options}
        samples = (options.get("num_samples") or k) if k else 0
        return cls(sampling, num_samples=samples, pass_k=k or None, **rest)

    @property
    def prompts_per_chunk(self) -> int:
        return max(1, self.batch_size // max(1, self.num_samples))

    @property
    def greedy(self) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.sampling.max_new_tokens, temperature=0.0)


# EvalSettings.from_options' keys: the first four build `sampling`, `num_samples` and `pass_k`
FLAT_OPTIONS = ("k", "num_samples", "max_new_tokens", "temperature", "batch_size")
FLAT_OPTIONS += ("success_threshold", "seed", "max_prompt_length", "chat_template_kwargs")
FLAT_OPTIONS += ("share_prompt_prefix",)


@dataclass(frozen=True)
class EvalRuntime:
    """What a training run lends an evaluation besides its settings (all optional)."""

    accelerator: Any = None  # several processes: the prompts are sharded, results gathered
    tools: Any = None  # a rollout.multiturn.ToolSetup the completions may call, or None
    checks: RewardChecks | None = None  # reward_timeout, non-finite checks; None: the defaults
    progress: Callable[[int], None] | None = None  # called with the prompts done per chunk


@dataclass(frozen=True)
class EvalTarget:
    """What is evaluated: the policy, its tokenizer and the tools its completions may call."""

    model: Any
    tokenizer: Any
    tools: Any = None  # a rollout.multiturn.ToolSetup, or None


@dataclass
class EvalTotals:
    """One set's results, accumulated over chunks (and merged over processes)."""

    correct: list[bool] = field(default_factory=list)  # (P,) greedy verdicts
    greedy_first: list[float] = field(default_factory=list)  # (P,) first reward, NaN unscored
    greedy_tool_calls: list[int] = field(default_factory=list)  # (P,), with tools
    pass_at_k: list[float] = field(default_factory=list)  # (P,) with a sampled pass
    pass_at_1: list[float] = field(default_factory=list)  # (P,) the same samples' pass@1
    rewards: list[torch.Tensor] = field(default_factory=list)  # chunks of (n,) scored
    per_func: list[torch.Tensor] = field(default_factory=list)  # chunks of (n, F)
    lengths: list[torch.Tensor] = field(default_factory=list)  # chunks of (n,)
    truncated: list[torch.Tensor] = field(default_factory=list)  # chunks of (n,) bool
    tool_calls: list[torch.Tensor] = field(default_factory=list)  # chunks of (n,), with tools
    chunk_stats: dict[str, list[float]] = field(default_factory=dict)  # per chunk (hook)
    logged: dict[str, list[float]] = field(default_factory=dict)  # rewards' log_metric values
    greedy_inputs: dict[str, list] = field(default_factory=dict)  # prompts, completions, ...
    chunks: int = 0
    rows_seen: int = 0
    num_tokens: int = 0  # prompt + completion tokens of every completion generated

    def add_greedy(self, rollout: Rollout, threshold: float) -> None:
        first = rollout.per_func[:, 0]  # (P,)
        self.correct += (~first.isnan() & (first >= threshold)).tolist()
        self.greedy_first += first.tolist()
        if rollout.batch.tool_calls is not None:
            self.greedy_tool_calls += rollout.batch.tool_calls.tolist()
        inputs = {
            "prompts": rollout.prompts,
            "completions": rollout.completions,
            "completion_ids": rollout.completion_ids,
            **rollout.columns,
        }
        for key, values in inputs.items():
            self.greedy_inputs.setdefault(key, []).extend(values)

    def add_scored(self, rollout: Rollout) -> None:
        b = rollout.batch
        self.rewards.append(rollout.rewards)
        self.per_func.append(rollout.per_func)
        self.lengths.append(b.model_mask.sum(dim=1).float().cpu())
        self.truncated.append(b.is_truncated.cpu())
        if b.tool_calls is not None:
            self.tool_calls.append(b.tool_calls.cpu())

    def add_pass_at_k(self, rollout: Rollout, n: int, k: int, threshold: float) -> None:
        first = rollout.per_func[:, 0].view(-1, n)  # (P, n)
        solved = (~first.isnan() & (first >= threshold)).sum(dim=1)  # (P,)
        self.pass_at_k += [pass_at_k(n, int(c), k) for c in solved]
        self.pass_at_1 += [pass_at_k(n, int(c), 1) for c in solved]

    def count_tokens(self, rollout: Rollout) -> None:
        b = rollout.batch
        self.num_tokens += int(b.prompt_mask.sum()) + int(b.completion_mask.sum())

    def add_stats(self, stats: dict[str, float]) -> None:
        for key, value in stats.items():
            self.chunk_stats.setdefault(key, []).append(value)

    def merge(self, other: EvalTotals) -> None:
        """Append another process's totals (called in process order)."""
        for name in ("correct", "greedy_first", "greedy_tool_calls", "pass_at_k", "pass_at_1"):
            getattr(self, name).extend(getattr(other, name))
        for name in ("rewards", "per_func", "lengths", "truncated", "tool_calls"):
            getattr(self, name).extend(getattr(other, name))
        for name in ("chunk_stats", "logged", "greedy_inputs"):
            mine = getattr(self, name)
            for key, values in getattr(other, name).items():
                mine.setdefault(key, []).extend(values)
        self.chunks += other.chunks
        self.rows_seen += other.rows_seen
        self.num_tokens += other.num_tokens


def _chunks(dataset: Any, size: int) -> Iterator[list[dict[str, Any]]]:
    """Rows in lists of `size` (works for Dataset and IterableDataset alike)."""
    rows: list[dict[str, Any]] = []
    for row in dataset:
        if "prompt" not in row:
            raise ValueError(f"an eval dataset row has no 'prompt' (keys: {sorted(row)})")
        rows.append(row)
        if len(rows) == size:
            yield rows
            rows = []
    if rows:
        yield rows


class Evaluator:
    """Evaluates one target on held-out sets. Subclasses add per-chunk statistics
    (`chunk_stats`) and per-process values gathered with the totals (`finish_local`)."""

    def __init__(self, target: EvalTarget, settings: EvalSettings, scorer: RewardScorer) -> None:
        self.target, self.settings, self.scorer = target, settings, scorer
        self.progress: Callable[[int], None] | None = None  # called with prompts done per chunk

    def chunk_stats(self, scored: Rollout) -> dict[str, float]:
        """Extra statistics of one chunk's scored completions (none here)."""
        return {}

    def finish_local(self, totals: EvalTotals) -> None:
        """Called on each process after its share, before the totals are gathered: what the
        reward logged (`log_metric`; `log_extra` has no table here and is dropped)."""
        context = self.scorer.context
        if context is not None:
            context.pop_extra_columns()
            totals.logged = context.pop_metric_values()

    def run(self, dataset: Any, accelerator: Any = None) -> EvalTotals:
        """The totals of `dataset` (see the module docstring for sharding)."""
        sharded = (
            accelerator is not None and accelerator.num_processes > 1 and hasattr(dataset, "select")
        )
        offset = 0
        if sharded:
            world, rank = accelerator.num_processes, accelerator.process_index
            offset, stop = contiguous_share(len(dataset), world, rank)
            dataset = dataset.select(range(offset, stop))
        if accelerator is None:
            return self._run_local(dataset, offset)
        with full_parameters(accelerator, self.target.model), failures_shared(accelerator):
            totals = self._run_local(dataset, offset)  # a reward raising stops every process
        if sharded:
            parts, totals = gather_objects(accelerator, totals), EvalTotals()
            for part in parts:
                totals.merge(part)
        return totals

    def _run_local(self, dataset: Any, offset: int) -> EvalTotals:
        """`offset`: the index of `dataset`'s first row in the whole set."""
        s, totals = self.settings, EvalTotals()
        with eval_mode(self.target.model), torch.no_grad():
            for rows in _chunks(dataset, s.prompts_per_chunk):
                self._run_chunk(rows, offset + totals.rows_seen, totals)
                if self.progress is not None:
                    self.progress(len(rows))
        self.finish_local(totals)
        return totals

    def _run_chunk(self, rows: list[dict[str, Any]], first: int, totals: EvalTotals) -> None:
        s = self.settings
        greedy = self._sample(rows, s.greedy, 1, first)
        if s.num_samples:
            self.scorer.first().score(greedy)
            scored = self.scorer.score(self._sample(rows, s.sampling, s.num_samples, first))
            totals.add_pass_at_k(
                scored, s.num_samples, s.pass_k or s.num_samples, s.success_threshold
            )
            totals.count_tokens(scored)
        else:
            scored = self.scorer.score(greedy)
        totals.add_greedy(greedy, s.success_threshold)
        totals.count_tokens(greedy)
        totals.add_scored(scored)
        totals.add_stats(self.chunk_stats(scored))
        totals.chunks += 1
        totals.rows_seen += len(rows)

    def _sample(self, rows, sampling: SamplingParams, group: int, first: int) -> Rollout:
        s = self.settings
        noise = None
        if not sampling.greedy:
            indices = range(first, first + len(rows))
            noise = KeyedNoise.for_evaluation(s.seed, indices, group, sampling.max_new_tokens)
        settings = GroupSampling(
            sampling,
            group,
            max_prompt_length=s.max_prompt_length,
            chat_template_kwargs=s.chat_template_kwargs,
            share_prompt_prefix=s.share_prompt_prefix,
            tools=self.target.tools,
        )
        return sample_groups(self.target.model, self.target.tokenizer, rows, settings, noise=noise)


def _summary(totals: EvalTotals, settings: EvalSettings) -> dict[str, float | int]:
    n = len(totals.correct)
    result: dict[str, float | int] = {
        "n": n,
        "accuracy": sum(totals.correct) / n,
        "mean_reward": sum(r for r in totals.greedy_first if not math.isnan(r)) / n,
    }
    if settings.num_samples:
        k = settings.pass_k or settings.num_samples
        score = sum(totals.pass_at_k) / len(totals.pass_at_k)
        result.update({f"pass@{k}": score, "k": k, "num_samples": settings.num_samples})
        if k > 1:  # pass@1 of the same samples: the mean share of right ones (sampled, not greedy)
            result["pass@1"] = sum(totals.pass_at_1) / len(totals.pass_at_1)
    calls = totals.greedy_tool_calls
    if calls:
        result["tool_call_rate"] = sum(c > 0 for c in calls) / len(calls)
        result["tool_calls"] = sum(calls) / len(calls)
    return result


def evaluate(
    model,
    tokenizer,
    dataset: Any,
    reward_fn: RewardFn,
    settings: EvalSettings | None = None,
    runtime: EvalRuntime | None = None,
) -> dict[str, float | int]:
    """Greedy accuracy and pass@k of `model` on `dataset` (needs a `prompt` column), scored by
    `reward_fn`, evaluated as `settings` say (default `EvalSettings()`: pass@8 of 64 tokens).

    Returns `{"n", "accuracy", "mean_reward", "pass@k", "k", "num_samples"}` (the last three only
    with `settings.num_samples` > 0). Samples are keyed on (`settings.seed`, the prompt's index
    in `dataset`). `runtime` (an `EvalRuntime`) lends what a training run has: with `tools` (a
    `rollout.multiturn.ToolSetup`) every completion may call them, and the result adds the greedy
    completions' `tool_call_rate` (share with at least one call) and `tool_calls` (calls per
    completion); rewards are scored under `checks` (the run's `reward_timeout` and non-finite
    checks; default: no time limit, NaN is an error); with an `accelerator` of several processes
    (every process calls this) the prompts are sharded and the results gathered: every number
    equals the one-process result; `progress` is called with the number of prompts done after
    each chunk. The model's train/eval mode is left as it was.
    """
    settings, runtime = settings or EvalSettings(), runtime or EvalRuntime()
    if "prompt" not in dataset.column_names:
        raise ValueError(
            f"evaluate needs a 'prompt' column; the dataset has {dataset.column_names}"
        )
    if len(dataset) == 0:
        raise ValueError("evaluate got an empty dataset; give it at least one held-out prompt")
    context = RewardContext(lambda: None)  # log_metric / log_extra; no trainer, no state
    checks = runtime.checks or RewardChecks()
    scorer = RewardScorer((reward_fn,), torch.ones(1), checks, context)
    engine = Evaluator(EvalTarget(model, tokenizer, runtime.tools), settings, scorer)
    engine.progress = runtime.progress
    totals = engine.run(dataset, runtime.accelerator)
    logged = {key: sum(v) / len(v) for key, v in totals.logged.items() if v}
    summary = _summary(totals, settings)
    return {**summary, **{k: v for k, v in logged.items() if k not in summary}}
