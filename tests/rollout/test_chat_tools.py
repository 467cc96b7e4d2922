"""The ChatML tool template, its parser, and which template a tokenizer gets."""

from __future__ import annotations

import copy

import pytest

from grpo_plugin.rollout.chat_tools import (
    CHATML_TOOL_TEMPLATE,
    assistant_message,
    parse_tool_calls,
    resolve_tool_format,
)
from grpo_plugin.rollout.types import ToolCall

SCHEMA = {"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}
# A template that renders tools itself, in the same <tool_call> JSON form (as Qwen2.5's does).
OWN_TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if tools and loop.first %}TOOLS {{ tools | tojson }}\n{% endif %}{{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}<tool_call>{{ {'name': c['function']['name'], "
    "'arguments': c['function']['arguments']} | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_parse_reads_calls_and_the_content_around_them():
    text = 'Let me compute.\n<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me compute."
    assert calls == [ToolCall("multiply", {"a": 2, "b": 3})]
    two = (
        '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{"name": "g"}</tool_call>'
    )
    assert [c.name for c in parse_tool_calls(two)[1]] == ["f", "g"]
    assert parse_tool_calls("No call here.") == ("No call here.", [])


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"name": "f", "arguments": {"a": 1,}}', "the tool call is not valid JSON"),
        ('{"arguments": {}}', 'a tool call needs a "name" string'),
        ('{"name": "f", "arguments": [1, 2]}', '"arguments" must be a JSON object'),
    ],
)
def test_unreadable_calls_carry_the_reason(body, error):
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")[1]
    assert call.error.startswith(error)


def test_lenient_forms_a_small_model_writes():
    unclosed = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}')[1]
    assert unclosed == [ToolCall("f", {"x": 1})]  # the turn ended before </tool_call>
    as_string = parse_tool_calls(
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    assert as_string[1] == [ToolCall("f", {"x": 1})]
    parameters = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>')
    assert parameters[1] == [ToolCall("f", {"x": 1})]


def test_the_chatml_template_renders_tools_calls_and_results(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "Multiply 2 and 3"},
        assistant_message("", [ToolCall("multiply", {"a": 2, "b": 3})]),
        {"role": "tool", "name": "multiply", "content": "6"},
        {"role": "assistant", "content": "It is 6."},
    ]
    text = tiny_tokenizer.apply_chat_template(
        messages, tools=[SCHEMA], chat_template=CHATML_TOOL_TEMPLATE, tokenize=False
    )
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert '<tools>\n{"type": "function", "function": {"name": "multiply"' in system
    assert rest == (
        "<|im_start|>user\nMultiply 2 and 3<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "multiply", "arguments": {"a": 2, "b": 3}}'
        "</tool_call><|im_end|>\n<|im_start|>tool\n6<|im_end|>\n"
        "<|im_start|>assistant\nIt is 6.<|im_end|>\n"
    )
    own_system = [{"role": "system", "content": "Be brief."}, *messages[:1]]
    text = tiny_tokenizer.apply_chat_template(own_system, chat_template=CHATML_TOOL_TEMPLATE,
                                              tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nMultiply 2 and 3<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_suffix_is_what_follows_the_models_end_of_turn(tiny_tokenizer):
    fmt = resolve_tool_format(tiny_tokenizer, "chatml")
    results = [{"role": "tool", "name": "multiply", "content": "6"},
               {"role": "tool", "name": "multiply", "content": "8"}]  # fmt: skip
    suffix = tiny_tokenizer.decode(fmt.suffix_ids(tiny_tokenizer, results))
    assert suffix == (
        "\n<|im_start|>tool\n6<|im_end|>\n<|im_start|>tool\n8<|im_end|>\n<|im_start|>assistant\n"
    )
    assert fmt.stop_token_ids(tiny_tokenizer) == [
        tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]


def test_which_template_a_tokenizer_gets(tiny_tokenizer):
    assert resolve_tool_format(tiny_tokenizer).name == "chatml"  # ChatML without tools: ours
    own = copy.deepcopy(tiny_tokenizer)
    own.chat_template = OWN_TOOL_TEMPLATE
    fmt = resolve_tool_format(own)
    assert fmt.name == "model" and fmt.template is None  # used as it is
    assert "TOOLS" in own.decode(
        fmt.render_prompt(own, [{"role": "user", "content": "x"}], [SCHEMA])
    )
    with pytest.raises(ValueError, match="tool_chat_template='model' but the tokenizer's chat"):
        resolve_tool_format(tiny_tokenizer, "model")
    other = copy.deepcopy(tiny_tokenizer)
    other.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="has no tool support and is not ChatML"):
        resolve_tool_format(other)
    unreadable = copy.deepcopy(tiny_tokenizer)
    unreadable.chat_template = OWN_TOOL_TEMPLATE.replace("<tool_call>", "[CALL]").replace(
        "</tool_call>", "[/CALL]"
    )
    with pytest.raises(ValueError, match="cannot read tool calls written by the model chat"):
        resolve_tool_format(unreadable)
