"""What scoring with code_tests costs inside a training run, against what the sandbox alone does.

    python benchmarks/code_scoring.py outputs/code               # a finished `grpo-plugin train code`
    python benchmarks/code_scoring.py outputs/code --programs 16 --rounds 5

Two parts:

1. **The run** (its `metrics.jsonl`): per step, `timing/reward_s` (the sandbox scoring the step's
   completions) against the step (`step_time`); the
   median share and the largest, and the median seconds per completion.
2. **The sandbox alone**, on this machine now: `--programs` correct and wrong functions (the
   recipe's step size by default) scored in one `code_tests` call with its default workers (the
   recipe's case), and one at a time (`workers=1`: each program's start-up latency, since a
   program of a few lines runs in microseconds once started). Median of `--rounds`, after one
   warm-up call that pays the one-time probe.

Run it when the machine is quiet: the two parts are only comparable on an idle CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

TESTS = (
    "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(2, 2) == 4\nassert add(0, 0) == 0"
)


def run_shares(run: Path, completions: int) -> dict[str, float]:
    """The scoring's share of each logged step of a run, and its seconds per completion."""
    shares, per_completion = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "timing/reward_s" not in row:
            continue
        parts = row["timing/generate_s"] + row["timing/reward_s"] + row["timing/train_s"]
        shares.append(row["timing/reward_s"] / row.get("step_time", parts))
        per_completion.append(row["timing/reward_s"] / completions)
    if not shares:
        raise SystemExit(f"{run}/metrics.jsonl has no timing/reward_s: not a training run's")
    out = {
        "steps": len(shares),
        "median_share": statistics.median(shares),
        "max_share": max(shares),
    }
    return {**out, "median_s_per_completion": statistics.median(per_completion)}


def sandbox_alone(programs: int, rounds: int) -> dict[str, float]:
    """Seconds per program: batched (the default workers) and one at a time."""
    import reward_fns

    codes = [f"```python\ndef add(a, b):\n    return a + b + {i % 2}\n```" for i in range(programs)]
    timings: dict[str, list[float]] = {"batched": [], "one_at_a_time": []}
    for workers, key in ((None, "batched"), (1, "one_at_a_time")):
        fn = reward_fns.get("code_tests", timeout_s=2.0, isolation="strict", workers=workers)
        fn(prompts=["p"], completions=codes[:1], tests=[TESTS])  # warm-up: the probe
        for _ in range(rounds):
            start = time.perf_counter()
            scores = fn(prompts=["p"] * programs, completions=codes, tests=[TESTS] * programs)
            timings[key].append((time.perf_counter() - start) / programs)
            assert scores == [1.0 if i % 2 == 0 else 0.0 for i in range(programs)], scores
    return {f"{key}_s_per_program": statistics.median(v) for key, v in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished run's output_dir")
    parser.add_argument("--programs", type=int, default=16, help="programs per call (a step's)")
    parser.add_argument("--completions", type=int, default=16, help="the run's per step")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = {
        "run": run_shares(args.run, args.completions),
        "sandbox": sandbox_alone(args.programs, args.rounds),
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
