"""Test arguments for the `code` dataset's exercises (`code_templates`), drawn with a seeded rng.

Each generator takes `(rng, params)` (params: the prompt's parameters, e.g. {"k": 3}) and returns
a list of argument tuples, edge cases first (an empty string or list where the request defines
it). Generators mix the cases a trivial answer would get wrong: a True and a False case for every
yes/no exercise, a value outside the range for clamping, a list holding k for "greater than k".
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

Args = list[tuple]
WORDS = (
    "apple banana cherry garden python river stone window orange planet silver forest candle "
    "bridge yellow rocket pencil market winter castle dragon jungle lemon mango tiger cloud "
    "ocean music paper train house green light sugar table zebra sky cat dog sun code tree "
    "bird fish moon star rhythm elephant notebook mountain umbrella kangaroo dinosaur sandwich "
    "chocolate keyboard airplane"
).split()  # no palindromes: is_palindrome builds its own
PRIMES = tuple(n for n in range(2, 100) if all(n % d for d in range(2, n)))
COMPOSITES = tuple(n for n in range(4, 100) if n not in PRIMES)


def one(*values: Any) -> Args:
    """Single-argument calls: `one(1, 2)` -> [(1,), (2,)]."""
    return [(v,) for v in values]


def word(rng: random.Random, keep: Callable[[str], Any] = bool) -> str:
    """A word of WORDS for which `keep` is true."""
    return rng.choice([w for w in WORDS if keep(w)])


def mixed_case(rng: random.Random) -> str:
    """A word with some letters in upper case."""
    return "".join(c.upper() if rng.random() < 0.4 else c for c in word(rng))


def line(rng: random.Random, low: int = 1, high: int = 5) -> str:
    """`low` to `high` words separated by single spaces."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def ints(rng: random.Random, low: int = -20, high: int = 20, size: int = 0) -> list[int]:
    """`size` integers in [low, high] (default size: 2 to 7)."""
    return [rng.randint(low, high) for _ in range(size or rng.randint(2, 7))]


def pick(rng: random.Random, keep: Callable[[int], Any], high: int = 100) -> int:
    """A number in [1, high] for which `keep` is true."""
    return rng.choice([n for n in range(1, high + 1) if keep(n)])


# ----------------------------------------------------------------------------- strings


def words(rng: random.Random, p: dict) -> Args:
    """ "", then four words."""
    return one("", *(word(rng) for _ in range(4)))


def short_words(rng: random.Random, p: dict) -> Args:
    """ "", then four words of at most 5 letters."""
    return one("", *(word(rng, lambda w: len(w) <= 5) for _ in range(4)))


def mixed_words(rng: random.Random, p: dict) -> Args:
    """ "", a lower-case word, then three words with some upper-case letters."""
    return one("", word(rng), *(mixed_case(rng) for _ in range(3)))


def lines(rng: random.Random, p: dict) -> Args:
    """ "", then four lines of 1 to 6 words."""
    return one("", *(line(rng, 1, 6) for _ in range(4)))


def spaced_lines(rng: random.Random, p: dict) -> Args:
    """ "", one word, then three lines of 2 to 5 words."""
    return one("", word(rng), *(line(rng, 2, 5) for _ in range(3)))


def with_letter(rng: random.Random, p: dict) -> Args:
    """ "", two words holding p["ch"], one without it, one of either."""
    having, lacking = (lambda w: p["ch"] in w), (lambda w: p["ch"] not in w)
    return one("", word(rng, having), word(rng, having), word(rng, lacking), word(rng))


def starting(rng: random.Random, p: dict) -> Args:
    """ "", two words starting with p["ch"], two that do not."""
    first, other = (lambda w: w[0] == p["ch"]), (lambda w: w[0] != p["ch"])
    return one("", word(rng, first), word(rng, first), word(rng, other), word(rng, other))


def ends(rng: random.Random, p: dict) -> Args:
    """ "", a word shorter than p["k"], three longer ones."""
    k = p["k"]
    longer = [word(rng, lambda w: len(w) > k) for _ in range(3)]
    return one("", word(rng)[: rng.randint(1, k - 1)], *longer)


def palindromes(rng: random.Random, p: dict) -> Args:
    """ "", an even and an odd palindrome, two words that are not."""
    a, b = (word(rng, lambda w: len(w) <= 5) for _ in range(2))
    return one("", a + a[::-1], b + b[-2::-1], word(rng), word(rng))


# ----------------------------------------------------------------------------- lists


def lists(rng: random.Random, p: dict) -> Args:
    """[], then four lists of 2 to 7 integers in [-20, 20]."""
    return one([], *(ints(rng) for _ in range(4)))


def nonempty(rng: random.Random, p: dict) -> Args:
    """A one-element list, then four lists of 2 to 7 integers."""
    return one([rng.randint(-20, 20)], *(ints(rng) for _ in range(4)))


def small_lists(rng: random.Random, p: dict) -> Args:
    """[], then four lists of 4 to 8 integers in [0, 5] (repeats likely)."""
    return one([], *(ints(rng, 0, 5, rng.randint(4, 8)) for _ in range(4)))


def factors(rng: random.Random, p: dict) -> Args:
    """[], then four lists of 1 to 5 integers in [-5, 6] (products stay small)."""
    return one([], *(ints(rng, -5, 6, rng.randint(1, 5)) for _ in range(4)))


def distinct_lists(rng: random.Random, p: dict) -> Args:
    """[], then four lists of 2 to 10 distinct integers."""
    return one([], *(rng.sample(range(-20, 41), rng.randint(2, 10)) for _ in range(4)))


def around(rng: random.Random, p: dict) -> Args:
    """[], a list holding p["k"] itself, then lists of integers near k."""
    k = p["k"]
    holding_k = [*ints(rng, k - 9, k + 9, 3), k]
    return one([], rng.sample(holding_k, 4), *(ints(rng, k - 9, k + 9) for _ in range(3)))


def holding(rng: random.Random, p: dict) -> Args:
    """[], a list holding p["k"] once and one holding it twice (at random places), two
    without it."""
    k, others = p["k"], [n for n in range(20) if n != p["k"]]
    with_k = [rng.sample(others, 4) for _ in range(2)]
    for values in (with_k[0], with_k[1], with_k[1]):
        values.insert(rng.randint(0, len(values)), k)
    return one([], *with_k, rng.sample(others, 3), rng.sample(others, 5))


def two_distinct(rng: random.Random, p: dict) -> Args:
    """Lists of at least two distinct integers; the first holds its largest value twice."""
    found = [rng.sample(range(-20, 21), rng.randint(2, 6)) for _ in range(4)]
    found[0].append(max(found[0]))
    return one(*(rng.sample(values, len(values)) for values in found))


# ----------------------------------------------------------------------------- numbers


def naturals(rng: random.Random, p: dict) -> Args:
    """0, then non-negative integers of 1, 2-3, and 4-6 digits."""
    return one(0, rng.randint(1, 9), rng.randint(10, 999), *rng.sample(range(1000, 10**6), 2))


def small_naturals(rng: random.Random, p: dict) -> Args:
    """0, 1, then three of [2, 12]."""
    return one(0, 1, *rng.sample(range(2, 13), 3))


def signed(rng: random.Random, p: dict) -> Args:
    """0, 1, a negative integer, then two of [2, 9]."""
    return one(0, 1, -rng.randint(2, 5), *rng.sample(range(2, 10), 2))


def fizz(rng: random.Random, p: dict) -> Args:
    """A multiple of both divisors, of only one (each), then two of neither."""
    a, b = p["d1"], p["d2"]
    neither = [pick(rng, lambda n: n % a and n % b) for _ in range(2)]
    only_a, only_b = (
        pick(rng, lambda n: n % a == 0 < n % b),
        pick(rng, lambda n: n % b == 0 < n % a),
    )
    return one(a * b * rng.randint(1, 3), only_a, only_b, *neither)


def multiples(rng: random.Random, p: dict) -> Args:
    """0, a multiple of p["k"], two that are not, and one below k."""
    k = p["k"]
    off = [k * rng.randint(1, 20) + rng.randint(1, k - 1) for _ in range(2)]
    return one(0, k * rng.randint(1, 20), *off, rng.randint(1, k - 1))


def below_limits(rng: random.Random, p: dict) -> Args:
    """Up to p["k"] (no positive multiple below it), then larger numbers and a multiple."""
    k = p["k"]
    return one(rng.randint(0, k), rng.randint(k + 1, 100), rng.randint(k + 1, 100), k * 7)


def clamps(rng: random.Random, p: dict) -> Args:
    """Below p["lo"], above p["hi"], inside, and both bounds."""
    lo, hi = p["lo"], p["hi"]
    return one(lo - rng.randint(1, 9), hi + rng.randint(1, 9), rng.randint(lo + 1, hi - 1), lo, hi)


def evens(rng: random.Random, p: dict) -> Args:
    """0, an even number, an odd one, a negative odd one, any."""
    odd = 2 * rng.randint(0, 50) + 1
    return one(0, 2 * rng.randint(1, 50), odd, -odd - 2, rng.randint(-100, 100))


def primes(rng: random.Random, p: dict) -> Args:
    """0 or 1, two primes, two composites (all below 100)."""
    return one(rng.choice((0, 1)), *rng.sample(PRIMES, 2), *rng.sample(COMPOSITES, 2))


def ending_zero(rng: random.Random, p: dict) -> Args:
    """0, a number ending in 0, then three of 2 to 5 digits."""
    return one(0, 10 * rng.randint(1, 999), *(rng.randint(10, 99999) for _ in range(3)))


def pairs(rng: random.Random, p: dict) -> Args:
    """Two equal integers, then a > b, a < b, and a pair of negatives."""
    a = rng.randint(-20, 20)
    high, low = rng.randint(5, 30), rng.randint(-20, 4)
    return [(a, a), (high, low), (low, high), (-rng.randint(1, 9), -rng.randint(10, 30))]


def gcd_pairs(rng: random.Random, p: dict) -> Args:
    """Two pairs with a common factor, two distinct primes, and g with a multiple of g."""
    g = rng.randint(2, 9)
    q, r = rng.sample(PRIMES[:10], 2)
    shared = [(g * rng.randint(1, 9), g * rng.randint(1, 9)) for _ in range(2)]
    return [*shared, (q, r), (g, g * q)]


def triples(rng: random.Random, p: dict) -> Args:
    """Three distinct integers with the largest first, in the middle, last; then a tie."""

    def ordered() -> list[int]:
        return sorted(rng.sample(range(-20, 21), 3))

    (a, b, top), (c, d, mid), (e, f, last), (g, h, _) = (ordered() for _ in range(4))
    return [(top, a, b), (c, mid, d), (e, f, last), (h, h, g)]
