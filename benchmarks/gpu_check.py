"""The GPU check, one command: `make gpu-check` (= `bash benchmarks/gpu_check.sh`, which installs
what the GPU image lacks from carried wheels first, then runs this file).

    bash benchmarks/gpu_check.sh --call 1   # on one NVIDIA GPU: tests, demo, qlora (<= 320 s)
    bash benchmarks/gpu_check.sh --call 2   # then vs_trl, big, overlap, decode (<= 420 s)
    python benchmarks/gpu_check.py --device cpu --dry-run   # the same code path on a CPU

Phases, in order. Each runs in its own subprocess under a time limit, so one that fails or hangs
is recorded and the next one still runs:

  1. tests   `pytest -m cuda` (tests/test_cuda.py): generation, the prefix-shared forward, bf16
             with fp32 LoRA adapters, 4-bit QLoRA and the memory autopilot, on the device
  2. demo    recipes/arithmetic.yaml with `bf16=True` on the device: held-out greedy accuracy
             before and after training
  3. qlora   the same recipe on a 4-bit NF4 base with LoRA, 20 steps: s/step, peak memory
  4. vs_trl  benchmarks/vs_trl.py --device cuda on `short` and `long` against TRL, both float32
             (TRL with transformers' generate: there is no vLLM on that image)
  5. big     vs_trl.py --bf16 on a random-weight model of Qwen2.5-1.5B's shape with fixed-length
             completions: speed and memory only
  6. overlap benchmarks/overlap_scoring.py on the device: `overlap_scoring` on and off with a
             judge that waits 20 ms per completion (on a CPU it does not pay: overlap.py)
  7. decode  benchmarks/decode_engine.py on the device: the dynamic loop, the static cache and
             the compiled decode step (`compile_decode`: CUDA graphs there), 16 rows x 128
             tokens: seconds, compile seconds, tokens that differ

Writes OUT/gpu_check.json (every phase's figures, logs named) and OUT/gpu_check.md (one table).
`--dry-run` shrinks every phase (steps, prompts, tokens, the big model's width and depth) but
runs each one through the same functions, so a CPU run proves the script end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PHASES = ("tests", "demo", "qlora", "vs_trl", "big", "overlap", "decode")
# Seconds per phase on the GPU, from the first H200 run (2026-12-04): demo took 152 s, decode 97 s
# (44 s of it compiling); tests 43 s. A device call runs at most 10 minutes and a session has 15
# minutes of device time, so the check is two calls (`--call 1`, `--call 2`) of under 6 and 7.5
# minutes: 740 s together, which leaves room for the machine's start and the packs' transfers.
LIMITS = {"tests": 60, "demo": 170, "qlora": 90, "vs_trl": 150, "big": 100, "overlap": 60,
          "decode": 110}  # fmt: skip
CALLS = {1: ("tests", "demo", "qlora"), 2: ("vs_trl", "big", "overlap", "decode")}
DRY_LIMITS = {"tests": 300, "demo": 400, "qlora": 300, "vs_trl": 400, "big": 300, "overlap": 300,
              "decode": 300}  # fmt: skip
# Qwen2.5-1.5B's shape (its config.json), with random weights: nothing is downloaded.
QWEN_1_5B_SHAPE = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}
DRY_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip


# --- the phases (each runs in a child: `gpu_check.py --phase NAME`) -----------------------------
def recipe_overrides(opts, out_dir: Path, steps: int) -> list[str]:
    flags = ["--output_dir", str(out_dir), "--overwrite_output_dir", "true", "--max_steps",
             str(steps), "--use_cpu", str(opts.device == "cpu").lower()]  # fmt: skip
    if opts.model_dir:
        flags += ["--model", opts.model_dir]
    if opts.dry_run:  # 8 prompts each way, no evaluation during training
        flags += ["--dataset.train_size", "8", "--dataset.eval_size", "8", "--eval_strategy", "no"]
    return flags


def step_seconds(out_dir: Path) -> list[float]:
    """Seconds of each optimizer step from the run's metrics.jsonl (generate + reward + train)."""
    parts = ("timing/generate_s", "timing/reward_s", "timing/train_s")
    steps = []
    for line in (out_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if all(k in row for k in parts):
            steps.append(sum(row[k] for k in parts))
    return steps


def peak_memory_mb(device: str) -> dict[str, float | None]:
    import resource

    import torch

    gpu = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    return {
        "peak_gpu_mb": gpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def phase_demo(opts, work: Path) -> dict[str, Any]:
    from grpo_plugin.app.pipeline import run_recipe

    out = work / "demo"
    steps = 2 if opts.dry_run else 48
    result = run_recipe(REPO / "recipes" / "arithmetic.yaml",
                        ["--bf16", "true", *recipe_overrides(opts, out, steps)])  # fmt: skip
    seconds = step_seconds(out)
    return {
        "steps": len(seconds),
        "accuracy_before": result["before"]["accuracy"],
        "accuracy_after": result["after"]["accuracy"],
        "median_step_s": statistics.median(seconds),
        "total_s": result.get("total_seconds"),
        **peak_memory_mb(opts.device),
    }


def phase_qlora(opts, work: Path) -> dict[str, Any]:
    from grpo_plugin.app.pipeline import run_recipe

    out = work / "qlora"
    steps = 2 if opts.dry_run else 20
    flags = ["--load_in_4bit", "true", "--bf16", str(opts.device == "cuda").lower(),
             "--eval.before", "false", "--eval_strategy", "no"]  # fmt: skip
    run_recipe(REPO / "recipes" / "arithmetic.yaml", [*flags, *recipe_overrides(opts, out, steps)])
    seconds = step_seconds(out)
    return {"steps": len(seconds), "median_step_s": statistics.median(seconds),
            **peak_memory_mb(opts.device)}  # fmt: skip


def phase_big_model(opts, work: Path) -> Path:
    """A random-weight model of Qwen2.5-1.5B's shape (SmolLM2's tokenizer), saved in bf16."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(embedded_dir(opts))
    shape = {**QWEN_1_5B_SHAPE, **(DRY_SHAPE if opts.dry_run else {})}
    config = Qwen2Config(**shape, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    with torch.device(opts.device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    path = work / "qwen2.5-1.5b-shape"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def embedded_dir(opts) -> str:
    if opts.model_dir:
        return opts.model_dir
    from grpo_plugin.models.embedded import EMBEDDED_NAME, resolve_model_path

    return resolve_model_path(EMBEDDED_NAME)


def vs_trl_argv(opts, out: Path, big: bool) -> list[str]:
    # SmolLM2 against TRL in float32, as issue 28's targets are set (TRL 1.16's bf16 `generate` of
    # SmolLM2 stopped on a device-side assert on the first H200, 2026-12-04); the big model in bf16
    argv = [sys.executable, str(REPO / "benchmarks" / "vs_trl.py"), "--device", opts.device,
            "--out", str(out)]  # fmt: skip
    if big:
        argv += ["--bf16", "--configs", "short", "--fixed-length", "--max-new-tokens", "128"]
    else:
        argv += ["--configs", "short", "long", "--model-dir", embedded_dir(opts),
                 "--trl-precisions", "fp32"]  # fmt: skip
    if opts.dry_run:  # one step each, 4 rows of 4 tokens, a 1-shot long prompt
        argv += ["--steps", "1", "--warmup", "0", "--max-new-tokens", "4", "--num-generations",
                 "4", "--prompts-per-step", "1", "--shots", "1"]  # fmt: skip
    else:
        argv += ["--steps", "3", "--warmup", "1"]
    return argv


def phase_vs_trl(opts, work: Path, big: bool = False) -> dict[str, Any]:
    name = "big" if big else "vs_trl"
    argv = vs_trl_argv(opts, work / f"{name}.json", big)
    if big:
        argv += ["--model-dir", str(phase_big_model(opts, work))]
    subprocess.run(argv, check=True, stdout=sys.stderr)  # the harness's table goes to the log
    report = json.loads((work / f"{name}.json").read_text())
    return {config: pair_figures(r) for config, r in report["results"].items()}


def pair_figures(r: dict[str, Any]) -> dict[str, Any]:
    if "failed" in r:
        return {"failed": r["failed"]}
    keep = (
        "median_step_s",
        "median_generate_s",
        "median_train_s",
        "median_tokens_per_s",
        "peak_mb",
    )
    return {
        **{
            f"{name}_{k.removeprefix('median_')}": r[name][k]
            for name in ("ours", "trl")
            for k in keep
        },
        "step_ratio": r["ratio"]["step_time"],
        "memory_ratio": r["ratio"]["peak_memory"],
    }


def phase_tests(opts, work: Path) -> dict[str, Any]:
    env = {**os.environ, "GRPO_TEST_DEVICE": opts.device}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
            str(REPO / "tests")]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    sys.stderr.write(done.stdout + done.stderr)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", done.stdout)}
    if done.returncode != 0:
        raise RuntimeError(f"pytest -m cuda: {counts or done.returncode}")
    return counts


def phase_overlap(opts, work: Path) -> dict[str, Any]:
    rounds = ["--rounds", "1" if opts.dry_run else "2"]
    argv = [sys.executable, str(REPO / "benchmarks" / "overlap_scoring.py"), "--device",
            opts.device, *rounds]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    sys.stderr.write(done.stdout)
    found = re.search(r"median ([\d.]+) .* rewards identical: (\w+)", done.stdout)
    return {"overlapped_over_after": float(found[1]), "rewards_identical": found[2] == "True"}


def phase_decode(opts, work: Path) -> dict[str, Any]:
    size = ["--length", "8", "--group", "2", "--rounds", "1"] if opts.dry_run else [
        "--length", "128", "--rounds", "2"]  # fmt: skip
    out = work / "decode_engine.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "decode_engine.py"), "--device",
            opts.device, *size, "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True)
    sys.stderr.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"decode_engine.py exited {done.returncode}")
    report = json.loads(out.read_text())
    (length,) = [k for k in report if k.startswith("length_")]
    return {f"{engine}_{key}": value for engine, figures in report[length].items()
            for key, value in figures.items()}  # fmt: skip


PHASE_FUNCS = {"tests": phase_tests, "demo": phase_demo, "qlora": phase_qlora,
               "vs_trl": phase_vs_trl, "big": lambda o, w: phase_vs_trl(o, w, big=True),
               "overlap": phase_overlap, "decode": phase_decode}  # fmt: skip


def run_phase_child(opts) -> None:
    """Child mode: run one phase, print its figures as the last line of stdout (JSON)."""
    work = Path(opts.out)
    figures = PHASE_FUNCS[opts.phase](opts, work)
    print("@@PHASE " + json.dumps(figures), flush=True)


# --- the parent: every phase in a child, under its time limit -----------------------------------
def run_phase(opts, name: str, work: Path) -> dict[str, Any]:
    limit = opts.limit.get(name) or (DRY_LIMITS if opts.dry_run else LIMITS)[name]
    log = work / f"{name}.log"
    argv = [sys.executable, str(Path(__file__).resolve()), "--phase", name, *child_flags(opts)]
    start = time.perf_counter()
    with log.open("w") as fh:
        try:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=fh, text=True,
                                  timeout=limit, cwd=REPO)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "seconds": limit, "log": log.name}
    seconds = round(time.perf_counter() - start, 1)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("@@PHASE ")]
    if done.returncode != 0 or not lines:
        tail = log.read_text().strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return {"status": "failed", "seconds": seconds, "log": log.name, "error": tail[0][:300]}
    return {"status": "ok", "seconds": seconds, "log": log.name, **json.loads(lines[-1][8:])}


def child_flags(opts) -> list[str]:
    flags = ["--device", opts.device, "--out", opts.out]
    flags += ["--model-dir", opts.model_dir] if opts.model_dir else []
    return flags + (["--dry-run"] if opts.dry_run else [])


def machine() -> dict[str, Any]:
    import torch

    facts = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch.__version__,
             "cpu_count": os.cpu_count()}  # fmt: skip
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return facts


def format_table(report: dict[str, Any]) -> str:
    lines = ["| phase | status | seconds | figures |", "|---|---|---|---|"]
    for name, r in report["phases"].items():
        figures = {k: v for k, v in r.items() if k not in ("status", "seconds", "log")}
        text = "; ".join(f"{k} {_fmt(v)}" for k, v in figures.items())
        lines.append(f"| {name} | {r['status']} | {r['seconds']} | {text} |")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_fmt(v)}" for k, v in value.items()) + "}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def run_all(opts) -> dict[str, Any]:
    work = Path(opts.out)
    work.mkdir(parents=True, exist_ok=True)
    report = {"device": opts.device, "dry_run": opts.dry_run, "machine": machine(), "phases": {}}
    for name in opts.phases:
        report["phases"][name] = run_phase(opts, name, work)
        print(f"[gpu-check] {name}: {report['phases'][name]}", flush=True)
        (work / "gpu_check.json").write_text(json.dumps(report, indent=2))
    table = format_table(report)
    (work / "gpu_check.md").write_text(f"GPU check, {report['machine']}\n\n{table}\n")
    print(table)
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dry-run", action="store_true", help="a few steps of every phase (CPU check)")
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out",
                   help="folder for gpu_check.json, gpu_check.md and the logs ($OUT if set)")  # fmt: skip
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--call", type=int, choices=sorted(CALLS),
                   help="the phases of one device call: 1 = tests demo qlora, 2 = the rest")  # fmt: skip
    p.add_argument("--model-dir", default=None, help="the demo's model dir (default: embedded)")
    p.add_argument("--limit", action="append", default=[], metavar="PHASE=SECONDS",
                   help="another time limit for one phase (repeatable), e.g. demo=180")  # fmt: skip
    p.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    opts.limit = parse_limits(p, opts.limit)
    if opts.call:
        opts.phases = list(CALLS[opts.call])
    if opts.device == "cuda" and not opts.phase:
        import torch

        if not torch.cuda.is_available():
            p.error("no CUDA device here: run on a GPU machine, or check the script with "
                    "--device cpu --dry-run")  # fmt: skip
    return opts


def parse_limits(p: argparse.ArgumentParser, items: list[str]) -> dict[str, float]:
    limits = {}
    for item in items:
        name, _, seconds = item.partition("=")
        if name not in PHASES or not seconds.replace(".", "", 1).isdigit():
            p.error(f"--limit {item!r}: write PHASE=SECONDS with PHASE one of {', '.join(PHASES)}")
        limits[name] = float(seconds)
    return limits


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    opts = parse_args(argv)
    if opts.phase:
        run_phase_child(opts)
        return None
    return run_all(opts)


if __name__ == "__main__":
    main()
