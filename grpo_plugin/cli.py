"""The `grpo-plugin` command: parsing, dispatch and printing only; the work is done by
`grpo_plugin.app` (nothing in the library imports this module; the arguments: `app/arguments.py`).

    grpo-plugin train RECIPE.yaml|NAME [--key value ...] [--dry-run]
    grpo-plugin eval --model M [--adapter DIR] --dataset D --reward R [--k 8] [--tool T ...]
    grpo-plugin chat RUN_DIR [--sample] [--system TEXT]       (a conversation; piped: per line)
    grpo-plugin generate RUN_DIR "What is 17 + 25?" [--sample]
    grpo-plugin report RUN_DIR [--out FILE.html]
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
from ._logging import visible  # noqa: E402

quiet_bnb_kernel_warnings()  # before anything imports bitsandbytes

from .app import arguments  # noqa: E402
from .app.recipe import RecipeError, load_recipe, one_line, recipe_parser  # noqa: E402
from .app.recipe_checks import check_recipe  # noqa: E402
from .run.rundir import SECRET_FIELDS  # noqa: E402

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
    from ._logging import CurrentStderrHandler

    logging.basicConfig(
        level=logging.WARNING, format="%(message)s", handlers=[CurrentStderrHandler()]
    )
    logging.getLogger("grpo_plugin").setLevel(logging.INFO)
    logging.getLogger("reward_fns").setLevel(logging.INFO)  # e.g. the sandbox's isolation line
    for name in ("bitsandbytes", "bitsandbytes.backends.cpu.ops", "peft", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)


def fail(message: str, code: int = EXIT_BAD_RECIPE) -> int:
    print(f"error: {visible(one_line(message))}", file=sys.stderr)  # it may quote a prompt
    return code


# ----------------------------------------------------------------------------- train


_BOOL_WORDS = ("true", "false", "yes", "no", "1", "0", "t", "f", "y", "n")


_SECRET_FLAGS = frozenset(
    f"--{spelling}" for name in SECRET_FIELDS for spelling in (name, name.replace("_", "-"))
)


def resume_command(argv: Sequence[str]) -> str:
    """The `train` command line that resumes the run `argv` started."""
    return train_command(argv, "--resume_from_checkpoint", "true")


def train_command(argv: Sequence[str], *flags: str) -> str:
    """`grpo-plugin train` with `argv` less its resume and overwrite flags, plus `flags`; a
    credential passed by flag (`--hub_token`) is left out, so that a printed line never carries it
    into a log."""
    kept, skip = [], 0
    for i, arg in enumerate(argv):
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in _SECRET_FLAGS:
            skip = 0 if "=" in arg else 1
            continue
        if name == "--overwrite_output_dir":  # a bare flag, or followed by its value
            following = argv[i + 1].lower() if i + 1 < len(argv) else ""
            skip = 1 if "=" not in arg and following in _BOOL_WORDS else 0
            continue
        if name == "--resume_from_checkpoint":
            skip = 0 if "=" in arg or i + 1 == len(argv) else 1
            continue
        kept.append(shlex.quote(arg))
    command = " ".join(["grpo-plugin", "train", *kept, *flags])
    dropped = sorted({a.split("=", 1)[0] for a in argv} & _SECRET_FLAGS)
    if dropped:  # a shell comment: the line can still be pasted as it is
        command += f"  # {', '.join(dropped)} left out: pass it again or set HF_TOKEN"
    return command


def aborted_line(argv: Sequence[str], output_dir: str) -> str:
    """What to run after an abort: resume from the newest complete checkpoint, else start over
    (over the aborted run's records, or, when it left nothing a run would lose, plainly)."""
    from .run.checkpoints import has_complete
    from .run.lock import previous_run_files

    if has_complete(output_dir):
        return f"Aborted without saving this step. To resume: {resume_command(argv)}"
    if not previous_run_files(output_dir):
        return f"Aborted; nothing was trained. To start again: {train_command(argv)}"
    again = train_command(argv, "--overwrite_output_dir")
    return (
        f"Aborted; no checkpoint was saved, so there is nothing to resume. To start over: {again}"
    )


def stopped_line(stop, argv: Sequence[str], output_dir: str) -> str:
    """One line after a SIGTERM outside the training steps: what happened, what to run next."""
    from .run.checkpoints import has_complete
    from .run.lock import previous_run_files

    if has_complete(output_dir):
        return f"{stop} To resume: {resume_command(argv)}"
    if previous_run_files(output_dir):
        return f"{stop} To start over: {train_command(argv, '--overwrite_output_dir')}"
    return f"{stop} Nothing was trained; to start again: {train_command(argv)}"


def disk_full_line(err: BaseException, output_dir: str | None) -> str | None:
    """One line for a full disk (None: `err` is something else)."""
    from .run.checkpoints import CheckpointWriteError, no_space, space_error

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
    from .app.preflight import RunFinished, prepare_run
    from .distributed import failures_shared, process_state
    from .engine.vllm_engine import StaleEngineError
    from .models.embedded import EmbeddedModelMissing
    from .run.guards import RolloutDriftError
    from .run.preemption import RunStopped, TrainingInterrupted
    from .scoring.scorer import RewardFunctionError

    recipe = None
    try:
        recipe = load_recipe(path, flags)
        with failures_shared(process_state()):  # a reward missing on one machine stops them all
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
    except RunFinished as done:  # nothing to do: the run there is finished and whole
        print(done)
        return 0
    except (RecipeError, EmbeddedModelMissing) as err:
        return fail(str(err))
    except RewardFunctionError as err:  # the user's reward broke the contract: one line
        return fail(str(err), code=1)
    except (RolloutDriftError, StaleEngineError) as err:  # use_vllm's sync checks: one line
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
    from .distributed import is_main_process

    if is_main_process():  # under `accelerate launch`, one summary, not one per process
        from .app.chat import example_question

        question = example_question(data.held_out if data.held_out is not None else data.train)
        out = Path(recipe.config.output_dir)
        print(visible("\n".join(summary_lines(evaluation, out, question))))  # the question
    return 0


# ----------------------------------------------------------------------------- eval


def cmd_eval(args: argparse.Namespace) -> int:
    from .app.eval_model import EvalRequest, evaluate_model
    from .models.embedded import EmbeddedModelMissing
    from .scoring.scorer import RewardFunctionError

    try:
        request = EvalRequest(
            dataset=args.dataset,
            reward=args.reward,
            model=args.model,
            adapter=args.adapter,
            k=args.k,
            eval_size=args.eval_size,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            batch_size=args.batch_size,
            load_in_4bit=args.load_in_4bit,
            tools=tuple(args.tool or ()),
        )
        result = evaluate_model(request, args)  # args: --tool-chat-template, --tool-timeout, ...
    except (RecipeError, EmbeddedModelMissing) as err:
        return fail(str(err))
    except RewardFunctionError as err:
        return fail(str(err), code=1)
    print(json.dumps(result, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
    return 0


# ----------------------------------------------------------------------------- chat, generate


def _typed_lines(prompt: str = "> "):
    """What the person types, line by line, until Ctrl-D."""
    while True:
        try:
            yield input(prompt)
        except EOFError:
            print()
            return


def cmd_answer(args: argparse.Namespace) -> int:
    """`chat` and `generate`: the run's model answers."""
    from .app.chat import ChatOptions, converse, open_chat
    from .models.embedded import EmbeddedModelMissing

    if args.command == "generate" and not args.prompt.strip():
        return fail(
            'PROMPT is empty; ask something, e.g. grpo-plugin generate RUN "What is 2 + 3?"'
        )
    options = ChatOptions(args.sample, args.max_new_tokens, args.system, args.seed)
    try:
        chat = open_chat(args.run_dir, options, args.command)
    except (RecipeError, EmbeddedModelMissing) as err:
        return fail(str(err))
    if args.command == "generate":
        try:
            print(visible(chat.answer(args.prompt)))  # the model's text, shown, never acted on
        except RecipeError as err:  # a prompt longer than the model's context
            return fail(str(err))
        return 0
    interactive = sys.stdin.isatty()
    if interactive:
        print("Type a message (/reset: a new conversation; /exit or Ctrl-D: quit).")
    lines = _typed_lines() if interactive else sys.stdin
    try:
        converse(chat, lines, lambda text: print(visible(text), flush=True), interactive)
    except KeyboardInterrupt:
        print()
        return 128 + signal.SIGINT
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .publish.report import ReportError, write_report

    try:
        path = write_report(args.run_dir, args.out)
    except ReportError as err:
        return fail(str(err))
    except OSError as err:  # the disk: nothing is left under the final name
        return fail(str(err), code=1)
    print(f"Wrote {path} (open it in a browser; it needs no server)")
    return 0


# ----------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grpo-plugin", description="GRPO fine-tuning with verifiable rewards."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from a recipe YAML", add_help=False)
    train.add_argument("rest", nargs=argparse.REMAINDER)
    arguments.add_eval_arguments(sub)
    arguments.add_chat_arguments(sub)
    arguments.add_generate_arguments(sub)
    arguments.add_report_arguments(sub)
    sub.add_parser("rewards", help="list the reward registry")
    sub.add_parser("recipes", help="list the built-in recipes (`grpo-plugin train NAME`)")
    publish = sub.add_parser("publish", help="upload a run to the Hugging Face Hub")
    arguments.add_publish_arguments(publish)
    arguments.add_export_arguments(sub)
    return parser


def cmd_export(args: argparse.Namespace) -> int:
    from .publish.gguf import export_gguf

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


def publish_from_args(args: argparse.Namespace) -> int:
    """Run `publish` from parsed CLI args; print the URL, or one error line. Returns an exit code."""
    from .publish.hub import HubPublishError, PublishOptions, publish

    options = PublishOptions(
        private=args.private,
        merge=args.merge,
        revision=args.revision,
        commit_message=args.commit_message,
        include_checkpoints=args.include_checkpoints,
        include_completions=args.include_completions,
        gguf=args.gguf,
    )
    try:
        url = publish(args.output_dir, args.repo_id, options)
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
    if args.command in ("chat", "generate"):
        return cmd_answer(args)
    if args.command == "report":
        return cmd_report(args)
    return publish_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
