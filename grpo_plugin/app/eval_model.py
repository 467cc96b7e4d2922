"""`grpo-plugin eval`: greedy accuracy and pass@k of a model (and adapter) on a dataset spec, with
the tools it may call; the evaluator is `evaluation/evaluator.py`'s `evaluate`.
Every bad argument is a `RecipeError` (one line, exit code 2) before the model loads."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..models import model_source
from ..run import rundir
from .data import dataset_label
from .recipe import RecipeError, one_line


@dataclass(frozen=True)
class EvalRequest:
    """What `grpo-plugin eval` evaluates, one field per flag."""

    dataset: str  # a dataset spec, as a recipe's `dataset` (--dataset)
    reward: str  # a reward name, 'module:function' or 'file.py:function' (--reward)
    model: str | None = None  # a model id or path; None: the adapter's base (--model)
    adapter: str | None = None  # a LoRA adapter dir, e.g. a grpo-plugin run (--adapter)
    k: int = 8  # pass@k's k; 0: greedy accuracy only (--k)
    eval_size: int | None = None  # prompts evaluated; None: the whole held-out split
    max_new_tokens: int = 64  # tokens per completion (--max-new-tokens)
    temperature: float = 1.0  # of the pass@k samples (--temperature)
    batch_size: int = 32  # sequences generated at once (--batch-size)
    load_in_4bit: bool = False  # the base model quantized with bitsandbytes (--load-in-4bit)
    tools: tuple[str, ...] = ()  # tools the model may call (--tool, repeated)

    def options(self) -> dict[str, Any]:
        """The evaluation's flat options (EvalSettings.from_options)."""
        options = {"k": self.k, "max_new_tokens": self.max_new_tokens}
        return {**options, "temperature": self.temperature, "batch_size": self.batch_size}


def _base_of_adapter(adapter: str) -> str:
    run = rundir.read_json(Path(adapter) / rundir.RUN_INFO_FILE)
    if run is not None:
        return run["base_model_path"]
    config = rundir.read_json(Path(adapter) / "adapter_config.json")
    if config is not None:
        return config["base_model_name_or_path"]
    raise RecipeError(
        f"{adapter} has no {rundir.RUN_INFO_FILE} or adapter_config.json; pass --model"
    )


def _default_checks():
    """GRPOConfig's default reward checks (reward_timeout, nan_rewards_as_unscored)."""
    from ..config.grpo_config import GRPOConfig
    from ..scoring.scorer import RewardChecks

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    return RewardChecks.from_args(SimpleNamespace(**defaults))


def _check_request(request: EvalRequest, tool_options: Any) -> None:
    from ..config.field_checks import check_tools
    from ..evaluation.setup import check_eval_options

    check_eval_options(request.options(), name=lambda key: "--" + key.replace("_", "-"))
    size = request.eval_size
    if size is not None and (isinstance(size, bool) or size < 1):
        raise ValueError(f"--eval-size={size!r} must be >= 1 (prompts to evaluate on)")
    if request.tools and tool_options is not None:
        check_tools(tool_options)  # --tool-timeout, --max-tool-result-length, ...
    if request.adapter:
        model_source.check_adapter_dir(request.adapter)


def _held_out(request: EvalRequest) -> tuple[Any, dict[str, Any]]:
    """The prompts to evaluate on (the held-out split, else the train split) and the spec."""
    from .data import load_prompt_datasets, parse_dataset_arg, validate_dataset_spec

    spec = parse_dataset_arg(request.dataset)
    if request.eval_size is not None:
        spec["eval_size"] = request.eval_size
    validate_dataset_spec(spec)
    train, held_out = load_prompt_datasets(spec)
    data = held_out if held_out is not None else train
    if request.eval_size is not None:
        data = data.select(range(min(request.eval_size, len(data))))
    return data, spec


def evaluate_model(request: EvalRequest, tool_options: Any = None) -> dict[str, Any]:
    """Greedy accuracy and pass@k of `request`'s model on its dataset (`tool_options`: an object
    with the `GRPOConfig` tool fields, e.g. the parsed flags); bad arguments raise `RecipeError`
    before the model loads."""
    from ..evaluation.evaluator import EvalRuntime, EvalSettings, evaluate
    from ..models.policy import load_adapter, load_policy
    from ..scoring.reward_models import resolve_reward_name
    from ..training.sampling.tool_inputs import ToolInputs

    try:
        _check_request(request, tool_options)
        data, spec = _held_out(request)
        reward_fn = resolve_reward_name(request.reward)
        model_name = request.model or (request.adapter and _base_of_adapter(request.adapter))
        if not model_name:
            raise RecipeError("pass --model (or --adapter DIR of a grpo-plugin run)")
        tool_inputs = ToolInputs.check(list(request.tools) or None, None, None)
        model_source.check_model_source(model_name)  # as `train` checks it: before anything loads
    except (ValueError, TypeError, KeyError) as err:
        raise RecipeError(one_line(err)) from err
    policy, tokenizer = load_policy(model_name, load_in_4bit=request.load_in_4bit)
    if request.adapter:
        policy = load_adapter(policy, request.adapter)
    try:
        setup = tool_inputs.setup(tokenizer, tool_options) if request.tools else None
    except ValueError as err:
        raise RecipeError(one_line(err)) from err
    settings = EvalSettings.from_options(request.options())
    runtime = EvalRuntime(tools=setup, checks=_default_checks())  # checks: as in a training run
    scores = evaluate(policy, tokenizer, data, reward_fn, settings, runtime)
    run = {"model": model_name, "adapter": request.adapter, "dataset": dataset_label(spec)}
    return {**run, "reward": request.reward, "tools": list(request.tools), **scores}
