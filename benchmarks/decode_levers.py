"""The engine's decode levers side by side: rollout seconds of the embedded model per form.

    python benchmarks/decode_levers.py [--rounds 5] [--length 24] [--group 8]

2 chat prompts x G completions of exactly `--length` tokens (an end id no row samples), at
temperature 1, from the embedded SmolLM2-135M in float32, through `generate_groups` with three
decode settings: the shared prefill (the default), every row prefilled (the reference plan), and
the static cache. A warm-up round runs each form once (and each lever's admission check); then
the forms alternate for `--rounds` rounds. Prints the median and range of each form's seconds,
the prompt tokens it prefilled, and whether its tokens equal the every-row form's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_plugin.engine.decode import DecodeSettings
from grpo_plugin.models.embedded import resolve_model_path
from grpo_plugin.rollout.generation import generate_groups
from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey
from grpo_plugin.rollout.types import GenerationRequest, SamplingParams

FORMS = {
    "shared prefill (default)": DecodeSettings(),
    "every row prefilled": DecodeSettings(shared_prefill=False),
    "static cache": DecodeSettings(static_cache=True),
}


def _prompts(tokenizer) -> list[list[int]]:
    questions = [f"What is {a} + {b}? Explain briefly." for a, b in ((12, 7), (3, 18))]
    chats = [[{"role": "user", "content": q}] for q in questions]
    rendered = [tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in chats]
    return [r if isinstance(r, list) else r["input_ids"] for r in rendered]


def _rollout(model, prompts, settings, length: int, group: int, never: int):
    request = GenerationRequest(
        SamplingParams(max_new_tokens=length, temperature=1.0),
        num_generations=group,
        eos_token_ids=[never],
        pad_token_id=0,
        noise=KeyedNoise.for_prompts(RolloutKey(1, 0), range(len(prompts)), group, length),
        engine=settings,
    )
    start = time.perf_counter()
    out = generate_groups(model, prompts, request)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--length", type=int, default=24)
    parser.add_argument("--group", type=int, default=8)
    a = parser.parse_args()
    path = resolve_model_path("embedded:smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts, never = _prompts(tokenizer), len(tokenizer) + 7
    for settings in FORMS.values():  # warm-up, and each lever's admission check
        _rollout(model, prompts, settings, a.length, a.group, never)
    seconds: dict[str, list[float]] = {name: [] for name in FORMS}
    outs = {}
    for _ in range(a.rounds):
        for name, settings in FORMS.items():
            took, outs[name] = _rollout(model, prompts, settings, a.length, a.group, never)
            seconds[name].append(took)
    reference = outs["every row prefilled"].completion_ids
    for name, took in seconds.items():
        same = torch.equal(outs[name].completion_ids, reference)
        print(
            f"{name:26s} median {statistics.median(took):.3f} s ({min(took):.3f}-{max(took):.3f}) "
            f"prefilled {outs[name].num_prefill_tokens} tokens, same tokens: {same}"
        )


if __name__ == "__main__":
    main()
