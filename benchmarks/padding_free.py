"""The padding-free training forward on its own (issue 28): `completion_logprobs` forward +
backward over the same micro-batch padded and packed (`padding_free`), side by side in one
process, in alternating order.

    python benchmarks/padding_free.py [--rounds 8] [--group 8] [--prompts 2] [--width 24]
        [--shortest 12] [--out FILE]

The policy is the embedded SmolLM2-135M-Instruct with a LoRA r=16 adapter on every linear layer
(B drawn at random so every adapter gets a gradient), prompts from the arithmetic task, the
prompt shared by each group as in training. Completion lengths are spread evenly from
`--shortest` to `--width` tokens (one row at `--width`): `--shortest` equal to `--width` is a
batch without padding. Reported: the median seconds of each form, their ratio, the share of
completion slots that are padding, and the largest differences between the two forms'
log-probs (absolute) and LoRA gradients (relative norm).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rollout_precision import build_policy, cpu_name, write_report


def batch(opts, tokenizer):
    from grpo_plugin.app.data import arithmetic_dataset
    from grpo_plugin.core.tensors import left_pad
    from grpo_plugin.rollout.prompts import encode_prompts

    rows = arithmetic_dataset(n_train=opts.prompts, n_eval=1, seed=0)[0]
    prompts = [
        p for p in encode_prompts(tokenizer, list(rows["prompt"])) for _ in range(opts.group)
    ]
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id or 0)
    n = len(prompts)
    lengths = torch.linspace(opts.shortest, opts.width, n).round().long()[torch.randperm(n)]
    completion_mask = (torch.arange(opts.width)[None] < lengths[:, None]).long()
    completion_ids = torch.randint(100, 20000, (n, opts.width)) * completion_mask
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def forward_backward(policy, tensors, group: int, packed: bool):
    from grpo_plugin.engine.forward import completion_logprobs

    policy.zero_grad()
    start = time.perf_counter()
    logps = completion_logprobs(policy, tensors, chunk_size=128, group_size=group, share_prompt_prefix=True, padding_free=packed).logps  # fmt: skip
    logps.sum().backward()
    seconds = time.perf_counter() - start
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    return seconds, logps.detach(), grads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--width", type=int, default=24)
    p.add_argument("--shortest", type=int, default=12)
    p.add_argument("--out", default=None)
    opts = p.parse_args()
    from transformers import AutoTokenizer

    from grpo_plugin.models.embedded import embedded_cache_path

    torch.manual_seed(0)
    policy = build_policy(None).train()
    tensors = batch(opts, AutoTokenizer.from_pretrained(str(embedded_cache_path())))
    _, padded_logps, padded_grads = forward_backward(policy, tensors, opts.group, False)
    _, packed_logps, packed_grads = forward_backward(policy, tensors, opts.group, True)
    seconds = {"padded": [], "packed": []}
    for r in range(opts.rounds):
        for name in ("padded", "packed") if r % 2 else ("packed", "padded"):
            seconds[name].append(forward_backward(policy, tensors, opts.group, name == "packed")[0])
    median = {name: statistics.median(s) for name, s in seconds.items()}
    report = {
        "cpu": cpu_name(),
        "threads": torch.get_num_threads(),
        "padding_share": round(1 - tensors[3].float().mean().item(), 3),
        "padded_s": round(median["padded"], 3),
        "packed_s": round(median["packed"], 3),
        "packed_vs_padded": round(median["packed"] / median["padded"], 3),
        "max_logp_diff": (padded_logps - packed_logps).abs().max().item(),
        "max_grad_rel_diff": max(
            ((g - packed_grads[n]).norm() / g.norm()).item() for n, g in padded_grads.items()
        ),
    }
    write_report(report, opts.out)


if __name__ == "__main__":
    main()
