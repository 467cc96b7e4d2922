"""Several processes, one run: the rules that make N processes train like one, and their helpers.

`accelerate launch --num_processes N` starts N copies of the same program; accelerate (DDP,
FSDP2, DeepSpeed ZeRO-2) averages the gradients. What the trainer adds, and where it lives:

- Groups never span processes. `PromptBatchSampler(num_shards=N)` cuts each rollout's global
  block of P * N prompts into N shards of P; process k samples G completions for global prompts
  k*P .. k*P + P - 1 (`global_prompt_offset`). The global prompts of a step do not depend on N.
- Loss normalisation is global. Every process trains on the same number of rows, so the mean of
  the per-process `grpo` / `dr_grpo` losses (what averaging the gradients computes) is the
  one-process loss; `dapo` divides by the token count of the whole global rollout
  (`mean_over_processes` of the per-process counts, times N, see the trainer).
- Metrics are global. Reward metrics are computed from every process's completions
  (`gather_rollout`), the others averaged over processes (`combine_metrics`) before logging.
- One writer. Process 0 alone writes files (`is_main_process`); the completions parquet holds
  every process's completions, gathered. It alone decides about the run directory
  (`on_main_process`: its lock, what a rerun resumes from), once every process has shown that it
  sees the same directory (`run/shared_dir.py`).
- Collectives are reached by every process the same number of times. Sampling, scoring and the
  dynamic-sampling refills run with no collective inside (sharded parameters are gathered once
  before, `full_parameters`), so processes may refill a different number of rounds. The local
  phase ends with `failures_shared`, which every process reaches once: an exception on one
  process is raised on all of them (the same type and message), instead of a hang.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import torch

from ._compat import fsdp2_parameters_held
from .engine.prompt_grad import SharedPromptGrad
from .rollout.dynamic_sampling import concat_rollouts
from .rollout.types import Rollout

# Per-process metrics whose global value is the sum over processes, not the mean.
SUMMED_METRICS = ("dynamic_sampling/filtered_groups", "generation/tokens_per_s")


def _world(accelerator) -> int:
    return accelerator.num_processes if accelerator is not None else 1


def is_main_process(accelerator=None) -> bool:
    """True on process 0 (and in a plain one-process run): the one process that writes files."""
    if accelerator is not None:
        return accelerator.is_main_process
    return process_state().is_main_process


def global_prompt_offset(accelerator, prompts_per_process: int) -> int:
    """Global batch position of this process's first prompt (see `PromptBatchSampler`)."""
    return accelerator.process_index * prompts_per_process if _world(accelerator) > 1 else 0


def own_share(items: Sequence[Any], accelerator) -> list[Any]:
    """This process's share of a list every process computed alike: items k, k+N, k+2N, ...
    (disjoint across processes, e.g. the fresh prompts a dynamic-sampling refill draws from)."""
    world = _world(accelerator)
    return list(items[accelerator.process_index :: world]) if world > 1 else list(items)


def contiguous_share(num_items: int, world: int, rank: int) -> tuple[int, int]:
    """`[start, stop)` of process `rank`'s contiguous share of `num_items` (sizes differ by <= 1,
    the first `num_items % world` processes taking one more)."""
    size, extra = divmod(num_items, world)
    start = rank * size + min(rank, extra)
    return start, start + size + (1 if rank < extra else 0)


def gather_objects(accelerator, obj: Any) -> list[Any]:
    """Every process's `obj` (picklable, on the CPU), in process order. A collective."""
    world = _world(accelerator)
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def mean_over_processes(accelerator, value: float) -> float:
    """The mean of a float over processes (float64, summed then divided). A collective."""
    world = _world(accelerator)
    if world == 1:
        return float(value)
    total = torch.tensor([float(value)], dtype=torch.float64, device=accelerator.device)
    torch.distributed.all_reduce(total)
    return float(total.item()) / world


def any_process(accelerator, flag: bool) -> bool:
    """True when `flag` is True on at least one process. A collective (when several)."""
    return mean_over_processes(accelerator, float(flag)) > 0


# --- errors --------------------------------------------------------------------------------------
def _portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling (to travel to the other processes), else a RuntimeError."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


@contextmanager
def failures_shared(accelerator) -> Iterator[None]:
    """Run a local phase (no collective inside); if it raised on any process, raise on every one.

    Every process reaches the exchange at the end exactly once, whether its phase failed or not.
    The error of the lowest-numbered failing process is raised everywhere (that process raises
    its own exception object, with its traceback), with a note naming the process.
    """
    world = _world(accelerator)
    if world == 1:
        yield
        return
    error: Exception | None = None
    try:
        yield
    except Exception as err:  # BaseException (Ctrl-C, SystemExit) ends the process as it is
        error = err
    reports = gather_objects(accelerator, None if error is None else _portable(error))
    failed = [(k, report) for k, report in enumerate(reports) if report is not None]
    if not failed:
        return
    rank, report = failed[0]
    raised = error if rank == accelerator.process_index else report
    raised.add_note(f"Raised on process {rank} of {world}; every process stops with this error.")
    raise raised


def on_main_process(accelerator, fn: Callable[[], Any]) -> Any:
    """`fn()` run on process 0 alone; its result (picklable) is returned on every process and its
    exception raised on every one (`failures_shared`). A collective, when several processes.

    For a decision about files only process 0 may take (the run directory's lock, what a rerun
    resumes from): the others must neither take it themselves (they would see process 0's lock)
    nor go on alone when it failed (they would wait for process 0 at the next collective)."""
    if _world(accelerator) == 1:
        return fn()
    result = None
    with failures_shared(accelerator):
        if accelerator.process_index == 0:
            result = fn()
    return gather_objects(accelerator, result)[0]


def process_state():
    """accelerate's view of this process (rank, world size): a `PartialState`, which
    `TrainingArguments` creates (and with it the process group) when a config is built."""
    from accelerate import PartialState

    return PartialState()


# --- rollouts and metrics -------------------------------------------------------------------------
def _rollout_on_cpu(r: Rollout) -> Rollout:
    fields = {name: getattr(r.batch, name).cpu() for name in r.batch.row_fields()}
    return replace(
        r,
        batch=replace(r.batch, **fields),
        environments=None,  # live objects stay on their process
        per_func=None if r.per_func is None else r.per_func.cpu(),
        rewards=None if r.rewards is None else r.rewards.cpu(),
    )


def gather_rollout(
    accelerator, rollout: Rollout, pad_token_id: int, advantages: torch.Tensor | None = None
) -> tuple[Rollout, torch.Tensor | None]:
    """Every process's scored rollout (and advantages `(N,)`), concatenated in process order:
    the global rollout of the step, as one process would have sampled it. A collective."""
    if _world(accelerator) == 1:
        return rollout, advantages
    local = (_rollout_on_cpu(rollout), None if advantages is None else advantages.cpu())
    parts = gather_objects(accelerator, local)
    merged = parts[0][0]
    for part, _ in parts[1:]:
        merged = concat_rollouts(merged, part, pad_token_id)
    if advantages is None:
        return merged, None
    return merged, torch.cat([adv for _, adv in parts])


def combine_metrics(per_process: Sequence[dict[str, float]]) -> dict[str, float]:
    """One log line from every process's metrics window.

    `SUMMED_METRICS` add up; a metric every process reports with the same value (computed from
    gathered data, like the rewards) is kept as is; any other is averaged over the processes that
    report it (timings, clip ratios, KL, entropy).
    """
    keys = list(dict.fromkeys(key for metrics in per_process for key in metrics))
    out = {}
    for key in keys:
        values = [metrics[key] for metrics in per_process if key in metrics]
        if key in SUMMED_METRICS:
            out[key] = sum(values)
        elif all(v == values[0] for v in values):
            out[key] = values[0]
        else:
            out[key] = sum(values) / len(values)
    return out


def reduce_metrics(accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """`combine_metrics` over all processes (a collective; the same result on every process)."""
    if _world(accelerator) == 1:
        return metrics
    return combine_metrics(gather_objects(accelerator, metrics))


# --- the training forward ------------------------------------------------------------------------
def forward_through(accelerator, model: torch.nn.Module, fn: Callable[[torch.nn.Module], Any]):
    """`fn(policy)` run as the forward of `model` (the policy, or the DDP / DeepSpeed wrapper the
    Trainer made of it), so the wrapper's forward bookkeeping runs around it.

    `completion_logprobs` calls the decoder body and the LM head itself, never the model's own
    forward. Called that way under DDP, the gradient-sync hooks would be skipped (DDP only
    averages gradients after its own forward), and under FSDP2 the root's weights would stay
    sharded. So the policy's forward is swapped for `fn` for one call of `model`, under the
    accelerator's autocast (bf16=True's mixed precision), which the swapped-out forward applied.
    """
    policy = accelerator.unwrap_model(model) if accelerator is not None else model
    saved = policy.__dict__.pop("forward", None)  # accelerate's mixed-precision forward, if any
    policy.forward = lambda: fn(policy)
    autocast = accelerator.autocast() if accelerator is not None else nullcontext()
    try:
        with autocast:
            return model()
    finally:
        del policy.forward
        if saved is not None:
            policy.forward = saved


def shares_prefix(accelerator, requested: bool) -> bool:
    """Whether the training forward may encode each prompt once for its group (`logprobs.py`).

    Not with grad under FSDP2: the prefix-shared forward runs every layer twice before the
    backward, and FSDP2 frees a layer's gathered weights after the first of those backwards
    (measured: "setStorage ... out of bounds for storage of size 0"); the plain forward is used.
    """
    sharded = getattr(accelerator, "is_fsdp2", False) and torch.is_grad_enabled()
    return requested and not sharded


def held_prompt(accelerator, args, held: SharedPromptGrad) -> SharedPromptGrad | None:
    """`held` when a training micro-batch is one part of a group, so the group's prompt is encoded
    once for all its micro-batches (engine/prompt_grad.py); else None. One process only: the held
    prompt's backward is a second backward pass in the step, which DDP's reducer refuses."""
    micro, group = args.per_device_train_batch_size, args.num_generations
    if not (2 <= micro < group and group % micro == 0 and torch.is_grad_enabled()):
        return None
    if accelerator.num_processes != 1 or not shares_prefix(accelerator, args.share_prompt_prefix):
        return None
    return held


# --- sharded parameters ---------------------------------------------------------------------------
ZERO3_REFUSED = (
    "DeepSpeed ZeRO-3 shards the parameters, so every generation step would be a collective and "
    "processes that stop decoding at different steps would hang; use "
    "recipes/accelerate/fsdp2_lora.yaml (or fsdp2_full.yaml) or ZeRO-2 instead."
)


def _zero_stage(deepspeed: Any) -> int:
    """The ZeRO stage of a `TrainingArguments.deepspeed` value (a dict or a JSON file)."""
    if isinstance(deepspeed, str) and os.path.isfile(deepspeed):
        with open(deepspeed) as fh:
            deepspeed = json.load(fh)
    stage = (
        (deepspeed or {}).get("zero_optimization", {}).get("stage", 0)
        if isinstance(deepspeed, dict)
        else 0
    )
    return int(stage) if str(stage).isdigit() else 0


def check_launch(args: Any) -> None:
    """Before anything loads: refuse ZeRO-3, from `accelerate launch`'s environment or from
    `args.deepspeed`."""
    launched = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "") == "3"
    if launched or _zero_stage(getattr(args, "deepspeed", None)) == 3:
        raise ValueError(ZERO3_REFUSED)


def check_backend(accelerator) -> None:
    """Refuse a backend whose forward passes are collectives we cannot gather out of (ZeRO-3)."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and getattr(plugin, "zero_stage", 0) == 3:
        raise ValueError(ZERO3_REFUSED)


@contextmanager
def full_parameters(accelerator, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model with every parameter whole on every process, for generation.

    Under FSDP2 each forward would all-gather the parameters of every layer: processes that run
    different numbers of decode steps (their completions end at different lengths) or refill
    rounds would wait for each other forever. The parameters are gathered once here (one
    collective per FSDP module, in module order on every process) and kept until the block ends,
    so the forward passes inside make no collective. Other backends keep whole parameters.
    """
    if not getattr(accelerator, "is_fsdp2", False):
        yield model
        return
    with fsdp2_parameters_held(model):
        yield model
