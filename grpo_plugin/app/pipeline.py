"""A recipe, run end to end: the one orchestrator behind `grpo-plugin train` and `run_recipe`.

    check (preflight.py: output dir, resume, data, prompt lengths) -> claim the output dir
    -> build the trainer -> evaluate (before; written to eval.json at once, so a resumed run
    reuses it) -> train (evaluating on its schedule; resumable) -> save -> evaluate (after)
    -> eval.json (before, after, the curve of every evaluation, the best step, reward-hacking
    alarms), recipe.yaml, reward_curve.png, README.md (the model card), report.html

Each phase a person waits for is a task on the progress board (`training/progress.py`): a live
line in a terminal, plain lines in a log; `disable_tqdm: true` turns them off.

Python users call `run_recipe("arithmetic", ["--max_steps", "8"])` (a built-in recipe name or a
YAML path, plus the same flags as the CLI); the CLI only parses arguments and prints.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

import reward_fns

from .. import distributed
from ..run import checkpoints, rundir
from ..run import lock as run_lock
from ..run.preemption import RunStopped, stop_on_signal
from ..run.resume import ResumeRefused
from ..training import progress
from ..training.callbacks import trainer_phase
from .data import dataset_hub_ids, dataset_label
from .preflight import RecipeData, prepare_run
from .recipe import Recipe, RecipeError, load_recipe, one_line
from .recipe_checks import (
    check_recipe,
    eval_metrics_fn,
    recipe_model_kwargs,
    recipe_tools,
)
from .recipe_eval import EvalCall, eval_reward, evaluate_split

logger = logging.getLogger(__name__)


def run_recipe(recipe: Recipe | str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Check, then run a recipe; returns what `eval.json` holds (plus `total_seconds`).

    Raises `RecipeError` (one line that says the fix) before any model loads when the recipe
    cannot run.
    """
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe, overrides)
    rewards = check_recipe(recipe)
    return train_recipe(recipe, rewards, prepare_run(recipe, rewards))


def _build_trainer(recipe: Recipe, rewards: list[Callable], data: RecipeData):
    from ..models.policy import lora_config
    from ..training.trainer import GRPOTrainer

    # the recipe's config is its own (the parser built it): load_in_4bit goes into it
    recipe.config.model_init_kwargs = recipe_model_kwargs(recipe) or None
    try:
        peft_config = lora_config(recipe.args.lora) if recipe.args.lora is not None else None
    except (TypeError, ValueError) as err:
        raise RecipeError(one_line(err)) from err
    trainer = GRPOTrainer(
        model=recipe.args.model,
        reward_funcs=rewards,
        args=recipe.config,
        train_dataset=data.train,
        eval_dataset=data.validation if data.validation is not None else data.held_out,
        peft_config=peft_config,
        eval_metrics=eval_metrics_fn(recipe),
        tools=recipe_tools(recipe) or None,
    )
    trainer.dataset_names = dataset_hub_ids(recipe.args.dataset)
    return trainer


def training_evaluations(
    watch: dict[str, Any], state: Any, evaluation: dict[str, Any]
) -> dict[str, Any]:
    """eval.json's `curve` (before, every evaluation during training, after: at the step of the
    weights it measured), `best_step` and `best_metric` when a best model was tracked, and the
    reward-hacking `alarms`; `watch` is the trainer's `eval_watch.summary`, `state` its
    `TrainerState` (the log history and the step)."""
    from ..evaluation.curve import build_curve

    after_step = watch.get("weights_step", state.global_step)
    history = state.log_history
    before, after = evaluation.get("before"), evaluation.get("after")
    out: dict[str, Any] = {"curve_split": "test"}
    if "validation_before" in evaluation:  # the curve is the validation split's, test aside
        before, after, out["curve_split"] = evaluation["validation_before"], None, "validation"
    out["curve"] = build_curve(history, before, after, after_step)
    if "best_step" in watch:
        out["best_step"] = watch["best_step"]
        out["best_metric"] = {"name": watch["metric"], "value": watch["best_metric"]}
    if watch.get("alarms"):
        out["alarms"] = watch["alarms"]
    return out


def write_recipe_copy(recipe: Recipe, out: Path, phases: Sequence[dict] = ()) -> None:
    """recipe.yaml; a run resumed with changes (`phases` of grpo_run.json) says that this recipe
    is its last phase's, and what each earlier phase ran with instead."""
    header = f"# The recipe as run (from {recipe.source or 'defaults'} plus command-line flags).\n"
    if len(phases) > 1:
        header += (
            f"# This run has {len(phases)} phases (grpo_run.json `phases`); this recipe is the "
            f"last one's, from step {phases[-1]['from_step'] + 1}.\n"
        )
    for before, after in zip(phases, phases[1:]):
        ran = ", ".join(f"{k}: {old!r}" for k, (old, _) in after.get("changed", {}).items())
        missing = f" (resumed without {', '.join(after['missing'])})" if "missing" in after else ""
        header += (
            f"# Phase {before['phase']} (steps {before['from_step'] + 1}-{after['from_step']}) "
            f"ran with {ran or 'the same values'}{missing}.\n"
        )
    kept = {k: v for k, v in recipe.raw.items() if k not in rundir.SECRET_FIELDS}
    for name in sorted(set(recipe.raw) - set(kept)):  # publish uploads this file
        header += f"# {name}: given, not written (pass it again, or set HF_TOKEN, to resume).\n"
    text = header + yaml.safe_dump(kept, sort_keys=False)
    rundir.write_text_atomic(out / rundir.RECIPE_FILE, text)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def try_it_lines(out: Path, question: str | None = None) -> list[str]:
    """How to look at the run: the report, and the commands that talk to the trained model."""
    lines = []
    if (out / rundir.REPORT_FILE).is_file():
        lines.append(f"Report (open it in a browser): {out / rundir.REPORT_FILE}")
    run = shlex.quote(str(out))
    lines.append(f"Talk to the model: grpo-plugin chat {run}")
    ask = shlex.quote(question or "your question")
    lines.append(f"One answer: grpo-plugin generate {run} {ask}")
    return lines


def summary_lines(evaluation: dict[str, Any], out: Path, question: str | None = None) -> list[str]:
    """What the CLI prints at the end of a run (`question`: an example for `generate`)."""
    train_min = evaluation.get("train_seconds", 0) / 60
    total_min = evaluation.get("total_seconds", 0) / 60
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    if not after:
        done = f"Trained in {train_min:.1f} min (no held-out set to evaluate). Outputs: {out}"
        return [done, *try_it_lines(out, question)]
    lines = [
        f"Held-out greedy accuracy (n={after.get('n', '?')}, {evaluation['reward']}): "
        f"{_pct(before.get('accuracy'))} -> {_pct(after.get('accuracy'))}"
    ]
    if "tool_call_rate" in after:
        lines.append(
            f"Tool-call rate: {_pct(before.get('tool_call_rate'))} -> "
            f"{_pct(after['tool_call_rate'])}"
        )
    for key in after:
        if key.startswith("pass@"):
            label = f"{key} (sampled)" if key == "pass@1" else key
            lines.append(f"{label}: {_pct(before.get(key))} -> {_pct(after.get(key))}")
    best = evaluation.get("best_metric")
    if best and "best_step" in evaluation:
        split = "validation " if evaluation.get("curve_split") == "validation" else ""
        lines.append(
            f"Best {split}{best['name']} during training: {best['value']:.4g} at step "
            f"{evaluation['best_step']}"
        )
    lines += [f"Warning: {alarm['message']}" for alarm in evaluation.get("alarms", [])[:1]]
    lines.append(f"Training {train_min:.1f} min; total {total_min:.1f} min. Outputs: {out}")
    return lines + try_it_lines(out, question)


def train_recipe(
    recipe: Recipe, rewards: list[Callable], data: RecipeData | None = None
) -> dict[str, Any]:
    """Evaluate, train, save, evaluate; write eval.json, recipe.yaml, the curve and the card.

    `data` is what `preflight.prepare_run` returned (run here when None). The output dir is
    claimed (locked, and cleared with `overwrite_output_dir`) before the model loads. A signal
    during training raises `TrainingInterrupted` once the checkpoint is saved.
    """
    data = data or prepare_run(recipe, rewards)
    out, main = Path(recipe.config.output_dir), distributed.is_main_process()
    c = recipe.config
    resume, others_ok = data.checkpoint is not None, c.allow_other_files_in_output_dir

    def claim() -> None:  # process 0's; a refusal (another run took the dir since) on every one
        run_lock.claim(out, resume=resume, overwrite=c.overwrite_output_dir, others_ok=others_ok)

    with stop_on_signal():  # SIGTERM outside the training steps: RunStopped, one line
        try:
            distributed.on_main_process(distributed.process_state(), claim)
        except (ValueError, run_lock.OutputDirInUse) as err:
            raise RecipeError(one_line(err)) from err
        try:
            return _run(recipe, rewards, data, out)
        finally:
            progress.close()  # after an error no live line stays on screen
            if main:
                run_lock.release(out)


def _before(trainer, recipe: Recipe, data: RecipeData, eval_fn: Callable, out: Path):
    """The evaluations before training, `{"before": test, "validation_before": validation}` (the
    second with a validation split): read back when resuming, else run and saved."""
    if data.checkpoint is not None:
        previous = rundir.read_json(out / rundir.EVAL_FILE) or {}
        keys = ["before"] + (["validation_before"] if data.validation is not None else [])
        if all(key in previous for key in keys):
            return {key: previous[key] for key in keys}
    else:
        previous = {}
    test = EvalCall(data.held_out, "eval before training", before=True)
    before = {"before": evaluate_split(trainer, test, eval_fn, recipe)}
    if data.validation is not None:  # step 0 of the validation curve: its greedy accuracy only
        label = "eval before training (validation)"
        validation = EvalCall(data.validation, label, greedy_only=True, before=True)
        before["validation_before"] = evaluate_split(trainer, validation, eval_fn, recipe)
    if trainer.is_world_process_zero():
        accuracy = before["before"]["accuracy"]
        logger.info("Before training: held-out greedy accuracy %s", _pct(accuracy))
        rundir.write_json(out / rundir.EVAL_FILE, previous | before)  # nothing of it is lost
    return before


def _load(recipe: Recipe, rewards: list[Callable], data: RecipeData):
    """The trainer, its model loaded, shown as a phase (before the trainer and its callbacks
    exist; later phases go through them). A first use of the embedded model converts it earlier,
    in preflight, under transformers' own bar and `models/embedded.py`'s log lines."""
    shown = not recipe.config.disable_tqdm and distributed.is_main_process()
    label = f"Loading {recipe.args.model}"
    # policy.load_model logs the start and the end; the live line shows the wait in between
    with progress.phase(label, enabled=shown, announce=False, summary=""):
        return _build_trainer(recipe, rewards, data)


class _Stage:
    """What the run is doing, for the line a SIGTERM outside the training steps prints."""

    now = "loading the model"


def _run(recipe: Recipe, rewards: list[Callable], data: RecipeData, out: Path) -> dict[str, Any]:
    stage = _Stage()
    try:
        return _stages(recipe, rewards, data, out, stage)
    except RunStopped as stop:
        newest = checkpoints.latest_complete(out) if out.is_dir() else None
        raise stop.during(stage.now, str(newest) if newest else None) from None


def _stages(
    recipe: Recipe, rewards: list[Callable], data: RecipeData, out: Path, stage: _Stage
) -> dict[str, Any]:
    from ..publish.card import write_model_card
    from ..publish.plot import plot_reward_curve
    from ..publish.report import write_report

    start = time.perf_counter()
    held_out = data.held_out
    trainer = _load(recipe, rewards, data)
    out.mkdir(parents=True, exist_ok=True)
    eval_fn = eval_reward(recipe, rewards)
    evaluation: dict[str, Any] = {
        "dataset": dataset_label(recipe.args.dataset),
        "reward": reward_fns.reward_name(eval_fn),
        "splits": data.sizes(),
    }
    if held_out is not None and (recipe.args.eval or {}).get("before", True):
        stage.now = "the evaluation before training"
        evaluation.update(_before(trainer, recipe, data, eval_fn, out))
    stage.now = "training (before its first step)"
    try:
        trainer.train(resume_from_checkpoint=data.checkpoint)
    except ResumeRefused as err:  # what only the built trainer sees (rewards, LoRA): one line
        raise RecipeError(one_line(err)) from err
    # the whole run's, a resumed run's included (the checkpoint records its part)
    evaluation["train_seconds"] = round(trainer.resume_plan.train_seconds, 1)
    stage.now = "saving the trained model"
    with trainer_phase(trainer, f"Saving the model to {out}"):
        trainer.save_model(str(out))
    if held_out is not None:
        stage.now = "the evaluation after training"
        after = EvalCall(held_out, "eval after training")
        evaluation["after"] = evaluate_split(trainer, after, eval_fn, recipe)
    watch = trainer.eval_watch.summary(trainer.args, trainer.state)
    evaluation.update(training_evaluations(watch, trainer.state, evaluation))
    stage.now = "writing eval.json, the curve, the model card and the report"
    if trainer.is_world_process_zero():  # one writer (several processes run this function)
        rundir.write_json(out / rundir.EVAL_FILE, evaluation)
        write_recipe_copy(recipe, out, trainer.resume_plan.phases)
        plot_reward_curve(out)
        write_model_card(out)
        if recipe.args.report:
            with trainer_phase(trainer, "Writing report.html"):
                write_report(out)
    evaluation["total_seconds"] = round(time.perf_counter() - start, 1)
    return evaluation
