"""How fast a large run's report.html opens: a synthetic run folder, its report, headless Chromium.

    python benchmarks/report_load.py                        # 1,000 steps x 64 completions
    python benchmarks/report_load.py --steps 200 --chars 1200

The run: `--steps` completions tables of `--groups` prompts x `--group-size` completions of about
`--chars` characters each (two reward functions, advantages), a metrics.jsonl line per step with
30 metrics, an eval.json with a curve. The report is written with `write_report` (timed), then
opened `--repeats` times in headless Chromium (a fresh profile each time); the page stores
`performance.now()` when its first render is done (`data-rendered-ms`: from navigation start,
so HTML parsing, the JSON parse and the render of the last step are all in it).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

WORDS = "the answer is so we add carry then sum each digit and check result step".split()
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def text(rng: random.Random, chars: int) -> str:
    words = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS) if rng.random() > 0.1 else str(rng.randint(0, 999)))
    return " ".join(words)


def synthetic_run(root: Path, opts) -> Path:
    from grpo_plugin.run import rundir

    rng = random.Random(0)
    g = opts.group_size
    info = {"base_model": "synthetic", "objective": {"num_generations": g, "loss_type": "dapo"},
            "reward_funcs": [{"name": "correct", "weight": 1.0}, {"name": "format", "weight": 0.5}],
            "global_step": opts.steps}  # fmt: skip
    (root / rundir.RUN_INFO_FILE).write_text(json.dumps(info))
    with (root / rundir.METRICS_FILE).open("w") as fh:
        for step in range(1, opts.steps + 1):
            row = {"step": step, **{f"metric/{k}": rng.random() for k in range(30)}}
            fh.write(json.dumps(row) + "\n")
    curve = [{"step": s, "accuracy": rng.random(), "ci95": [0.1, 0.9], "n": 64}
             for s in range(0, opts.steps + 1, 100)]  # fmt: skip
    evaluation = {"before": {"accuracy": 0.4, "n": 64}, "after": {"accuracy": 0.7, "n": 64}}
    (root / rundir.EVAL_FILE).write_text(json.dumps({**evaluation, "curve": curve}))
    for step in range(opts.steps):
        records: dict[str, list] = {k: [] for k in ("step", "prompt", "completion", "reward",
                                                    "advantage", "rewards/correct",
                                                    "rewards/format")}  # fmt: skip
        for _ in range(opts.groups):
            prompt = [{"role": "user", "content": text(rng, 80)}]
            for _ in range(g):
                correct, form = float(rng.random() > 0.5), float(rng.random() > 0.3)
                records["step"].append(step)
                records["prompt"].append(prompt)
                records["completion"].append(
                    [{"role": "assistant", "content": text(rng, opts.chars)}]
                )
                records["reward"].append(correct + 0.5 * form)
                records["advantage"].append(rng.gauss(0, 1))
                records["rewards/correct"].append(correct)
                records["rewards/format"].append(form)
        rundir.write_completions_parquet(rundir.completions_file(root, step), records)
    return root


def open_ms(browser: str, page: Path) -> int:
    profile = tempfile.mkdtemp(prefix="report-load-")
    try:
        command = [browser, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
        dom = subprocess.run(command, capture_output=True, text=True, timeout=300).stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    found = re.search(r'data-rendered-ms="(\d+)"', dom)
    if found is None:
        raise SystemExit("the page did not finish rendering (no data-rendered-ms)")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--chars", type=int, default=300, help="characters per completion")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--browser", default=shutil.which("chromium") or "chromium")
    opts = parser.parse_args()
    from grpo_plugin.publish.report import write_report

    with tempfile.TemporaryDirectory() as tmp:
        run = synthetic_run(Path(tmp), opts)
        start = time.perf_counter()
        page = write_report(run)
        written = time.perf_counter() - start
        times = [open_ms(opts.browser, page) for _ in range(opts.repeats)]
        per_step = opts.groups * opts.group_size
        print(f"{opts.steps} steps x {per_step} completions of ~{opts.chars} chars: "
              f"report.html {page.stat().st_size / 2**20:.1f} MiB, written in {written:.1f} s; "
              f"rendered in the browser after {statistics.median(times)} ms (median of "
              f"{opts.repeats}: {times})")  # fmt: skip


if __name__ == "__main__":
    main()
