"""A scripted fake policy for the multi-turn loop: a tiny Llama that says what a script says.

`ScriptedLlama` is a real (tiny, random) `LlamaForCausalLM` whose `forward`, the one generation
calls, adds a large bias to the next character of `script(history)`: the current assistant
turn's text, then `<|im_end|>`. The history of each row is rebuilt from its attention mask over
the token ids its cache holds (`IdsCache`, a `DynamicCache` that also keeps the ids), so a wrong
mask shows up as a wrong token; `forward` also asserts that each new token's position id is the
number of real tokens before it. The training forward (decoder body + LM head) is the plain
model, so the trainer trains it as any policy.

`prefilled` counts the real tokens given to multi-token forwards: what the model actually
prefilled, to check the loop's own counter against.
"""

from __future__ import annotations

import inspect
import re

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

ASSISTANT = "<|im_start|>assistant\n"
END = "<|im_end|>"
BIAS = 50.0  # softmax puts ~all the mass on the scripted token, at any temperature used here
# transformers 5.24 renamed the KV-cache argument `past_key_values` to `cache`; the floors venv
# (docs/dependencies.md) runs 5.16.1. `forward` takes both and passes the cache on by the base
# model's name (the plugin picks `cache` from this signature: `_compat.cache_argument_name`).
_CACHE_ARG = (
    "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
    else "past_key_values"
)  # fmt: skip


class IdsCache(DynamicCache):
    """A `DynamicCache` that also keeps the token id of every cached column `(B, W)`."""

    def __init__(self, config):
        super().__init__(config=config)
        self.ids: torch.Tensor | None = None

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.ids = self.ids.repeat_interleave(repeats, 0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self.ids = self.ids[indices]


class ScriptedLlama(LlamaForCausalLM):
    """A tiny Llama whose sampled tokens follow `self.script`; see the module docstring."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                use_cache=None, logits_to_keep=0, past_key_values=None, **kwargs):  # fmt: skip
        cache = cache if cache is not None else past_key_values
        cache = cache if cache is not None else IdsCache(self.config)
        width = 0 if cache.ids is None else cache.ids.shape[1]
        new_ids = input_ids if cache.ids is None else torch.cat([cache.ids, input_ids], dim=1)
        out = super().forward(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=True, logits_to_keep=logits_to_keep, **{_CACHE_ARG: cache}, **kwargs,
        )  # fmt: skip
        cache.ids = new_ids
        mask = attention_mask.bool()  # (B, W + L)
        expected = (mask.long().cumsum(-1) - 1)[:, width:]
        real = mask[:, width:]
        assert torch.equal(position_ids[real], expected[real]), "positions do not follow the mask"
        if input_ids.shape[1] > 1:
            self.prefilled += int(real.sum())
        logits = out.logits.clone()
        for b in range(input_ids.shape[0]):
            logits[b, -1, self.next_token(new_ids[b][mask[b]].tolist())] += self.bias
        out.logits = logits
        return out

    def next_token(self, history: list[int]) -> int:
        """The scripted token after `history` (real token ids, prompt included)."""
        header, end = self.turn
        text = self.tokenizer.decode(history, skip_special_tokens=False)
        start = text.rfind(header) + len(header)
        turn, target = text[start:], self.script(text[:start])
        if turn == target or not target.startswith(turn):
            return self.tokenizer.convert_tokens_to_ids(end)
        rest = target[len(turn) :]
        special = [t for t in self.tokenizer.all_special_tokens if rest.startswith(t)]
        if special:  # a template marker (e.g. <|tool_call_start|>) is one token
            return self.tokenizer.convert_tokens_to_ids(special[0])
        return self.tokenizer.convert_tokens_to_ids(target[len(turn)])


def scripted_llama(
    tokenizer, script, seed: int = 0, bias: float = BIAS, init: float = 0.02,
    turn: tuple[str, str] = (ASSISTANT, END),
) -> ScriptedLlama:  # fmt: skip
    """`bias` 50 makes sampling at any temperature follow the script; a small one (8) still makes
    greedy decoding follow it while the log-probs depend on the model's own logits. `turn`: the
    text that opens an assistant turn and the token that ends it (ChatML's by default)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False, initializer_range=init,
    )  # fmt: skip
    model = ScriptedLlama(config).eval()
    model.tokenizer, model.script, model.prefilled, model.bias = tokenizer, script, 0, bias
    model.turn = turn
    return model


def last_turn(history: str, role: str) -> str | None:
    """The content of the last `role` turn in a ChatML history (None when there is none)."""
    turns = re.findall(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", history, re.DOTALL)
    contents = [content for r, content in turns if r == role]
    return contents[-1] if contents else None


def after_tool(history: str) -> bool:
    """Whether the turn being written follows a tool result."""
    return history.rfind("<|im_start|>tool") > history.rfind("<|im_start|>user")


def call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def multiply_script(history: str) -> str:
    """Call multiply(a, b) for "Multiply A and B", then state the tool's result."""
    if after_tool(history):
        return f"It is {last_turn(history, 'tool')}."
    a, b = re.findall(r"Multiply (\d+) and (\d+)", last_turn(history, "user"))[0]
    return call("multiply", f'{{"a": {a}, "b": {b}}}')


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b
