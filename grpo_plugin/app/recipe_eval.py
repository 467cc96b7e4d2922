"""The recipe's evaluations: its `eval` section as settings, and one split evaluated (before
training, the result of an identical earlier evaluation where it is known:
`evaluation/known_results.py`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..training.callbacks import evaluation_progress
from .recipe import Recipe
from .recipe_checks import resolve_rewards, reward_specs

logger = logging.getLogger(__name__)


def eval_reward(recipe: Recipe, rewards: list[Callable]) -> Callable:
    spec = (recipe.args.eval or {}).get("reward")
    if spec is None:
        return rewards[0]
    return resolve_rewards(recipe, reward_specs([spec]))[0]


def eval_settings(recipe: Recipe, greedy_only: bool):
    """The recipe's `eval` section as EvalSettings (`greedy_only`: its greedy accuracy alone)."""
    from ..evaluation.evaluator import EvalSettings

    c = recipe.config
    skip = ("reward", "before", "cache")
    spec = {k: v for k, v in (recipe.args.eval or {}).items() if k not in skip}
    if greedy_only:
        spec["k"] = 0
    spec.setdefault("max_new_tokens", c.max_completion_length)
    spec.setdefault("temperature", c.temperature)
    spec.setdefault("seed", c.seed)
    spec["max_prompt_length"] = c.max_prompt_length  # prompts encoded as in training
    spec.update(
        chat_template_kwargs=c.chat_template_kwargs, share_prompt_prefix=c.share_prompt_prefix
    )
    return EvalSettings.from_options(spec)


@dataclass(frozen=True)
class EvalCall:
    """One of the pipeline's evaluations: which split, under which label, and how."""

    dataset: Any
    label: str
    greedy_only: bool = False  # the greedy accuracy alone (the validation curve's step 0)
    before: bool = False  # of the untrained model: its result may be known (known_results.py)


def evaluate_split(trainer, call: EvalCall, reward_fn: Callable, recipe: Recipe) -> dict[str, Any]:
    from ..evaluation import known_results
    from ..evaluation.evaluator import EvalRuntime, evaluate

    settings = eval_settings(recipe, call.greedy_only)
    model = trainer.accelerator.unwrap_model(trainer.model)
    checks = trainer.rewards.checks  # reward_timeout and the non-finite checks hold here
    tokenizer = trainer.processing_class
    key = None
    if call.before and may_reuse(trainer, recipe):
        key = known_results.evaluation_key(
            model, tokenizer, call.dataset, reward_fn, settings, checks
        )
    known = known_results.known_result(key) if key else None
    if known is not None:
        logger.info(
            "%s: %d prompts, the result of an identical earlier evaluation (%s; "
            "eval: {cache: false} runs it again)",
            call.label,
            len(call.dataset),
            known_results.store_dir(),
        )
        return known
    total = len(call.dataset) if trainer.accelerator.num_processes == 1 else None
    with evaluation_progress(trainer, call.label, total) as advance:
        runtime = EvalRuntime(
            trainer.accelerator,  # sharded over the processes, then gathered
            tools=trainer.tool_setup,  # the tools are available before and after alike
            checks=checks,
            progress=advance,
        )
        result = evaluate(model, tokenizer, call.dataset, reward_fn, settings, runtime)
    keep = ("accuracy", "n", "tool_call_rate", "tool_calls")
    keep += tuple(k for k in result if k.startswith("pass@"))
    kept = {k: result[k] for k in keep if k in result}
    if key:
        known_results.remember(key, kept)
    return kept


def may_reuse(trainer, recipe: Recipe) -> bool:
    """Whether an evaluation before training may be read from known_results: not turned off
    (`eval: {cache: false}`, `$GRPO_PLUGIN_EVAL_CACHE=off`: then no key is computed), one
    process, no tools (their code is outside what the key sees)."""
    from ..evaluation.known_results import store_dir

    wanted = (recipe.args.eval or {}).get("cache", True) and store_dir() is not None
    return wanted and trainer.accelerator.num_processes == 1 and trainer.tool_setup is None
