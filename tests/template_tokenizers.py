"""Tiny tokenizers carrying the real chat templates that TRL 1.16 ships (`trl/chat_templates/`).

Offline: the templates are read from the installed trl package. Each tokenizer is character-level
(every printable ASCII character and every other character of the template is a token) with the
template's `<|...|>` markers as special tokens, its end of turn as EOS (Qwen: `<|im_end|>`,
Llama 3.x: `<|eot_id|>`) and Llama's `<|begin_of_text|>` as BOS. `exchange` gives what a model
trained on that template writes for a call and for the answer after its result, read off the
template itself, so a scripted policy (`scripted_policy.py`) can write exactly that.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

import trl.chat_template_utils

TRL_TEMPLATES = Path(trl.chat_template_utils.__file__).parent / "chat_templates"
END_TOKENS = ("<|im_end|>", "<|eot_id|>")
STOPS = ("<|im_end|>", "<|eot_id|>", "<|call|>", "<|return|>")  # what ends a scripted turn


def trl_template(name: str) -> str:
    return (TRL_TEMPLATES / f"{name}.jinja").read_text()


def template_tokenizer(name: str):
    """A character-level fast tokenizer whose chat template is TRL's `name`.jinja."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    source = trl_template(name)
    specials = sorted(set(re.findall(r"<\|[A-Za-z0-9_]+\|>", source)))
    chars = sorted(set(string.printable) | {c for c in source if ord(c) > 127})
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *specials, *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(
        Regex("(?m)."), behavior="isolated"
    )  # (?m): Oniguruma dotall
    backend.decoder = decoders.Fuse()
    eos = next((t for t in END_TOKENS if t in specials), "</s>")
    bos = "<|begin_of_text|>" if "<|begin_of_text|>" in specials else "<s>"
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token=bos,
                                  eos_token=eos, unk_token="<unk>",
                                  additional_special_tokens=specials)  # fmt: skip
    tok.chat_template = source
    return tok


def _written(tokenizer, template, before, message) -> str:
    """What the template writes for `message` after `before` (and its generation prompt), up to
    and with the first token of `STOPS` (the one the model ends its turn with)."""
    render = dict(tokenize=False, chat_template=template)
    head = tokenizer.apply_chat_template(before, add_generation_prompt=True, **render)
    full = tokenizer.apply_chat_template(before + [message], **render)
    text = full[len(os.path.commonprefix([head, full])) :]
    end = min((text.index(t), t) for t in STOPS if t in text)
    return text[: end[0] + len(end[1])]


def exchange(tokenizer, template, a: int, b: int) -> tuple[str, str]:
    """`(call, answer)`: the text of an assistant turn calling multiply(a, b) and of the turn
    "It is {a * b}." after its result, as `template` (None: the tokenizer's) renders them, each
    with the token that ends it."""
    user = [{"role": "user", "content": f"Multiply {a} and {b}"}]
    calls = [{"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}]
    call_turn = {"role": "assistant", "content": "", "tool_calls": calls}
    call = _written(tokenizer, template, user, call_turn)
    result = [call_turn, {"role": "tool", "name": "multiply", "content": str(a * b)}]
    answer = {"role": "assistant", "content": f"It is {a * b}."}
    return call, _written(tokenizer, template, user + result, answer)


def generation_prompt(tokenizer, template) -> str:
    """The text that opens an assistant turn (the generation prompt)."""
    render = dict(tokenize=False, chat_template=template)
    user = [{"role": "user", "content": "x"}]
    head = tokenizer.apply_chat_template(user, add_generation_prompt=True, **render)
    return head[len(tokenizer.apply_chat_template(user, **render)) :]


def family_policy(tokenizer, fmt):
    """A scripted policy (`scripted_policy.py`) writing, in the template's own format, a call to
    multiply(a, b) for "Multiply A and B" and then "It is {a * b}." (the texts the template renders
    for those turns; `fmt`: the `ToolFormat` the trainer resolved)."""
    from scripted_policy import scripted_llama

    def script(history: str) -> str:
        a, b = map(int, re.findall(r"Multiply (\d+) and (\d+)", history)[-1])
        call, answer = exchange(tokenizer, fmt.template, a, b)
        return answer if call in history else call  # each ends with its stop token

    header = generation_prompt(tokenizer, fmt.template)
    return scripted_llama(tokenizer, script, turn=(header, tokenizer.eos_token))
