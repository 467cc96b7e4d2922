"""The arguments of every `grpo-plugin` command but `train` (whose flags are the recipe's keys,
`recipe.recipe_parser`). `cli.py` builds its parser from these and dispatches."""

from __future__ import annotations

import argparse

from ..rollout.chat_tools import DEFAULT_TOOL_TEMPLATE
from ..rollout.multiturn import DEFAULT_MAX_TOOL_RESULT_CHARS, DEFAULT_TOOL_TIMEOUT_S


def add_eval_arguments(sub) -> None:
    p = sub.add_parser("eval", help="greedy accuracy and pass@k on a held-out set")
    p.add_argument("--model", default=None, help="embedded:smollm2-135m-instruct, a dir or Hub id")
    p.add_argument("--adapter", default=None, help="a LoRA adapter dir (e.g. a train output_dir)")
    p.add_argument(
        "--dataset",
        required=True,
        help="arithmetic | code | gsm8k | humaneval | FILE | '{name: ...}'",
    )
    p.add_argument("--reward", required=True, help="a reward name (see `grpo-plugin rewards`)")
    p.add_argument("--k", type=int, default=8, help="pass@k with the unbiased estimator; 0 = off")
    p.add_argument("--eval-size", type=int, default=None, help="evaluate on the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--temperature", type=float, default=1.0, help="of pass@k's samples (greedy: always 0)"
    )
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


def add_export_arguments(sub) -> None:
    from ..publish.gguf import QUANT_TYPES

    p = sub.add_parser("export", help="write a run as a GGUF (llama.cpp, Ollama) + a Modelfile")
    p.add_argument("run_dir", help="a training run's output dir (or a checkpoint-N dir)")
    p.add_argument("--gguf", required=True, metavar="TYPE", help=f"one of {', '.join(QUANT_TYPES)}")
    p.add_argument(
        "--out", default=None, help="the .gguf to write (default: RUN_DIR/NAME-TYPE.gguf)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing GGUF / Modelfile")


def add_publish_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Arguments of `grpo-plugin publish` (cli.py's `publish_from_args` runs it)."""
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


def _add_answer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a training run's output dir (or a checkpoint-N dir)")
    p.add_argument(
        "--sample", action="store_true", help="sample with the run's settings (default: greedy)"
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=None, help="default: the run's max_completion_length"
    )
    p.add_argument(
        "--system",
        default=None,
        help="the system prompt (default: the one the run trained with; '' for none)",
    )
    p.add_argument("--seed", type=int, default=0, help="the sampling seed (with --sample)")


def add_chat_arguments(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="talk to a trained run: a conversation in a terminal, one answer per line when piped",
    )
    _add_answer_options(p)


def add_generate_arguments(sub) -> None:
    p = sub.add_parser("generate", help="one answer of a trained run to PROMPT")
    _add_answer_options(p)
    p.add_argument("prompt", help='the question, e.g. "What is 17 + 25?"')


def add_report_arguments(sub) -> None:
    p = sub.add_parser(
        "report", help="write RUN_DIR/report.html: the curve, the evaluations, the completions"
    )
    p.add_argument("run_dir", help="a training run's output dir")
    p.add_argument(
        "--out", default=None, help="the HTML file to write (default: RUN_DIR/report.html)"
    )
