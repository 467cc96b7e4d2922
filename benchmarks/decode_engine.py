"""The decode loop's engines side by side (issue 28 item 2): the dynamic cache (the default),
the static cache, and the static cache with a compiled decode step, on the same rollout.

    python benchmarks/decode_engine.py [--rounds 3] [--length 24 256] [--group 8] [--prompts 2]
        [--engines dynamic static compiled] [--precision policy|fp16|bf16] [--device cpu|cuda]
        [--out FILE]

The model is the embedded SmolLM2-135M-Instruct with a LoRA r=16 adapter on every linear layer
(B drawn at random), or its rollout copy with `--precision`. Each round samples the same prompts
and draws once per engine (order rotated each round); rows decode exactly `--length` tokens (no
end of sequence). Reported per engine and length: the first call's seconds (for `compiled`, the
compilation), the median of the later rounds, their ratio to `dynamic`, and the share of tokens
that differ from the dynamic loop's under the same draws.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_precision import build_policy, cpu_name  # noqa: E402
from rollout_precision import rollout as precision_rollout  # noqa: E402

ENGINES = {
    "dynamic": {},
    "static": {"static_cache": True},
    "compiled": {"static_cache": True, "compile": True},
}


def rollout(model, prompt_ids, length: int, group: int, seed: int, engine: str):
    from grpo_plugin.engine.decode import DecodeSettings

    return precision_rollout(
        model, prompt_ids, length, group, seed, DecodeSettings(**ENGINES[engine])
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--length", type=int, nargs="+", default=[24, 256])
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    p.add_argument("--precision", default="policy", choices=["policy", "fp16", "bf16"])
    p.add_argument("--device", default="cpu", help="cpu or cuda (compiled: CUDA graphs there)")
    p.add_argument("--out", default=None)
    opts = p.parse_args()
    from transformers import AutoTokenizer

    from grpo_plugin.app.data import arithmetic_dataset
    from grpo_plugin.engine.rollout_copy import RolloutCopy
    from grpo_plugin.models.embedded import embedded_cache_path
    from grpo_plugin.rollout.prompts import encode_prompts

    model = build_policy(None).to(opts.device)
    if opts.precision != "policy":
        model = RolloutCopy(opts.precision).refresh(model, 0)
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_cache_path()))
    rows = arithmetic_dataset(n_train=opts.prompts, n_eval=1, seed=0)[0]
    prompt_ids = encode_prompts(tokenizer, list(rows["prompt"]))
    report = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "precision": opts.precision}
    if opts.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
    for length in opts.length:
        first = {e: rollout(model, prompt_ids, length, opts.group, 0, e)[0] for e in opts.engines}
        seconds = {e: [] for e in opts.engines}
        differ = {e: [] for e in opts.engines}
        for r in range(opts.rounds):
            shift = r % len(opts.engines)
            tokens = {}
            for engine in opts.engines[shift:] + opts.engines[:shift]:
                s, tokens[engine] = rollout(model, prompt_ids, length, opts.group, r + 1, engine)
                seconds[engine].append(s)
            for engine in opts.engines:
                reference = tokens.get("dynamic", tokens[opts.engines[0]])
                differ[engine].append((tokens[engine] != reference).float().mean().item())
        base = statistics.median(seconds[opts.engines[0]])
        report[f"length_{length}"] = {
            e: {
                "first_call_s": round(first[e], 2),
                "generate_s": round(statistics.median(seconds[e]), 3),
                "vs_first_engine": round(statistics.median(seconds[e]) / base, 3),
                "tokens_differing": round(statistics.mean(differ[e]), 4),
            }
            for e in opts.engines
        }
    text = json.dumps(report, indent=2)
    print(text)
    if opts.out:
        Path(opts.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
