"""A recipe's checks that read the disk, the data or the tokenizer: run before any model loads,
by `grpo-plugin train` and by `--dry-run` alike (`recipe_checks.check_recipe` does the rest).

    check_run_dir      output_dir usable (and one folder for every process); a rerun resumes or
                       overwrites; the checkpoint to resume; a finished run there: `RunFinished`
    load_checked_data  the datasets loaded (a malformed line named by file and line), every
                       reward's columns present, every prompt usable (bad rows named)
    check_lengths      the prompts fit the model's context (its tokenizer and config only)
    check_model_config what the config decides: a MoE router, LoRA target_modules that match
    check_resume       a resume: the checkpoint holds every piece of an exact resume, and the
                       recipe is the run's (`run/resume.py`; rewards, LoRA and
                       model_init_kwargs are compared again once the trainer is built)

Each problem raises `RecipeError` with one line that says how to fix it; under `accelerate launch`
on every process (`failures_shared`), so none goes on alone. The checks themselves are
`training/inputs.py`'s, which remembers what passed: the trainer, handed the same datasets, neither
checks nor tokenizes their prompts again.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import reward_fns

from .. import distributed
from ..models import model_source
from ..run import checkpoints, pending, resume, rundir
from ..run import lock as run_lock
from ..run.shared_dir import check_shared
from ..training import inputs
from .recipe import Recipe, RecipeError, one_line
from .recipe_checks import check_reward_columns, recipe_model_kwargs
from .splits import load_splits


class RunFinished(RecipeError):
    """output_dir holds this recipe's run, trained to its end and whole, and the command neither
    resumes nor overwrites it: nothing to do (the CLI prints the line and exits 0). The message
    is one line: the run's result, how to look at it, how to train again."""


@dataclass
class RecipeData:
    """A recipe's datasets, checked, and the checkpoint it resumes from (None: a fresh run).

    `held_out` is the test split (before/after numbers); `validation` (dataset
    `validation_size`) is what the evaluations during training run on (`splits.py`)."""

    train: Any
    held_out: Any | None
    checkpoint: str | None = None
    validation: Any | None = None

    def named(self) -> list[tuple[str, Any]]:
        """(how messages name it, dataset) for each split the recipe has."""
        splits = [("the training data", self.train), ("the held-out data", self.held_out)]
        splits.append(("the validation data", self.validation))
        return [(name, data) for name, data in splits if data is not None]

    def sizes(self) -> dict[str, int]:
        """Rows per split, for eval.json and the card: train, validation, test."""
        named = {"train": self.train, "validation": self.validation, "test": self.held_out}
        return {name: len(data) for name, data in named.items() if data is not None}


def check_run_dir(recipe: Recipe) -> str | None:
    """The output dir can take this run; returns the checkpoint to resume from, if any.

    Several processes: each checks what it reads itself (output_dir's place, the model), then
    that they all see one output_dir; process 0 alone checks the run in it (the lock it will
    take, a rerun, the checkpoint), and its verdict holds for every process."""
    c, state = recipe.config, distributed.process_state()
    try:
        with distributed.failures_shared(state):
            inputs.check_output_dir(c.output_dir)
        check_shared(c.output_dir, state)
        checkpoint = distributed.on_main_process(state, lambda: _check_previous_run(c))
        with distributed.failures_shared(state):
            model_source.check_model_source(recipe.args.model)
    except RunFinished:
        raise
    except (ValueError, run_lock.OutputDirInUse) as err:
        raise RecipeError(one_line(err)) from err
    return checkpoint


def _check_previous_run(config: Any) -> str | None:
    # a live run first: "resume it" or "overwrite it" would be wrong advice while it runs
    run_lock.check_not_in_use(config.output_dir)
    checkpoint = checkpoints.resolve_resume(config.output_dir, config.resume_from_checkpoint)
    others_ok = config.allow_other_files_in_output_dir  # files no run wrote: refused unless
    resuming, overwrite = checkpoint is not None, config.overwrite_output_dir
    if not resuming and not overwrite:
        _check_finished(Path(config.output_dir))
    run_lock.check_rerun(config.output_dir, resuming, overwrite, None, others_ok)
    return checkpoint


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "n/a"


def finished_result(evaluation: dict[str, Any], step: int) -> str:
    """What a finished run's eval.json says, in a few words."""
    after = evaluation.get("after")
    if not isinstance(after, dict):
        return f"{step} steps, no held-out set evaluated"
    before = evaluation.get("before") or {}
    reward = evaluation.get("reward", "?")
    return (
        f"{step} steps, held-out greedy accuracy {_pct(before.get('accuracy'))} -> "
        f"{_pct(after.get('accuracy'))} (n={after.get('n', '?')}, {reward})"
    )


def _check_finished(out: Path) -> None:
    """Raise `RunFinished` when `out` holds a recipe's run trained to its end and whole: its model
    saved at the top, and eval.json as the recipe writes it last (with `train_seconds`), and no
    change of the folder left half done (`pending.py`)."""
    step = run_lock.saved_step(out)
    if step is None or pending.read(out) is not None:
        return
    try:
        evaluation = rundir.read_json(out / rundir.EVAL_FILE)
    except ValueError:
        return  # damaged: check_rerun's refusal says what to do
    if not isinstance(evaluation, dict) or "train_seconds" not in evaluation:
        return
    run = shlex.quote(str(out))
    report = out / rundir.REPORT_FILE
    shown = f"open {report} in a browser" if report.is_file() else f"grpo-plugin report {run}"
    look = f"{shown}, or talk to it: grpo-plugin chat {run}"
    further = (
        ", or train it further with --resume_from_checkpoint true and a larger --max_steps"
        if checkpoints.has_complete(out)
        else ""
    )
    raise RunFinished(
        f"{out} holds a finished run: {finished_result(evaluation, step)}. Nothing was changed. "
        f"Look at it: {look}. To train again: add --overwrite_output_dir (it replaces the run) "
        f"or choose another --output_dir{further}."
    )


def load_checked_data(recipe: Recipe, rewards: list[Callable]) -> RecipeData:
    try:
        splits = load_splits(recipe.args.dataset)
    except (ValueError, FileNotFoundError) as err:
        raise RecipeError(one_line(err)) from err
    data = RecipeData(splits.train, splits.test, validation=splits.validation)
    try:
        inputs.check_train_size(data.train, recipe.config)
    except ValueError as err:
        raise RecipeError(one_line(err)) from err
    for name, dataset in data.named():  # the first reward scores the evaluations
        check_reward_columns(
            rewards if dataset is data.train else rewards[:1], dataset.column_names, name
        )
        try:
            inputs.check_prompts(dataset, name)
        except ValueError as err:
            raise RecipeError(one_line(err)) from err
    return data


def check_lengths(recipe: Recipe, data: RecipeData) -> None:
    """Prompt lengths against the context, with the model's tokenizer and config (no weights)."""
    from transformers import AutoConfig, AutoTokenizer

    from ..models.embedded import resolve_model_path
    from ..models.policy import prepare_tokenizer

    c = recipe.config
    remote = bool(c.trust_remote_code)
    try:
        source = resolve_model_path(recipe.args.model)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=remote)
        config = AutoConfig.from_pretrained(source, trust_remote_code=remote)
    except (OSError, ValueError) as err:  # no tokenizer files, a broken config.json, ...
        raise RecipeError(
            f"model {recipe.args.model}: its tokenizer and config cannot be read "
            f"({one_line(err)[:300]}); give a model folder or Hub id with both"
        ) from err
    tokenizer = prepare_tokenizer(tokenizer)
    check_model_config(recipe, config)
    for name, dataset in data.named():
        try:
            inputs.check_prompt_lengths(dataset, tokenizer, config, c, name)
        except ValueError as err:
            raise RecipeError(one_line(err)) from err


def check_model_config(recipe: Recipe, config: Any) -> None:
    """What the model's config decides (a MoE router, model_init_kwargs, the LoRA targets),
    before the weights load."""
    from ..models.policy import lora_config, model_init_kwargs
    from ..models.setup_checks import check_against_model_config

    c = recipe.config
    try:
        peft = lora_config(recipe.args.lora) if recipe.args.lora is not None else None
        kwargs = {**recipe_model_kwargs(recipe), "trust_remote_code": bool(c.trust_remote_code)}
        check_against_model_config(c, peft, config, model_init_kwargs(kwargs, bf16=bool(c.bf16)))
    except ValueError as err:
        raise RecipeError(one_line(err)) from err


def _reward_names(rewards: list[Callable]) -> list[str] | None:
    """The names the trainer records for `rewards` (None: a reward model, named once loaded)."""
    from ..scoring.reward_models import is_reward_model

    if not all(callable(fn) and not is_reward_model(fn) for fn in rewards):
        return None
    return [reward_fns.reward_name(fn) for fn in rewards]


def check_resume(
    recipe: Recipe, data: RecipeData, checkpoint: str, rewards: list[Callable] = ()
) -> None:
    """Before the model loads: what `GRPOTrainer.train` checks on resume, with what a recipe knows,
    the reward functions' names included (the trainer checks again, with LoRA and
    model_init_kwargs too)."""
    c = recipe.config
    identity = resume.RunIdentity(recipe.args.model, resume.dataset_digest(data.train))
    current = resume.run_record(c, identity)
    for name in resume.AFTER_LOAD:
        current["config"].pop(name, None)
    names = _reward_names(list(rewards)) if rewards else None
    if names is not None:  # compared with the checkpoint's before any model loads
        current["run"]["reward_funcs"] = names
    try:
        missing = resume.check_pieces(checkpoint, c)
        resume.check_config(checkpoint, current, c, missing)
    except resume.ResumeRefused as err:
        raise RecipeError(one_line(err)) from err


def prepare_run(recipe: Recipe, rewards: list[Callable]) -> RecipeData:
    """Every check above, in order; what the run needs from them."""
    checkpoint = check_run_dir(recipe)
    with distributed.failures_shared(distributed.process_state()):  # data missing on a machine
        data = load_checked_data(recipe, rewards)
        check_lengths(recipe, data)
        if checkpoint is not None:
            check_resume(recipe, data, checkpoint, rewards)
    data.checkpoint = checkpoint
    return data
