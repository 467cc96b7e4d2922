"""One default step of our trainer, phase by phase, against what this CPU can do (issue 60, item 2).

    python benchmarks/roofline.py                  # short + long, 1 warm-up + 3 measured steps
    python benchmarks/roofline.py --configs short --steps 5 --out roofline-short.json
    python benchmarks/roofline.py --model-dir /path/to/model --max-new-tokens 8   # other model

The work is vs_trl's (`vs_trl_child.py`: CONFIGS, build_dataset, build_trainer with the opts of
vs_trl's own parser), our trainer only, in this process, with its defaults. Each phase is timed
by wrapping the function that implements it (time.perf_counter; grpo_plugin is not modified):

    prefill           engine.decode.Decoder.prefill
    decode            rollout.generation.decode / decode_static (the whole loop: forwards, sampling)
    sync              engine.rollout_copy.RolloutCopy.refresh (the bf16 copy's weights written in)
    scoring           trainer.rewards.score
    logprobs          trainer._add_policy_logps (old / reference log-probs, no grad; none by
                      default: beta = 0 and the rollout used on-policy)
    forward_backward  trainer.compute_loss + trainer.accelerator.backward
    optimizer         trainer._clip_grad_norm + trainer.optimizer.step

The rest of the step (tokenising, advantages, the scheduler, zero_grad, logging) is `unattributed`.

The limits are measured here, with torch's threads: memory bandwidth by a STREAM-like triad
(a = b + s*c, float32 arrays 4x the L3 cache together, bytes = 3 x 4 x n, best of reps) and the
compute peak by a square matmul in float32 and in bfloat16 (2 n^3 FLOP, best of reps).

Work (element counts from the policy; a "product weight" is a weight of a matrix product):
- a forward, per token: 2 FLOP per product weight of the body, 2 per LM-head weight at each
  position whose logits are needed, and causal attention 4 x layers x (heads x head_dim) FLOP per
  (query, key) pair;
- the training forward + backward: 4 FLOP per frozen weight (forward, and the activation
  gradient the backward still propagates through it), 6 per trainable one (the weight gradient
  too), attention x 3. So ~6 P T with everything trained, ~4 P T with LoRA (+6 per adapter
  weight). Its tokens are the batch's: each distinct prompt once (prefix sharing and packing),
  every real completion token; the head at completion tokens only;
- prefill: the real prompt tokens prefilled (each distinct prompt once when shared), the head at
  one position per row;
- decode: bytes = the weights read per step (the rollout copy's, 2 bytes each for bf16 / fp16,
  else the policy's) x steps + the KV cache read (rows x cache columns x 2 x layers x kv_heads x
  head_dim x its element size, per step); FLOP = 2 x weights x rows per step + attention;
- sync: the refresh reads each linked float32 weight and writes it into the copy (4 + 2 bytes
  per element for bf16) and forms W + s B A (2 r FLOP per element);
- optimizer: AdamW reads weight, gradient and both moments and writes weight and moments
  (7 x 4 bytes per trainable parameter) and the gradient norm reads the gradient (4): 32 bytes;
- scoring: Python reward functions, no hardware limit.

Each phase's floor is max(FLOP / peak of its dtype, bytes / triad bandwidth) (the roofline; the
larger names its limit): the bf16 copy's products at the bf16 peak, the training products at
the policy's dtype's (float32 by default), except with train_precision 'bf16', where the frozen
base products (2 FLOP per base weight per token forward, 4 with the backward) are counted at
the bf16 peak and the limit is the mix's ("float32+bf16"). fraction = floor / seconds; gap = share of the step x
(1 - fraction), the step's share that running the phase at its limit would save. The report
names the phase furthest from its limit (lowest fraction) and the one with the largest gap.
Counted work is a floor (padding and recomputation are not counted), so fractions are too.
"""

# No `from __future__ import annotations`: the dataclasses below would then look this module up
# in sys.modules, where the tests' `load_script` does not put it.
import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by the tests
from machine import cpu_name  # noqa: E402
from vs_trl_child import CONFIGS, build_dataset, build_trainer  # noqa: E402

PHASES = (
    "prefill",
    "decode",
    "sync",
    "scoring",
    "logprobs",
    "forward_backward",
    "optimizer",
)
ADAMW_BYTES = 7 * 4 + 4  # per trainable fp32 parameter: AdamW's 7 passes, the norm's 1
PEAK_DTYPES = (torch.float32, torch.bfloat16)  # the matmul peaks measured


# --- the machine's limits ------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    bandwidth: float  # bytes/s, the triad's
    peak: dict[str, float]  # FLOP/s of a matmul, by dtype name ("float32", "bfloat16")


def l3_bytes() -> int:
    """The L3 cache's size from sysfs (32 MiB where it cannot be read)."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "level").read_text().strip() == "3":
                size = (index / "size").read_text().strip()
                scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
                return int(size.rstrip("KMG")) * scale
        except (OSError, ValueError):
            continue
    return 32 * 2**20


def best_seconds(run: Callable[[], Any], reps: int) -> float:
    run()  # untimed: first touch of the pages, kernel selection
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def triad_bandwidth(total_bytes: int, reps: int = 5) -> float:
    """Bytes/s of a = b + s*c over three float32 arrays of `total_bytes` together."""
    n = max(total_bytes // 12, 1)
    a, b, c = torch.empty(n), torch.ones(n), torch.full((n,), 2.0)
    seconds = best_seconds(lambda: torch.add(b, c, alpha=3.0, out=a), reps)
    return 3 * 4 * n / seconds


def matmul_peak(n: int, dtype: torch.dtype, reps: int = 5) -> float:
    """FLOP/s of an n x n x n matmul in `dtype` (2 n^3 FLOP)."""
    x, y = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return 2 * n**3 / best_seconds(lambda: torch.mm(x, y), reps)


def measure_limits(triad_bytes: int, matmul_n: int) -> Limits:
    peaks = {str(d).removeprefix("torch."): matmul_peak(matmul_n, d) for d in PEAK_DTYPES}
    return Limits(bandwidth=triad_bandwidth(triad_bytes), peak=peaks)


def default_triad_bytes() -> int:
    """4x the L3 cache, at least 256 MiB, at most a quarter of the free memory."""
    available = 2**34
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    return min(max(4 * l3_bytes(), 256 * 2**20), available // 4)


# --- the model's sizes and the work formulas -----------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """The policy's product weights (element counts) and attention sizes."""

    served: int  # the body's product weights without LoRA adapters (what a merged copy holds)
    adapters: int  # LoRA A and B weights
    trainable: int  # the body's trainable product weights (the adapters, or `served` in full)
    head: int  # LM-head weights (V x H)
    head_trainable: bool
    layers: int
    attention_width: int  # heads x head_dim
    kv_width: int  # kv heads x head_dim (K, and again V, per layer and token)
    trainable_params: int  # every trainable parameter (the optimizer's)
    synced: int  # elements the rollout copy's refresh writes
    rank: int  # LoRA rank (0: full fine-tuning)


@dataclass
class Tokens:
    """What one forward over a training batch runs on."""

    body: int = 0  # tokens through the body: distinct prompt tokens + real completion tokens
    head: int = 0  # positions through the LM head (real completion tokens)
    attended: int = 0  # (query, key) pairs of causal attention


def attention_flops(shape: ModelShape, attended: int) -> float:
    """Q K^T and A V: 2 x 2 FLOP per (query, key) pair per layer per query channel."""
    return 4.0 * shape.layers * shape.attention_width * attended


def forward_flops(shape: ModelShape, t: Tokens) -> float:
    """A forward of the policy (LoRA adapters unmerged): 2 FLOP per weight per token."""
    body = 2.0 * (shape.served + shape.adapters) * t.body
    return body + 2.0 * shape.head * t.head + attention_flops(shape, t.attended)


def train_flops(shape: ModelShape, t: Tokens) -> float:
    """Forward + backward: 4 FLOP per frozen weight per token, 6 per trainable one."""
    frozen = shape.served + shape.adapters - shape.trainable
    body = t.body * (4.0 * frozen + 6.0 * shape.trainable)
    head = t.head * shape.head * (6.0 if shape.head_trainable else 4.0)
    return body + head + 3 * attention_flops(shape, t.attended)


def served_weights(shape: ModelShape, from_copy: bool) -> int:
    """Product weights a rollout forward runs: the merged copy's, or the policy's with adapters."""
    return shape.served + shape.head + (0 if from_copy else shape.adapters)


@dataclass
class Counts:
    """One step's counted work (filled by the wrappers)."""

    prefill_tokens: int = 0  # real prompt tokens prefilled (each shared prompt once)
    prefill_rows: int = 0  # rows whose last position went through the LM head
    prefill_attended: int = 0
    decode_steps: int = 0
    decode_rows: int = 0  # rows decoded, summed over steps
    decode_columns: int = 0  # rows x KV-cache columns, summed over steps
    kv_element_bytes: int = 4
    copy_precision: str | None = None  # None: the rollouts sampled from the policy
    syncs: int = 0
    logprob_passes: int = 0
    logprob: Tokens = field(default_factory=Tokens)
    train: Tokens = field(default_factory=Tokens)
    prompt_tokens: int = 0  # the training batch's real prompt tokens, every row
    completion_tokens: int = 0  # its real completion tokens


@dataclass(frozen=True)
class Work:
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "float32"  # the products' dtype: which peak applies
    bf16_flops: float = 0.0  # of `flops`, those run in bf16 (train_precision 'bf16')


def decode_work(shape: ModelShape, c: Counts, weight_bytes: int, dtype: str) -> Work:
    """Weights read once per step, the KV cache read at each step, 2 FLOP per weight per row."""
    weights = served_weights(shape, c.copy_precision is not None)
    kv = c.decode_columns * 2 * shape.layers * shape.kv_width * c.kv_element_bytes
    flops = 2.0 * weights * c.decode_rows + attention_flops(shape, c.decode_columns)
    return Work(flops=flops, bytes=float(weights * weight_bytes * c.decode_steps + kv), dtype=dtype)


def prefill_work(shape: ModelShape, c: Counts, dtype: str) -> Work:
    body = 2.0 * (served_weights(shape, c.copy_precision is not None) - shape.head)
    flops = body * c.prefill_tokens + 2.0 * shape.head * c.prefill_rows
    return Work(flops=flops + attention_flops(shape, c.prefill_attended), dtype=dtype)


def sync_work(shape: ModelShape, syncs: int, copy_bytes: int) -> Work:
    """Read each linked float32 weight, write it into the copy; W + s B A: 2 r FLOP each."""
    flops = 2.0 * shape.rank * shape.synced * syncs
    return Work(flops=flops, bytes=float((4 + copy_bytes) * shape.synced * syncs))


def optimizer_work(shape: ModelShape) -> Work:
    return Work(bytes=float(ADAMW_BYTES * shape.trainable_params))


def phase_work(
    shape: ModelShape, c: Counts, policy_dtype: torch.dtype, bf16_training: bool = False
) -> dict[str, Work]:
    """Each phase's work in one step. `bf16_training` (train_precision 'bf16'): the frozen base
    products of the training forwards (2 FLOP per weight per token, 4 with the backward's dx) at
    the bf16 peak, the rest (adapters, head, attention) at the policy dtype's."""
    policy = str(policy_dtype).removeprefix("torch.")
    rollout = "bfloat16" if c.copy_precision == "bf16" else policy  # fp16 copy: fp32 products
    copy_bytes = 2 if c.copy_precision else policy_dtype.itemsize
    return {
        "prefill": prefill_work(shape, c, rollout),
        "decode": decode_work(shape, c, copy_bytes, rollout),
        "sync": sync_work(shape, c.syncs, copy_bytes),
        "scoring": Work(),
        "logprobs": Work(
            flops=c.logprob_passes * forward_flops(shape, c.logprob),
            dtype=policy,
            bf16_flops=2.0 * shape.served * c.logprob.body * c.logprob_passes * bf16_training,
        ),
        "forward_backward": Work(
            flops=train_flops(shape, c.train),
            dtype=policy,
            bf16_flops=4.0 * shape.served * c.train.body * bf16_training,
        ),
        "optimizer": optimizer_work(shape),
    }


def roofline(seconds: float, work: Work, limits: Limits) -> dict[str, Any]:
    """The phase's floor (the slower of compute and memory at their limits) against its time."""
    own = work.flops - work.bf16_flops  # FLOP at the dtype's peak, the rest at bf16's
    compute_s = own / limits.peak[work.dtype] + work.bf16_flops / limits.peak["bfloat16"]
    memory_s = work.bytes / limits.bandwidth if work.bytes else 0.0
    floor = max(compute_s, memory_s)
    if floor == 0.0 or seconds <= 0.0:
        return {"limit": None, "rate": None, "limit_rate": None, "fraction": None}
    if memory_s >= compute_s:
        limit, rate, limit_rate = "memory", work.bytes / seconds, limits.bandwidth
    else:
        limit, rate, limit_rate = work.dtype, work.flops / seconds, limits.peak[work.dtype]
        if work.bf16_flops:  # mixed: the peak their mix would run at
            limit, limit_rate = f"{work.dtype}+bf16", work.flops / compute_s
    return {"limit": limit, "rate": rate, "limit_rate": limit_rate, "fraction": floor / seconds}


def model_shape(policy: torch.nn.Module) -> ModelShape:
    """Element counts of `policy`'s product weights (a peft model or a plain one)."""
    head = policy.get_output_embeddings()
    served = adapters = trainable = rank = synced = 0
    for name, module in policy.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        n = module.weight.numel()
        is_adapter = ".lora_A." in name or ".lora_B." in name
        adapters += n if is_adapter else 0
        served += 0 if is_adapter else n
        trainable += n if module.weight.requires_grad else 0
        if ".lora_A." in name:
            rank = module.weight.shape[0]
        if name.endswith(".base_layer"):
            synced += n  # a LoRA layer's W: refreshed as W + s B A
    params = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    c = policy.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    return ModelShape(
        served=served,
        adapters=adapters,
        trainable=trainable,
        head=head.weight.numel(),
        head_trainable=head.weight.requires_grad,
        layers=c.num_hidden_layers,
        attention_width=heads * head_dim,
        kv_width=kv_heads * head_dim,
        trainable_params=params,
        synced=synced if rank else params,  # full fine-tuning: every trainable parameter
        rank=rank,
    )


def causal_pairs(lengths: torch.Tensor) -> int:
    """(query, key) pairs of causal attention over sequences of these lengths."""
    return int((lengths * (lengths + 1) // 2).sum())


def batch_tokens(batch: Any, group: int) -> Tokens:
    """A training batch's forward: each prompt once per block of `group` rows sharing it."""
    prompt = batch.prompt_mask.sum(-1)  # (n,)
    completion = batch.completion_mask.sum(-1)  # (n,)
    distinct = prompt[::group]  # (n / group,)
    pairs = causal_pairs(distinct) + int((completion * prompt).sum()) + causal_pairs(completion)
    return Tokens(int(distinct.sum() + completion.sum()), int(completion.sum()), pairs)


# --- timing: wrappers around the functions that implement each phase -----------------------------
@dataclass
class Probe:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    counts: Counts = field(default_factory=Counts)
    decoding: bool = False

    def reset(self) -> None:
        self.seconds, self.counts = dict.fromkeys(PHASES, 0.0), Counts()


def timed(fn: Callable, probe: Probe, phase: str, after: Callable | None = None) -> Callable:
    """`fn` with its seconds added to `probe.seconds[phase]`; `after(args, result)` counts."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        finally:
            probe.seconds[phase] += time.perf_counter() - start
        if after is not None:
            after(args, result)
        return result

    return wrapper


@contextmanager
def patched(owner: Any, name: str, replacement: Callable) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)


def count_prefill(probe: Probe) -> Callable:
    def after(args, result) -> None:  # args: (decoder, unique_ids, unique_mask, group, share)
        unique_mask, group = args[2], args[3]
        lengths = unique_mask.sum(-1)  # (P,)
        rows_each = 1 if result[2] == int(lengths.sum()) else group  # shared: once per prompt
        c = probe.counts
        c.prefill_tokens += result[2]
        c.prefill_rows += len(lengths) * rows_each
        c.prefill_attended += causal_pairs(lengths) * rows_each
        c.kv_element_bytes = next(args[0].model.parameters()).element_size()

    return after


def counting_step(fn: Callable, probe: Probe) -> Callable:
    """A decoder's `__call__` that counts one-token steps made inside the decode loop."""

    @functools.wraps(fn)
    def wrapper(self, input_ids, attention_mask, *args, **kwargs):
        if probe.decoding and input_ids.shape[1] == 1:
            c = probe.counts
            c.decode_steps += 1
            c.decode_rows += input_ids.shape[0]
            c.decode_columns += input_ids.shape[0] * attention_mask.shape[1]
        return fn(self, input_ids, attention_mask, *args, **kwargs)

    return wrapper


def decoding(fn: Callable, probe: Probe) -> Callable:
    """The decode loop, timed, with `probe.decoding` set while it runs."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        probe.decoding = True
        try:
            return fn(*args, **kwargs)
        finally:
            probe.decoding = False

    return timed(wrapper, probe, "decode")


def count_sync(probe: Probe) -> Callable:
    def after(args, result) -> None:  # args: (copy, policy, version)
        probe.counts.syncs += 1
        probe.counts.copy_precision = args[0].precision

    return after


@contextmanager
def engine_wrapped(probe: Probe) -> Iterator[None]:
    """The rollout's phases timed on their classes and module (restored on exit)."""
    import grpo_plugin.rollout.generation as generation
    from grpo_plugin.engine.decode import Decoder, StaticDecoder
    from grpo_plugin.engine.rollout_copy import RolloutCopy

    with (
        patched(Decoder, "prefill", timed(Decoder.prefill, probe, "prefill", count_prefill(probe))),
        patched(Decoder, "__call__", counting_step(Decoder.__call__, probe)),
        patched(StaticDecoder, "__call__", counting_step(StaticDecoder.__call__, probe)),
        patched(generation, "decode", decoding(generation.decode, probe)),
        patched(generation, "decode_static", decoding(generation.decode_static, probe)),
        patched(
            RolloutCopy, "refresh", timed(RolloutCopy.refresh, probe, "sync", count_sync(probe))
        ),
    ):
        yield


def wrap_trainer(trainer: Any, probe: Probe) -> None:
    """The trainer's phases timed on the instance (the optimizer: once it exists)."""
    from grpo_plugin.core.batching import shared_group_size

    a = trainer.args
    passes = int(a.needs_old_logps) + int(a.beta > 0)

    def group_of(batch: Any) -> int:
        return shared_group_size(a.num_generations, len(batch)) if a.share_prompt_prefix else 1

    def count_logprobs(args, result) -> None:
        probe.counts.logprob_passes += passes
        probe.counts.logprob = batch_tokens(args[0], group_of(args[0]))

    def count_train(args, result) -> None:  # args: (model, inputs)
        batch, c = args[1], probe.counts
        t = batch_tokens(batch, group_of(batch))
        c.train = Tokens(
            c.train.body + t.body, c.train.head + t.head, c.train.attended + t.attended
        )
        c.prompt_tokens += int(batch.prompt_mask.sum())
        c.completion_tokens += int(batch.completion_mask.sum())

    trainer.rewards.score = timed(trainer.rewards.score, probe, "scoring")
    trainer._add_policy_logps = timed(trainer._add_policy_logps, probe, "logprobs", count_logprobs)
    trainer.compute_loss = timed(trainer.compute_loss, probe, "forward_backward", count_train)
    backward = trainer.accelerator.backward
    trainer.accelerator.backward = timed(backward, probe, "forward_backward")
    trainer._clip_grad_norm = timed(trainer._clip_grad_norm, probe, "optimizer")


def step_callback(trainer: Any, probe: Probe, records: list[dict[str, Any]]):
    """Resets the probe at each step's start; records its seconds and counts at the end."""
    from transformers import TrainerCallback

    class StepProbe(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            optimizer = trainer.optimizer
            optimizer.step = timed(optimizer.step, probe, "optimizer")

        def on_step_begin(self, args, state, control, **kwargs):
            probe.reset()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_s = time.perf_counter() - self.start
            precision = getattr(trainer, "train_precision", "fp32")  # older checkouts: fp32
            records.append(
                {
                    "step_s": step_s,
                    "seconds": dict(probe.seconds),
                    "counts": probe.counts,
                    "train_precision": precision,
                }
            )

        def on_log(self, args, state, control, logs=None, **kwargs):
            if records and logs and "loss" in logs:
                keys = ("timing/generate_s", "timing/reward_s", "timing/train_s")
                records[-1]["trainer_timing"] = {k: logs[k] for k in keys if k in logs}

    return StepProbe()


# --- one config: run, summarise ------------------------------------------------------------------
def child_opts(opts: argparse.Namespace, config: str) -> argparse.Namespace:
    """The opts vs_trl's child would get for our trainer on `config` (vs_trl's own parser)."""
    from vs_trl import parse_args as vs_trl_args

    new_tokens = opts.max_new_tokens or CONFIGS[config]["max_new_tokens"]
    return vs_trl_args(["--child", "--trainer", "ours", "--config", config,
                        "--model-dir", str(opts.model_dir), "--steps", str(opts.steps),
                        "--warmup", str(opts.warmup), "--shots", str(opts.shots),
                        "--max-new-tokens", str(new_tokens),
                        "--num-generations", str(opts.num_generations),
                        "--prompts-per-step", str(opts.prompts_per_step),
                        "--ours-train-precision", opts.train_precision])  # fmt: skip


def run_steps(opts: argparse.Namespace, config: str) -> tuple[list[dict], ModelShape, torch.dtype]:
    """Train warmup + steps steps of `config`; the measured steps' records."""
    child = child_opts(opts, config)
    dataset = build_dataset(
        config, (child.warmup + child.steps) * child.prompts_per_step, child.shots
    )
    probe, records = Probe(), []
    with tempfile.TemporaryDirectory() as out_dir, engine_wrapped(probe):
        trainer = build_trainer(child, dataset, out_dir)
        policy = trainer.accelerator.unwrap_model(trainer.model)
        shape, dtype = model_shape(policy), next(policy.parameters()).dtype
        wrap_trainer(trainer, probe)
        trainer.add_callback(step_callback(trainer, probe, records))
        trainer.train()
    return records[child.warmup :], shape, dtype


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def summarise(records: list[dict], shape: ModelShape, dtype: torch.dtype, limits: Limits) -> dict:
    """Median seconds and work per phase, each phase's roofline, the furthest and largest gap."""
    works = [
        phase_work(shape, r["counts"], dtype, r.get("train_precision") == "bf16") for r in records
    ]
    step_s = median([r["step_s"] for r in records])
    phases = {}
    for name in PHASES:
        seconds = median([r["seconds"][name] for r in records])
        work = Work(
            flops=median([w[name].flops for w in works]),
            bytes=median([w[name].bytes for w in works]),
            dtype=works[0][name].dtype,
            bf16_flops=median([w[name].bf16_flops for w in works]),
        )
        share = seconds / step_s if step_s else 0.0
        line = {
            "seconds": seconds,
            "share": share,
            **asdict(work),
            **roofline(seconds, work, limits),
        }
        line["gap"] = None if line["fraction"] is None else share * (1 - line["fraction"])
        phases[name] = line
    limited = {k: v for k, v in phases.items() if v["fraction"] is not None}
    counted = [asdict(r["counts"]) for r in records]
    return {
        "step_s": step_s,
        "phases": phases,
        "unattributed_s": median([r["step_s"] - sum(r["seconds"].values()) for r in records]),
        "furthest": min(limited, key=lambda k: limited[k]["fraction"]) if limited else None,
        "largest_gap": max(limited, key=lambda k: limited[k]["gap"]) if limited else None,
        "counts": counted,
        "trainer_timing": [r.get("trainer_timing", {}) for r in records],
        "model": asdict(shape),
        "policy_dtype": str(dtype).removeprefix("torch."),
    }


# --- the report --------------------------------------------------------------------------------
def work_text(line: dict) -> tuple[str, str, str]:
    """(work, achieved rate, limit) of a phase line, in the units of its limit."""
    if line["limit"] is None:
        return "-", "-", "-"
    if line["limit"] == "memory":
        return (f"{line['bytes'] / 1e9:.3f} GB", f"{line['rate'] / 1e9:.1f} GB/s",
                f"triad {line['limit_rate'] / 1e9:.1f} GB/s")  # fmt: skip
    return (f"{line['flops'] / 1e9:.2f} GFLOP", f"{line['rate'] / 1e9:.1f} GFLOP/s",
            f"{line['limit']} {line['limit_rate'] / 1e9:.0f} GFLOP/s")  # fmt: skip


def format_table(config: str, result: dict) -> str:
    head = (f"{'phase':<17}{'s':>8}{'share':>7}{'work':>14}{'rate':>17}{'limit':>26}"
            f"{'frac':>7}{'gap':>7}")  # fmt: skip
    lines = [f"{config}: step {result['step_s']:.3f} s", head]
    for name, line in result["phases"].items():
        work, rate, limit = work_text(line)
        frac = "-" if line["fraction"] is None else f"{line['fraction']:.2f}"
        gap = "-" if line["gap"] is None else f"{line['gap']:.2f}"
        lines.append(f"{name:<17}{line['seconds']:>8.3f}{line['share']:>7.1%}{work:>14}{rate:>17}"
                     f"{limit:>26}{frac:>7}{gap:>7}")  # fmt: skip
    lines.append(f"{'unattributed':<17}{result['unattributed_s']:>8.3f}")
    lines.append(
        f"furthest from its limit: {result['furthest']}; largest gap: {result['largest_gap']}"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["short", "long"])
    p.add_argument("--steps", type=int, default=3, help="measured steps (median per phase)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    p.add_argument("--model-dir", default=None, help="local model dir (default: embedded SmolLM2)")
    p.add_argument("--out", default="benchmarks/results/roofline.json")
    p.add_argument("--shots", type=int, default=4, help="GSM8K shots in the long prompt")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override the config's")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--prompts-per-step", type=int, default=2, help="rows per step = this x G")
    p.add_argument("--triad-mib", type=int, default=None,
                   help="the triad's 3 arrays together (default 4x L3, >= 256 MiB)")  # fmt: skip
    p.add_argument("--matmul-n", type=int, default=2048, help="the peak matmul's size")
    p.add_argument("--train-precision", default="default", choices=["default", "fp32", "bf16"],
                   help="ours: train_precision; 'default': the config's default")  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    opts = parse_args(argv)
    if opts.model_dir is None:
        from grpo_plugin.models.embedded import EMBEDDED_NAME, resolve_model_path

        opts.model_dir = resolve_model_path(EMBEDDED_NAME)
    triad = opts.triad_mib * 2**20 if opts.triad_mib else default_triad_bytes()
    limits = measure_limits(triad, opts.matmul_n)
    report: dict[str, Any] = {
        "cpu": cpu_name(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model_dir": str(opts.model_dir),
        "warmup_steps": opts.warmup,
        "measured_steps": opts.steps,
        "limits": {
            "triad_gbps": limits.bandwidth / 1e9,
            "triad_bytes": triad,
            "matmul_n": opts.matmul_n,
            **{f"{d}_gflops": v / 1e9 for d, v in limits.peak.items()},
        },
        "results": {},
    }
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for config in opts.configs:
        records, shape, dtype = run_steps(opts, config)
        report["results"][config] = summarise(records, shape, dtype, limits)
        out.write_text(json.dumps(report, indent=2))  # rewritten after each config
        print(format_table(config, report["results"][config]))
    print(f"limits: triad {limits.bandwidth / 1e9:.1f} GB/s, "
          + ", ".join(f"{d} {v / 1e9:.0f} GFLOP/s" for d, v in limits.peak.items()))  # fmt: skip
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
