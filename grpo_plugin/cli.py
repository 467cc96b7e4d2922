"""The `grpo-plugin` command: `train`, `eval`, `rewards`, `recipes`, `publish`, `export`. Parsing
only:
the work is done by `grpo_plugin.app` (nothing in the library imports this module).

    grpo-plugin train RECIPE.yaml|NAME [--key value ...] [--dry-run]
    grpo-plugin eval --model M [--adapter DIR] --dataset D --reward R [--k 8] [--tool T ...]
    grpo-plugin rewards
    grpo-plugin recipes
    grpo-plugin publish OUTPUT_DIR --repo-id USER/NAME
    grpo-plugin export RUN_DIR --gguf f16|bf16|q8_0|... [--out FILE.gguf] [--overwrite]

`train` checks the whole recipe (keys, dataset, columns, rewards, batch sizes) before loading a
model; a bad recipe exits with code 2 and one line on stderr. It then runs the recipe pipeline
(`grpo_plugin.app.pipeline`): evaluate, train, save, evaluate, and write `eval.json`,
`recipe.yaml`, `reward_curve.png` and the model card `README.md` next to the adapter.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import shlex
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from ._compat import quiet_bnb_kernel_warnings  # noqa: E402

quiet_bnb_kernel_warnings()  # before anything imports bitsandbytes

from .app.recipe import RecipeError, load_recipe, one_line, recipe_parser  # noqa: E402
from .app.recipe_checks import check_recipe  # noqa: E402
from .rollout.chat_tools import DEFAULT_TOOL_TEMPLATE  # noqa: E402
from .rollout.multiturn import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_TOOL_TIMEOUT_S  # noqa: E402

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
    logging.getLogger("reward_fns").setLevel(logging.INFO)  # e.g. the sandbox's isolation line
    for name in ("bitsandbytes", "bitsandbytes.backends.cpu.ops", "peft", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


def fail(message: str, code: int = EXIT_BAD_RECIPE) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return code


# ----------------------------------------------------------------------------- train


def resume_command(argv: Sequence[str]) -> str:
    """The `train` command line that resumes the run `argv` started."""
    kept, skip = [], 0
    for i, arg in enumerate(argv):
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name == "--overwrite_output_dir":
            continue
        if name == "--resume_from_checkpoint":
            skip = 0 if "=" in arg or i + 1 == len(argv) else 1
            continue
        kept.append(shlex.quote(arg))
    return " ".join(["grpo-plugin", "train", *kept, "--resume_from_checkpoint", "true"])


def aborted_line(argv: Sequence[str], output_dir: str) -> str:
    """What to run after an abort: resume from the newest complete checkpoint, else start over."""
    from .training.run.checkpoints import has_complete

    if has_complete(output_dir):
        return f"Aborted without saving this step. To resume: {resume_command(argv)}"
    again = resume_command(argv).removesuffix(" --resume_from_checkpoint true")
    return (
        f"Aborted; no checkpoint was saved, so there is nothing to resume. To start over: "
        f"{again} --overwrite_output_dir"
    )


def stopped_line(stop, argv: Sequence[str], output_dir: str) -> str:
    """One line after a SIGTERM outside the training steps: what happened, what to run next."""
    from .training.run.checkpoints import has_complete
    from .training.run.lock import previous_run_files

    if has_complete(output_dir):
        return f"{stop} To resume: {resume_command(argv)}"
    again = resume_command(argv).removesuffix(" --resume_from_checkpoint true")
    if previous_run_files(output_dir):
        return f"{stop} To start over: {again} --overwrite_output_dir"
    return f"{stop} Nothing was trained; to start again: {again}"


def disk_full_line(err: BaseException, output_dir: str | None) -> str | None:
    """One line for a full disk (None: `err` is something else)."""
    from .training.run.checkpoints import CheckpointWriteError, no_space, space_error

    if isinstance(err, CheckpointWriteError):
        return str(err)
    if output_dir is None or not no_space(err):
        return None
    return str(space_error(err, output_dir))


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
    from .app.preflight import prepare_run
    from .models import EmbeddedModelMissing
    from .training.rewards.scoring import RewardFunctionError
    from .training.run.preemption import RunStopped, TrainingInterrupted

    recipe = None
    try:
        recipe = load_recipe(path, flags)
        rewards = check_recipe(recipe)
        data = prepare_run(recipe, rewards)  # data, prompts, output dir, resume: no model yet
        if dry_run:
            c = recipe.config
            resume = f", resumes from {data.checkpoint}" if data.checkpoint else ""
            print(
                f"{path}: OK ({recipe.args.model}, rewards: {len(rewards)}, "
                f"G={c.num_generations}, max_steps={c.max_steps}{resume})"
            )
            return 0
        from .app.pipeline import summary_lines, train_recipe

        evaluation = train_recipe(recipe, rewards, data)
    except (RecipeError, EmbeddedModelMissing) as err:
        return fail(str(err))
    except RewardFunctionError as err:  # the user's reward broke the contract: one line
        return fail(str(err), code=1)
    except TrainingInterrupted as stop:
        print(f"{stop}\nTo resume: {resume_command(argv)}", file=sys.stderr)
        return stop.exit_code
    except RunStopped as stop:  # outside the training steps: one line
        print(stopped_line(stop, argv, recipe.config.output_dir), file=sys.stderr)
        return stop.exit_code
    except Exception as err:  # a full disk (OSError, torch's or safetensors' own): one line
        line = disk_full_line(err, recipe.config.output_dir if recipe is not None else None)
        if line is None:
            raise
        return fail(line, code=1)
    except KeyboardInterrupt:  # a second Ctrl-C: aborted without saving
        where = recipe.config.output_dir if recipe is not None else None
        print(aborted_line(argv, where) if where else "Aborted.", file=sys.stderr)
        return 128 + signal.SIGINT
    from .training.distributed import is_main_process

    if is_main_process():  # under `accelerate launch`, one summary, not one per process
        print("\n".join(summary_lines(evaluation, Path(recipe.config.output_dir))))
    return 0


# ----------------------------------------------------------------------------- eval


def cmd_eval(args: argparse.Namespace) -> int:
    from .app.pipeline import evaluate_model
    from .models import EmbeddedModelMissing
    from .training.rewards.scoring import RewardFunctionError

    try:
        result = evaluate_model(
            model=args.model,
            adapter=args.adapter,
            dataset=args.dataset,
            reward=args.reward,
            k=args.k,
            eval_size=args.eval_size,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            load_in_4bit=args.load_in_4bit,
            tools=args.tool,
            tool_options=args,  # --tool-chat-template, --tool-timeout, ...
        )
    except (RecipeError, EmbeddedModelMissing) as err:
        return fail(str(err))
    except RewardFunctionError as err:
        return fail(str(err), code=1)
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
    p.add_argument(
        "--tool",
        action="append",
        default=None,
        help="a tool the model may call: python, module:function or file.py:function (repeat)",
    )
    p.add_argument(
        "--tool-chat-template", default=DEFAULT_TOOL_TEMPLATE, help="auto | chatml | model"
    )
    p.add_argument("--max-tool-calling-iterations", type=int, default=None)
    p.add_argument(
        "--tool-timeout",
        type=float,
        default=DEFAULT_TOOL_TIMEOUT_S,
        help="seconds per round of calls",
    )
    p.add_argument(
        "--max-tool-result-length",
        type=int,
        default=DEFAULT_MAX_TOOL_RESULT_CHARS,
        help="characters",
    )


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
    sub.add_parser("recipes", help="list the built-in recipes (`grpo-plugin train NAME`)")
    add_publish_arguments(sub.add_parser("publish", help="upload a run to the Hugging Face Hub"))
    _export_parser(sub)
    return parser


def _export_parser(sub) -> None:
    from .training.publish.gguf import QUANT_TYPES

    p = sub.add_parser("export", help="write a run as a GGUF (llama.cpp, Ollama) + a Modelfile")
    p.add_argument("run_dir", help="a training run's output dir (or a checkpoint-N dir)")
    p.add_argument("--gguf", required=True, metavar="TYPE", help=f"one of {', '.join(QUANT_TYPES)}")
    p.add_argument(
        "--out", default=None, help="the .gguf to write (default: RUN_DIR/NAME-TYPE.gguf)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing GGUF / Modelfile")


def cmd_export(args: argparse.Namespace) -> int:
    from .training.publish.gguf import export_gguf

    try:
        paths = export_gguf(args.run_dir, args.out, args.gguf, overwrite=args.overwrite)
    except ValueError as err:  # bad input: one line, exit 2, as `train` and `publish`
        return fail(str(err))
    except OSError as err:  # the disk (full, read-only): nothing is left under the final name
        return fail(str(err), code=1)
    size = paths.gguf.stat().st_size / 2**20
    print(f"Wrote {paths.gguf} ({size:.1f} MiB) and {paths.modelfile}")
    print(f"Run it: llama-cli -m {paths.gguf}  |  ollama create NAME -f {paths.modelfile}")
    return 0


def add_publish_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of `grpo-plugin publish`; dispatch the parsed args to `publish_from_args`."""
    parser.add_argument("output_dir", help="a training run's output dir (or a checkpoint-N dir)")
    parser.add_argument("--repo-id", required=True, help="USER/NAME or ORG/NAME on the Hub")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument(
        "--merge", action="store_true", help="upload full weights: the adapter merged into the base"
    )
    parser.add_argument("--revision", default=None, help="branch to commit to (created if needed)")
    parser.add_argument("--commit-message", default=None)
    parser.add_argument("--include-checkpoints", action="store_true")
    parser.add_argument("--include-completions", action="store_true")
    parser.add_argument(
        "--gguf", default=None, metavar="TYPE", help="also upload a GGUF (f16, q8_0, ...)"
    )
    return parser


def publish_from_args(args: argparse.Namespace) -> int:
    """Run `publish` from parsed CLI args; print the URL, or one error line. Returns an exit code."""
    from .training.publish.hub import HubPublishError, publish

    try:
        url = publish(
            args.output_dir,
            args.repo_id,
            private=args.private,
            merge=args.merge,
            revision=args.revision,
            commit_message=args.commit_message,
            include_checkpoints=args.include_checkpoints,
            include_completions=args.include_completions,
            gguf=args.gguf,
        )
    except ValueError as err:  # bad input, found before anything loads or uploads
        return fail(str(err))
    except HubPublishError as err:
        return fail(str(err), code=1)
    print(f"Published to {url}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from ._compat import release_process_group

    # several processes: destroy the process group at exit (no abort after a finished run), not
    # on return (a Python caller of main may go on using it)
    atexit.unregister(release_process_group)  # once, however often main is called
    atexit.register(release_process_group)
    if argv and argv[0] == "train":  # everything after `train` belongs to the recipe parser
        quiet_logs()
        return cmd_train(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "rewards":
        import reward_fns

        print(reward_fns.format_registry())
        return 0
    if args.command == "recipes":
        from .app.recipe_library import format_recipes

        print(format_recipes())
        return 0
    quiet_logs()
    if args.command == "eval":
        return cmd_eval(args)
    if args.command == "export":
        return cmd_export(args)
    return publish_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
