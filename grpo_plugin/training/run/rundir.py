"""The run directory (`output_dir`): the one owner of its file names, and of the run summary.

    output_dir/
      adapter_model.safetensors, adapter_config.json   (or the full model), tokenizer files
      grpo_run.json        RUN_INFO_FILE   what was trained and how (`run_summary`; `phases`
                                           when a resume changed it, run/resume.py)
      metrics.jsonl        METRICS_FILE    one JSON line per log (train and eval)
      completions/         COMPLETIONS_DIR step_XXXXX.parquet per logged rollout
      eval.json            EVAL_FILE       held-out evaluation before/after (recipes)
      recipe.yaml          RECIPE_FILE     the recipe as run (recipes)
      reward_curve.png     CURVE_FILE      the training curve
      README.md            CARD_FILE       the model card
      report.html          REPORT_FILE     the run at a glance (`grpo-plugin report`)
      checkpoint-N/        the Trainer's checkpoints

Writers: the trainer (metrics, completions, run info at save), the recipe pipeline (eval, recipe,
curve, card, report). Readers: the card, the plot, the report, `publish` and `chat`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..._version import __version__
from ...models import EMBEDDED_HUB_ID, EMBEDDED_LICENSE, EMBEDDED_NAME

logger = logging.getLogger(__name__)

RUN_INFO_FILE = "grpo_run.json"
METRICS_FILE = "metrics.jsonl"
COMPLETIONS_DIR = "completions"
EVAL_FILE = "eval.json"
RECIPE_FILE = "recipe.yaml"
CURVE_FILE = "reward_curve.png"
CARD_FILE = "README.md"
REPORT_FILE = "report.html"
ENTROPY_STATE_FILE = "entropy_ctrl_state.json"  # in checkpoint-N/, TRL's name
RESUME_RECORD_FILE = "grpo_resume.json"  # in checkpoint-N/: what the run is (run/resume.py)
# run/shared_dir.py: PREFIX + a nonce (+ ".K" from process K), removed once every process read it
SHARED_CHECK_PREFIX = ".grpo-plugin-shared-"
# Files that show a directory holds a run (with the checkpoint-N folders), and everything a run
# writes at the top level (what `overwrite_output_dir` deletes; tokenizer files are rewritten).
RUN_MARKERS = (METRICS_FILE, RUN_INFO_FILE, COMPLETIONS_DIR, EVAL_FILE)
RUN_OUTPUTS = RUN_MARKERS + (
    RECIPE_FILE,
    CURVE_FILE,
    CARD_FILE,
    REPORT_FILE,
    "adapter_model.safetensors",
    "adapter_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
)


def completions_file(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / COMPLETIONS_DIR / f"step_{step:05d}.parquet"


def write_text_atomic(path: Path, text: str) -> Path:
    """Write to a temporary file next to `path`, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, data: dict[str, Any]) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2))


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON file's content, None when absent; a corrupt file is an error that says so."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); fix or delete it.") from err


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def append_metrics(output_dir: str | Path, step: int, logs: dict[str, Any]) -> None:
    """Append one log as a JSON line (non-finite floats become null)."""
    path = Path(output_dir) / METRICS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"step": step, **{k: _finite(v) for k, v in logs.items()}}
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")


def cut_back_to_step(output_dir: str | Path, step: int) -> None:
    """Make the run dir show steps 1..`step` only (a resume from checkpoint-`step`): later
    `metrics.jsonl` lines and the end-of-training summary go, and so do the completion tables of
    rollouts sampled at step >= `step` (a table is named by the step its rollout started from)."""
    path = Path(output_dir) / METRICS_FILE
    if path.is_file():
        kept = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the kill
            if row.get("step", 0) < step or (
                row.get("step") == step and "train_runtime" not in row
            ):
                kept.append(line)
        write_text_atomic(path, "".join(f"{line}\n" for line in kept))
    tables = Path(output_dir) / COMPLETIONS_DIR
    for table in tables.glob("step_*.parquet") if tables.is_dir() else ():
        if int(table.stem.split("_")[1]) >= step:
            table.unlink()


def read_metrics(output_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of `metrics.jsonl` (skipping blank or truncated lines); `[]` if absent."""
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by an interrupted run
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def load_run_info(output_dir: str | Path) -> dict[str, Any]:
    """`grpo_run.json` of the run (or of the run above a `checkpoint-N` dir); `{}` if absent."""
    output_dir = Path(output_dir)
    for candidate in (output_dir, output_dir.parent):
        info = read_json(candidate / RUN_INFO_FILE)
        if info is not None:
            return info
    logger.warning("%s has no %s; the run's settings are unknown.", output_dir, RUN_INFO_FILE)
    return {}


def _lora_summary(model: Any) -> dict[str, Any] | None:
    peft_config = getattr(model, "peft_config", None)
    if not peft_config:
        return None
    cfg = peft_config[model.active_adapter]
    targets = cfg.target_modules
    targets = sorted(targets) if isinstance(targets, set) else targets
    return {"r": cfg.r, "lora_alpha": cfg.lora_alpha, "target_modules": targets}


def _sampling_summary(args: Any) -> dict[str, Any]:
    """How the run sampled (`grpo-plugin chat --sample` samples the same way)."""
    return {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "max_completion_length": args.max_completion_length,
        "chat_template_kwargs": args.chat_template_kwargs,
    }


def _objective_summary(args: Any) -> dict[str, Any]:
    return {
        "loss_type": args.loss_type,
        "importance_sampling_level": args.importance_sampling_level,
        "advantage_estimator": args.estimator,
        "scale_rewards": args.scale_rewards,
        "num_generations": args.num_generations,
        "beta": args.beta,
        "epsilon": args.epsilon,
        "epsilon_high": args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        "num_iterations": args.num_iterations,
        "dynamic_sampling": args.dynamic_sampling,
    }


def reward_summary(
    names: Sequence[str], weights: torch.Tensor, reward_models: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """`grpo_run.json`'s `reward_funcs`: each reward's name and weight; `reward_models` maps the
    name of each reward that is a reward model to its model id/path."""
    reward_models = reward_models or {}
    return [
        {"name": name, "weight": float(w)}
        | ({"model": reward_models[name]} if name in reward_models else {})
        for name, w in zip(names, weights)
    ]


def run_summary(
    args: Any,
    model: Any,
    model_name: str,
    global_step: int,
    reward_funcs: list[dict[str, Any]],
    dataset_names: Sequence[str] = (),
) -> dict[str, Any]:
    """The facts written to `grpo_run.json` (read by the card, the plot and `publish`);
    `reward_funcs` from `reward_summary`."""
    lora = _lora_summary(model)
    embedded = model_name == EMBEDDED_NAME
    return {
        "base_model": EMBEDDED_HUB_ID if embedded else model_name,
        "base_model_path": model_name,
        "adapter": lora is not None,
        "load_in_4bit": bool(getattr(model, "is_loaded_in_4bit", False)),
        "objective": _objective_summary(args),
        "learning_rate": args.learning_rate,
        "global_step": global_step,
        "max_completion_length": args.max_completion_length,
        "temperature": args.temperature,
        "sampling": _sampling_summary(args),
        "reward_funcs": reward_funcs,
        "datasets": list(dataset_names),
        "lora": lora,
        "license": EMBEDDED_LICENSE if embedded else None,
        "grpo_plugin_version": __version__,
    }


def write_completions_parquet(path: Path, records: dict[str, list[Any]]) -> Path:
    """Write one rollout's prompts, completions, rewards and advantages as a parquet table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {
        k: [json.dumps(v) if not isinstance(v, (str, int, float, type(None))) else v for v in vals]
        for k, vals in records.items()
    }
    tmp = path.with_name(f".{path.name}.tmp")  # renamed when whole: a reader (the report of a
    pq.write_table(pa.table(columns), tmp)  # run in progress) never sees half a table
    os.replace(tmp, path)
    return path


__all__ = [
    "CARD_FILE",
    "COMPLETIONS_DIR",
    "CURVE_FILE",
    "EVAL_FILE",
    "METRICS_FILE",
    "RECIPE_FILE",
    "REPORT_FILE",
    "RUN_INFO_FILE",
    "RUN_MARKERS",
    "RUN_OUTPUTS",
    "append_metrics",
    "completions_file",
    "cut_back_to_step",
    "load_run_info",
    "read_json",
    "read_metrics",
    "run_summary",
    "write_completions_parquet",
    "write_json",
    "write_text_atomic",
]


def trainer_summary(trainer: Any) -> dict[str, Any]:
    """`run_summary` of a `GRPOTrainer`, with its evaluation and tools (`grpo_run.json`)."""
    t = trainer
    rewards = reward_summary(t.reward_names, t.reward_weights, t.rewards.model_sources())
    model = t.accelerator.unwrap_model(t.model)
    summary = run_summary(
        t.args, model, t.model_name, t.state.global_step, rewards, t.dataset_names
    )
    summary["evaluation"] = t.eval_watch.summary(t.args, t.state)
    summary["tools"] = [getattr(fn, "__name__", repr(fn)) for fn in t.tools]
    phases = t.resume_plan.phases
    if len(phases) > 1:  # resumed with changes (run/resume.py): the fields above are the last's
        summary["phases"] = phases
    return summary
