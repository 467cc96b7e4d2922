"""think_format and DAPO's soft overlong punishment (eq. 13), with hand-derived numbers."""

from __future__ import annotations

import pytest

import reward_fns


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>add them</think><answer>7</answer>", 1.0),
        ("\n<think>\nadd them\n</think>\n\n<answer> 7 </answer>\n", 1.0),
        ("<answer>7</answer><think>add</think>", 0.0),  # wrong order
        ("<answer>7</answer>", 0.0),  # no think block
        ("<think>add</think>", 0.0),  # no answer block
        ("<think>add</think><answer>7</answer> and more text", 0.0),
        ("preamble <think>add</think><answer>7</answer>", 0.0),
        ("<think>a</think><answer>7</answer><answer>8</answer>", 0.0),  # open-r1's regex says 1
        ("<think>a<think>b</think><answer>7</answer>", 0.0),  # nested think
        ("<think>a</think><think>b</think><answer>7</answer>", 0.0),
        ("<think></think><answer>7</answer>", 0.0),  # empty think
        ("<think>a</think><answer>  </answer>", 0.0),  # empty answer
        ("<Think>a</Think><answer>7</answer>", 0.0),  # tags are case-sensitive
        ([{"role": "assistant", "content": "<think>a</think><answer>7</answer>"}], 1.0),
    ],
)
def test_think_format(completion, expected):
    assert reward_fns.get("think_format")(completions=[completion]) == [expected]


def test_think_format_custom_tags():
    fn = reward_fns.get("think_format", think_tag="reasoning", answer_tag="solution")
    assert fn.__name__ == "think_format"
    good = "<reasoning>r</reasoning><solution>s</solution>"
    assert fn(completions=[good, "<think>r</think><answer>s</answer>"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="no angle brackets"):
        reward_fns.get("think_format", think_tag="<think>")(completions=["x"])


@pytest.mark.parametrize(
    "length, expected",
    # L_max = 20, L_cache = 5: free up to 15 tokens, then -(|y| - 15) / 5, then -1.
    [(0, 0.0), (10, 0.0), (15, 0.0), (16, -0.2), (18, -0.6), (19, -0.8), (20, -1.0), (25, -1.0)],
)
def test_soft_overlong_matches_dapo_eq13(length, expected):
    fn = reward_fns.get("soft_overlong", max_completion_length=20, cache_length=5)
    got = fn(prompts=["p"], completions=["c"], completion_ids=[list(range(length))])
    assert got == [pytest.approx(expected, abs=1e-12)]


def test_soft_overlong_needs_parameters_and_ids():
    with pytest.raises(TypeError, match="max_completion_length=..., cache_length=..."):
        reward_fns.get("soft_overlong")(completions=["c"], completion_ids=[[1]])
    with pytest.raises(ValueError, match="0 < cache_length <= max_completion_length"):
        reward_fns.get("soft_overlong", max_completion_length=4, cache_length=8)(
            completions=["c"], completion_ids=[[1]]
        )
    with pytest.raises(ValueError, match="needs completion_ids"):
        reward_fns.get("soft_overlong", max_completion_length=8, cache_length=4)(completions=["c"])
