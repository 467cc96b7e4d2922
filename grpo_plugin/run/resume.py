"""What a resume may and may not change, checked before the run continues.

    check_pieces      the checkpoint holds every piece of an exact resume (optimizer, scheduler,
                      trainer_state.json, grpo_state per process; RNG state: a warning)
    run_record        what the run is: its config, model, rewards, data, LoRA, and its phases
                      (saved in every checkpoint as grpo_resume.json by lifecycle.save_checkpoint)
    check_config      the resumed run's record against the checkpoint's: a change of what the run
                      is is refused (unless `resume_as_new_phase`), schedule fields are honoured,
                      optimizer hyperparameters the restored optimizer keeps are named
    rebuild_schedule  after the Trainer restored optimizer and scheduler: the learning-rate
                      schedule as now configured, evaluated at the restored step

How it differs from `transformers.Trainer`: there a checkpoint without optimizer.pt, scheduler.pt
or the RNG state resumes with fresh ones and no word, and a changed config is taken silently (a
changed learning rate is undone by the restored scheduler, a longer `max_steps` trains its first
new step at the restored learning rate, 0.0 at the end of a linear decay).
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .._compat import set_scheduler_last_lr
from ..engine import cpu_threads
from . import checkpoints, rundir

logger = logging.getLogger(__name__)

RECORD_FILE = rundir.RESUME_RECORD_FILE
OPTIMIZER, SCHEDULER = "optimizer.pt", "scheduler.pt"  # transformers' names

# How the run is watched, saved, evaluated or reported, not what it trains: free to change.
FREE = frozenset(
    """output_dir overwrite_output_dir allow_other_files_in_output_dir resume_from_checkpoint resume_as_new_phase run_name project
    report_to trackio_space_id trackio_bucket_id trackio_static_space_id disable_tqdm log_level
    log_level_replica log_on_each_node logging_steps logging_strategy logging_first_step
    logging_nan_inf_filter save_steps save_strategy save_total_limit save_on_each_node
    save_only_model eval_steps eval_strategy eval_delay eval_on_start per_device_eval_batch_size
    eval_accumulation_steps eval_do_concat_batches eval_use_gather_object batch_eval_metrics
    num_generations_eval include_for_metrics include_num_input_tokens_seen prediction_loss_only
    load_best_model_at_end metric_for_best_model greater_is_better do_train do_eval do_predict
    push_to_hub hub_model_id hub_strategy hub_token hub_private_repo hub_always_push hub_revision
    log_completions num_completions_to_print log_unique_prompts log_multimodal
    log_completions_hub_repo skip_memory_metrics dataloader_num_workers dataloader_pin_memory
    dataloader_persistent_workers dataloader_prefetch_factor dataloader_multiprocessing_context
    ddp_timeout torch_empty_cache_steps reward_timeout isolate_user_code reward_hacking_window
    reward_hacking_threshold zero_std_patience restore_callback_states_from_checkpoint
    enable_jit_checkpoint local_rank debug auto_batch_memory_gb torch_threads""".split()
)
# Honoured: the schedule is rebuilt for them at the restored step (`rebuild_schedule`).
SCHEDULE = frozenset(
    "learning_rate lr_scheduler_type lr_scheduler_kwargs warmup_steps max_steps num_train_epochs".split()
)
# Restored with the optimizer's state, which keeps the checkpoint's values: named in a warning.
KEPT_BY_OPTIMIZER = frozenset("adam_beta1 adam_beta2 adam_epsilon weight_decay".split())
# Compared once the trainer is built (the recipe check before the model loads cannot see them).
AFTER_LOAD = frozenset({"model_init_kwargs", "reward_funcs", "lora"})
_PROMPTS_HASHED = 1000


_warned: set[str] = set()


def _warn_once(text: str) -> None:
    """The recipe check and the trainer check the same resume: say each thing once."""
    if text not in _warned:
        _warned.add(text)
        logger.warning("%s", text)


def _kind(args: Any) -> str:
    return str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))


class ResumeRefused(ValueError):
    """A resume that would not continue the run it claims to (one line, with the fix)."""


# --- the pieces of an exact resume ---------------------------------------------------------------
def _has_optimizer(folder: Path) -> bool:
    # optimizer.pt, optimizer.bin, or the sharded forms (optimizer.pt_*, rank*-of-*-optimizer.pt)
    return any("optimizer" in p.name for p in folder.iterdir())


def missing_pieces(folder: str | Path, world_size: int = 1) -> tuple[list[str], list[str]]:
    """(pieces whose absence makes the resume differ, missing RNG files) of a checkpoint."""
    folder = Path(folder)
    refused = [] if _has_optimizer(folder) else [OPTIMIZER]
    refused += [] if (folder / SCHEDULER).is_file() else [SCHEDULER]
    refused += [] if (folder / checkpoints.TRAINER_STATE).is_file() else [checkpoints.TRAINER_STATE]
    states = [checkpoints.STATE_FILE.format(process=i) for i in range(world_size)]
    refused += [name for name in states if not (folder / name).is_file()]
    rng = (
        ["rng_state.pth"] if world_size == 1 else [f"rng_state_{i}.pth" for i in range(world_size)]
    )
    return refused, [name for name in rng if not (folder / name).is_file()]


def _earlier_complete(folder: Path, world_size: int) -> Path | None:
    step = checkpoints.checkpoint_step(folder) or 0
    for other in reversed(checkpoints.checkpoints(folder.parent)):
        earlier = (checkpoints.checkpoint_step(other) or 0) < step
        if earlier and not checkpoints.missing_files(other):
            if not missing_pieces(other, world_size)[0]:
                return other
    return None


def check_pieces(folder: str | Path, args: Any) -> list[str]:
    """Refuse (`ResumeRefused`) a checkpoint that lacks a piece of an exact resume, unless
    `args.resume_as_new_phase` (then warned); a missing RNG state is warned. Returns what is
    missing (for the phase record)."""
    folder, world = Path(folder), args.world_size
    refused, rng = missing_pieces(folder, world)
    if rng:
        _warn_once(
            f"{folder} has no {', '.join(rng)}: the resume draws from fresh random generators. "
            "The sampling draws are keyed on (seed, rollout, prompt) and do not need them; "
            "dropout and reward or user code drawing from torch's global generator would differ."
        )
    if not refused:
        return []
    needed = [
        OPTIMIZER,
        SCHEDULER,
        checkpoints.TRAINER_STATE,
        checkpoints.STATE_FILE.format(process=0 if world == 1 else "N"),
    ]
    head = f"{folder} has no {', '.join(refused)}, and an exact resume needs all of {', '.join(needed)}"
    if args.resume_as_new_phase:
        _warn_once(f"{head}; resume_as_new_phase: continuing without them (not exactly).")
        return refused
    earlier = _earlier_complete(folder, world)
    options = ["restore the file(s)"]
    if earlier is not None:
        options.append(
            f"resume from the earlier complete checkpoint with --resume_from_checkpoint {earlier}"
        )
    options.append("or pass --resume_as_new_phase true to continue without them (not exactly)")
    raise ResumeRefused(f"{head}: {', '.join(options)}.")


# --- what the run is -----------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """JSON-able: enums by value, configs by their dict, anything else by repr."""

    def default(obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            return obj.value
        if hasattr(obj, "to_dict"):
            return obj.to_dict()
        return repr(obj)

    return json.loads(json.dumps(value, default=default, sort_keys=True))


def config_values(args: Any) -> dict[str, Any]:
    """Every init field of a GRPOConfig, JSON-able (transformers' `to_dict` writes into the
    config's own `model_init_kwargs`; this copies). A credential (`SECRET_FIELDS`) is left out."""
    kept = [f.name for f in fields(args) if f.init and f.name not in rundir.SECRET_FIELDS]
    return _plain({name: getattr(args, name) for name in kept})


def dataset_digest(dataset: Any) -> str | None:
    """The training data's size and a hash of its first prompts; None for a streamed one."""
    try:
        size = len(dataset)
    except TypeError:
        return None
    h = hashlib.sha256(str(size).encode())
    for i in range(min(size, _PROMPTS_HASHED)):
        row = dataset[i]
        prompt = row.get("prompt") if isinstance(row, dict) else row
        h.update(json.dumps(_plain(prompt), sort_keys=True).encode())
    return f"{size} rows, {h.hexdigest()[:16]}"


@dataclass
class RunIdentity:
    """What a run is besides its config (`lora`, `reward_funcs`: None when not known yet)."""

    model: str
    dataset: str | None
    reward_funcs: list[str] | None = None
    lora: dict[str, Any] | None = field(default=None)


def run_record(args: Any, identity: RunIdentity) -> dict[str, Any]:
    """grpo_resume.json's content: the config and identity (its `phases` added by `check_config`)."""
    run = {"model": identity.model, "dataset": identity.dataset}
    if identity.reward_funcs is not None:
        run |= {"reward_funcs": identity.reward_funcs, "lora": _plain(identity.lora)}
    return {"config": config_values(args), "run": run, "phases": [{"phase": 1, "from_step": 0}]}


def read_record(folder: str | Path | None) -> dict[str, Any] | None:
    path = Path(folder) / RECORD_FILE if folder is not None else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def save_record(folder: str | Path, record: dict[str, Any]) -> None:
    (Path(folder) / RECORD_FILE).write_text(json.dumps(record, indent=2))


# --- comparing ----------------------------------------------------------------------------------
@dataclass
class Changes:
    """Differences between the checkpoint's record and the resumed run's: {field: (old, new)}."""

    refused: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    schedule: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    kept: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def recorded(self) -> dict[str, list[Any]]:
        return {
            k: list(v) for part in (self.refused, self.schedule, self.kept) for k, v in part.items()
        }


def compare(saved: dict[str, Any], current: dict[str, Any]) -> Changes:
    """Each differing field of two records, sorted into refused / schedule / kept (FREE ones,
    fields one side does not know, and run facts one side has as None are skipped). A config
    field's None is a value like any other (`rollout_precision` None: the device's default)."""
    old_run, new_run = saved.get("run", {}), current.get("run", {})
    old = {**saved.get("config", {}), **old_run}
    new = {**current.get("config", {}), **new_run}
    out = Changes()
    for name in sorted(old.keys() & new.keys()):
        if name in FREE or old[name] == new[name]:
            continue
        if name in old_run and None in (old[name], new[name]):
            continue  # not known on one side (a streamed dataset's digest, rewards before load)
        part = (
            out.schedule
            if name in SCHEDULE
            else out.kept
            if name in KEPT_BY_OPTIMIZER
            else out.refused
        )
        part[name] = (old[name], new[name])
    return out


def _listed(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())


def check_config(checkpoint: str | Path, current: dict[str, Any], args: Any, missing=()) -> Changes:
    """Refuse (`ResumeRefused`) a resume whose config changes what the run is, unless
    `args.resume_as_new_phase`; warn about what the restored optimizer keeps. Sets `current`'s
    `phases`: the checkpoint's, plus a new one when anything but FREE fields changed or a piece
    was `missing`. A checkpoint without a record (an older version) is warned about."""
    saved = read_record(checkpoint)
    step = checkpoints.checkpoint_step(checkpoint) or 0
    if saved is None:
        _warn_once(
            f"{checkpoint} has no {RECORD_FILE} (an older version wrote it): the resumed config "
            "cannot be compared with the one it was trained with."
        )
        saved = {}
    changes = compare(saved, current)
    if changes.refused and not args.resume_as_new_phase:
        raise ResumeRefused(
            f"{checkpoint} was trained with another config: {_listed(changes.refused)}; resuming "
            "would mix two runs under one record. Resume with the checkpoint's values, start a new "
            f"run (another output_dir, or overwrite_output_dir), or pass --resume_as_new_phase "
            f"true to continue from step {step} as a new phase recorded in grpo_run.json."
        )
    if changes.refused:
        _warn_once(
            f"resume_as_new_phase: steps after {step} train with {_listed(changes.refused)}."
        )
    if changes.kept:
        _warn_once(
            f"{_listed(changes.kept)}: not applied; the optimizer restored from {checkpoint} "
            "keeps its own values (start a new run to change them)."
        )
    phases = list(saved.get("phases") or [{"phase": 1, "from_step": 0}])
    if changes.recorded() or missing:
        phase = {"phase": len(phases) + 1, "from_step": step, "changed": changes.recorded()}
        phases.append(phase | ({"missing": list(missing)} if missing else {}))
    current["phases"] = phases
    return changes


# --- the trainer's side ----------------------------------------------------------------------
def trainer_record(trainer: Any) -> dict[str, Any]:
    """`run_record` of a `GRPOTrainer` about to train (before the autopilot resizes batches)."""
    from .rundir import _lora_summary

    model = trainer.accelerator.unwrap_model(trainer.model)
    names = list(trainer.reward_names)
    identity = RunIdentity(trainer.model_name, dataset_digest(trainer.train_dataset), names)
    identity.lora = _lora_summary(model)
    return run_record(trainer.args, identity)


@dataclass
class ResumePlan:
    """What `prepare` found for one `train()` call, held by the trainer as `resume_plan` and
    written only here: the run's record (saved with each checkpoint; None before `train()`), on
    resume the schedule `after_restore` rebuilds, and the run's training time (the checkpoint's,
    plus this call's)."""

    record: dict[str, Any] | None = None
    schedule: SchedulePlan | None = None
    seconds_before: float = 0.0  # training time recorded in the checkpoint resumed from
    started: float | None = None  # time.perf_counter() when this train() call began
    ended: float | None = None

    @property
    def phases(self) -> list[dict[str, Any]]:
        """grpo_run.json's `phases` (more than one: resumed with changes)."""
        return (self.record or {}).get("phases", [])

    @property
    def train_seconds(self) -> float:
        """The whole run's training time: what the checkpoint resumed from recorded, plus this
        call's (steps trained after that checkpoint and lost to a kill are not counted)."""
        if self.started is None:
            return self.seconds_before
        return self.seconds_before + ((self.ended or time.perf_counter()) - self.started)

    def stop_clock(self) -> None:
        self.ended = time.perf_counter()

    def saved_record(self) -> dict[str, Any] | None:
        """What a checkpoint saves as grpo_resume.json: the record and the training time so far."""
        if self.record is None:
            return None
        return self.record | {"train_seconds": round(self.train_seconds, 3)}


def prepare(trainer: Any, checkpoint: str | None) -> None:
    """Before `Trainer.train`: the run's record (saved with each checkpoint), and on resume the
    checks above; what `after_restore` needs goes into `trainer.resume_plan`."""
    plan, saved = trainer.resume_plan, read_record(checkpoint)
    if checkpoint is not None:  # first: the record below holds the count the run goes on with
        cpu_threads.restore(saved, trainer.args, str(checkpoint))
    plan.record, plan.schedule = cpu_threads.record(trainer_record(trainer)), None
    plan.started, plan.ended = time.perf_counter(), None
    plan.seconds_before = float((saved or {}).get("train_seconds", 0.0))
    if checkpoint is None:
        return
    missing = check_pieces(checkpoint, trainer.args)
    changes = check_config(checkpoint, plan.record, trainer.args, missing)
    fresh = OPTIMIZER in missing or SCHEDULER in missing  # transformers then loads neither
    step = checkpoints.checkpoint_step(checkpoint) or 0
    plan.schedule = SchedulePlan(step, changes.schedule, fresh)


def after_restore(trainer: Any, checkpoint: str | None) -> None:
    """After the Trainer restored optimizer and scheduler: `rebuild_schedule`."""
    plan = trainer.resume_plan.schedule
    if checkpoint is not None and plan is not None and trainer.lr_scheduler is not None:
        rebuild_schedule(trainer.optimizer, trainer.lr_scheduler, plan, trainer.args)
    _warned.clear()  # this resume is told; a later one in this process is told again


# --- the learning-rate schedule after a resume ------------------------------------------------
@dataclass
class SchedulePlan:
    """What `rebuild_schedule` needs from the check: the step, the schedule changes, whether the
    optimizer and scheduler came back fresh (a missing piece under resume_as_new_phase)."""

    step: int
    changes: dict[str, tuple[Any, Any]]
    fresh: bool = False


def rebuild_schedule(optimizer: Any, scheduler: Any, plan: SchedulePlan, args: Any) -> None:
    """The schedule as now configured at the restored step: a changed learning rate scales the
    restored base rates, a longer or shorter `max_steps` (or another scheduler type or warmup,
    which transformers already built) is evaluated at the restored step, so the next step trains
    at the rate the new schedule gives it, not the restored one. Nothing changes on an
    unchanged resume (it stays exact). Warns when the schedule is 0 before the last step."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:
        if plan.changes or plan.fresh:
            _warn_once(
                f"{_listed(plan.changes)}: the {type(scheduler).__name__} scheduler cannot be "
                "rebuilt; it keeps the restored learning rate."
            )
        return
    if plan.fresh:  # a fresh scheduler: continue the schedule at the checkpoint's step
        scheduler.last_epoch = plan.step
    if "learning_rate" in plan.changes:
        old, new = plan.changes["learning_rate"]
        scheduler.base_lrs = [base * new / old for base in scheduler.base_lrs]
    step = scheduler.last_epoch
    if plan.changes or plan.fresh:
        before = [g["lr"] for g in optimizer.param_groups]
        lrs = [base * fn(step) for base, fn in zip(scheduler.base_lrs, lambdas)]
        for group, base, lr in zip(optimizer.param_groups, scheduler.base_lrs, lrs):
            group["initial_lr"], group["lr"] = base, lr
        set_scheduler_last_lr(scheduler, lrs)  # what get_last_lr() reports
        what = _listed(plan.changes) or "a fresh optimizer (its moments start at zero)"
        _warn_once(
            f"Resuming at step {step} with {what}: the {_kind(args)} schedule is evaluated at "
            f"step {step} for max_steps={args.max_steps}; step {step + 1} trains at learning "
            f"rate {lrs[0]:.4g} (restored: {before[0]:.4g})."
        )
    _warn_zero_lr(scheduler, lambdas, step, args)


def _warn_zero_lr(scheduler: Any, lambdas: list, step: int, args: Any) -> None:
    if args.max_steps <= 0:
        return
    zero = [
        k + 1 for k in range(step, args.max_steps) if scheduler.base_lrs[0] * lambdas[0](k) == 0
    ]
    if zero:
        _warn_once(
            f"The {_kind(args)} learning-rate schedule is 0 at step(s) {zero[:5]} of "
            f"max_steps={args.max_steps}: those steps train nothing; change lr_scheduler_type, "
            "warmup_steps or max_steps."
        )


__all__ = [
    "RECORD_FILE",
    "ResumePlan",
    "Changes",
    "ResumeRefused",
    "RunIdentity",
    "SchedulePlan",
    "check_config",
    "check_pieces",
    "compare",
    "dataset_digest",
    "missing_pieces",
    "read_record",
    "rebuild_schedule",
    "run_record",
    "save_record",
]
