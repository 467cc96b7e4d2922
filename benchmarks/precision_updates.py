"""How much of the model a few small-learning-rate steps change, per precision mode.

    python benchmarks/precision_updates.py                    # 3 steps at lr 1e-5 and 1e-6
    python benchmarks/precision_updates.py --steps 5 --lrs 1e-5

The tiny random Llama of the tests (hidden 32, 2 layers), loaded by path, full fine-tuning, 16
completions a step (2 prompts x G=8), a reward that differs between any two completions. Three
modes: `fp32` (bf16=False), `mixed` (bf16=True with default model_init_kwargs: fp32 master weights,
bf16 autocast) and `pure-bf16` (bf16=True, model_init_kwargs={"dtype": "bfloat16"}). For each it
prints the share of trainable weight elements that differ from their starting value after the
steps, the trainable weights' dtypes, and the dtype a decoder layer's q_proj computes in during
the rollout (no grad) and during the training forward (grad).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import tempfile
from pathlib import Path

import torch

MODES = {
    "fp32": (False, {}),
    "mixed": (True, {}),
    "pure-bf16": (True, {"dtype": "bfloat16"}),
}


def _fixtures():
    path = Path(__file__).resolve().parents[1] / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_tiny_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(fx, model_dir: str, mode: str, lr: float, steps: int) -> dict:
    from grpo_plugin import GRPOConfig, GRPOTrainer

    bf16, init_kwargs = MODES[mode]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=16, num_generations=8,
                          max_completion_length=8, max_steps=steps, learning_rate=lr,
                          save_strategy="no", disable_tqdm=True, seed=0, report_to="none",
                          bf16=bf16, model_init_kwargs=init_kwargs or None)  # fmt: skip
        trainer = GRPOTrainer(model_dir, fx.char_codes, args=args, train_dataset=fx.SEVEN_DATA)
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        seen: dict[str, set] = {"rollout": set(), "train": set()}
        q_proj = trainer.model.model.layers[0].self_attn.q_proj
        q_proj.register_forward_hook(
            lambda m, a, out: seen["train" if torch.is_grad_enabled() else "rollout"].add(
                str(out.dtype).removeprefix("torch.")
            )
        )
        trainer.train()
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(params, before))
    return {
        "changed": changed / sum(p.numel() for p in params),
        "weights": sorted({str(p.dtype).removeprefix("torch.") for p in params}),
        "rollout": sorted(seen["rollout"]),
        "train": sorted(seen["train"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 1e-6])
    opts = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    fx = _fixtures()
    with tempfile.TemporaryDirectory() as model_dir:
        tok = fx.make_tiny_tokenizer()
        fx.make_tiny_model(tok).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        for lr in opts.lrs:
            for mode in MODES:
                r = run(fx, model_dir, mode, lr, opts.steps)
                print(f"lr={lr:g} {mode:>9}: changed {r['changed']:.1%} of weight elements; "
                      f"weights {'/'.join(r['weights'])}; q_proj computes in "
                      f"{'/'.join(r['rollout'])} (rollout), {'/'.join(r['train'])} (training forward)")  # fmt: skip


if __name__ == "__main__":
    main()
