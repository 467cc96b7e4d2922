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
      checkpoint-N/        the Trainer's checkpoints (run/checkpoints.py)
      .checkpoint-staging/ STAGING_DIR     where checkpoint-N is written before it is renamed
      .grpo-plugin.lock    LOCK_FILE       held by the run's main process (run/lock.py)
      .grpo-plugin-pending.json PENDING_FILE  a change of the folder begun and not yet done: set
                                           aside a timeline, or clear a run (run/pending.py)
      .NAME-<pid>-<hex>    `temporary_path` a file being written (renamed to NAME when whole)
      abandoned/           ABANDONED_DIR   what a resume from an earlier checkpoint set aside:
                                           one folder per resume (run/timeline.py)

Writers: the trainer (metrics, completions, run info at save), the recipe pipeline (eval, recipe,
curve, card, report). Readers: the card, the plot, the report, `publish` and `chat`. Which of a
folder's files a run wrote, and which are the user's: run/ownership.py.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .._version import __version__
from ..models.embedded import EMBEDDED_HUB_ID, EMBEDDED_LICENSE, EMBEDDED_NAME

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
STAGING_DIR = ".checkpoint-staging"
LOCK_FILE = ".grpo-plugin.lock"
ABANDONED_DIR = "abandoned"
PENDING_FILE = ".grpo-plugin-pending.json"
# run/shared_dir.py: PREFIX + a nonce (+ ".K" from process K), removed once every process read it
SHARED_CHECK_PREFIX = ".grpo-plugin-shared-"
# Files that show a directory holds a run (with the checkpoint-N folders), and everything a run
# writes at the top level (what `overwrite_output_dir` deletes; tokenizer files are rewritten).
RUN_MARKERS = (METRICS_FILE, RUN_INFO_FILE, COMPLETIONS_DIR, EVAL_FILE)
WEIGHT_OUTPUTS = (
    "adapter_model.safetensors",
    "adapter_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
)
RUN_OUTPUTS = RUN_MARKERS + (RECIPE_FILE, CURVE_FILE, CARD_FILE, REPORT_FILE) + WEIGHT_OUTPUTS
# Besides those: what saving a model, a tokenizer or the Trainer's arguments writes beside them,
# TensorBoard's default `runs/`, and `grpo-plugin export`'s files (fnmatch patterns).
SAVED_BESIDE = (
    "model-*-of-*.safetensors",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.bin",
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "training_args.bin",
    "runs",
    "*.gguf",
    "*.Modelfile",
)
# The entries of eval.json that describe the run before training: what stays when a resume from
# an earlier checkpoint sets the rest aside (run/timeline.py).
EVAL_BEFORE_KEYS = ("dataset", "reward", "splits", "before", "validation_before")

# Config fields that hold a credential: in no file of the run (recipe.yaml, grpo_resume.json,
# training_args.bin) and in no printed command; the trainer keeps hub_token's value to itself.
SECRET_FIELDS = frozenset({"hub_token"})


def completions_file(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / COMPLETIONS_DIR / f"step_{step:05d}.parquet"


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError raised while writing `path` names it (a full disk is then one line that says
    which file; pyarrow's and a buffered write's errors name none)."""
    try:
        yield
    except OSError as err:
        if err.filename is not None:
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err


_TEMPORARY = re.compile(r"^\.(?P<name>.+)-(?P<pid>\d+)-[0-9a-f]{8}$")


def temporary_path(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: `.NAME-<pid>-<hex>` beside it,
    the one pattern every writer of a run folder uses (`temporary_of` reads it back)."""
    return path.with_name(f".{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def temporary_of(name: str) -> tuple[str, int] | None:
    """(the name it becomes, the writer's pid) of a `temporary_path` name; None for another."""
    match = _TEMPORARY.match(name)
    return (match["name"], int(match["pid"])) if match else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temporaries(folder: str | Path) -> list[str]:
    """Delete the `temporary_path` files in `folder` whose writer is gone (a kill while one was
    written: the file it was to replace is whole); returns their names. Called under the lock."""
    root = Path(folder)
    removed = []
    for path in sorted(root.iterdir()) if root.is_dir() else ():
        found = temporary_of(path.name)
        if found is not None and path.is_file() and not path.is_symlink():
            if found[1] != os.getpid() and not _alive(found[1]):
                path.unlink(missing_ok=True)
                removed.append(path.name)
    return removed


def _replace_atomically(path: Path, write: Callable[[str], None]) -> Path:
    """`write(temporary path)` next to `path`, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # created by the writer, so with the umask's permissions (mkstemp's are 0600)
    tmp = str(temporary_path(path))
    try:
        with naming(path):
            write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Write to a temporary file next to `path`, then rename: readers never see half a file."""
    return _replace_atomically(path, lambda tmp: Path(tmp).write_text(text))


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
    with naming(path), path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")


def split_metrics(output_dir: str | Path, step: int) -> tuple[list[str], list[str]]:
    """`metrics.jsonl`'s lines as (up to `step`, after it): a resume from checkpoint-`step` keeps
    the first and sets the second aside. The end-of-training summary line of step `step`, and a
    line cut short by a kill, belong to the second; blank lines to neither."""
    path = Path(output_dir) / METRICS_FILE
    kept: list[str] = []
    later: list[str] = []
    for line in path.read_text().splitlines() if path.is_file() else ():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            later.append(line)  # cut short by the kill: kept aside, not read
            continue
        at = row.get("step", 0) if isinstance(row, dict) else 0
        if at < step or (at == step and "train_runtime" not in row):
            kept.append(line)
        else:
            later.append(line)
    return kept, later


def completion_step(table: Path) -> int | None:
    """The step of a `completions/step_XXXXX.parquet` table (None: not one of ours)."""
    stem = table.stem
    if table.suffix != ".parquet" or not stem.startswith("step_") or not stem[5:].isdigit():
        return None
    return int(stem[5:])


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

    columns = {
        k: [json.dumps(v) if not isinstance(v, (str, int, float, type(None))) else v for v in vals]
        for k, vals in records.items()
    }
    table = pa.table(columns)  # renamed when whole: a reader (the report of a run in
    return _replace_atomically(path, lambda tmp: pq.write_table(table, tmp))  # progress) too


__all__ = [
    "SECRET_FIELDS",
    "ABANDONED_DIR",
    "CARD_FILE",
    "COMPLETIONS_DIR",
    "CURVE_FILE",
    "EVAL_BEFORE_KEYS",
    "EVAL_FILE",
    "METRICS_FILE",
    "LOCK_FILE",
    "PENDING_FILE",
    "RECIPE_FILE",
    "REPORT_FILE",
    "RUN_INFO_FILE",
    "RUN_MARKERS",
    "RUN_OUTPUTS",
    "SAVED_BESIDE",
    "STAGING_DIR",
    "append_metrics",
    "completions_file",
    "split_metrics",
    "completion_step",
    "temporary_of",
    "temporary_path",
    "load_run_info",
    "read_json",
    "read_metrics",
    "remove_stale_temporaries",
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
