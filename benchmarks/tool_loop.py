"""The multi-turn tool loop with its KV cache kept across turns vs re-encoding the history.

    python benchmarks/tool_loop.py [--recipe recipes/tool_use.yaml] [--rounds 3] [--out f.json]

Runs the rollout of `recipes/tool_use.yaml` (the embedded SmolLM2-135M, its multiply tool, 2
prompts x G=8, temperature 0.7, keyed draws) two ways, alternating, `--rounds` times each:

- `reuse` (ours): each row continues from its own KV cache; a turn after a tool call prefills
  only the tool message and the template glue;
- `reencode` (what TRL 1.16 does): each continuing row's prompt + exchange so far + tool message
  is prefilled again as a new prompt, then decoded.

Both draw the same uniforms at the same completion positions, so they sample the same tokens
(up to float rounding at a sampling boundary); the script reports how many rows agree. Per
variant: prefilled tokens (prompts once per group, plus every continuation), wall seconds of
the whole rollout (median), and the seconds spent after the first turn.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def reencode_continue(self, rows, blocks, out):
    """`_Loop.continue_rows`, the way a loop without cache reuse does it: prefill everything."""
    from dataclasses import replace

    from grpo_plugin.rollout.generation import prefill_and_decode
    from grpo_plugin.rollout.noise import ShiftedNoise

    next_rows = [r for _, r, _ in blocks]
    histories = [self.prompts[r] + self.traj[r].ids for r in next_rows]
    used = torch.tensor([len(self.traj[r].ids) for r in next_rows])
    sampling = replace(self.sampling, max_new_tokens=int(self.max_len - used.min()))
    noise = ShiftedNoise(self.noise, torch.tensor(next_rows), used)
    spec = replace(self.spec, sampling=sampling, noise=noise)
    _, mask, decoded, prefilled = prefill_and_decode(self.model, histories, 1, spec, False)
    self.prefilled += prefilled
    self._width = mask.shape[1]
    return next_rows, decoded


def rollout(model, tokenizer, rows, setup, sampling, noise, variant: str):
    from grpo_plugin.rollout import multiturn
    from grpo_plugin.rollout.prompts import sample_groups
    from grpo_plugin.rollout.types import GroupSampling

    original_continue, original_turn = multiturn._Loop.continue_rows, multiturn._Loop.take_turn
    timing = {}

    def timed_turn(self, rows_, out, width):
        timing.setdefault("first_turn_end", time.perf_counter())
        width = getattr(self, "_width", width)  # re-encoded rows start a fresh cache
        return original_turn(self, rows_, out, width)

    if variant == "reencode":
        multiturn._Loop.continue_rows = reencode_continue
    multiturn._Loop.take_turn = timed_turn
    try:
        start = time.perf_counter()
        settings = GroupSampling(sampling, num_generations=8, tools=setup)
        result = sample_groups(model, tokenizer, rows, settings, noise=noise)
        seconds = time.perf_counter() - start
    finally:
        multiturn._Loop.continue_rows, multiturn._Loop.take_turn = original_continue, original_turn
    return result, seconds, start + seconds - timing["first_turn_end"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "tool_use.yaml"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)

    from grpo_plugin.app.data import load_prompt_datasets
    from grpo_plugin.app.recipe import load_recipe
    from grpo_plugin.app.recipe_checks import recipe_tools
    from grpo_plugin.models.policy import load_policy
    from grpo_plugin.rollout.noise import KeyedNoise, RolloutKey
    from grpo_plugin.training.sampling.tool_inputs import ToolInputs

    recipe = load_recipe(args.recipe)
    train, _ = load_prompt_datasets(recipe.args.dataset)
    rows = [train[i] for i in range(2)]
    model, tokenizer = load_policy(recipe.args.model)
    model.eval()
    setup = ToolInputs.check(recipe_tools(recipe), None, None).setup(tokenizer, recipe.config)
    sampling = recipe.config.sampling_params()
    noise = KeyedNoise.for_prompts(RolloutKey(0, 0), [0, 1], 8, sampling.max_new_tokens)
    runs = {"reuse": [], "reencode": []}
    tokens = {}
    for _ in range(args.rounds):
        for variant in runs:
            out, seconds, after_first = rollout(model, tokenizer, rows, setup, sampling, noise,
                                                variant)  # fmt: skip
            runs[variant].append((seconds, after_first))
            tokens[variant] = out
    reuse, reencode = tokens["reuse"].batch, tokens["reencode"].batch
    same = sum(
        a[m.bool()].tolist() == b[n.bool()].tolist()
        for a, m, b, n in zip(
            reuse.completion_ids,
            reuse.completion_mask,
            reencode.completion_ids,
            reencode.completion_mask,
        )  # fmt: skip
    )
    report = {
        "rows": len(reuse.completion_ids),
        "rows_with_identical_tokens": same,
        "tool_calls": int(reuse.tool_calls.sum()),
        "prefill_tokens": {
            "reuse": reuse.num_prefill_tokens,
            "reencode": reencode.num_prefill_tokens,
        },
        "reused_tokens_counter": reuse.num_reused_tokens,
    }
    for variant, values in runs.items():
        report[f"{variant}_rollout_s"] = statistics.median(v[0] for v in values)
        report[f"{variant}_after_first_turn_s"] = statistics.median(v[1] for v in values)
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
