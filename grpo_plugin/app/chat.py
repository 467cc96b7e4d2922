"""`grpo-plugin chat RUN_DIR` and `grpo-plugin generate RUN_DIR PROMPT`: the trained model answers.

    check_run_dir   it exists, no run holds it, it holds an adapter or a full model, the adapter's
                    base is there: one line naming the fix otherwise, before anything loads
    open_chat       the run's policy (`publish/weights.trained_policy`: the one loading path),
                    its tokenizer and chat template, and how it answers (`ChatOptions`)
    RunChat.reply   messages in, the reply out: the training sampler (`rollout.prompts`)
    converse        the loop behind `chat`: a conversation in a terminal, one answer per line
                    of standard input when piped

Greedy by default (what the held-out accuracy measures); `sample=True` samples with the run's
own settings (`grpo_run.json`'s `sampling`: temperature, top-p, top-k, min-p, repetition
penalty). The system prompt defaults to the one the run trained with (read from its logged
completions), so the model sees what it saw in training; `system=""` sends none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rollout.types import GroupSampling, SamplingParams
from ..training import weight_files
from ..training.run import checkpoints, rundir
from ..training.run.lock import lock_holder
from .recipe import RecipeError, one_line

logger = logging.getLogger(__name__)

RESET, QUIT = "/reset", ("/exit", "/quit")


@dataclass(frozen=True)
class ChatOptions:
    """How the run's model answers."""

    sample: bool = False  # False: greedy; True: the run's sampling settings
    max_new_tokens: int | None = None  # None: the run's max_completion_length
    system: str | None = None  # None: the run's training system prompt; "": none
    seed: int = 0  # the sampling draws (with `sample`)


def _newest_with_weights(run: Path) -> Path | None:
    from ..training.publish.weights import model_kind

    for folder in reversed(checkpoints.checkpoints(run)):
        try:
            model_kind(folder)
            return folder
        except ValueError:
            continue
    return None


def check_run_dir(run_dir: str | Path, command: str = "chat") -> Path:
    """The run dir, checked before anything loads; `RecipeError` (one line) when it cannot
    answer: missing, still training, no weights, or an adapter whose base is gone."""
    from ..training.publish.weights import base_model_ref, model_kind

    run = Path(run_dir).expanduser()
    if not run.is_dir():
        what = "is not a directory" if run.exists() else "does not exist"
        raise RecipeError(
            f"run dir {run_dir} {what}; pass the output_dir of a training run "
            "(e.g. outputs/arithmetic) or one of its checkpoint-N dirs"
        )
    newest = _newest_with_weights(run)
    holder = lock_holder(run)
    if holder is not None:
        other = f", or use its newest checkpoint: grpo-plugin {command} {newest}" if newest else ""
        raise RecipeError(
            f"run dir {run_dir} is still training ({holder}); wait for it to finish{other}"
        )
    try:
        if model_kind(run) == "adapter":
            weight_files.check_adapter_weights(run)
            base_model_ref(run)  # the base must still be where the run found it
        else:
            weight_files.check_model_weights(run)
    except ValueError as err:
        hint = (
            f" Its newest checkpoint has weights: grpo-plugin {command} {newest}" if newest else ""
        )
        raise RecipeError(one_line(f"{err}{hint}")) from err
    return run


def _logged_prompt(run: Path) -> Any:
    """The first prompt of the run's first completions table (None when nothing was logged)."""
    import pyarrow.parquet as pq

    folder = run / rundir.COMPLETIONS_DIR
    if not folder.is_dir():
        folder = run.parent / rundir.COMPLETIONS_DIR  # a checkpoint-N dir: its run's
    tables = sorted(folder.glob("step_*.parquet")) if folder.is_dir() else []
    for table in tables[:3]:  # a table still being written is skipped
        try:
            prompt = pq.read_table(table, columns=["prompt"]).column(0)[0].as_py()
        except Exception:  # unreadable (being written?): the next one
            continue
        try:
            messages = json.loads(prompt)  # chat prompts are stored as JSON lists of messages
        except (TypeError, ValueError):
            return prompt
        chat = isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        return messages if chat else prompt
    return None


def system_prompt_of(prompt: Any) -> str | None:
    """The system message of a chat prompt, when it has one."""
    if isinstance(prompt, list) and prompt and prompt[0].get("role") == "system":
        return str(prompt[0].get("content", ""))
    return None


def run_sampling(info: dict[str, Any], options: ChatOptions) -> SamplingParams:
    """Greedy, or the run's sampling settings; `max_new_tokens` from the options or the run."""
    settings = dict(info.get("sampling") or {})
    settings.setdefault("temperature", info.get("temperature", 1.0))
    length = options.max_new_tokens  # 0 or less is refused below, not replaced
    if length is None:
        length = settings.get("max_completion_length") or info.get("max_completion_length") or 256
    try:
        if not options.sample:
            return SamplingParams(max_new_tokens=length, temperature=0.0)
        return SamplingParams(
            max_new_tokens=length,
            temperature=settings["temperature"],
            top_p=settings.get("top_p", 1.0),
            top_k=settings.get("top_k") or None,
            min_p=settings.get("min_p"),
            repetition_penalty=settings.get("repetition_penalty", 1.0),
        )
    except ValueError as err:
        raise RecipeError(one_line(err)) from err


class RunChat:
    """A trained run that answers: messages in, the model's reply out."""

    def __init__(
        self, model: Any, tokenizer: Any, settings: GroupSampling, system: str | None, chat: bool
    ):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.system = system or None
        self.uses_chat = chat  # False: plain-text prompts, as the run trained on

    def messages(self, question: str) -> list[dict[str, str]]:
        """A one-turn conversation with the system prompt."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": question}]

    def reply(self, messages: list[dict[str, str]]) -> str:
        """The reply to a conversation (a run trained on plain-text prompts, or a tokenizer
        without a chat template, reads the last user message as plain text)."""
        import torch

        from ..rollout.prompts import sample_groups
        from ..training.policy import eval_mode

        prompt: Any = messages if self.uses_chat else messages[-1]["content"]
        with eval_mode(self.model), torch.no_grad():
            rollout = sample_groups(self.model, self.tokenizer, [{"prompt": prompt}], self.settings)
        completion = rollout.completions[0]
        return completion[-1]["content"] if isinstance(completion, list) else completion

    def answer(self, question: str) -> str:
        return self.reply(self.messages(question))


def open_chat(run_dir: str | Path, options: ChatOptions, command: str = "chat") -> RunChat:
    """Check the run dir (one-line `RecipeError`s), then load its model."""
    import torch

    from ..training.publish.weights import trained_policy

    run = check_run_dir(run_dir, command)
    info = rundir.load_run_info(run)
    sampling = run_sampling(info, options)
    logged = _logged_prompt(run)  # what the run trained on: chat or plain text, its system prompt
    system = options.system if options.system is not None else system_prompt_of(logged)
    if info.get("tools"):
        logger.warning(
            "This run trained with tools (%s); %s runs without them: a tool call is shown, not "
            "executed.",
            ", ".join(info["tools"]),
            command,
        )
    torch.manual_seed(options.seed)  # the draws when sampling; greedy draws nothing
    model, tokenizer = trained_policy(run)
    context = getattr(model.config, "max_position_embeddings", None)
    keep = context - sampling.max_new_tokens if context else None  # a long chat keeps its end
    template = (info.get("sampling") or {}).get("chat_template_kwargs")
    keep = keep if keep and keep > 0 else None
    settings = GroupSampling(sampling, 1, max_prompt_length=keep, chat_template_kwargs=template)
    chat = isinstance(logged, list) if logged is not None else tokenizer.chat_template is not None
    return RunChat(model, tokenizer, settings, system, chat)


def one_line_answer(text: str) -> str:
    """An answer on one line (piped `chat`: one answer per line of input): newlines as `\\n`."""
    return text.replace("\r\n", "\n").replace("\n", "\\n")


def converse(
    chat: RunChat, lines: Iterable[str], write: Callable[[str], None], interactive: bool
) -> int:
    """Answer each line; returns how many answers were given.

    Interactive: one conversation (each answer sees the earlier turns); `/reset` starts a new
    one, `/exit` ends. Piped: each line is its own question and gets exactly one output line
    (an empty line for an empty one), so answers line up with the questions."""
    history: list[dict[str, str]] = []
    answered = 0
    for raw in lines:
        text = raw.rstrip("\r\n")
        command = text.strip().lower()
        if interactive and command in QUIT:
            break
        if interactive and command == RESET:
            history = []
            write("(a new conversation)")
            continue
        if not text.strip():
            if not interactive:
                write("")
            continue
        if interactive:
            history = history or chat.messages(text)[:-1]
            history.append({"role": "user", "content": text})
            reply = chat.reply(history)
            history.append({"role": "assistant", "content": reply})
            write(reply)
        else:
            write(one_line_answer(chat.answer(text)))
        answered += 1
    return answered


def example_question(dataset: Any) -> str | None:
    """The last user message of a dataset's first prompt (for the end-of-run summary)."""
    try:
        prompt = dataset[0]["prompt"]
    except Exception:  # a streamed set, an environment's, an empty one: no example
        return None
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1].get("content")) if users else None
