"""A/B of `overlap_scoring`: one rollout's generate + score wall time, scored after the decode vs
group by group while later groups decode.

    python benchmarks/overlap_scoring.py                  # a judge that waits 20 ms per completion
    python benchmarks/overlap_scoring.py --judge-ms 0     # a cheap reward: what the thread costs
    python benchmarks/overlap_scoring.py --device cuda    # where it is meant to pay (gpu_check.py)

The embedded SmolLM2-135M with LoRA r=16, 8 arithmetic prompts x G=8 = 64 completions of up to
48 tokens at temperature 0.7. The reward stands in for a remote judge or a sandbox run: it
sleeps `--judge-ms` per completion (releasing the interpreter lock, as waiting on a socket or a
child process does) and returns last-integer correctness. A and B alternate round by round on
the same prompts and draws; the result is the median of the per-round ratios, and whether the
rewards are identical.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time

import torch


def judge(ms: float):
    def judge_reward(prompts, completions, answer, **kwargs):
        time.sleep(ms / 1000 * len(completions))
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        found = [re.findall(r"-?\d+", t) for t in texts]
        return [float(bool(f) and f[-1] == str(a)) for f, a in zip(found, answer)]

    return judge_reward


def build(opts, out_dir: str):
    from peft import LoraConfig

    from grpo_plugin import GRPOConfig, GRPOTrainer
    from grpo_plugin.app.data import arithmetic_dataset
    from grpo_plugin.models.embedded import EMBEDDED_NAME

    train = arithmetic_dataset(n_train=64, n_eval=8)[0]
    args = GRPOConfig(output_dir=out_dir, num_generations=8, per_device_train_batch_size=64,
                      max_completion_length=48, temperature=0.7, use_cpu=opts.device == "cpu", seed=0,
                      report_to="none", disable_tqdm=True)  # fmt: skip
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(EMBEDDED_NAME, judge(opts.judge_ms), args=args, train_dataset=train,
                          peft_config=lora)  # fmt: skip
    return trainer, [dict(train[i]) for i in range(8)]


def one_rollout(trainer, rows, overlapped: bool):
    trainer.args.overlap_scoring = overlapped
    trainer._metrics.values.clear()
    start = time.perf_counter()
    rollout = trainer._sample_and_score(rows, trainer._rollout_key)
    wall = time.perf_counter() - start
    sums = {k: sum(v) for k, v in trainer._metrics.values.items() if k.startswith("timing/")}
    return wall, sums, rollout.rewards


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--judge-ms", type=float, default=20.0, help="reward wait per completion")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    opts = p.parse_args()
    with tempfile.TemporaryDirectory() as out_dir:
        trainer, rows = build(opts, out_dir)
        one_rollout(trainer, rows, False)  # warm-up
        ratios, same = [], True
        for r in range(opts.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            out = {flag: one_rollout(trainer, rows, flag) for flag in order}
            ratios.append(out[True][0] / out[False][0])
            same &= torch.equal(out[True][2], out[False][2])
            for flag in (False, True):
                wall, sums, _ = out[flag]
                parts = ", ".join(f"{k.removeprefix('timing/')} {v:.2f}" for k, v in sums.items())
                print(f"round {r} overlap={flag}: {wall:.2f} s ({parts})", flush=True)
    print(f"overlapped/after wall time: median {statistics.median(ratios):.3f} over "
          f"{opts.rounds} rounds (judge {opts.judge_ms:g} ms per completion); "
          f"rewards identical: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
