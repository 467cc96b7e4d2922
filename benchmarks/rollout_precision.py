"""The rollout copy on its own (issue 28): generation time of the same rollout sampled by the
float32 policy, a bf16 copy and an fp16-weight copy, side by side in one process, in alternating order.

    python benchmarks/rollout_precision.py [--rounds 5] [--length 24 256] [--group 8] [--prompts 2]
        [--precisions policy bf16 fp16] [--adapter RUN_DIR] [--out FILE]

`bf16-unpacked` is a bf16 copy whose linear layers stay plain `nn.Linear` (as with
`compile_decode`), against `bf16`'s oneDNN-packed weights on an x86 CPU.

The policy is the embedded SmolLM2-135M-Instruct with a LoRA r=16 adapter on every linear layer
(the demo's; `--adapter` loads a trained one, else B is drawn at random so the adapter changes
the outputs). Each round samples the same prompts and draws once per precision (order rotated
each round); `--length` rows decode exactly that many tokens (no end of sequence). Reported per
precision and length: the median generate seconds and their ratio to the policy's, tokens/s,
the copy's median refresh seconds (each round refreshes as after an optimizer step, and
releases the copy's refreshed tensors after the rollout, as training does) and refresh +
generate, the share of sampled tokens
that differ from the policy's with the same draws, and the log-prob gap: mean and max
|log pi_policy - log pi_copy| over one policy rollout's tokens, teacher forced.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from machine import cpu_name  # decode_engine and padding_free import it from here


def write_report(report: dict, out: str | None) -> None:
    """The report as JSON on stdout, and in `out` when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def build_policy(adapter: str | None):
    from peft import LoraConfig, get_peft_model

    from grpo_plugin.models.policy import load_adapter, load_model

    base = load_model("embedded:smollm2-135m-instruct", {"dtype": torch.float32})
    if adapter:
        return load_adapter(base, adapter)
    policy = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    torch.manual_seed(0)
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.01)
    return policy.eval()


def rollout(model, prompt_ids, length: int, group: int, seed: int, engine=None):
    """Seconds and completion ids of one full-length rollout (`engine`: a `DecodeSettings`, None:
    the default loop; benchmarks/decode_engine.py passes one)."""
    from grpo_plugin.engine.decode import DecodeSettings
    from grpo_plugin.rollout.generation import generate_groups
    from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey
    from grpo_plugin.rollout.types import GenerationRequest, SamplingParams

    noise = KeyedNoise.for_prompts(RolloutKey(seed, 0), range(len(prompt_ids)), group, length)
    never = model.config.vocab_size + 7  # an end-of-sequence id no row samples: full length
    sampling = SamplingParams(max_new_tokens=length, temperature=0.7)
    engine = engine or DecodeSettings()
    request = GenerationRequest(sampling, group, (never,), 0, noise=noise, engine=engine)
    start = time.perf_counter()
    batch = generate_groups(model, prompt_ids, request)
    return time.perf_counter() - start, batch.completion_ids


def logprob_gap(policy, model, prompt_ids, completion_ids) -> dict[str, float]:
    """Mean and max |log pi_policy - log pi_copy| over the policy's own sampled tokens (teacher
    forced, temperature 1): what the correction's `sampling/sampling_logp_difference` reads."""
    gaps = []
    with torch.no_grad():
        for p, row in zip(
            prompt_ids, completion_ids.view(len(prompt_ids), -1, completion_ids.shape[-1])
        ):
            ids = torch.cat([torch.tensor(p).expand(len(row), -1), row], dim=1)
            logps = [m(input_ids=ids).logits.float().log_softmax(-1) for m in (policy, model)]
            picked = [lp[:, len(p) - 1 : -1].gather(2, row.unsqueeze(-1)) for lp in logps]
            gaps.append((picked[0] - picked[1]).abs().flatten())
    gap = torch.cat(gaps)
    return {"mean": round(gap.mean().item(), 4), "max": round(gap.max().item(), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--length", type=int, nargs="+", default=[24, 256])
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--precisions", nargs="+", default=["policy", "bf16", "fp16"])
    p.add_argument("--adapter", default=None)
    p.add_argument("--out", default=None)
    opts = p.parse_args()
    from transformers import AutoTokenizer

    from grpo_plugin.app.data import arithmetic_dataset
    from grpo_plugin.engine.rollout_copy import RolloutCopy
    from grpo_plugin.models.embedded import embedded_cache_path
    from grpo_plugin.rollout.prompts import encode_prompts

    policy = build_policy(opts.adapter)
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_cache_path()))
    rows = arithmetic_dataset(n_train=opts.prompts, n_eval=1, seed=0)[0]
    prompt_ids = encode_prompts(tokenizer, list(rows["prompt"]))
    models, copies = {"policy": policy}, {}
    for name in opts.precisions:
        if name != "policy":
            copies[name] = RolloutCopy(
                name.removesuffix("-unpacked"), pack=not name.endswith("-unpacked")
            )
            models[name] = copies[name].refresh(policy, 0)
    version = iter(range(1, 10**6))

    def timed_rollout(name, length, seed):
        """A refresh as after an optimizer step (timed apart), the rollout, the release."""
        start = time.perf_counter()
        model = copies[name].refresh(policy, next(version)) if name in copies else policy
        refreshed = time.perf_counter() - start
        seconds, tokens = rollout(model, prompt_ids, length, opts.group, seed)
        if name in copies:
            copies[name].release()
        return refreshed, seconds, tokens

    report = {"cpu": cpu_name(), "threads": torch.get_num_threads()}
    for length in opts.length:
        rollout(policy, prompt_ids, length, opts.group, 0)  # warm-up
        seconds = {n: [] for n in opts.precisions}
        refresh = {n: [] for n in opts.precisions}
        differ = {n: [] for n in opts.precisions}
        _, drawn = rollout(policy, prompt_ids, length, opts.group, 0)
        gaps = {
            n: logprob_gap(policy, copies[n].refresh(policy, -length) if n in copies else policy,
                           prompt_ids, drawn)
            for n in opts.precisions
        }  # fmt: skip
        for r in range(opts.rounds):
            order = (
                opts.precisions[r % len(opts.precisions) :]
                + opts.precisions[: r % len(opts.precisions)]
            )
            tokens = {}
            for name in order:
                refreshed, s, tokens[name] = timed_rollout(name, length, r + 1)
                seconds[name].append(s)
                refresh[name].append(refreshed)
            for name in opts.precisions:
                differ[name].append((tokens[name] != tokens["policy"]).float().mean().item())
        base = statistics.median(seconds["policy"])
        n_tokens = length * opts.group * opts.prompts
        report[f"length_{length}"] = {
            name: {
                "generate_s": round(statistics.median(seconds[name]), 3),
                "vs_policy": round(statistics.median(seconds[name]) / base, 3),
                "tokens_per_s": round(n_tokens / statistics.median(seconds[name]), 1),
                "refresh_s": round(statistics.median(refresh[name]), 3),
                "refresh_and_generate_s": round(
                    statistics.median(a + b for a, b in zip(refresh[name], seconds[name])), 3
                ),
                "tokens_differing": round(statistics.mean(differ[name]), 3),
                "logprob_gap": gaps[name],
            }
            for name in opts.precisions
        }
    write_report(report, opts.out)


if __name__ == "__main__":
    main()
