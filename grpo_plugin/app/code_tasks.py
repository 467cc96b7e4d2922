"""The generated `code` dataset: requests for a small Python function, scored by hidden tests.

`dataset: {name: code}` asks for short functions a small model can write in a few lines: string
exercises (reverse a word, count vowels, is it a palindrome), list exercises (largest, running
sum, the elements greater than k) and number exercises (FizzBuzz, is prime, gcd). There are 48
templates (`code_templates.TEMPLATES`), 16 per family; each draws its parameters per prompt: the
function's name (one of two), its argument names, and where the exercise has them the numbers
or letters of the request ("divisible by {k}", "every '{ch}' removed"), so one template yields
many distinct prompts and no answer can be learned by heart.

Fixed split by template. Every template belongs to exactly one split, written in its row and the
same for every seed: train 30 templates (10 string, 10 list, 10 number), validation 9 and test 9
(3 of each family each). The held-out (test) and validation prompts are exercises that training
never saw, not new parameters of seen ones, so a test score measures writing new functions.

Prompt. A chat: the optional system message, then one user message, the request and a fixed
instruction (`INSTRUCTION`):

    Write a Python function `count_vowels(text)` that returns how many vowels (a, e, i, o, u,
    upper or lower case) the string `text` contains (0 for an empty string).

    Answer with the function in a ```python code block.

Scoring. The `tests` column holds 4-5 lines `assert count_vowels('bAnana') == 3`, edge cases
first (an empty string or list where the request defines it), the expected values computed by
each template's reference solution (on the host, never shown). The `code_tests` reward takes the
reply's last fenced code block (the whole reply when it has none), runs it in its sandbox, then
the asserts, each one test: the reward is the fraction that pass. Columns: `prompt`, `tests`,
`template` (the exercise, e.g. "count_vowels") and `entry_point` (the function's name).

Rows. Each split draws with its own `random.Random` seeded from (seed, split), so train and test
are the same with or without a validation split, and the first N rows of a split do not depend
on its size. The rows cycle through the split's templates in a seeded order; a template gives
each of its variants at most once, so no two rows of a split share a prompt, and a split holds at
most `split_capacity(split)` rows (a template that runs out drops out of the cycle).
"""

from __future__ import annotations

import random
from typing import Any

from datasets import Dataset

from .code_templates import SPLITS, TEMPLATES, CodeTemplate

INSTRUCTION = "Answer with the function in a ```python code block."
CODE_TRAIN_SIZE, CODE_EVAL_SIZE = 256, 64  # the defaults of train_size and eval_size
COLUMNS = ["prompt", "tests", "template", "entry_point"]
SIZE_KEYS = {"train": "train_size", "test": "eval_size", "validation": "validation_size"}


def split_templates(split: str) -> list[CodeTemplate]:
    """The templates of one split ("train", "validation" or "test"), in table order."""
    if split not in SPLITS:
        raise ValueError(f"code: unknown split {split!r}; one of {', '.join(SPLITS)}")
    return [t for t in TEMPLATES if t.split == split]


def split_capacity(split: str) -> int:
    """How many distinct prompts a split can hold: its templates' variants together."""
    return sum(len(t.variants()) for t in split_templates(split))


def check_sizes(sizes: dict[str, int]) -> None:
    """Raise ValueError if a split is asked for more rows than it has distinct prompts."""
    for split, n in sizes.items():
        capacity = split_capacity(split)
        if n > capacity:
            raise ValueError(
                f"code: {SIZE_KEYS[split]}={n} asks for more than the {capacity} distinct "
                f"prompts of the {split} split's {len(split_templates(split))} templates; "
                f"lower {SIZE_KEYS[split]}"
            )


def code_dataset(
    n_train: int,
    n_eval: int,
    n_validation: int = 0,
    *,
    seed: int = 0,
    system_prompt: str | None = None,
) -> tuple[Dataset, Dataset, Dataset | None]:
    """`(train, test, validation)` coding prompts with hidden tests (the module docstring);
    validation is None when `n_validation` is 0."""
    check_sizes({"train": n_train, "test": n_eval, "validation": n_validation})
    train, test = (
        _split(s, n, seed, system_prompt) for s, n in (("train", n_train), ("test", n_eval))
    )
    validation = _split("validation", n_validation, seed, system_prompt) if n_validation else None
    return train, test, validation


def code_splits(
    spec: dict[str, Any], n_validation: int
) -> tuple[Dataset, Dataset | None, Dataset | None]:
    """A `name: code` dataset spec's `(train, test or None, validation or None)`."""
    n_train = spec.get("train_size", CODE_TRAIN_SIZE)
    n_eval = spec.get("eval_size", CODE_EVAL_SIZE)
    train, test, validation = code_dataset(
        n_train,
        n_eval,
        n_validation,
        seed=spec.get("seed", 0),
        system_prompt=spec.get("system_prompt"),
    )
    return train, test if len(test) else None, validation


def check_spec_sizes(spec: dict[str, Any]) -> None:
    """`check_sizes` on a spec's train_size, eval_size and validation_size (with the defaults)."""
    check_sizes(
        {
            "train": spec.get("train_size", CODE_TRAIN_SIZE),
            "test": spec.get("eval_size", CODE_EVAL_SIZE),
            "validation": spec.get("validation_size", 0),
        }
    )


def _split(split: str, n: int, seed: int, system_prompt: str | None) -> Dataset:
    rng = random.Random(f"code:{seed}:{split}")
    templates = split_templates(split)
    rng.shuffle(templates)
    pending = [
        rng.sample(variants, len(variants)) for variants in (t.variants() for t in templates)
    ]
    rows: dict[str, list] = {column: [] for column in COLUMNS}
    while len(rows["tests"]) < n:
        for template, left in zip(templates, pending):
            if left and len(rows["tests"]) < n:
                _add_row(rows, template, left.pop(), rng, system_prompt)
    return Dataset.from_dict(rows)


def _add_row(
    rows: dict[str, list],
    template: CodeTemplate,
    params: dict[str, Any],
    rng: random.Random,
    system_prompt: str | None,
) -> None:
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    request = f"{template.request_text(params)}\n\n{INSTRUCTION}"
    rows["prompt"].append([*system, {"role": "user", "content": request}])
    rows["tests"].append(template.tests(params, rng))
    rows["template"].append(template.name)
    rows["entry_point"].append(params["fn"])
