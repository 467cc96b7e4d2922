"""The `grpo-plugin` command: `train`, `eval`, `rewards`, `publish`.

    grpo-plugin train recipes/arithmetic.yaml [--key value ...] [--dry-run]
    grpo-plugin eval --model M [--adapter DIR] --dataset D --reward R [--k 8]
    grpo-plugin rewards
    grpo-plugin publish OUTPUT_DIR --repo-id USER/NAME

`train` checks the whole recipe (keys, dataset, columns, rewards, batch sizes) before loading a
model; a bad recipe exits with code 2 and one line on stderr. It then measures held-out greedy
accuracy, trains, saves, measures again, and writes `eval.json`, `recipe.yaml`,
`reward_curve.png` and the model card `README.md` next to the adapter.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

# Before anything imports bitsandbytes: its CPU backend logs a "kernels" warning on import.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

from .recipe import Recipe, RecipeError, check_recipe, load_recipe, one_line, recipe_parser  # noqa: E402

logger = logging.getLogger("grpo_plugin.cli")
EXIT_BAD_RECIPE = 2


def quiet_logs() -> None:
    """Only errors from the libraries, no download/loading bars, no Python warnings (CLI only)."""
    import datasets
    import huggingface_hub.utils
    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    huggingface_hub.utils.disable_progress_bars()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("grpo_plugin").setLevel(logging.INFO)
    for name in ("bitsandbytes", "bitsandbytes.backends.cpu.ops", "peft", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


def fail(message: str, code: int = EXIT_BAD_RECIPE) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return code


# ----------------------------------------------------------------------------- train


def _lora_config(lora: dict[str, Any] | None):
    if lora is None:
        return None
    from peft import LoraConfig

    try:
        return LoraConfig(**{"target_modules": "all-linear", "task_type": "CAUSAL_LM", **lora})
    except (TypeError, ValueError) as err:
        raise RecipeError(f"lora: {one_line(err)} (see peft.LoraConfig)") from err


def _quantization_kwargs(recipe: Recipe) -> None:
    """`load_in_4bit` -> NF4 double-quant `quantization_config` in `model_init_kwargs`."""
    if not recipe.args.load_in_4bit:
        return
    cfg = recipe.config
    kwargs = dict(cfg.model_init_kwargs or {})
    compute = "bfloat16" if cfg.bf16 else "float32"
    kwargs.setdefault(
        "quantization_config",
        {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
         "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": compute},
    )  # fmt: skip
    cfg.model_init_kwargs = kwargs


def _load_data(recipe: Recipe, rewards: list) -> tuple[Any, Any]:
    from .data import load_prompt_datasets
    from .recipe import check_columns

    try:
        train, held_out = load_prompt_datasets(recipe.args.dataset)
    except (ValueError, FileNotFoundError) as err:
        raise RecipeError(one_line(err)) from err
    check_columns(rewards, train.column_names, "the training data")
    if held_out is not None:
        check_columns(rewards[:1], held_out.column_names, "the held-out data")
    return train, held_out


def _eval_reward(recipe: Recipe, rewards: list):
    from .recipe import resolve_rewards, reward_specs

    spec = (recipe.args.eval or {}).get("reward")
    if spec is None:
        return rewards[0]
    return resolve_rewards(recipe, reward_specs([spec]))[0]


def _evaluate(trainer, dataset, reward_fn, recipe: Recipe) -> dict[str, Any]:
    from .evaluate import evaluate

    spec = {k: v for k, v in (recipe.args.eval or {}).items() if k not in ("reward", "before")}
    spec.setdefault("k", 8)
    spec.setdefault("max_new_tokens", recipe.config.max_completion_length)
    spec.setdefault("temperature", recipe.config.temperature)
    spec.setdefault("seed", recipe.config.seed)
    model = trainer.accelerator.unwrap_model(trainer.model)
    result = evaluate(model, trainer.processing_class, dataset, reward_fn, **spec)
    keep = ("accuracy", "n") + tuple(k for k in result if k.startswith("pass@"))
    return {k: result[k] for k in keep if k in result}


def _dataset_label(spec: dict[str, Any]) -> str:
    return str(spec.get("name") or spec.get("path"))


def _dataset_hub_ids(spec: dict[str, Any]) -> list[str]:
    from .data import GSM8K_HUB_ID

    path = spec.get("path")
    if spec.get("name") == "gsm8k" and path is None:
        return [GSM8K_HUB_ID]
    if path and not Path(str(path)).exists() and "/" in str(path) and "." not in Path(path).name:
        return [str(path)]
    return []


def _write_recipe_copy(recipe: Recipe, out: Path) -> None:
    header = f"# The recipe as run (from {recipe.source or 'defaults'} plus command-line flags).\n"
    (out / "recipe.yaml").write_text(header + yaml.safe_dump(recipe.raw, sort_keys=False))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _summary(evaluation: dict[str, Any], train_s: float, total_s: float, out: Path) -> str:
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    lines = [f"Held-out greedy accuracy (n={after.get('n', '?')}, {evaluation['reward']}): "
             f"{_pct(before.get('accuracy'))} -> {_pct(after.get('accuracy'))}"]  # fmt: skip
    for key in after:
        if key.startswith("pass@"):
            lines.append(f"{key}: {_pct(before.get(key))} -> {_pct(after.get(key))}")
    lines.append(f"Training {train_s / 60:.1f} min; total {total_s / 60:.1f} min. Outputs: {out}")
    return "\n".join(lines)


def run_training(recipe: Recipe, rewards: list) -> dict[str, Any]:
    """Evaluate, train, save, evaluate; write eval.json, recipe.yaml, the curve and the card."""
    from .card import plot_reward_curve, write_model_card
    from .trainer import GRPOTrainer

    start = time.perf_counter()
    train, held_out = _load_data(recipe, rewards)
    peft_config = _lora_config(recipe.args.lora)
    _quantization_kwargs(recipe)
    trainer = GRPOTrainer(
        model=recipe.args.model, reward_funcs=rewards, args=recipe.config,
        train_dataset=train, eval_dataset=held_out, peft_config=peft_config,
    )  # fmt: skip
    trainer.dataset_names = _dataset_hub_ids(recipe.args.dataset)
    out = Path(recipe.config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    eval_fn = _eval_reward(recipe, rewards)
    evaluation: dict[str, Any] = {
        "dataset": _dataset_label(recipe.args.dataset),
        "reward": getattr(eval_fn, "__name__", str(eval_fn)),
    }
    do_eval = held_out is not None
    if do_eval and (recipe.args.eval or {}).get("before", True):
        evaluation["before"] = _evaluate(trainer, held_out, eval_fn, recipe)
        print(f"Before training: held-out greedy accuracy {_pct(evaluation['before']['accuracy'])}")
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    trainer.save_model(str(out))
    if do_eval:
        evaluation["after"] = _evaluate(trainer, held_out, eval_fn, recipe)
    evaluation["train_seconds"] = round(train_s, 1)
    (out / "eval.json").write_text(json.dumps(evaluation, indent=2))
    _write_recipe_copy(recipe, out)
    plot_reward_curve(out)
    write_model_card(out)
    evaluation["total_seconds"] = round(time.perf_counter() - start, 1)
    if do_eval:
        print(_summary(evaluation, train_s, evaluation["total_seconds"], out))
    else:
        print(f"Trained in {train_s / 60:.1f} min (no held-out set to evaluate). Outputs: {out}")
    return evaluation


def cmd_train(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        recipe_parser().print_help()
        return 0 if argv else EXIT_BAD_RECIPE
    path, flags = argv[0], list(argv[1:])
    dry_run = "--dry-run" in flags
    flags = [f for f in flags if f != "--dry-run"]
    if "-h" in flags or "--help" in flags:
        recipe_parser().print_help()
        return 0
    try:
        recipe = load_recipe(path, flags)
        rewards = check_recipe(recipe)
        if dry_run:
            print(f"{path}: OK ({recipe.args.model}, rewards: {len(rewards)}, "
                  f"G={recipe.config.num_generations}, max_steps={recipe.config.max_steps})")  # fmt: skip
            return 0
        run_training(recipe, rewards)
    except RecipeError as err:
        return fail(str(err))
    return 0


# ----------------------------------------------------------------------------- eval


def _dataset_spec(text: str) -> dict[str, Any]:
    """`arithmetic`, `gsm8k`, a file path, or a YAML/JSON mapping such as `{name: gsm8k, ...}`."""
    if text in ("arithmetic", "gsm8k"):
        return {"name": text}
    if text.lstrip().startswith("{"):
        spec = yaml.safe_load(text)
        if not isinstance(spec, dict):
            raise RecipeError(f"--dataset {text!r} is not a mapping")
        return spec
    return {"path": text}


def _base_of_adapter(adapter: str) -> str:
    run = Path(adapter) / "grpo_run.json"
    if run.is_file():
        return json.loads(run.read_text())["base_model_path"]
    cfg = Path(adapter) / "adapter_config.json"
    if cfg.is_file():
        return json.loads(cfg.read_text())["base_model_name_or_path"]
    raise RecipeError(f"{adapter} has no grpo_run.json or adapter_config.json; pass --model")


def cmd_eval(args: argparse.Namespace) -> int:
    import reward_fns

    from .data import load_prompt_datasets, validate_dataset_spec
    from .evaluate import evaluate
    from .models import load_policy

    try:
        spec = _dataset_spec(args.dataset)
        if args.eval_size is not None:
            spec["eval_size"] = args.eval_size
        validate_dataset_spec(spec)
        reward_fn = reward_fns.resolve(args.reward)
        train, held_out = load_prompt_datasets(spec)
        dataset = held_out if held_out is not None else train
        if args.eval_size is not None:
            dataset = dataset.select(range(min(args.eval_size, len(dataset))))
        model_name = args.model or (args.adapter and _base_of_adapter(args.adapter))
        if not model_name:
            raise RecipeError("pass --model (or --adapter DIR of a grpo-plugin run)")
    except (RecipeError, ValueError, TypeError, KeyError) as err:
        return fail(str(err))
    model, tokenizer = load_policy(model_name, load_in_4bit=args.load_in_4bit)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    result = evaluate(model, tokenizer, dataset, reward_fn, k=args.k,
                      max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)  # fmt: skip
    result = {"model": model_name, "adapter": args.adapter, "dataset": _dataset_label(spec),
              "reward": args.reward, **result}  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
    return 0


def _eval_parser(sub) -> None:
    p = sub.add_parser("eval", help="greedy accuracy and pass@k on a held-out set")
    p.add_argument("--model", default=None, help="embedded:smollm2-135m-instruct, a dir or Hub id")
    p.add_argument("--adapter", default=None, help="a LoRA adapter dir (e.g. a train output_dir)")
    p.add_argument("--dataset", required=True, help="arithmetic | gsm8k | FILE | '{name: ...}'")
    p.add_argument("--reward", required=True, help="a reward name (see `grpo-plugin rewards`)")
    p.add_argument("--k", type=int, default=8, help="pass@k with the unbiased estimator; 0 = off")
    p.add_argument("--eval-size", type=int, default=None, help="evaluate on the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--load-in-4bit", action="store_true")
    p.add_argument("--output", default=None, help="also write the result JSON here")


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-plugin", description="GRPO fine-tuning with verifiable rewards."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a recipe YAML", add_help=False)
    train.add_argument("rest", nargs=argparse.REMAINDER)
    _eval_parser(sub)
    sub.add_parser("rewards", help="list the reward registry")
    from .hub import add_publish_arguments

    add_publish_arguments(sub.add_parser("publish", help="upload a run to the Hugging Face Hub"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "train":  # everything after `train` belongs to the recipe parser
        quiet_logs()
        return cmd_train(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "rewards":
        import reward_fns

        print(reward_fns.format_registry())
        return 0
    quiet_logs()
    if args.command == "eval":
        return cmd_eval(args)
    from .hub import publish_from_args

    return publish_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
