"""`recipes/tool_use.yaml` against TRL 1.16 running the same tool task with `tools=` (issue 28).

    python benchmarks/tool_use_vs_trl.py [--steps 4] [--warmup 1] [--out FILE]
        [--ours-rollout-precision policy|auto|bf16|fp16]

Both trainers get the recipe's model (the embedded SmolLM2-135M-Instruct), its LoRA adapter,
its data (the 128 training prompts with their system prompt and two tool-calling shots), its
multiply tool, its reward (`last_integer`) and its settings (G=8, 16 completions per step,
64 completion tokens for the whole exchange, temperature 0.7, one round of tool calls,
`loss_type="dapo"`, beta 0, lr 3e-4 constant), with `gradient_checkpointing=False` and
`shuffle_dataset=False` for both (step k sees the same prompts). Each runs alone, one after the
other, in its own subprocess (2 threads): `--warmup` steps, then `--steps` measured ones.

SmolLM2's own chat template does not render tools, and TRL needs one that does: TRL's child gets
SmolLM2's tokenizer with TRL's own Qwen2.5 template, which writes tools, calls
(`<tool_call>{...}</tool_call>`) and results in ChatML exactly as ours does for SmolLM2
(`tool_chat_template="chatml"`). The two prompts differ in the wording of the tool preamble only.

Per trainer: the median wall seconds per optimizer step (`on_step_begin` to `on_step_end`),
the share of completions that called the tool, the mean completion length and the peak RSS.
The headline is the ratio of the medians, ours / TRL.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "@@TOOLBENCH "


def recipe_parts() -> dict[str, Any]:
    """The tool-use recipe's data, tool, reward and settings (the one source for both)."""
    sys.path.insert(0, str(ROOT / "recipes"))
    from tool_use_tools import multiply

    from grpo_plugin.app.data import load_prompt_datasets
    from grpo_plugin.app.recipe import load_recipe
    from reward_fns import get as get_reward

    recipe = load_recipe(ROOT / "recipes" / "tool_use.yaml")
    train, _ = load_prompt_datasets(recipe.args.dataset)
    c = recipe.config
    settings = {
        "num_generations": c.num_generations,
        "per_device_train_batch_size": c.per_device_train_batch_size,
        "max_completion_length": c.max_completion_length,
        "temperature": c.temperature,
        "max_tool_calling_iterations": c.max_tool_calling_iterations,
        "loss_type": c.loss_type,
        "beta": c.beta,
        "learning_rate": c.learning_rate,
        "lr_scheduler_type": "constant",
        "gradient_checkpointing": False,
        "shuffle_dataset": False,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 0,
        "dataloader_num_workers": 0,
        "logging_steps": 1,
    }
    return {"data": train, "tool": multiply, "reward": get_reward("last_integer"),
            "lora": recipe.args.lora, "settings": settings}  # fmt: skip


class StepClock:
    """A TrainerCallback-like recorder of each step's wall seconds."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, *args, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, *args, **kwargs):
        self.seconds.append(time.perf_counter() - self._start)


def run_child(trainer_name: str, steps: int, precision: str) -> dict[str, Any]:
    import torch
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback

    from grpo_plugin.models.embedded import embedded_cache_path

    torch.set_num_threads(2)
    parts = recipe_parts()
    model_dir = str(embedded_cache_path())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = {
        **parts["settings"],
        "max_steps": steps,
        "output_dir": f"/tmp/toolbench-{trainer_name}",
    }
    if trainer_name == "trl":
        from trl import GRPOConfig, GRPOTrainer

        template = resources.files("trl") / "chat_templates" / "qwen2_5.jinja"
        tokenizer.chat_template = template.read_text()
        settings.update(use_vllm=False, mask_truncated_completions=False)
    else:
        from grpo_plugin import GRPOConfig, GRPOTrainer

        settings.update(tool_chat_template="chatml", rollout_precision=precision)
    clock = StepClock()
    callback = type("Clock", (TrainerCallback,), {"on_step_begin": clock.on_step_begin,
                                                   "on_step_end": clock.on_step_end})()  # fmt: skip
    trainer = GRPOTrainer(
        model_dir,
        parts["reward"],
        args=GRPOConfig(**settings),
        train_dataset=parts["data"],
        processing_class=tokenizer,
        peft_config=LoraConfig(task_type="CAUSAL_LM", **parts["lora"]),
        tools=[parts["tool"]],
        callbacks=[callback],
    )
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    calls = [
        e.get("tools/call_frequency") for e in logs if e.get("tools/call_frequency") is not None
    ]
    return {
        "step_s": clock.seconds,
        "tool_call_frequency": calls,
        "mean_length": [e.get("completions/mean_length") for e in logs],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def summarise(name: str, record: dict[str, Any], warmup: int) -> dict[str, Any]:
    measured = record["step_s"][warmup:]
    calls = record["tool_call_frequency"][warmup:]
    return {
        "median_step_s": round(statistics.median(measured), 2),
        "steps_s": [round(s, 2) for s in record["step_s"]],
        "tool_call_frequency": round(statistics.mean(calls), 3) if calls else None,
        "mean_length": record["mean_length"],
        "peak_rss_mb": round(record["peak_rss_mb"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--ours-rollout-precision", default="policy")
    p.add_argument("--out", default=None)
    p.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    opts = p.parse_args()
    total = opts.warmup + opts.steps
    if opts.child:
        print(PREFIX + json.dumps(run_child(opts.child, total, opts.ours_rollout_precision)))
        return
    report: dict[str, Any] = {"steps": opts.steps, "warmup": opts.warmup}
    for name in ("ours", "trl"):
        argv = [sys.executable, __file__, "--child", name, "--steps", str(opts.steps),
                "--warmup", str(opts.warmup), "--ours-rollout-precision",
                opts.ours_rollout_precision]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith(PREFIX)]
        if done.returncode != 0 or not lines:
            sys.stderr.write(done.stderr[-3000:])
            raise SystemExit(f"{name} child failed (exit {done.returncode})")
        report[name] = summarise(name, json.loads(lines[-1][len(PREFIX) :]), opts.warmup)
        print(name, report[name], flush=True)
    report["step_ratio"] = round(
        report["ours"]["median_step_s"] / report["trl"]["median_step_s"], 3
    )
    report["memory_ratio"] = round(report["ours"]["peak_rss_mb"] / report["trl"]["peak_rss_mb"], 3)
    print(json.dumps(report, indent=2))
    if opts.out:
        Path(opts.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
