"""What the worker process for the user's code costs (`user_code/worker.py`, docs/rewards.md).

    python benchmarks/user_code_worker.py                # the demo's rollout: 64 completions
    python benchmarks/user_code_worker.py --rounds 200   # more rounds for the median

Measured, in one process, alternating round by round:
- a reward call through `RewardScorer` in this process and in the worker, with the same rollout
  (a TRL-style reward over chat completions: the payload is what crosses the boundary);
- one round of tool calls in this process and in the worker (`run_calls`);
- forking the worker, at this script's size and after training the embedded SmolLM2-135M with
  LoRA (the trainer forks before the model loads; a worker forked again after a timeout forks the
  loaded process);
- the worker's private memory (from /proc/PID/smaps_rollup) after `--train-steps` steps of the
  demo's shape with a reward of the user's: what copy-on-write made it hold.
Each figure is the median over `--rounds`; the CPU is named in the output.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_name

from grpo_plugin.rollout.tool_calls import Tool, run_calls, toolbox
from grpo_plugin.rollout.types import ToolCall
from grpo_plugin.scoring.scorer import RewardChecks, RewardScorer
from grpo_plugin.user_code import worker as isolation


def last_number(prompts, completions, answer, **kwargs):
    texts = [c[-1]["content"] for c in completions]
    return [float(t.rsplit(" ", 1)[-1] == str(a)) for t, a in zip(texts, answer)]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def rollout(n: int, chars: int) -> tuple:
    prompts = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(n)]
    text = ("Let me think step by step. " * (chars // 27 + 1))[:chars]
    completions = [[{"role": "assistant", "content": f"{text} {2 * i}"}] for i in range(n)]
    ids = [list(range(chars // 4)) for _ in range(n)]
    return prompts, completions, ids, {"answer": [2 * i for i in range(n)]}


def ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e3:.2f} ms"


def time_rewards(args) -> None:
    prompts, completions, ids, columns = rollout(args.completions, args.chars)
    scorers = {
        isolate: RewardScorer((last_number,), torch.ones(1), RewardChecks(600.0, False, isolate))
        for isolate in (False, True)
    }
    scorers[True].score_columns(prompts, completions, ids, columns)  # the worker forks here
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for isolate, scorer in scorers.items():
            start = time.perf_counter()
            scorer.score_columns(prompts, completions, ids, columns)
            times[isolate].append(time.perf_counter() - start)
    print(f"reward call, {args.completions} completions of {args.chars} chars: "
          f"in process {ms(times[False])}, in the worker {ms(times[True])}")  # fmt: skip


def time_tools(args) -> None:
    box = toolbox([Tool.of(add)])
    calls = [[ToolCall("add", {"a": i, "b": 1})] for i in range(args.completions)]
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for isolate in (False, True):
            start = time.perf_counter()
            run_calls(calls, [box] * len(calls), timeout=10.0, max_chars=1000, isolate=isolate)
            times[isolate].append(time.perf_counter() - start)
    print(f"tool round, {args.completions} calls: in process {ms(times[False])}, "
          f"in the worker {ms(times[True])}")  # fmt: skip


def unique_mb(pid: int) -> float:
    """The worker's private pages (what it costs beyond the pages it shares with the trainer)."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/smaps_rollup") if ":" in line)
    private = ("Private_Clean", "Private_Dirty")
    return sum(int(fields[k].split()[0]) for k in private if k in fields) / 1024


def time_fork(label: str, rounds: int) -> None:
    worker = isolation.UserWorker()
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        worker.prepare([last_number, object()])  # a new object: a new fork
        seconds.append(time.perf_counter() - start)
    reply = worker.run(_pid_job, (last_number,), None, 10.0)
    print(f"fork the worker ({label}): {ms(seconds)}; its private memory {unique_mb(reply.result):.0f} MB")  # fmt: skip
    worker.stop()


def _pid_job(targets, payload, emit) -> int:
    import os

    return os.getpid()


def answer_reward(prompts, completions, answer, **kwargs):
    texts = [c[-1]["content"] for c in completions]
    return [float(str(a) in t) for t, a in zip(texts, answer)]


def time_training(steps: int) -> None:
    """The worker's private memory after `steps` demo-shaped steps of the embedded model (what
    copy-on-write made it hold while the trainer ran), next to the trainer's own."""
    import tempfile

    from peft import LoraConfig

    from grpo_plugin import GRPOConfig, GRPOTrainer
    from grpo_plugin.app.data import arithmetic_dataset
    from grpo_plugin.models.embedded import EMBEDDED_NAME

    train = arithmetic_dataset(n_train=64, n_eval=8)[0]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, num_generations=4, per_device_train_batch_size=16,
                          max_completion_length=24, max_steps=steps, report_to="none",
                          disable_tqdm=True, save_strategy="no")  # fmt: skip
        lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
        trainer = GRPOTrainer(EMBEDDED_NAME, answer_reward, args=args, train_dataset=train,
                              peft_config=lora)  # fmt: skip
        trainer.train()
        reply = isolation.shared_worker().run(_pid_job, (answer_reward,), None, 10.0)
        self_mb = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
        print(f"after {steps} steps of SmolLM2-135M + LoRA: the worker's private memory "
              f"{unique_mb(reply.result):.0f} MB, the trainer's resident memory {self_mb:.0f} MB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--chars", type=int, default=800)
    parser.add_argument("--train-steps", type=int, default=8)
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d')}, {cpu_name()}, torch threads {torch.get_num_threads()}")
    time_rewards(args)
    time_tools(args)
    time_fork("this script", min(args.rounds, 20))
    time_training(args.train_steps)
    time_fork("after training: a worker replaced mid-run", min(args.rounds, 20))


if __name__ == "__main__":
    main()
