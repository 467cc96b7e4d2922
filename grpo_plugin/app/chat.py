"""`grpo-plugin chat RUN_DIR` and `grpo-plugin generate RUN_DIR PROMPT`: the trained model answers.

    check_run_dir   it exists, no run holds it, it holds an adapter or a full model, the adapter's
                    base is there: one line naming the fix otherwise, before anything loads
    open_chat       the run's policy (`publish/weights.trained_policy`: the one loading path),
                    its tokenizer and chat template, and how it answers (`ChatOptions`)
    RunChat.reply   messages in, the reply out: the training sampler (`rollout.prompts`)
    RunChat.fit     a conversation that fits the model's context beside the answer's tokens
    converse        the loop behind `chat`: a conversation in a terminal, one answer per line
                    of standard input when piped

Nothing is cut without a word: a prompt that does not fit the context beside `max_new_tokens` is
refused with its token count (`PromptTooLong`: `generate` exits 2, piped `chat` logs it and
writes an empty line); a conversation that grows past the context leaves out its oldest turns
(the system prompt stays), and says so once. Before, the prompt's first tokens were cut, the
chat template's start and the system prompt with them.

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

from ..models import weight_files
from ..rollout.types import GroupSampling, SamplingParams
from ..run import checkpoints, rundir
from ..run.lock import lock_holder
from ..training import inputs
from .recipe import RecipeError, one_line

logger = logging.getLogger(__name__)

RESET, QUIT = "/reset", ("/exit", "/quit")


class PromptTooLong(RecipeError):
    """A prompt that does not fit the model's context beside the answer's tokens."""


@dataclass(frozen=True)
class ChatOptions:
    """How the run's model answers."""

    sample: bool = False  # False: greedy; True: the run's sampling settings
    max_new_tokens: int | None = None  # None: the run's max_completion_length
    system: str | None = None  # None: the run's training system prompt; "": none
    seed: int = 0  # the sampling draws (with `sample`)


def _newest_with_weights(run: Path) -> Path | None:
    from ..publish.weights import model_kind

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
    from ..publish.weights import base_model_ref, model_kind

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
        self.context: int | None = None  # the model's context in tokens (None: not known)

    @property
    def budget(self) -> int | None:
        """The tokens a prompt may take beside `max_new_tokens` (None: no known bound)."""
        if self.context is None:
            return None
        return self.context - self.settings.sampling.max_new_tokens

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        """The prompt's length in tokens, encoded as `reply` encodes it."""
        from ..rollout.prompts import encode_prompts

        kwargs = self.settings.chat_template_kwargs
        return len(
            encode_prompts(self.tokenizer, [self._prompt(messages)], chat_template_kwargs=kwargs)[0]
        )

    def _prompt(self, messages: list[dict[str, str]]) -> Any:
        return messages if self.uses_chat else messages[-1]["content"]

    def check_fits(self, messages: list[dict[str, str]]) -> None:
        """`PromptTooLong` (one line with the counts) when `messages` do not fit."""
        budget = self.budget
        if budget is None:
            return
        n = self.prompt_tokens(messages)
        if n > budget:
            raise PromptTooLong(
                f"the prompt is {n} tokens, and the model's context of {self.context} leaves "
                f"{budget} beside max_new_tokens={self.settings.sampling.max_new_tokens}; "
                "shorten it, or lower --max-new-tokens"
            )

    def fit(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """`messages` without their oldest turns, as many as the context needs (the system
        prompt and the last message stay); `PromptTooLong` when the last message alone does
        not fit."""
        head = messages[:1] if messages and messages[0].get("role") == "system" else []
        turns = messages[len(head) :]
        while len(turns) > 1:
            try:
                self.check_fits(head + turns)
                return head + turns
            except PromptTooLong:
                turns = turns[1:]
                while len(turns) > 1 and turns[0].get("role") != "user":
                    turns = turns[1:]  # a conversation starts with the user's turn
        self.check_fits(head + turns)
        return head + turns

    def messages(self, question: str) -> list[dict[str, str]]:
        """A one-turn conversation with the system prompt."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": question}]

    def reply(self, messages: list[dict[str, str]]) -> str:
        """The reply to a conversation (a run trained on plain-text prompts, or a tokenizer
        without a chat template, reads the last user message as plain text)."""
        import torch

        from ..models.policy import eval_mode
        from ..rollout.prompts import sample_groups

        self.check_fits(messages)  # never cut from the left without a word
        prompt = self._prompt(messages)
        with eval_mode(self.model), torch.no_grad():
            rollout = sample_groups(self.model, self.tokenizer, [{"prompt": prompt}], self.settings)
        completion = rollout.completions[0]
        return completion[-1]["content"] if isinstance(completion, list) else completion

    def answer(self, question: str) -> str:
        return self.reply(self.messages(question))


def open_chat(run_dir: str | Path, options: ChatOptions, command: str = "chat") -> RunChat:
    """Check the run dir (one-line `RecipeError`s), then load its model."""
    import torch

    from ..publish.weights import trained_policy

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
    context = inputs.context_length(model.config, tokenizer)
    if context is not None and sampling.max_new_tokens >= context:
        raise RecipeError(
            f"max_new_tokens={sampling.max_new_tokens} leaves no room for a prompt in the "
            f"model's context of {context} tokens; lower --max-new-tokens"
        )
    template = (info.get("sampling") or {}).get("chat_template_kwargs")
    settings = GroupSampling(sampling, 1, chat_template_kwargs=template)  # nothing is cut
    chat = isinstance(logged, list) if logged is not None else tokenizer.chat_template is not None
    answering = RunChat(model, tokenizer, settings, system, chat)
    answering.context = context
    return answering


def one_line_answer(text: str) -> str:
    """An answer on one line (piped `chat`: one answer per line of input): newlines as `\\n`."""
    return text.replace("\r\n", "\n").replace("\n", "\\n")


def converse(
    chat: RunChat, lines: Iterable[str], write: Callable[[str], None], interactive: bool
) -> int:
    """Answer each line; returns how many answers were given.

    Interactive: one conversation (each answer sees the earlier turns, as many as the context
    holds); `/reset` starts a new one, `/exit` ends; a message too long for the context gets an
    error line and is not kept. Piped: each line is its own question and gets exactly one output
    line (an empty line for an empty one, or for one too long, which is logged), so answers line
    up with the questions."""
    history: list[dict[str, str]] = []
    told = False  # that the oldest turns are left out: said once per conversation
    answered = 0
    for number, raw in enumerate(lines, 1):
        text = raw.rstrip("\r\n")
        command = text.strip().lower()
        if interactive and command in QUIT:
            break
        if interactive and command == RESET:
            history, told = [], False
            write("(a new conversation)")
            continue
        if not text.strip():
            if not interactive:
                write("")
            continue
        try:
            if interactive:
                history, told = _turn(chat, history, text, write, told)
            else:
                write(one_line_answer(chat.answer(text)))
        except PromptTooLong as err:
            if interactive:
                write(f"error: {err}")
            else:
                logger.warning("line %d not answered: %s", number, err)
                write("")
            continue
        answered += 1
    return answered


def _turn(
    chat: RunChat, history: list[dict[str, str]], text: str, write: Callable, told: bool
) -> tuple[list[dict[str, str]], bool]:
    """One interactive turn: the conversation after it, and whether the cut was announced."""
    asked = [*(history or chat.messages(text)[:-1]), {"role": "user", "content": text}]
    kept = chat.fit(asked)  # PromptTooLong: the history stays as it was
    if len(kept) < len(asked) and not told:
        write(
            f"(the conversation no longer fits the model's context of {chat.context} tokens: "
            "its oldest turns are left out from here on)"
        )
        told = True
    reply = chat.reply(kept)
    write(reply)
    return [*kept, {"role": "assistant", "content": reply}], told


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
