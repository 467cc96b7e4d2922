"""The demo's training time alone and beside a busy process (issue 47: a laptop is rarely idle).

    python benchmarks/busy_machine.py                         # ours: the demo, 8 steps, 4 cases
    python benchmarks/busy_machine.py --cases alone busy --env OMP_WAIT_POLICY=PASSIVE
    python benchmarks/busy_machine.py --trl                   # + TRL 1.16 on `short`, same load
    python benchmarks/busy_machine.py --full                  # the whole demo (`make demo`)

Each case runs `grpo-plugin train recipes/arithmetic.yaml --max_steps N --eval_strategy no` (with
`--full`: the recipe as `make demo` runs it) in a fresh output folder and reads the training
seconds from its `eval.json` (the model load and the evaluations before and after are not
counted there; the wall time of the whole command is printed too). A "busy" case first starts the busy process the
issue measured beside the run (`python3 -c "while True: pass"`, one core's worth of work at the
same priority) and stops it when the run ends. The cases:

- alone / busy: the default, `torch_threads: auto` (threads chosen from the cores that are free);
- alone-2 / busy-2: two torch threads whatever the load (`--torch_threads 2`, before issue 47);
- alone-1 / busy-1: one thread (`--torch_threads 1`).

`--trl` adds TRL 1.16 and ours on `vs_trl.py`'s `short` work (SmolLM2-135M + LoRA, 16 completions
of up to 24 tokens), one trainer after the other (`--sequential`), alone and beside the same busy
process: TRL's own slowdown is the reference. TRL runs with torch's default thread count (one
per core), ours with `torch_threads: auto`, as the CLI's recipes do.
Every figure names the CPU; run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
# name -> (beside the busy process, --torch_threads; None: the recipe's `auto`)
CASES = {
    "alone": (False, None),
    "busy": (True, None),
    "alone-2": (False, 2),
    "busy-2": (True, 2),
    "alone-1": (False, 1),
    "busy-1": (True, 1),
}


class BusyProcess:
    """One core's worth of pure-Python spinning, started and stopped around a case."""

    def __enter__(self) -> BusyProcess:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)  # let the scheduler see it before the run looks at the load
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def train_seconds(opts, threads: int | None, env_extra: dict[str, str]) -> dict:
    """One demo run in a fresh folder; its training seconds and the thread count it used."""
    with tempfile.TemporaryDirectory(prefix="busy-bench-") as out:
        cmd = [str(Path(sys.executable).parent / "grpo-plugin"), "train", opts.recipe,
               "--report", "false", "--output_dir", out]  # fmt: skip
        if not opts.full:
            cmd += ["--max_steps", str(opts.steps), "--eval_strategy", "no"]
        if threads is not None:
            cmd += ["--torch_threads", str(threads)]
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | env_extra
        started = time.perf_counter()
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-3000:]}")
        record = json.loads((Path(out) / "eval.json").read_text())
        used = [ln for ln in run.stderr.splitlines() if "torch thread" in ln]
        accuracy = [record.get(k, {}).get("accuracy") for k in ("before", "after")]
        return {"train_s": record["train_seconds"], "wall_s": time.perf_counter() - started,
                "accuracy": accuracy, "threads_line": used[-1] if used else None}  # fmt: skip


def run_case(opts, name: str, env_extra: dict[str, str]) -> dict:
    busy, threads = CASES[name]
    runs = []
    for _ in range(opts.repeats):
        if busy:
            with BusyProcess():
                result = train_seconds(opts, threads, env_extra)
        else:
            result = train_seconds(opts, threads, env_extra)
        runs.append(result)
        print(f"  {name}: {result['train_s']:.1f} s of training, {result['wall_s']:.1f} s in all"
              f", accuracy {result['accuracy']}  ({result['threads_line']})", flush=True)  # fmt: skip
    return {"train_s": statistics.median(r["train_s"] for r in runs), "runs": runs}


def trl_reference(opts) -> dict:
    """TRL and ours on `short`, sequentially, alone and beside the busy process."""
    result = {}
    for load in ("alone", "busy"):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [sys.executable, str(ROOT / "benchmarks" / "vs_trl.py"), "--configs", "short",
                   "--sequential", "--steps", str(opts.trl_steps), "--out", out.name,
                   "--ours-torch-threads", "auto", "--trl-precisions", "fp32"]  # fmt: skip
            if load == "busy":
                with BusyProcess():
                    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
            else:
                subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
            short = json.loads(Path(out.name).read_text())["results"]["short"]
        result[load] = {n: short[n]["median_step_s"] for n in ("ours", "trl")}
        print(f"  short {load}: ours {result[load]['ours']:.2f} s/step, "
              f"TRL {result[load]['trl']:.2f} s/step", flush=True)  # fmt: skip
    result["slowdown"] = {n: result["busy"][n] / result["alone"][n] for n in ("ours", "trl")}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="recipes/arithmetic.yaml")
    p.add_argument("--steps", type=int, default=8, help="training steps per run")
    p.add_argument("--repeats", type=int, default=1, help="runs per case (the median is kept)")
    p.add_argument("--cases", nargs="*", choices=sorted(CASES), default=["alone", "busy"])
    p.add_argument(
        "--full",
        action="store_true",
        help="the recipe as it is (all its steps and evaluations), not --steps",
    )
    p.add_argument("--env", nargs="*", default=[], help="NAME=VALUE set for every run")
    p.add_argument("--trl", action="store_true", help="also TRL vs ours on `short`, same load")
    p.add_argument("--trl-steps", type=int, default=4)
    p.add_argument("--out", default=None, help="write the figures here as JSON")
    opts = p.parse_args()
    env_extra = dict(item.split("=", 1) for item in opts.env)
    cpu = f"{cpu_name()} {os.cpu_count()} cores"
    report = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "env": env_extra,
              "steps": None if opts.full else opts.steps, "cases": {}}  # fmt: skip
    work = "all the steps" if opts.full else f"{opts.steps} steps"
    print(f"{report['date']}, {report['cpu']}, {work} of {opts.recipe}", flush=True)
    for name in opts.cases:
        report["cases"][name] = run_case(opts, name, env_extra)
    cases = report["cases"]
    for threads in ("", "-2", "-1"):
        if f"alone{threads}" in cases and f"busy{threads}" in cases:
            ratio = cases[f"busy{threads}"]["train_s"] / cases[f"alone{threads}"]["train_s"]
            report[f"slowdown{threads}"] = ratio
            print(f"busy/alone{threads}: {ratio:.2f}x", flush=True)
    if opts.trl:
        report["trl_short"] = trl_reference(opts)
    if opts.out:
        Path(opts.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
