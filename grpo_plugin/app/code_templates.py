"""The exercises of the generated `code` dataset: one `CodeTemplate` per kind of small function.

A template's `request` is the text after "Write a Python function `name(args)` that ", with the
placeholders {fn} (the function's name), {x} {y} {z} (its argument names) and the template's own
parameters ({k}, {ch}, ...). `solve(params, *args)` is the trusted reference that computes the
expected values of the hidden tests, on the host only; `inputs(rng, params)` draws one prompt's
test arguments (`code_inputs`). Each template's split is written in its row, never drawn: see
`code_tasks` for what the splits mean.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from itertools import product
from typing import Any

from . import code_inputs as draw

MIN_TESTS, MAX_TESTS = 4, 5
FAMILIES = ("string", "list", "number")
SPLITS = ("train", "validation", "test")
FAMILY_ARGS = {
    "string": (("s",), ("text",), ("word",), ("value",)),
    "list": (("nums",), ("values",), ("numbers",), ("xs",)),
    "number": (("n",), ("x",), ("num",), ("value",)),
}
LINE_ARGS = (("s",), ("text",), ("sentence",), ("line",))
PAIR_ARGS = (("a", "b"), ("x", "y"), ("m", "n"), ("p", "q"))
TRIPLE_ARGS = (("a", "b", "c"), ("x", "y", "z"), ("p", "q", "r"))


@dataclass(frozen=True)
class CodeTemplate:
    """One kind of exercise. Its variants are every combination of function name, argument
    names (`choices["args"]`, default: the family's) and parameter values: one template yields
    `len(variants())` distinct requests."""

    family: str  # "string" | "list" | "number"
    split: str  # "train" | "validation" | "test": fixed here, never by seed
    functions: tuple[str, ...]  # the names a request may ask for; the first names the template
    request: str  # what the function returns, with {fn}, {x}, {y}, {z} and the parameters
    solve: Callable[..., Any]  # the reference: solve(params, *args) -> the expected value
    inputs: Callable[[random.Random, dict[str, Any]], list[tuple]]  # the tests' arguments
    choices: dict[str, tuple] = field(default_factory=dict)  # e.g. {"k": (2, 3), "args": ...}

    @property
    def name(self) -> str:
        """The template's name: its first function name, e.g. "count_vowels"."""
        return self.functions[0]

    def variants(self) -> list[dict[str, Any]]:
        """Every combination of the choices, as params: {"fn", "args", and each parameter}."""
        choices = {"args": FAMILY_ARGS[self.family], **self.choices}
        return [
            {"fn": fn, **dict(zip(choices, values))}
            for fn, *values in product(self.functions, *choices.values())
        ]

    def request_text(self, params: dict[str, Any]) -> str:
        """One variant's request: "Write a Python function `f(s)` that returns ..."."""
        fn, args = params["fn"], params["args"]
        body = self.request.format(fn=fn, **dict(zip("xyz", args)), **parameters(params))
        return f"Write a Python function `{fn}({', '.join(args)})` that {body}"

    def tests(self, params: dict[str, Any], rng: random.Random) -> str:
        """4-5 lines `assert fn(args) == expected`, the arguments drawn with `rng`."""
        own = parameters(params)
        lines = []
        for args in self.calls(rng, own):
            call = f"{params['fn']}({', '.join(map(repr, args))})"
            lines.append(f"assert {call} == {self.solve(own, *args)!r}")
        return "\n".join(lines) + "\n"

    def calls(self, rng: random.Random, own: dict[str, Any]) -> list[tuple]:
        """Distinct argument tuples, edge cases first, drawn until there are 4 (at most 5)."""
        found: list[tuple] = []
        while len(found) < MIN_TESTS:
            for args in self.inputs(rng, own):
                if args not in found and len(found) < MAX_TESTS:
                    found.append(args)
        return found


def parameters(params: dict[str, Any]) -> dict[str, Any]:
    """A variant's own parameters ({k}, {ch}, ...): all but the function and argument names."""
    return {k: v for k, v in params.items() if k not in ("fn", "args")}


# ----------------------------------------------------------------------------- references


def _fizzbuzz(p: dict, n: int) -> str:
    said = ("Fizz" if n % p["d1"] == 0 else "") + ("Buzz" if n % p["d2"] == 0 else "")
    return said or str(n)


def _fibonacci(p: dict, n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _running_sum(p: dict, values: list[int]) -> list[int]:
    return [sum(values[: i + 1]) for i in range(len(values))]


def _unique(p: dict, values: list[int]) -> list[int]:
    return list(dict.fromkeys(values))


def _second_largest(p: dict, values: list[int]) -> int:
    return sorted(set(values))[-2]


def _index_of(p: dict, values: list[int]) -> int:
    return values.index(p["k"]) if p["k"] in values else -1


def _capitalize(p: dict, s: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in s.split(" "))


def _longest(p: dict, s: str) -> str:
    return max(s.split(" "), key=len) if s else ""


def _is_prime(p: dict, n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _no_vowels(p: dict, s: str) -> str:
    return "".join(c for c in s if c.lower() not in "aeiou")


# ----------------------------------------------------------------------------- the exercises

EMPTY_S = "('' for an empty string)."
EMPTY_L = "([] for an empty list)."
VOWELS = "vowels (a, e, i, o, u, upper or lower case)"
LETTERS = {"ch": tuple("aeinorst")}
SIZES = {"k": (2, 3, 4, 5, 6)}
String = partial(CodeTemplate, "string")
List = partial(CodeTemplate, "list")
Number = partial(CodeTemplate, "number")

STRING_TEMPLATES = (
    String(
        "train",
        ("reverse_string", "reversed_text"),
        f"returns the string `{{x}}` reversed {EMPTY_S}",
        lambda p, s: s[::-1],
        draw.words,
    ),
    String(
        "train",
        ("count_vowels", "vowel_count"),
        f"returns how many {VOWELS} the string `{{x}}` contains (0 for an empty string).",
        lambda p, s: sum(c.lower() in "aeiou" for c in s),
        draw.mixed_words,
    ),
    String(
        "train",
        ("capitalize_words", "title_words"),
        "takes `{x}`, lower-case words separated by single spaces, and returns it with the "
        f"first letter of every word in upper case {EMPTY_S}",
        _capitalize,
        draw.lines,
        {"args": LINE_ARGS},
    ),
    String(
        "train",
        ("remove_char", "drop_char"),
        f"returns the string `{{x}}` with every '{{ch}}' removed {EMPTY_S}",
        lambda p, s: s.replace(p["ch"], ""),
        draw.with_letter,
        LETTERS,
    ),
    String(
        "train",
        ("repeat_string", "repeat_text"),
        f"returns the string `{{x}}` repeated {{times}} times, nothing in between {EMPTY_S}",
        lambda p, s: s * p["times"],
        draw.short_words,
        {"times": (2, 3, 4, 5, 6)},
    ),
    String(
        "train",
        ("count_letter", "count_char"),
        "returns how many times the letter '{ch}' occurs in the lower-case string `{x}` "
        "(0 for an empty string).",
        lambda p, s: s.count(p["ch"]),
        draw.with_letter,
        LETTERS,
    ),
    String(
        "train",
        ("first_chars", "prefix"),
        "returns the first {k} characters of the string `{x}` (all of it if it is shorter).",
        lambda p, s: s[: p["k"]],
        draw.ends,
        SIZES,
    ),
    String(
        "train",
        ("count_words", "word_count"),
        "returns the number of words in `{x}`, words being separated by single spaces "
        "(0 for an empty string).",
        lambda p, s: len(s.split()),
        draw.lines,
        {"args": LINE_ARGS},
    ),
    String(
        "train",
        ("longest_word", "find_longest"),
        "returns the longest word in `{x}`, words being separated by single spaces; on a tie "
        f"the first of them {EMPTY_S}",
        _longest,
        draw.lines,
        {"args": LINE_ARGS},
    ),
    String(
        "train",
        ("double_chars", "double_letters"),
        f"returns the string `{{x}}` with every character doubled ('ab' gives 'aabb') {EMPTY_S}",
        lambda p, s: "".join(c * 2 for c in s),
        draw.short_words,
    ),
    String(
        "validation",
        ("count_upper", "count_capitals"),
        "returns how many upper-case letters the string `{x}` contains (0 for an empty string).",
        lambda p, s: sum(c.isupper() for c in s),
        draw.mixed_words,
    ),
    String(
        "validation",
        ("remove_vowels", "strip_vowels"),
        f"returns the string `{{x}}` without its {VOWELS} {EMPTY_S}",
        _no_vowels,
        draw.mixed_words,
    ),
    String(
        "validation",
        ("starts_with", "begins_with"),
        "returns True if the string `{x}` starts with the letter '{ch}', else False "
        "(False for an empty string).",
        lambda p, s: s.startswith(p["ch"]),
        draw.starting,
        {"ch": tuple("bcdmpst")},
    ),
    String(
        "test",
        ("is_palindrome", "reads_same_backwards"),
        "returns True if the string `{x}` reads the same forwards and backwards, else False "
        "(True for an empty string).",
        lambda p, s: s == s[::-1],
        draw.palindromes,
    ),
    String(
        "test",
        ("last_chars", "suffix"),
        "returns the last {k} characters of the string `{x}` (all of it if it is shorter).",
        lambda p, s: s[-p["k"] :],
        draw.ends,
        SIZES,
    ),
    String(
        "test",
        ("replace_spaces", "fill_spaces"),
        f"returns the string `{{x}}` with every space replaced by '{{ch}}' {EMPTY_S}",
        lambda p, s: s.replace(" ", p["ch"]),
        draw.spaced_lines,
        {"ch": tuple("-_*+.|"), "args": LINE_ARGS},
    ),
)

LIST_TEMPLATES = (
    List(
        "train",
        ("largest", "max_value"),
        "returns the largest number in `{x}`, a non-empty list of integers.",
        lambda p, v: max(v),
        draw.nonempty,
    ),
    List(
        "train",
        ("sum_list", "total"),
        "returns the sum of the integers in the list `{x}` (0 for an empty list).",
        lambda p, v: sum(v),
        draw.lists,
    ),
    List(
        "train",
        ("running_sum", "prefix_sums"),
        "returns a list whose i-th element is the sum of the first i + 1 integers of the list "
        f"`{{x}}` {EMPTY_L}",
        _running_sum,
        draw.lists,
    ),
    List(
        "train",
        ("greater_than", "keep_above"),
        "returns a list of the integers in `{x}` that are greater than {k}, in their original "
        "order ([] if there are none).",
        lambda p, v: [n for n in v if n > p["k"]],
        draw.around,
        {"k": tuple(range(10))},
    ),
    List(
        "train",
        ("count_evens", "num_evens"),
        "returns how many even integers the list `{x}` contains (0 for an empty list).",
        lambda p, v: sum(n % 2 == 0 for n in v),
        draw.lists,
    ),
    List(
        "train",
        ("remove_duplicates", "unique"),
        "returns the list `{x}` without repeated values, keeping the first occurrence of each "
        f"in the original order {EMPTY_L}",
        _unique,
        draw.small_lists,
    ),
    List(
        "train",
        ("product", "multiply_all"),
        "returns the product of the integers in the list `{x}` (1 for an empty list).",
        lambda p, v: math.prod(v),
        draw.factors,
    ),
    List(
        "train",
        ("reverse_list", "reversed_list"),
        f"returns a new list with the elements of the list `{{x}}` in reverse order {EMPTY_L}",
        lambda p, v: v[::-1],
        draw.distinct_lists,
    ),
    List(
        "train",
        ("every_kth", "take_every"),
        "returns the elements of the list `{x}` whose index is a multiple of {k} (indices 0, "
        f"{{k}}, ...) {EMPTY_L}",
        lambda p, v: v[:: p["k"]],
        draw.distinct_lists,
        {"k": (2, 3, 4)},
    ),
    List(
        "train",
        ("multiply_each", "scale_list"),
        f"returns a new list with every integer of the list `{{x}}` multiplied by {{k}} {EMPTY_L}",
        lambda p, v: [n * p["k"] for n in v],
        draw.lists,
        {"k": tuple(range(2, 10))},
    ),
    List(
        "validation",
        ("smallest", "min_value"),
        "returns the smallest number in `{x}`, a non-empty list of integers.",
        lambda p, v: min(v),
        draw.nonempty,
    ),
    List(
        "validation",
        ("contains", "has_value"),
        "returns True if the number {k} is in the list `{x}`, else False (False for an empty "
        "list).",
        lambda p, v: p["k"] in v,
        draw.holding,
        {"k": tuple(range(10))},
    ),
    List(
        "validation",
        ("sum_of_squares", "square_sum"),
        "returns the sum of the squares of the integers in the list `{x}` (0 for an empty list).",
        lambda p, v: sum(n * n for n in v),
        draw.lists,
    ),
    List(
        "test",
        ("second_largest", "runner_up"),
        "returns the second largest distinct value in `{x}`, a list holding at least two "
        "different integers ([5, 5, 3] gives 3).",
        _second_largest,
        draw.two_distinct,
    ),
    List(
        "test",
        ("index_of", "find_index"),
        "returns the index of the first {k} in the list `{x}`, or -1 if {k} is not in it.",
        _index_of,
        draw.holding,
        {"k": tuple(range(10))},
    ),
    List(
        "test",
        ("odd_numbers", "keep_odds"),
        "returns a list of the odd integers in `{x}`, in their original order ([] if there are "
        "none).",
        lambda p, v: [n for n in v if n % 2],
        draw.lists,
    ),
)

NUMBER_TEMPLATES = (
    Number(
        "train",
        ("fizzbuzz", "fizz_buzz"),
        "returns 'FizzBuzz' if the integer `{x}` is divisible by both {d1} and {d2}, 'Fizz' if "
        "only by {d1}, 'Buzz' if only by {d2}, and otherwise `{x}` as a string.",
        _fizzbuzz,
        draw.fizz,
        {"d1": (2, 3, 4), "d2": (5, 7)},
    ),
    Number(
        "train",
        ("factorial", "fact"),
        "returns the factorial of the non-negative integer `{x}` (1 for 0).",
        lambda p, n: math.factorial(n),
        draw.small_naturals,
    ),
    Number(
        "train",
        ("sum_digits", "digit_sum"),
        "returns the sum of the decimal digits of the non-negative integer `{x}` (0 for 0).",
        lambda p, n: sum(map(int, str(n))),
        draw.naturals,
    ),
    Number(
        "train",
        ("is_divisible", "divides_evenly"),
        "returns True if the integer `{x}` is divisible by {k}, else False.",
        lambda p, n: n % p["k"] == 0,
        draw.multiples,
        {"k": tuple(range(2, 13))},
    ),
    Number(
        "train",
        ("clamp", "limit"),
        "returns the integer `{x}` limited to the range {lo} to {hi}: {lo} if `{x}` is smaller, "
        "{hi} if it is larger, else `{x}` itself.",
        lambda p, n: min(max(n, p["lo"]), p["hi"]),
        draw.clamps,
        {"lo": tuple(range(-10, 1)), "hi": tuple(range(5, 21))},
    ),
    Number(
        "train",
        ("abs_diff", "distance"),
        "returns the absolute difference between the integers `{x}` and `{y}`.",
        lambda p, a, b: abs(a - b),
        draw.pairs,
        {"args": PAIR_ARGS},
    ),
    Number(
        "train",
        ("fibonacci", "fib"),
        "returns the `{x}`-th Fibonacci number, where {fn}(0) = 0, {fn}(1) = 1 and each next one "
        "is the sum of the two before it.",
        _fibonacci,
        draw.small_naturals,
    ),
    Number(
        "train",
        ("gcd", "greatest_common_divisor"),
        "returns the greatest common divisor of the positive integers `{x}` and `{y}`.",
        lambda p, a, b: math.gcd(a, b),
        draw.gcd_pairs,
        {"args": PAIR_ARGS},
    ),
    Number(
        "train",
        ("is_even", "even"),
        "returns True if the integer `{x}` is even, else False.",
        lambda p, n: n % 2 == 0,
        draw.evens,
    ),
    Number(
        "train",
        ("max_of_three", "largest_of_three"),
        "returns the largest of the three integers `{x}`, `{y}` and `{z}`.",
        lambda p, *n: max(n),
        draw.triples,
        {"args": TRIPLE_ARGS},
    ),
    Number(
        "validation",
        ("count_digits", "num_digits"),
        "returns how many decimal digits the non-negative integer `{x}` has (0 has one digit).",
        lambda p, n: len(str(n)),
        draw.naturals,
    ),
    Number(
        "validation",
        ("power", "raise_to"),
        "returns the integer `{x}` raised to the power {k}.",
        lambda p, n: n ** p["k"],
        draw.signed,
        {"k": (2, 3, 4, 5)},
    ),
    Number(
        "validation",
        ("round_down", "floor_to_multiple"),
        "returns the largest multiple of {k} that is less than or equal to the non-negative "
        "integer `{x}`.",
        lambda p, n: n - n % p["k"],
        draw.multiples,
        {"k": tuple(range(2, 11))},
    ),
    Number(
        "test",
        ("is_prime", "check_prime"),
        "returns True if the integer `{x}` is a prime number, else False (numbers below 2 are "
        "not prime).",
        _is_prime,
        draw.primes,
    ),
    Number(
        "test",
        ("reverse_digits", "reversed_number"),
        "returns the non-negative integer `{x}` with its decimal digits in reverse order, as an "
        "integer (120 gives 21).",
        lambda p, n: int(str(n)[::-1]),
        draw.ending_zero,
    ),
    Number(
        "test",
        ("sum_multiples", "multiples_sum"),
        "returns the sum of all positive multiples of {k} that are less than `{x}` (0 if there "
        "are none).",
        lambda p, n: sum(range(p["k"], n, p["k"])),
        draw.below_limits,
        {"k": tuple(range(2, 10))},
    ),
)

TEMPLATES: tuple[CodeTemplate, ...] = STRING_TEMPLATES + LIST_TEMPLATES + NUMBER_TEMPLATES
