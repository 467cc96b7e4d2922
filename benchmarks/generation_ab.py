"""A/B of one rollout's generation: decoding through the LoRA adapter vs on merged weights.

    python benchmarks/generation_ab.py                 # fp32, 16 rows (2 prompts x G=8), 24 tokens
    python benchmarks/generation_ab.py --bf16 --rounds 8

The embedded SmolLM2-135M with a LoRA r=16 adapter on every linear layer (B drawn at random so
the adapter changes the output), the benchmark's `short` prompts, full-length completions (EOS
never stops a row). A and B alternate round by round, on the same prompts and draws; the result
is the median of the per-round ratios B/A, and how many of the sampled tokens agree.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(bf16: bool):
    from peft import LoraConfig, get_peft_model

    from grpo_plugin.app.data import arithmetic_dataset
    from grpo_plugin.models import EMBEDDED_NAME
    from grpo_plugin.rollout.prompts import encode_prompts
    from grpo_plugin.training.policy import load_model, load_tokenizer

    dtype = torch.bfloat16 if bf16 else torch.float32
    model = load_model(EMBEDDED_NAME, {"dtype": dtype})
    torch.manual_seed(0)
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(model, config).eval()
    tokenizer = load_tokenizer(model, EMBEDDED_NAME)
    rows = arithmetic_dataset(n_train=8, n_eval=8)[0].select(range(2))
    prompts = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    return model, prompts


def one_rollout(model, prompts, tokens: int, merged: bool):
    from grpo_plugin.rollout.generation import generate_groups
    from grpo_plugin.rollout.merged_lora import maybe_merged
    from grpo_plugin.rollout.types import SamplingParams

    start = time.perf_counter()
    with maybe_merged(model, merged):
        batch = generate_groups(model, prompts, SamplingParams(max_new_tokens=tokens),
                                num_generations=8, eos_token_ids=[model.config.vocab_size],
                                pad_token_id=0, generator=torch.Generator().manual_seed(1))  # fmt: skip
    return time.perf_counter() - start, batch.completion_ids


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=24)
    opts = p.parse_args()
    model, prompts = build(opts.bf16)
    one_rollout(model, prompts, opts.tokens, False)  # warm-up
    ratios, same, total = [], 0, 0
    for r in range(opts.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        out = {merged: one_rollout(model, prompts, opts.tokens, merged) for merged in order}
        ratios.append(out[True][0] / out[False][0])
        same += int((out[True][1] == out[False][1]).sum())
        total += out[True][1].numel()
        print(f"round {r}: adapter {out[False][0]:.3f} s, merged {out[True][0]:.3f} s", flush=True)
    print(f"merged/adapter generation time: median {statistics.median(ratios):.3f} "
          f"over {opts.rounds} rounds; tokens equal {same}/{total}")  # fmt: skip


if __name__ == "__main__":
    main()
