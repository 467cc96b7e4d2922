"""Numeric answer verifiers: ``exact_integer``, ``last_integer`` and ``gsm8k``.

``exact_integer`` is the seed's ``arithmetic_reward`` (the completion, stripped, is exactly the
integer). ``last_integer`` is its lenient form for small models that explain first.
``gsm8k`` extracts a final answer from free-form text in this order: the last ``#### N``, the
last ``\\boxed{N}``, the last "the answer is N" / "final answer: N" / line-initial ``A: N``, else
the last number. Values are compared exactly as fractions after removing ``$``, thousands
separators, units, ``%`` and trailing zeros (``$1,234.00`` == ``1234``); ``3/4`` and
``\\frac{3}{4}`` are fractions, ``−5`` (unicode minus) is negative. The gold comes from a GSM8K
``answer`` column (``... #### N``), a solution ending in ``A: N``, or a plain number; a gold
with no number scores ``None``.

Departure from common practice (TRL examples, open-r1): those compare strings, so ``18.00``
vs ``18`` or ``1,000`` vs ``1000`` score 0; here they are equal.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from reward_fns.registry import column, completion_text, in_process, register

_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K calculator annotations: <<3*4=12>>
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_NUMBER = re.compile(
    r"(?P<sign>-\s?)?(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:\s?/\s?(?P<den>\d+(?:\.\d+)?)(?![\d.,]\d))?"
)
_HASHES = re.compile(r"####\s*")
_ANSWER_IS = re.compile(
    r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|=|:|would\s+be|will\s+be)\s*:?"
    r"|(?:^|\n)[ \t]*A\s*:",
    re.IGNORECASE,
)
_INTEGER_ONLY = re.compile(r"[+-]?[0-9]+")


def _clean(text: str) -> str:
    text = _CALCULATOR.sub("", text)
    text = text.replace("\u2212", "-").replace("\\$", "").replace("$", "")
    text = text.replace("{,}", ",").replace("\\,", "").replace("\\!", "").replace("\\%", "%")
    return _LATEX_FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", text)


def _to_fraction(match: re.Match[str], text: str) -> Fraction | None:
    try:
        value = Fraction(match.group("num").replace(",", ""))
        if match.group("den"):
            den = Fraction(match.group("den"))
            if den == 0:
                return None
            value /= den
    except (ValueError, ZeroDivisionError):
        return None
    start = match.start()
    before = text[start - 1] if start > 0 else " "
    negative = bool(match.group("sign")) and not (before.isalnum() or before in ")]}")
    return -value if negative else value


def find_numbers(text: str) -> list[Fraction]:
    """All numbers in ``text`` in order, as exact fractions (``1,234.50`` -> 2469/2)."""
    text = _clean(text)
    found = []
    for match in _NUMBER.finditer(text):
        start = match.start("num")
        if start > 0 and (text[start - 1].isalpha() or text[start - 1] == "_"):
            continue  # part of an identifier such as x2 or var_3
        value = _to_fraction(match, text)
        if value is not None:
            found.append(value)
    return found


def _matching_braces(text: str) -> dict[int, int]:
    """`{index of "{": index of its "}"}` for every closed brace, in one pass (a scan per
    ``\\boxed{`` would take quadratic time on a text of many unclosed ones)."""
    pairs, opened = {}, []
    for i, char in enumerate(text):
        if char == "{":
            opened.append(i)
        elif char == "}" and opened:
            pairs[opened.pop()] = i
    return pairs


def _boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}``, with nested braces."""
    matches = list(re.finditer(r"\\(?:boxed|fbox)\s*\{", text))
    if not matches:
        return []
    pairs = _matching_braces(text)
    return [text[m.end() : pairs[m.end() - 1]] for m in matches if m.end() - 1 in pairs]


def _first_line(span: str) -> str:
    return span.strip().split("\n", 1)[0]


def extract_answer(text: str) -> Fraction | None:
    """The final numeric answer of free-form ``text``, or None when it has no number."""
    text = _clean(text)
    hashes = list(_HASHES.finditer(text))
    spans = [_first_line(text[hashes[-1].end() :])] if hashes else []
    boxed = _boxed_contents(text)
    if boxed:
        numbers = find_numbers(boxed[-1])
        if numbers:
            spans.append(boxed[-1])
            if not hashes:  # a box holds one answer: take its last number
                return numbers[-1]
    markers = list(_ANSWER_IS.finditer(text))
    if markers:
        spans.append(_first_line(text[markers[-1].end() :]))
    for span in spans:
        numbers = find_numbers(span)
        if numbers:
            return numbers[0]
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None


def parse_gold(gold: Any) -> Fraction | None:
    """A gold answer as a fraction: a number, ``... #### N``, ``... A: N`` or plain text."""
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, int):
        return Fraction(gold)
    if isinstance(gold, float):
        return Fraction(gold).limit_denominator(10**9) if gold == gold else None
    if isinstance(gold, Fraction):
        return gold
    return extract_answer(str(gold))


def _parse_integer_gold(gold: Any) -> int | None:
    value = parse_gold(gold)
    return int(value) if value is not None and value.denominator == 1 else None


def _score(golds: list[Any], preds: list[Fraction | None], parse: Any) -> list[float | None]:
    scores: list[float | None] = []
    for gold, pred in zip(golds, preds):
        target = parse(gold)
        scores.append(None if target is None else float(pred is not None and pred == target))
    return scores


@register("exact_integer")
@in_process
def exact_integer(
    prompts: Any = None,
    completions: Any = None,
    completion_ids: Any = None,
    *,
    column_name: str = "answer",
    **columns: Any,
) -> list[float | None]:
    """1.0 when the stripped completion is exactly the integer in the answer column."""
    texts = [completion_text(c).strip() for c in completions]
    golds = column(columns, column_name, len(texts), "exact_integer")
    preds = [Fraction(int(t)) if _INTEGER_ONLY.fullmatch(t) else None for t in texts]
    return _score(golds, preds, _parse_integer_gold)


@register("last_integer")
@in_process
def last_integer(
    prompts: Any = None,
    completions: Any = None,
    completion_ids: Any = None,
    *,
    column_name: str = "answer",
    **columns: Any,
) -> list[float | None]:
    """1.0 when the last integer in the completion equals the answer column."""
    texts = [completion_text(c) for c in completions]
    golds = column(columns, column_name, len(texts), "last_integer")
    preds = []
    for text in texts:
        numbers = find_numbers(text)
        last = numbers[-1] if numbers else None
        preds.append(last if last is not None and last.denominator == 1 else None)
    return _score(golds, preds, _parse_integer_gold)


@register("gsm8k")
@in_process
def gsm8k(
    prompts: Any = None,
    completions: Any = None,
    completion_ids: Any = None,
    *,
    column_name: str = "answer",
    **columns: Any,
) -> list[float | None]:
    """1.0 when the final number (#### / \\boxed / 'answer is' / last) equals the gold."""
    texts = [completion_text(c) for c in completions]
    golds = column(columns, column_name, len(texts), "gsm8k")
    return _score(golds, [extract_answer(t) for t in texts], parse_gold)
