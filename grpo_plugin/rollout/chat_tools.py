"""Tool calls in the chat template: how tools, calls and results are written, and read back.

A `ToolFormat` is the pair the multi-turn loop needs: a chat template that renders tools, calls
and results, and a parser for the calls the model writes. One format ships:

- `chatml` (ours, for the ChatML family: SmolLM2, Qwen2.5, ...): the tools' JSON schemas are
  listed in the system message, a call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  in an assistant turn, and each result is a `tool` turn:

      <|im_start|>assistant\\n<tool_call>{"name": "multiply", ...}</tool_call><|im_end|>\\n
      <|im_start|>tool\\n5535<|im_end|>\\n<|im_start|>assistant\\n

A tokenizer whose own template already renders tools is used as TRL 1.16's GRPOTrainer uses it
(`model`): as it is when it is prefix-preserving (a tool result appended after a call leaves the
call's rendering unchanged), else TRL's training version of it
(`trl.chat_template_utils.get_training_chat_template`, e.g. Qwen3's, which drops the thinking
block of earlier turns), else refused. Calls are read with TRL's response template for that
template family when TRL has one (`add_response_schema`: Qwen2.5/3, Llama 3.1/3.2, GLM-4-MoE,
GPT-OSS, ...), else as `<tool_call>` JSON (ours, Hermes-style templates). Only the tokens after the
model's end of turn are rendered (`suffix_ids`; TRL re-renders the whole conversation), and
`check` proves, before training, that the template renders and the parser reads back a call.
"""

from __future__ import annotations

import json
import logging
import os
import re
import types
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .types import ToolCall

logger = logging.getLogger(__name__)

TOOL_TEMPLATES = ("auto", "chatml", "model")
DEFAULT_TOOL_TEMPLATE = "auto"  # `GRPOConfig.tool_chat_template` and the CLI read it from here
CHATML_END = "<|im_end|>"
# The token that ends a turn with calls, by template family (the first one the template holds):
# ChatML / Qwen, Llama 3.x, gpt-oss. And the other tokens that end a turn there (a stop token
# each, as in those models' generation configs): Llama's <|eom_id|>, gpt-oss's final <|return|>.
END_OF_TURN_TOKENS = (CHATML_END, "<|eot_id|>", "<|call|>")
OTHER_STOP_TOKENS = ("<|eom_id|>", "<|return|>")
DEFAULT_SYSTEM = "You are a helpful assistant."

# Jinja, rendered by transformers with trim_blocks and lstrip_blocks: every newline is explicit.
CHATML_TOOL_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set system = '" + DEFAULT_SYSTEM + "' -%}{%- set rest = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\nYou can call these tools:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    '{{- \'\\n</tools>\\nTo call a tool, write <tool_call>{"name": TOOL_NAME, "arguments": '
    "{ARGUMENT: VALUE}}</tool_call> and end your turn; its result comes back in a tool turn.' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for m in rest -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (m['content'] or '') -}}"
    "{%- for call in m['tool_calls'] or [] -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    "{%- if (m['content'] or '') and loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{%- set args = f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) -%}"
    "{{- '<tool_call>{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' + args "
    "+ '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] | string) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """`(content, calls)` of an assistant turn: the text outside `<tool_call>` blocks (stripped)
    and each block's call. A block left open at the end of the turn is read to the end; one
    that is not `{"name": str, "arguments": {...}}` JSON is a call with an `error`, so the model
    is told what was wrong instead of silently getting nothing."""
    calls = [_read_call(m.group(1)) for m in _CALL.finditer(text)]
    content = _CALL.sub("", text).strip()
    return content, calls


def _read_call(body: str) -> ToolCall:
    body = body.strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        return ToolCall(name="", arguments={}, error=f"the tool call is not valid JSON ({err.msg})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall(name="", arguments={}, error='a tool call needs a "name" string')
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(data["name"], {}, error='"arguments" must be a JSON object')
    return ToolCall(name=data["name"], arguments=arguments)


def assistant_message(content: str, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """An assistant turn as TRL passes it to reward functions (`tool_calls` in OpenAI's form)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    valid = [c for c in calls if c.error is None]
    if valid:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in valid
        ]
    return message


@dataclass(frozen=True)
class ToolFormat:
    """A chat template that renders tools (None: the tokenizer's own) and its end-of-turn token."""

    name: str  # "chatml" or "model"
    template: str | None  # Jinja source; None = tokenizer.chat_template
    end_of_turn: str | None  # the token that closes a turn with calls (ChatML: <|im_end|>)
    response_template: dict | None = None  # TRL's parser for the template; None: <tool_call> JSON
    other_stops: tuple[str, ...] = ()  # other tokens that end an assistant turn

    def parse(self, tokenizer, ids: list[int], prefix: list[int] | None = None, tools=None):
        """`(content, calls)` of the assistant turn `ids` (sampled tokens; `prefix`: the ids before
        them; `tools`: the schemas, to type the arguments), with this template's parser."""
        if self.response_template is None:
            return parse_tool_calls(tokenizer.decode(ids, skip_special_tokens=True))
        return _parse_with_template(tokenizer, self.response_template, ids, prefix, tools)

    def render_prompt(self, tokenizer, messages, tools, chat_template_kwargs=None) -> list[int]:
        """Token ids of a chat prompt with the tools' schemas and the generation prompt."""
        text = tokenizer.apply_chat_template(
            messages,
            tools=list(tools) or None,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=True,
            **(chat_template_kwargs or {}),
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def stop_token_ids(self, tokenizer) -> list[int]:
        """Ids that end an assistant turn besides the model's EOS (ChatML's <|im_end|>)."""
        tokens = ([self.end_of_turn] if self.end_of_turn else []) + list(self.other_stops)
        ids = [tokenizer.convert_tokens_to_ids(token) for token in tokens]
        return [int(i) for i in ids if i is not None and i != tokenizer.unk_token_id]

    def suffix_ids(self, tokenizer, results: Sequence[dict[str, Any]], kwargs=None) -> list[int]:
        """The tokens after the model's end of turn that carry the tool `results` (messages
        `{"role": "tool", "name", "content"}`) and open the next assistant turn: the rendering of
        [user, assistant call] + results, minus that of [user, assistant call] up to its last
        end-of-turn token (the one the model sampled)."""
        call = [{"type": "function", "function": {"name": results[0]["name"], "arguments": {}}}]
        head = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": call},
        ]
        render = dict(tokenize=False, chat_template=self.template, **(kwargs or {}))
        prefix = tokenizer.apply_chat_template(head, add_generation_prompt=False, **render)
        full = tokenizer.apply_chat_template(
            head + list(results), add_generation_prompt=True, **render
        )
        end = self.end_of_turn or tokenizer.eos_token
        cut = prefix.rfind(end) + len(end) if end and end in prefix else len(prefix)
        if not full.startswith(prefix[:cut]):
            raise ValueError(
                f"the {self.name} chat template does not render a tool result after the call it "
                "follows (it is not prefix-preserving) and TRL ships no training version of it; "
                "use tool_chat_template='chatml' (ChatML models) or give the tokenizer a "
                "prefix-preserving template"
            )
        return tokenizer(full[cut:], add_special_tokens=False)["input_ids"]

    def check(self, tokenizer) -> None:
        """Render a call and read it back; raise ValueError (one line, with the fix) if it fails."""
        probe = ToolCall(name="probe_tool", arguments={"x": 1})
        user = [{"role": "user", "content": "x"}]
        render = dict(tokenize=False, chat_template=self.template)
        head = tokenizer.apply_chat_template(user, add_generation_prompt=True, **render)
        full = tokenizer.apply_chat_template(user + [assistant_message("", [probe])], **render)
        written = full[len(os.path.commonprefix([head, full])) :]
        ids = tokenizer(written, add_special_tokens=False)["input_ids"]
        prefix = tokenizer(head, add_special_tokens=False)["input_ids"]
        schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
        probe_tools = [
            {"type": "function", "function": {"name": "probe_tool", "parameters": schema}}
        ]
        _, calls = self.parse(tokenizer, ids, prefix, probe_tools)
        if not calls or calls[0].name != "probe_tool" or calls[0].arguments != {"x": 1}:
            raise ValueError(
                f"cannot read tool calls written by the {self.name} chat template (TRL has no "
                'response template for it and it does not write <tool_call>{"name": ..., '
                '"arguments": {...}}</tool_call>); for a ChatML model set '
                "tool_chat_template='chatml', otherwise pass rollout_func= with your own loop"
            )
        end = self.end_of_turn or tokenizer.eos_token
        if not end or end not in written:  # the turn would not end where the template ends it
            raise ValueError(
                f"the {self.name} chat template does not close a turn with tool calls with a token "
                f"that ends generation (we stop on {end!r}; GLM-4-MoE-style templates, whose turn "
                "ends when the next one opens, are not supported); use "
                "tool_chat_template='chatml' (ChatML models) or pass rollout_func= with your own loop"
            )
        self.suffix_ids(tokenizer, [{"role": "tool", "name": "probe_tool", "content": "1"}])


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's own chat template writes the tools' schemas into the prompt."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    # as get_json_schema writes a schema: gpt-oss's template reads every key
    function = {"name": "probe_tool_name", "description": "Probe.", "parameters": {}}
    function["parameters"] = {"type": "object", "properties": {}}
    schema = {"type": "function", "function": function}
    messages = [{"role": "user", "content": "x"}]
    try:
        text = tokenizer.apply_chat_template(messages, tools=[schema], tokenize=False)
    except Exception:  # a template that chokes on tools does not support them
        return False
    return "probe_tool_name" in text


def resolve_tool_format(tokenizer, name: str | None = DEFAULT_TOOL_TEMPLATE) -> ToolFormat:
    """The format for `tool_chat_template`: "chatml" (ours), "model" (the tokenizer's own,
    which must render tools; TRL's training version of it where it is not prefix-preserving), or
    "auto": the tokenizer's own when it renders tools, else ours for a ChatML template; anything
    else is a ValueError saying what to set. Checked by `check`."""
    name = name or DEFAULT_TOOL_TEMPLATE
    if name not in TOOL_TEMPLATES:
        raise ValueError(f"tool_chat_template={name!r}; use one of {', '.join(TOOL_TEMPLATES)}")
    own = getattr(tokenizer, "chat_template", None) or ""
    if name == "auto":
        if renders_tools(tokenizer):
            name = "model"
        elif "<|im_start|>" in own or not own:
            name = "chatml"
        else:
            raise ValueError(
                "the tokenizer's chat template has no tool support and is not ChatML; give the "
                "tokenizer a template that renders tools, or pass rollout_func= with your own loop"
            )
    if name == "chatml":
        fmt = ToolFormat(name, CHATML_TOOL_TEMPLATE, CHATML_END)
    elif not renders_tools(tokenizer):
        raise ValueError(
            "tool_chat_template='model' but the tokenizer's chat template ignores tools; "
            "use tool_chat_template='chatml' (ChatML models) or 'auto'"
        )
    else:
        own = own if isinstance(own, str) else ""
        end = next((t for t in END_OF_TURN_TOKENS if t in own), None)
        stops = tuple(t for t in OTHER_STOP_TOKENS if t in own)
        fmt = ToolFormat(name, None, end, response_template_for(tokenizer), stops)
        if not _prefix_preserving(fmt, tokenizer):
            fmt = replace(fmt, template=training_template_for(tokenizer))
    fmt.check(tokenizer)
    return fmt


def _prefix_preserving(fmt: ToolFormat, tokenizer) -> bool:
    """TRL's check (token ids of a call, then of call + result) and ours (`suffix_ids`)."""
    from trl.chat_template_utils import is_chat_template_prefix_preserving

    try:
        fmt.suffix_ids(tokenizer, [{"role": "tool", "name": "probe_tool", "content": "1"}])
    except ValueError:
        return False
    return is_chat_template_prefix_preserving(tokenizer)


def training_template_for(tokenizer) -> str | None:
    """TRL's prefix-preserving training version of the tokenizer's template (logged), or None
    (no version known: `check` then refuses in one line)."""
    from trl.chat_template_utils import get_training_chat_template

    try:
        template = get_training_chat_template(tokenizer)
    except ValueError:  # TRL knows no patch for this template
        return None
    if template is not None:
        logger.info(
            "tool use: the tokenizer's chat template is not prefix-preserving; using TRL's "
            "training version of it (trl.chat_template_utils.get_training_chat_template) for the "
            "rollout and the training forward"
        )
    return template


def response_template_for(tokenizer) -> dict | None:
    """The tokenizer's own `response_template`, else TRL's for its chat template family
    (`add_response_schema`, applied to a stand-in so the tokenizer is left as it is), else None."""
    if getattr(tokenizer, "response_template", None) is not None:
        return tokenizer.response_template
    from trl.chat_template_utils import add_response_schema

    stand_in = types.SimpleNamespace(chat_template=getattr(tokenizer, "chat_template", None))
    try:
        add_response_schema(stand_in)
    except ValueError:  # a template TRL does not know
        return None
    return getattr(stand_in, "response_template", None)


def _parse_with_template(tokenizer, template: dict, ids, prefix, tools) -> tuple[str, list]:
    """`tokenizer.parse_response` with TRL's template; output it cannot read is plain content,
    as in TRL (`trl.chat_template_utils.parse_response`), except a `<tool_call>` block (Qwen's
    form) that it could not read: that call's error goes back to the model, as with ours."""
    try:
        parsed = tokenizer.parse_response(
            ids, schema=template, prefix=prefix or [], tools=tools or None
        )
    except Exception:  # noqa: BLE001 - transformers raises several kinds on malformed output
        parsed = None
    if not isinstance(parsed, dict) or not parsed.get("tool_calls"):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        content, calls = parse_tool_calls(text)
        if calls or not isinstance(parsed, dict):
            return (content, calls) if calls else (text.strip(), [])
    content = parsed.get("content") or ""
    if tokenizer.eos_token and isinstance(content, str):
        content = content.removesuffix(tokenizer.eos_token)
    calls = [_template_call(c) for c in parsed.get("tool_calls") or []]
    return str(content).strip(), calls


def _template_call(call: Any) -> ToolCall:
    f = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        return ToolCall(name="", arguments={}, error='a tool call needs a "name" string')
    arguments = f.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return ToolCall(f["name"], {}, error=f"the arguments are not valid JSON ({err.msg})")
    if not isinstance(arguments, dict):
        return ToolCall(f["name"], {}, error='"arguments" must be a JSON object')
    return ToolCall(name=f["name"], arguments=arguments)
