"""What the worker process for the user's code costs (`rollout/isolation.py`, docs/rewards.md).

    python benchmarks/user_code_worker.py                # the demo's rollout: 64 completions
    python benchmarks/user_code_worker.py --rounds 200   # more rounds for the median

Measured, in one process, alternating round by round:
- a reward call through `RewardScorer` in this process and in the worker, with the same rollout
  (a TRL-style reward over chat completions: the payload is what crosses the boundary);
- one round of tool calls in this process and in the worker (`run_calls`);
- forking the worker, at this script's size and after loading the embedded SmolLM2-135M with LoRA
  (the trainer forks before the model loads; a worker forked again after a timeout forks the
  loaded process), and the worker's own memory (its unique pages, from /proc/PID/smaps_rollup).
Each figure is the median over `--rounds`; the CPU is named in the output.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from grpo_plugin.rollout import isolation
from grpo_plugin.rollout.tools import Tool, run_calls, toolbox
from grpo_plugin.rollout.types import ToolCall
from grpo_plugin.training.rewards.scoring import RewardChecks, RewardScorer


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


def load_policy() -> object:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_plugin.models import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path("embedded:smollm2-135m-instruct")
    )
    return get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--chars", type=int, default=800)
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
          f"torch threads {torch.get_num_threads()}")  # fmt: skip
    time_rewards(args)
    time_tools(args)
    time_fork("this script", min(args.rounds, 20))
    policy = load_policy()  # noqa: F841 - held, so the fork copies a loaded process
    time_fork("after loading SmolLM2-135M + LoRA", min(args.rounds, 20))


if __name__ == "__main__":
    main()
