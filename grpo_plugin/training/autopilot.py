"""Memory autopilot: `auto_find_batch_size=True` picks the micro-batch and the log-prob chunk size
before the first step, keeping prompt groups whole.

TRL refuses `auto_find_batch_size` for GRPO: transformers halves the batch after a CUDA
out-of-memory error, which splits prompt groups (and on a CPU running out of memory is the
kernel's OOM killer, not an exception). Here the work is kept and only its cut changes:

- The rows of an optimizer step (`per_device_train_batch_size * gradient_accumulation_steps`)
  and of a rollout (`generation_batch_size`) stay as configured. The micro-batch m becomes a
  multiple of G (whole groups) or a divisor of G (one group split row-wise: each micro-batch still
  shares its prompt's prefix), dividing both; `gradient_accumulation_steps` and
  `steps_per_generation` follow, so the loss and the sampled completions are those of the
  configured run.
- Probe: one forward + backward of the training forward (`completion_logprobs` with the
  trainer's settings) on the longest training prompt (after `max_prompt_length`) plus
  `max_completion_length` tokens per row, first at the smallest candidate, with the peak memory
  measured (CUDA: `max_memory_allocated`; CPU: the process's peak RSS, reset through
  `/proc/self/clear_refs`). Larger candidates are predicted in proportion to their tokens
  (prompts once per group, completions once per row); the largest whose prediction, plus the
  optimizer's two moments per trainable parameter, fits 90% of the memory available (free
  memory plus what this process holds, or `auto_batch_memory_gb`) is probed too, and the next
  smaller one taken if the probe does not fit.
- `logprob_chunk_size`: the largest power of two, at most the configured value, whose fp32
  logits (with the log-softmax and its gradient: 3 copies) take at most 5% of that memory.
- One log line gives the choice, the probes and the memory available.
- With tools the longest prompt is rendered with the tools' schemas, as the tool loop renders it
  (`max_completion_length` bounds the whole exchange). A resumed run keeps the micro-batch its
  checkpoint was trained with (`trainer_state.json`), so the resume stays exact.
- Refused, with one line: several processes (`config/checks.py`), `environment_factory` (a
  reset's observation lengthens the prompt before the rollout) and `rollout_func` (it builds its
  own prompts), by `check_inputs`, which `GRPOTrainer.__init__` calls first. The autopilot runs from
  `lifecycle.train`, after the output dir is claimed and before `Trainer.train`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..rollout.prompts import encode_prompts
from ..rollout.types import TrainingBatch
from ..run import checkpoints
from . import inputs
from .sampling import streaming

logger = logging.getLogger(__name__)
GIB = 2**30
HEADROOM = 0.9  # plan for 90% of the memory available
CHUNK_SHARE = 0.05  # of the budget, for one LM-head chunk's logits


@dataclass
class Plan:
    """What the autopilot chose (`rows` per optimizer step and per rollout are unchanged)."""

    micro_batch: int
    gradient_accumulation_steps: int
    steps_per_generation: int
    logprob_chunk_size: int
    probes: dict[int, float]  # micro-batch rows -> measured peak bytes
    budget: float  # bytes the plan may use


def check_inputs(args: Any, tool_inputs: Any) -> None:
    """Refuse, before anything loads, what the autopilot cannot plan for (module docstring)."""
    if not args.auto_find_batch_size:
        return
    for given, name, why in (
        (tool_inputs.rollout_func, "rollout_func", "it builds its own prompts"),
        (tool_inputs.environments, "environment_factory", "a reset lengthens the prompts"),
    ):
        if given is not None:
            raise ValueError(
                f"auto_find_batch_size cannot probe a run with {name} ({why}); set it False "
                "and choose per_device_train_batch_size."
            )


def candidate_micro_batches(step_rows: int, rollout_rows: int, group: int) -> list[int]:
    """Micro-batch sizes that keep groups whole (multiples of G) or split one group row-wise
    (divisors of G) and divide both the step and the rollout; largest first."""
    return [
        m
        for m in range(step_rows, 0, -1)
        if step_rows % m == 0 and rollout_rows % m == 0 and (m % group == 0 or group % m == 0)
    ]


def predicted_peak(m: int, probed: int, peak: float, base: float, group: int, shape) -> float:
    """`m` rows' peak from one probe at `probed` rows: what the probe added to `base`, scaled by
    the tokens a micro-batch runs (each group's prompt once, each row's completion once)."""
    prompt_len, completion_len = shape

    def tokens(rows: int) -> int:
        return math.ceil(rows / group) * prompt_len + rows * completion_len

    return base + (peak - base) * tokens(m) / tokens(probed)


def choose_micro_batch(
    candidates: list[int],
    probe: Callable[[int], float],
    base: float,
    budget: float,
    group: int,
    shape: tuple[int, int],
) -> tuple[int, dict[int, float]]:
    """The largest candidate whose probed peak fits `budget` (see the module docstring);
    `probe(m)` measures one micro-batch of m rows. Returns `(m, {rows: peak})`."""
    smallest = candidates[-1]
    probes = {smallest: probe(smallest)}
    if probes[smallest] > budget:
        return smallest, probes  # nothing smaller keeps a group's prefix shared
    fitting = [
        m
        for m in candidates
        if predicted_peak(m, smallest, probes[smallest], base, group, shape) <= budget
    ]
    for m in fitting:
        if m == smallest:
            break
        probes[m] = probe(m)
        if probes[m] <= budget:
            return m, probes
    return smallest, probes


def chunk_size_for(budget: float, vocab: int, configured: int) -> int:
    """The LM-head chunk whose fp32 logits (x3) take at most `CHUNK_SHARE` of `budget`."""
    fits = int(budget * CHUNK_SHARE / (vocab * 4 * 3))
    return max(16, min(configured, 2 ** max(4, fits.bit_length() - 1)))


# --- measuring memory -----------------------------------------------------------------------------
def _rss_bytes(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024
    raise OSError(f"{field} not in /proc/self/status")


def memory_in_use(device: torch.device) -> float:
    """Bytes this process holds now on `device` (CUDA: allocated tensors; CPU: resident set)."""
    if device.type == "cuda":
        return float(torch.cuda.memory_allocated(device))
    return _rss_bytes("VmRSS")


def memory_available(device: torch.device) -> float:
    """Bytes this process could hold: what it holds plus what is free (CPU: MemAvailable, capped
    by a cgroup limit)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return float(free + torch.cuda.memory_reserved(device))
    with open("/proc/meminfo") as info:
        free = next(
            float(line.split()[1]) * 1024 for line in info if line.startswith("MemAvailable")
        )
    limit = _cgroup_room()
    return _rss_bytes("VmRSS") + (free if limit is None else min(free, limit))


def _cgroup_room() -> float | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = float(f.read().strip())
    except OSError:
        return None
    return None if limit == "max" else float(limit) - used


def measure_peak(device: torch.device, run: Callable[[], None]) -> float:
    """Peak bytes while `run()` runs (CUDA: allocated; CPU: resident set, Linux only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return float(torch.cuda.max_memory_allocated(device))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    run()
    return _rss_bytes("VmHWM")


# --- the trainer side ------------------------------------------------------------------------------
def longest_prompt(trainer: Any, limit: int = 4096) -> list[int]:
    """Token ids of the longest prompt among the first `limit` training rows, after
    `max_prompt_length` (with tools: rendered with their schemas, as `prompts._sample_with_tools`
    renders it). Without tools the lengths are those the trainer's input check measured
    (`inputs.prompt_lengths`): only the longest prompt is encoded here."""
    a, dataset, tokenizer = trainer.args, trainer.train_dataset, trainer.processing_class
    cut = a.max_prompt_length
    rows = range(min(limit, len(dataset)))
    setup = getattr(trainer, "tool_setup", None)
    if setup is None:
        lengths = inputs.prompt_lengths(dataset, tokenizer, a.chat_template_kwargs)
        kept = [min(n, cut) if cut else n for n in lengths[: len(rows)]]
        longest = dataset[kept.index(max(kept))]["prompt"]
        (ids,) = encode_prompts(tokenizer, [longest], chat_template_kwargs=a.chat_template_kwargs)
    else:
        schemas = [tool.schema for tool in setup.tools]
        render = setup.format.render_prompt
        encoded = [
            render(tokenizer, dataset[i]["prompt"], schemas, a.chat_template_kwargs) for i in rows
        ]
        ids = max((e[-cut:] if cut else e for e in encoded), key=len)
    return ids[-cut:] if cut else ids


def probe_batch(prompt: list[int], rows: int, completion_len: int, vocab: int, device):
    """A training micro-batch of `rows` rows sharing `prompt`, each with a full-length completion."""
    prompt_ids = torch.tensor([prompt] * rows, device=device)
    gen = torch.Generator().manual_seed(0)
    completion = torch.randint(vocab // 4, vocab // 2, (rows, completion_len), generator=gen)
    ones = torch.ones(rows, completion_len, dtype=torch.long, device=device)
    return TrainingBatch(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion.to(device),
        completion_mask=ones,
        loss_mask=ones,
        advantages=torch.zeros(rows, device=device),
    )


def _probe(trainer: Any, prompt: list[int], rows: int) -> float:
    model, a = trainer.model, trainer.args
    device = next(model.parameters()).device
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    batch = probe_batch(prompt, rows, a.max_completion_length, vocab, device)
    pad_id = trainer.processing_class.pad_token_id or 0
    batch = batch.padded_to_multiple(a.pad_to_multiple_of, pad_id)  # as the trainer pads

    def step() -> None:
        with trainer.compute_loss_context_manager(), trainer.accelerator.autocast():  # as trained
            out = trainer.probe_logps(model, batch)
            logps, entropy = out.logps, out.entropy
        (logps.sum() + (entropy.sum() if entropy.requires_grad else 0.0)).backward()

    was_training = model.training
    model.train()
    try:
        return measure_peak(device, step)
    except torch.cuda.OutOfMemoryError:  # a prediction that was wrong: this size does not fit
        return math.inf
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def plan(trainer: Any, kept: int | None = None) -> Plan:
    """Probe and choose (see the module docstring), or take `kept` (a resumed run's micro-batch)
    when it still divides the step and the rollout; nothing is changed yet."""
    a = trainer.args
    G, step_rows = a.num_generations, a.per_device_train_batch_size * a.gradient_accumulation_steps
    rollout_rows = a.generation_batch_per_device
    device = next(trainer.model.parameters()).device
    candidates = candidate_micro_batches(step_rows, rollout_rows, G)
    trainable = sum(
        p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad
    )
    gb = a.auto_batch_memory_gb
    budget = (gb * GIB if gb else memory_available(device) * HEADROOM) - 2 * trainable
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    chunk = chunk_size_for(budget, vocab, a.logprob_chunk_size)
    if kept in candidates:
        return Plan(kept, step_rows // kept, rollout_rows // kept, chunk, {}, budget)
    prompt = longest_prompt(trainer)
    shape = (len(prompt), a.max_completion_length)
    base = memory_in_use(device)
    m, probes = choose_micro_batch(
        candidates, lambda rows: _probe(trainer, prompt, rows), base, budget, G, shape
    )
    return Plan(m, step_rows // m, rollout_rows // m, chunk, probes, budget)


def _checkpoint_micro_batch(args: Any, checkpoint: str | None) -> int | None:
    """The micro-batch a checkpoint was trained with (its `train_batch_size`), if any."""
    if checkpoint is None:
        return None
    from transformers import TrainerState

    state_file = Path(checkpoint) / checkpoints.TRAINER_STATE
    if not state_file.is_file():
        return None
    size = TrainerState.load_from_json(str(state_file)).train_batch_size
    return None if size is None else size // max(1, args.n_gpu)


def choose(trainer: Any, checkpoint: str | None = None) -> Plan | None:
    """Choose the micro-batch, accumulation, rollout steps and chunk size, and log one line; the
    trainer applies the plan (`GRPOTrainer.plan_batch`). None without
    `auto_find_batch_size`, and for streamed datasets (no longest prompt to probe: the configured
    sizes stay, with a warning). A resumed `checkpoint` keeps its micro-batch."""
    a = trainer.args
    if not a.auto_find_batch_size:
        return None
    if streaming.is_streamed(trainer.train_dataset) or trainer.train_dataset is None:
        logger.warning(
            "auto_find_batch_size: a streamed dataset has no longest prompt to probe; "
            "keeping per_device_train_batch_size=%d.",
            a.per_device_train_batch_size,
        )
        return None
    chosen = plan(trainer, _checkpoint_micro_batch(trainer.args, checkpoint))
    probes = ", ".join(f"{rows} rows {peak / GIB:.2f} GB" for rows, peak in chosen.probes.items())
    probes = f"probed peak {probes}" if probes else "micro-batch kept from the checkpoint"
    logger.info(
        "auto_find_batch_size: micro-batch %d x %d accumulation steps (%d rows per step, G=%d), "
        "logprob_chunk_size %d; %s; budget %.1f GB (pid %d).",
        chosen.micro_batch,
        chosen.gradient_accumulation_steps,
        chosen.micro_batch * chosen.gradient_accumulation_steps,
        a.num_generations,
        chosen.logprob_chunk_size,
        probes,
        chosen.budget / GIB,
        os.getpid(),
    )
    return chosen
